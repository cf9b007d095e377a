"""The benchmark of issue 16: the seeds' way of watching a run (every step:
gradient and parameter norms, update ratio, an anomaly check, all read on the
host; a profiler measurement every 50 steps; bench/seeds_monitor.py) against the
`health`, `trace` and `early-stop` plugins at their default cadences, on the MLP
and the tiny GPT of bench/configs; and the `trace` plugin loaded but outside its
windows against fast mode (its cost there should be none).

    bench/health_trace.sh [--repeats 7] [--threads 1] [--models mlp,gpt] [--steps N]

Contenders run as separate processes, alternating (each round runs each once, in
a rotated order), after one untimed warm-up run each; the table gives median
step times (the training loop's wall time / steps, as bench/run.py measures it).
Prints a Markdown table and writes every sample to bench/out/health_trace.json.
"""

import argparse
import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "out"
PTRAIN = ROOT / "target" / "release" / "ptrain"
PYTHON = ROOT / ".venv" / "bin" / "python"

MODELS = {
    "mlp": {"config": "bench/configs/mlp.toml", "steps": 4500, "title": "MLP 784-256-10, batch 64"},
    "gpt": {"config": "bench/configs/gpt.toml", "steps": 450, "title": "tiny GPT (2 layers, width 64, context 32), batch 16"},
}


def contenders(steps):
    beyond = steps + 100
    return [
        ("torch", "Python eager loop (bench/seeds_monitor.py --no-monitor)", ["py", "--no-monitor"]),
        ("seeds", "the seeds' way in Python: every step grad norm, param norm, update ratio, anomaly check (`.item()` each); "
                  "profiler (record_shapes, with_flops) on step 1 and every 50", ["py"]),
        ("ptrain", "ptrain fast mode (no plugins)", ["ptrain"]),
        ("plugins", "ptrain + health (every 100), trace (steps 10-12, then every 1000), early-stop (each eval)",
         ["ptrain", "--plugins", "health,trace,early-stop"]),
        ("health-every", "ptrain + health every step (the seeds' cadence, on the device, one read per step)",
         ["ptrain", "--plugins", "health", "--set", "plugins.health.every=1"]),
        ("trace-idle", "ptrain + trace loaded, its first window after the run's last step",
         ["ptrain", "--plugins", "trace", "--set", f"plugins.trace.wait={beyond}", "--set", "plugins.trace.every=0"]),
    ]


def command(spec, model, steps, threads, seed, run_dir, out_json):
    kind, *extra = spec
    common = ["--config", model["config"], "--steps", str(steps), "--seed", str(seed), "--device", "cpu"]
    if kind == "py":
        return [str(PYTHON), "bench/seeds_monitor.py", *common, "--set", f"run.threads={threads}", "--out", str(out_json),
                "--quiet", *extra], out_json
    return [str(PTRAIN), "run", *common, "--set", f"run.threads={threads}", "--run-dir", str(run_dir), "--quiet",
            *extra], run_dir / "summary.json"


def run(spec, model, steps, args, tag):
    run_dir, out_json = OUT / "health_trace" / tag, OUT / "health_trace" / f"{tag}.json"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    cmd, result_path = command(spec, model, steps, args.threads, args.seed, run_dir, out_json)
    proc = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0 or not result_path.exists():
        sys.exit(f"{' '.join(cmd)} failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}")
    result = json.loads(result_path.read_text())
    shutil.rmtree(run_dir, ignore_errors=True)
    out_json.unlink(missing_ok=True)
    failures = result.get("plugin_failures") or []
    if failures:
        sys.exit(f"{tag}: plugin failures {failures}")
    return result["wall_s"] / max(result["steps"], 1)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--models", default="mlp,gpt")
    p.add_argument("--steps", type=int, help="override every model's step count")
    args = p.parse_args()
    results = {}
    for name in args.models.split(","):
        model = MODELS[name]
        steps = args.steps or model["steps"]
        specs = contenders(steps)
        samples = {cid: [] for cid, _, _ in specs}
        print(f"{name}: warm-up", file=sys.stderr)
        for cid, _, spec in specs:
            run(spec, model, steps, args, f"{name}-{cid}-warmup")
        for r in range(args.repeats):
            order = specs[r % len(specs):] + specs[:r % len(specs)]
            for cid, _, spec in order:
                samples[cid].append(run(spec, model, steps, args, f"{name}-{cid}-{r}"))
            print(f"{name}: round {r + 1}/{args.repeats} done", file=sys.stderr)
        results[name] = {"steps": steps, "samples": samples, "what": {cid: what for cid, what, _ in specs}}

    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "health_trace.json").write_text(json.dumps(results, indent=2) + "\n")
    ratios = {"seeds": "torch", "plugins": "ptrain", "health-every": "ptrain", "trace-idle": "ptrain"}
    for name, r in results.items():
        med = {cid: statistics.median(s) for cid, s in r["samples"].items()}
        print(f"\n#### {MODELS[name]['title']}, {r['steps']} steps, medians of {args.repeats}\n")
        print("| contender | what | median step time | ratio | compared with |")
        print("| --- | --- | --- | --- | --- |")
        for cid, s in r["samples"].items():
            base = ratios.get(cid)
            ratio = f"{med[cid] / med[base]:.3f}" if base else "–"
            print(f"| {cid} | {r['what'][cid]} | {med[cid] * 1e3:.3f} ms | {ratio} | {base or 'reference'} |")
        print(f"\nptrain + the plugins vs the seeds' way: {med['seeds'] / med['plugins']:.2f}× the steps/s")


if __name__ == "__main__":
    main()
