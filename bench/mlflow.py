"""What logging to MLflow costs, on one local `mlflow server` (sqlite backend):

  (1) ptrain's benchmark GPT (bench/configs/gpt.toml) in fast mode, and with the
      `mlflow` plugin logging every step (every attachment at every=1, 13 metrics a
      step): step time and the ratio to fast mode, and whether every value reached
      the server;
  (2) the Python client logging the same 13 metrics for the same number of steps,
      `mlflow.log_metrics(metrics, step=i)` in a loop, synchronously and with MLflow's
      async logging: calls per second (no training in that loop: it is the client's
      ceiling), next to ptrain's steps per second.

Run it through bench/mlflow.sh on a quiet machine:

    bench/mlflow.sh                       # 2000 steps, 5 repeats, 1 libtorch thread
    bench/mlflow.sh --steps 500 --repeats 2 --no-build

Prints the Markdown rows of BENCHMARKS.md's "MLflow: logging every step" section.
"""

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PTRAIN = ROOT / "target" / "release" / "ptrain"
CONFIG = ROOT / "bench" / "configs" / "gpt.toml"
# What ptrain emits at a step where both of the plugin's attachments are due.
METRICS = ["train/loss", "train/lr", "train/tokens_per_s", "train/samples_per_s", "train/epoch", "train/grad_norm",
           "time/data_s", "time/forward_s", "time/backward_s", "time/optimizer_s", "time/step_s",
           "memory/current_bytes", "memory/peak_bytes"]

CLIENT_LOOP = """
import json, sys, time
import mlflow
uri, steps, mode, names = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4].split(",")
mlflow.set_tracking_uri(uri)
mlflow.set_experiment("bench-python")
with mlflow.start_run() as run:
    t0 = time.perf_counter()
    for i in range(1, steps + 1):
        mlflow.log_metrics({n: float(i) for n in names}, step=i, synchronous=(mode == "sync"))
    if mode == "async":
        mlflow.flush_async_logging()
    print(json.dumps({"seconds": time.perf_counter() - t0, "run_id": run.info.run_id}))
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(work, workers):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] = "false"
    log = open(work / "server.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", str(workers),
         "--backend-store-uri", f"sqlite:///{work / 'mlflow.db'}", "--artifacts-destination", str(work / "artifacts")],
        cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    uri = f"http://127.0.0.1:{port}"
    for _ in range(3000):
        if proc.poll() is not None:
            raise SystemExit(f"mlflow server exited:\n{(work / 'server.log').read_text()}")
        try:
            with urllib.request.urlopen(f"{uri}/health", timeout=5) as r:
                if r.status == 200:
                    return proc, uri
        except OSError:
            time.sleep(0.2)
    raise SystemExit("mlflow server did not start")


def stop_server(proc):
    try:
        os.killpg(proc.pid, 9)
    except ProcessLookupError:
        pass
    proc.wait()


def history_len(uri, run_id, key):
    query = urllib.parse.urlencode({"run_id": run_id, "metric_key": key, "max_results": 100000})
    with urllib.request.urlopen(f"{uri}/api/2.0/mlflow/metrics/get-history?{query}", timeout=60) as r:
        return len(json.load(r).get("metrics", []))


def run_ptrain(work, name, steps, threads, uri=None):
    run_dir = work / "runs" / name
    shutil.rmtree(run_dir, ignore_errors=True)
    cmd = [str(PTRAIN), "run", "--config", str(CONFIG), "--steps", str(steps), "--device", "cpu", "--quiet",
           "--run-dir", str(run_dir), "--set", f"run.threads={threads}"]
    if uri:
        cmd += ["--plugins", "mlflow", "--set", f'plugins.mlflow.uri="{uri}"', "--set", 'plugins.mlflow.experiment="bench"',
                "--set", "plugins.mlflow.every=1", "--set", "plugins.mlflow.detailed.every=1",
                "--set", "plugins.mlflow.end_timeout_secs=600"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    t0 = time.perf_counter()
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    process_s = time.perf_counter() - t0
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{out.stderr}")
    summary = json.loads((run_dir / "summary.json").read_text())
    result = {"step_s": summary["wall_s"] / summary["steps"], "process_s": process_s,
              "queue_drops": sum(summary.get("queue_drops", {}).values())}
    if uri:
        m = summary["plugins"]["mlflow"]
        result.update(run_id=m["run_id"], sent=m["sent"]["metrics"], pending=m["pending_items"],
                      on_server=history_len(uri, m["run_id"], "train/loss"))
    return result


def client_loop(uri, steps, mode):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    out = subprocess.run([sys.executable, "-c", CLIENT_LOOP, uri, str(steps), mode, ",".join(METRICS)],
                         env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"the client loop ({mode}) failed:\n{out.stderr}")
    # MLflow prints its own lines (the run's URL) at the end of a run.
    result = next(json.loads(line) for line in out.stdout.splitlines() if line.startswith('{"seconds"'))
    return result["seconds"], history_len(uri, result["run_id"], METRICS[0]) == steps


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=1, help="libtorch intra-op threads (1 on a 2-core machine)")
    p.add_argument("--workers", type=int, default=4, help="mlflow server workers (its default)")
    p.add_argument("--no-build", action="store_true")
    args = p.parse_args()
    if not args.no_build:
        subprocess.run(["cargo", "build", "--release", "-p", "ptrain", "-p", "ptrain-plugin-mlflow"], cwd=ROOT, check=True)
    work = Path(tempfile.mkdtemp(prefix="ptrain-bench-mlflow-"))
    proc, uri = start_server(work, args.workers)
    try:
        fast, logged, sync, asyn = [], [], [], []
        run_ptrain(work, "warmup", min(args.steps, 200), args.threads, uri)
        for r in range(args.repeats):
            # Alternate, so slow drifts of the machine hit both sides alike.
            order = [("fast", None), ("mlflow", uri)] if r % 2 == 0 else [("mlflow", uri), ("fast", None)]
            for name, u in order:
                (logged if u else fast).append(run_ptrain(work, f"{name}-{r}", args.steps, args.threads, u))
            sync.append(client_loop(uri, args.steps, "sync"))
            asyn.append(client_loop(uri, args.steps, "async"))
            print(f"round {r + 1}/{args.repeats} done", file=sys.stderr)
    finally:
        stop_server(proc)
        shutil.rmtree(work, ignore_errors=True)

    med = lambda xs: statistics.median(xs)
    fast_s, mlflow_s = med([x["step_s"] for x in fast]), med([x["step_s"] for x in logged])
    complete = all(x["on_server"] == args.steps and x["pending"] == 0 and x["queue_drops"] == 0 for x in logged)
    print(f"`bench/mlflow.sh --steps {args.steps} --repeats {args.repeats} --threads {args.threads}`: "
          f"bench/configs/gpt.toml on the CPU, one local `mlflow server` (sqlite, {args.workers} workers), medians of {args.repeats}.\n")
    print("| | step time | ratio to fast mode | steps (log calls) per second | on the server |")
    print("| --- | ---: | ---: | ---: | --- |")
    print(f"| ptrain, fast mode | {fast_s * 1e3:.3f} ms | 1 | {1 / fast_s:.0f} | – |")
    print(f"| ptrain + mlflow, every step ({len(METRICS)} metrics) | {mlflow_s * 1e3:.3f} ms | {mlflow_s / fast_s:.3f} | "
          f"{1 / mlflow_s:.0f} | {'every value, nothing pending' if complete else 'INCOMPLETE: ' + json.dumps(logged)} |")
    for label, loops in [("`mlflow.log_metrics`, synchronous", sync), ("`mlflow.log_metrics(synchronous=False)` + flush", asyn)]:
        stored = "every value" if all(ok for _, ok in loops) else "INCOMPLETE"
        print(f"| Python {label}, no training | – | – | {args.steps / med([s for s, _ in loops]):.0f} | {stored} |")
    wait = med([x["process_s"] for x in logged]) - med([x["process_s"] for x in fast])
    print(f"\nptrain + mlflow, whole process minus fast mode's (training, start-up and the end-of-run flush): {wait:.2f} s (median)")


if __name__ == "__main__":
    main()
