"""ptrain's benchmarks: ptrain side by side with a bare tch loop, Python PyTorch
and PyTorch Lightning, in one run.

Run it through bench/run.sh (which sets up the libtorch environment):

    bench/run.sh                  # the full CPU benchmark (several minutes)
    bench/run.sh --write          # ... and regenerate BENCHMARKS.md from it
    bench/run.sh --quick          # a smoke test of the harness (about two minutes)
    bench/run.sh --device cuda    # the GPU table (GPT-small, bf16, MFU)
    bench/run.sh --template       # BENCHMARKS.md with placeholders, running nothing

For each model (the MLP 784-256-10 and the tiny GPT on the CPU; GPT-small on a
GPU) every contender trains the same model on the same kind of data with the
same seed and step count. The contenders run as separate processes, one after
the other, alternating: round r runs every contender once, in an order rotated
by r. After one untimed warm-up run of each (page cache, lazy loading), each
contender runs `--repeats` times; the table reports medians.

Every contender times its training loop the same way: from just before the
first step (after process start-up, imports, data generation, model and
optimizer construction) to the end of the final evaluation, which includes the
end-of-run flush of loggers and checkpoints. That is ptrain's `summary.json`
`wall_s`; the bare loop and the Python scripts measure the same span. Step time
= wall time / steps; the first steps (warm-up of allocators and kernels) are
included identically on every side.

Results: bench/out/results.json (every sample), bench/out/logs/ (each run's
output); with --write also BENCHMARKS.md.
"""

import argparse
import datetime
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
OUT = BENCH / "out"
# From a bundle (scripts/bundle.sh, docs/gpu.md): PTRAIN_BIN_DIR=bundle/bin and
# PTRAIN_PYTHON=the device's python, with --no-build.
BIN_DIR = Path(os.environ.get("PTRAIN_BIN_DIR") or ROOT / "target" / "release").resolve()
PTRAIN = BIN_DIR / "ptrain"
BARE = BIN_DIR / "bare-tch"
PYTHON = Path(os.environ.get("PTRAIN_PYTHON") or ROOT / ".venv" / "bin" / "python")

ALL_PLUGINS = ["tensorboard", "wandb", "flops", "dataset-metrics", "perf", "checkpoint"]
# Language-model data has no dataset ids: dataset-metrics has nothing to group by.
LM_PLUGINS = [p for p in ALL_PLUGINS if p != "dataset-metrics"]
CRATES = ["ptrain", "ptrain-bench-bare"] + [f"ptrain-plugin-{p}" for p in ALL_PLUGINS]

# --------------------------------------------------------------------------
# What is measured

# Step counts: a few seconds of training per run on a 2-core CPU. Not multiples
# of 1000, so that Lightning's step checkpoint and its end-of-training
# checkpoint never fall on the same step (ptrain saves such a step once).
MODELS = {
    "cpu": {
        "mlp": {"title": "MLP 784-256-10, batch 64, Adam (AdamW, no weight decay)", "config": "bench/configs/mlp.toml",
                "steps": 4500, "quick_steps": 300, "every_steps": 450, "quick_every_steps": 60, "plugins": ALL_PLUGINS},
        "gpt": {"title": "tiny GPT (2 layers, 2 heads, width 64, context 32, bytes), batch 16, AdamW",
                "config": "bench/configs/gpt.toml", "steps": 450, "quick_steps": 40, "every_steps": 90,
                "quick_every_steps": 10, "plugins": LM_PLUGINS},
    },
    "cuda": {
        "gpt-small": {"title": "GPT-small (12 layers, 12 heads, width 768, context 1024), batch 16, bf16 autocast, AdamW",
                      "config": "configs/gpu-gpt-small.toml", "steps": 150, "quick_steps": 20, "every_steps": 30,
                      "quick_every_steps": 5, "plugins": LM_PLUGINS},
    },
}

# Default cadences of the plugins, for the table.
CADENCES = {"tensorboard": "scalars 10, histograms 500", "wandb": "10, detailed 50", "flops": "first step + 500",
            "dataset-metrics": "50", "perf": "50", "checkpoint": "1000 + end"}


def contenders(device, plugins):
    """The contenders of one model, in their table order.

    kind: how it is run. ref: the contender its ratio is taken against. ratio:
    "time" (this one's step time / ref's: ptrain's own overheads) or "speedup"
    (ref's steps/s / this one's: how many times faster the ptrain row `ref` is).
    """
    names = ", ".join(f"{p} ({CADENCES.get(p, 'default')})" for p in plugins)
    n = len(plugins)
    rows = [
        dict(id="bare", label="bare tch loop (fused AdamW)", kind="bare", args=["--optimizer", "fused"],
             does="no framework (bench/bare-tch): batches made inline; fused AdamW (ptrain-torch-ext, ptrain's groups); "
                  "clip on the device; loss read every 50 steps; eval at the end. No non-finite guard, no threads",
             ref=None),
        dict(id="bare-guard", label="bare tch loop + non-finite guard", kind="bare",
             args=["--optimizer", "fused", "--nonfinite-guard"],
             does="the bare loop plus ptrain's non-finite guard, written out in it (a device flag per step passed to the "
                  "fused kernel, read every 10 steps): the same work as ptrain's loop, without the framework",
             ref="bare", ratio="time", goal=None, note="context: step time / bare tch loop's (the guard's cost)"),
        dict(id="bare-tch-adamw", label="bare tch loop (tch nn::AdamW)", kind="bare", args=["--optimizer", "tch"],
             does="the typical tch loop: as above with tch's `nn::AdamW` and `backward_step_clip_norm` (per-parameter "
                  "AdamW, decay on every parameter, gradient norm read on the host every step)",
             ref="ptrain", ratio="speedup", goal=None, note="context: ptrain fast mode's steps/s / this one's"),
        dict(id="ptrain", label="ptrain, fast mode", kind="ptrain", plugins=[], sets=[],
             does="`ptrain run`, no plugins: batches made inline on the training thread (the CPU default, as the bare "
                  "loop); fused AdamW; clip on the device; non-finite guard (one device flag per step, read every 10); "
                  "loss read every 50 steps; eval at the end",
             ref="bare", ratio="time", goal=("<=", 1.01), tag="(a)", note="step time / bare tch loop's"),
        dict(id="ptrain-loader", label="ptrain, fast mode, data.num_workers=1", kind="ptrain", plugins=[],
             sets=["data.num_workers=1"],
             does="as above with batches from one background loader thread (what GPU runs use): on a CPU-only box the "
                  "thread competes with libtorch's own threads",
             ref="ptrain", ratio="time", goal=None, note="context: step time / fast mode's"),
        dict(id="plugins-idle", label=f"ptrain + {n} plugins loaded, none due", kind="ptrain", plugins=plugins, sets="idle",
             does="the same plugins loaded, every scheduled attachment moved beyond the run (`every` = 10^9, no "
                  "first/end/eval/checkpoint steps): what a loaded plugin costs when it is not due",
             ref="ptrain", ratio="time", goal=("<=", 1.01), note="step time / fast mode's"),
        dict(id="plugins", label=f"ptrain + {n} plugins, default cadences", kind="ptrain", plugins=plugins, sets=[],
             does=f"fast mode + {names}", ref="ptrain", ratio="time", goal=("<=", 1.03), tag="(b)",
             note="step time / fast mode's"),
        dict(id="plugins-every", label=f"ptrain + {n} plugins, every step", kind="ptrain", plugins=plugins, sets="every",
             does="the same plugins, every scheduled attachment forced to every step (`--set plugins.<name>.<attachment>"
                  ".every=1`), checkpoint saves included; fewer steps per run, as its steps are many times slower",
             ref="plugins", ratio="time", goal=None, tag="(c)", note="step time / default cadences': what the cadences save"),
        dict(id="torch", label="Python PyTorch eager", kind="python", script="bench/torch_eager.py",
             does="bench/torch_eager.py, the same loop in Python: `AdamW(fused=True)`, `clip_grad_norm_(foreach=True)`, "
                  "`.item()` every 50 steps, eval at the end; batches made inline from numpy-generated data of the same "
                  "recipe (other random numbers: losses differ)",
             ref="ptrain", ratio="speedup", tag="(d)", note="ptrain fast mode's steps/s / this one's"),
        dict(id="lightning", label="PyTorch Lightning", kind="python", script="bench/lightning_run.py",
             does="bench/lightning_run.py: `Trainer.fit`, TensorBoardLogger every 10 steps + histograms every 500, "
                  "ModelCheckpoint every 1000 steps + at the end, `gradient_clip_val`, fused AdamW, eval at the end",
             ref="ptrain-tb", ratio="speedup", goal=(">=", 1.5), tag="(e)",
             note="ptrain + tensorboard,checkpoint's steps/s / this one's"),
        dict(id="ptrain-tb", label="ptrain + tensorboard,checkpoint", kind="ptrain", plugins=["tensorboard", "checkpoint"],
             sets=[], does="fast mode + tensorboard (scalars 10, histograms 500) + checkpoint (1000 + end): Lightning's "
                           "work, in ptrain", ref=None),
    ]
    if device == "cuda":
        # A GPT-small checkpoint (model + AdamW state) is about 1.5 GB: one every
        # step is a disk benchmark, not a training one. (c) is on the CPU tables.
        rows = [c for c in rows if c["id"] != "plugins-every"]
        # The flops plugin's MFU: one more ptrain row, with flops and perf only.
        at = next(i for i, c in enumerate(rows) if c["id"] == "ptrain-loader") + 1
        rows.insert(at, dict(id="ptrain-flops", label="ptrain + flops,perf", kind="ptrain", plugins=["flops", "perf"], sets=[],
                            does="fast mode + flops (MFU) and perf at default cadences", ref="ptrain", ratio="time", goal=None,
                            note="step time / fast mode's"))
    return rows


def speed_goal(model):
    """Goal (d): ptrain's steps/s over Python eager's, on the CPU."""
    return {"mlp": (">=", 2.0), "gpt": (">=", 1.2)}.get(model)


# --------------------------------------------------------------------------
# Running one contender


def sh(cmd, **kw):
    return subprocess.run(cmd, cwd=ROOT, text=True, capture_output=True, **kw)


def every_step_sets(plugins, idle=False):
    """`--set` assignments forcing every scheduled attachment of `plugins` to every
    step (or, with `idle`, beyond the run), read from `ptrain plugins info` (so
    plugins finished later are covered)."""
    sets = []
    for name in plugins:
        info = sh([str(PTRAIN), "plugins", "info", name])
        if info.returncode != 0:
            raise SystemExit(f"ptrain plugins info {name} failed:\n{info.stdout}{info.stderr}")
        for line in info.stdout.splitlines()[3:]:
            # "  <attachment> hook <hook> <cadence>"
            parts = line.split()
            if len(parts) < 4 or parts[1] != "hook":
                continue
            cadence = " ".join(parts[3:])
            # Not scheduled: evaluation attachments, and ignored run start/end ones.
            if cadence in ("never", "at every evaluation") or cadence.startswith("ignored"):
                continue
            if not idle:
                sets.append(f"plugins.{name}.{parts[0]}.every=1")
                continue
            key = f"plugins.{name}.{parts[0]}"
            sets += [f"{key}.every=1000000000", f"{key}.every_secs=0"]
            sets += [f"{key}.{flag}=false" for flag in ("first_step", "at_end", "at_eval", "at_checkpoint")]
    return sets


def command(c, config, steps, seed, threads, run_dir, out_json, device):
    """The command line of contender `c`, and where its result lands."""
    common_sets = ["--set", f"run.threads={threads}"]
    if c["kind"] == "ptrain":
        cmd = [str(PTRAIN), "run", "--config", config, "--steps", str(steps), "--seed", str(seed), "--device", device,
               "--run-dir", str(run_dir), "--quiet", *common_sets]
        if c["plugins"]:
            cmd += ["--plugins", ",".join(c["plugins"])]
        for s in c["resolved_sets"]:
            cmd += ["--set", s]
        return cmd, run_dir / "summary.json"
    if c["kind"] == "bare":
        cmd = [str(BARE), "--config", config, "--steps", str(steps), "--seed", str(seed), "--device", device,
               "--out", str(out_json), *c["args"], *common_sets]
        return cmd, out_json
    cmd = [str(PYTHON), c["script"], "--config", config, "--steps", str(steps), "--seed", str(seed), "--device", device,
           "--out", str(out_json), "--run-dir", str(run_dir), "--quiet", *common_sets]
    return cmd, out_json


def run_one(c, model, spec, steps, args, round_name):
    tag = f"{c['id']}-{round_name}"
    run_dir = OUT / "runs" / model / tag
    log = OUT / "logs" / model / f"{tag}.log"
    out_json = OUT / "runs" / model / f"{tag}.json"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    cmd, result_path = command(c, spec["config"], steps, args.seed, args.threads, run_dir, out_json, args.device)
    started, usage = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    elapsed, after = time.perf_counter() - started, resource.getrusage(resource.RUSAGE_CHILDREN)
    # The whole process's CPU time (set-up included): a diagnostic that other load
    # on the machine disturbs less than wall time.
    cpu_s = (after.ru_utime - usage.ru_utime) + (after.ru_stime - usage.ru_stime)
    log.write_text(" ".join(cmd) + "\n\n" + proc.stdout)
    result = None
    if proc.returncode == 0 and result_path.exists():
        result = json.loads(result_path.read_text())
    if not args.keep_runs:
        shutil.rmtree(run_dir, ignore_errors=True)
        out_json.unlink(missing_ok=True)
    if result is None:
        tail = "\n".join(proc.stdout.splitlines()[-5:])
        print(f"    {c['id']}: FAILED (exit {proc.returncode}); see {log.relative_to(ROOT)}\n      {tail}")
        return {"error": f"exit {proc.returncode}", "log": str(log.relative_to(ROOT))}
    sample = {
        "wall_s": result["wall_s"],
        "steps": result["steps"],
        "step_s": result["wall_s"] / max(result["steps"], 1),
        "process_s": elapsed,
        "process_cpu_s": cpu_s,
        "first_loss": result.get("first_loss"),
        "final_loss": result.get("final_loss"),
        "final_eval_loss": result.get("final_eval_loss"),
        "threads": result.get("threads", args.threads),
    }
    if c["kind"] == "ptrain":
        sample["plugin_failures"] = result.get("plugin_failures", [])
        sample["plugins_loaded"] = result.get("plugins_loaded", [])
        flops = (result.get("plugins") or {}).get("flops") or {}
        for key in ("flops_per_step", "peak_tflops", "mfu", "achieved_tflops"):
            if key in flops:
                sample[key] = flops[key]
        if sample["plugin_failures"]:
            print(f"    {c['id']}: plugin failures: {sample['plugin_failures']}")
    print(f"    {c['id']:<16} {sample['step_s'] * 1e3:8.3f} ms/step  ({result['steps'] / result['wall_s']:8.1f} steps/s, "
          f"final loss {sample['final_loss']})")
    return sample


# --------------------------------------------------------------------------
# Statistics


def summarize(samples):
    ok = [s for s in samples if "error" not in s]
    if not ok:
        return {"runs": 0, "failures": len(samples)}
    times = [s["step_s"] for s in ok]
    med = statistics.median(times)
    out = {"runs": len(ok), "failures": len(samples) - len(ok), "median_step_s": med, "steps_per_s": 1.0 / med,
           "min_step_s": min(times), "max_step_s": max(times),
           "median_process_cpu_s": statistics.median(s["process_cpu_s"] for s in ok), "final_loss": ok[-1]["final_loss"],
           "final_eval_loss": ok[-1]["final_eval_loss"], "threads": ok[-1]["threads"]}
    for key in ("flops_per_step", "peak_tflops"):
        if key in ok[-1]:
            out[key] = ok[-1][key]
    return out


def compare(rows, stats, samples, model, device):
    """The ratio of each row against its reference (medians), the median of
    the per-round paired ratios as a check on drift, and the goal."""
    out = {}
    for c in rows:
        ref = c.get("ref")
        if not ref or stats[c["id"]].get("runs", 0) == 0 or stats.get(ref, {}).get("runs", 0) == 0:
            continue
        mine, theirs = stats[c["id"]]["median_step_s"], stats[ref]["median_step_s"]
        paired = [a["step_s"] / b["step_s"] for a, b in zip(samples[c["id"]], samples[ref]) if "error" not in a and "error" not in b]
        if c.get("ratio") == "speedup":
            # How many times faster `ref` is: its steps/s over this one's.
            value = mine / theirs
        else:
            value = mine / theirs
        goal = c.get("goal")
        if c["id"] == "torch" and device == "cpu":
            goal = speed_goal(model)
        met = None
        if goal:
            met = value <= goal[1] if goal[0] == "<=" else value >= goal[1]
        out[c["id"]] = {"ratio": value, "paired_median": statistics.median(paired) if paired else None, "goal": goal,
                        "met": met, "ref": ref, "note": c.get("note"), "tag": c.get("tag")}
    return out


# On CUDA, correct code does not repeat bit for bit: flash-attention's backward and
# index_add (the embedding's gradient) accumulate with atomics in a varying order, so
# two runs of the same binary already differ in the last bits, and training carries
# that forward. There the check is a relative tolerance: the first loss (before any
# update) almost exact, the final ones within 1% (bf16, GPT-small, 150 steps).
CUDA_LOSS_TOLERANCE = {"first_loss": 1e-4, "final_loss": 1e-2, "final_eval_loss": 1e-2}


def losses_agree(pairs, device):
    """(identical bit for bit, within the device's tolerance, largest relative difference)."""
    keys = tuple(CUDA_LOSS_TOLERANCE)
    identical = all(x[k] == y[k] for x, y in pairs for k in keys)
    rel = {k: max(abs(x[k] - y[k]) / max(abs(y[k]), 1e-12) for x, y in pairs) for k in keys}
    within = identical or (device == "cuda" and all(rel[k] <= CUDA_LOSS_TOLERANCE[k] for k in keys))
    return identical, within, max(rel.values())


def loss_checks(samples, rows, device="cpu"):
    """ptrain's math against the bare loop's: the same losses, bit for bit (on the
    CPU), or within CUDA_LOSS_TOLERANCE on CUDA?"""
    checks = {}

    def same(a, b):
        pairs = [(x, y) for x, y in zip(samples.get(a, []), samples.get(b, [])) if "error" not in x and "error" not in y]
        if not pairs:
            return None
        keys = tuple(CUDA_LOSS_TOLERANCE)
        identical, within, max_rel = losses_agree(pairs, device)
        return {"runs": len(pairs), "identical": identical, "within_tolerance": within, "max_rel_diff": max_rel,
                "device": device, "values": {k: (pairs[-1][0][k], pairs[-1][1][k]) for k in keys}}

    ids = {c["id"] for c in rows}
    checks["ptrain_vs_bare"] = same("ptrain", "bare")
    if "bare-guard" in ids:
        checks["bare-guard_vs_bare"] = same("bare-guard", "bare")
    if "ptrain-loader" in ids:
        checks["ptrain-loader_vs_bare"] = same("ptrain-loader", "bare")
    # The every-step row runs fewer steps: its losses are not comparable.
    for other in ("plugins", "plugins-idle", "ptrain-tb", "ptrain-flops"):
        if other in ids:
            checks[f"{other}_vs_ptrain"] = same(other, "ptrain")
    return checks


# --------------------------------------------------------------------------
# The machine and the versions


def machine_info(device):
    cpu = "unknown"
    physical = set()
    try:
        core = {}
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key, value = key.strip(), value.strip()
            if key == "model name":
                cpu = value
            elif key in ("physical id", "core id"):
                core[key] = value
                if len(core) == 2:
                    physical.add((core["physical id"], core["core id"]))
                    core = {}
    except OSError:
        pass
    gpu = "none"
    if shutil.which("nvidia-smi"):
        q = sh(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"])
        if q.returncode == 0 and q.stdout.strip():
            gpu = "; ".join(line.strip() for line in q.stdout.strip().splitlines())
    mem_gb = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_gb = round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return {"cpu": cpu, "logical_cores": os.cpu_count(), "physical_cores": len(physical) or None, "memory_gib": mem_gb,
            "gpu": gpu, "os": platform.platform(), "device": device}


def versions():
    v = {"python": platform.python_version()}
    # From a bundle on a device there is no rustc and no git; Cargo.lock travels in the bundle.
    rustc = sh(["rustc", "--version"]) if shutil.which("rustc") else None
    v["rustc"] = rustc.stdout.strip() if rustc and rustc.returncode == 0 else "unknown"
    lock_file = ROOT / "Cargo.lock"
    lock = lock_file.read_text().split("[[package]]") if lock_file.exists() else []
    for block in lock:
        if 'name = "tch"' in block:
            v["tch"] = block.split('version = "')[1].split('"')[0]
    probe = sh([str(PYTHON), "-c", "import json, torch, platform; d = {'torch': torch.__version__, 'python': platform.python_version(),"
                " 'torch_threads': torch.get_num_threads()}\ntry:\n import lightning; d['lightning'] = lightning.__version__\n"
                "except ImportError: pass\nprint(json.dumps(d))"])
    if probe.returncode == 0:
        v.update(json.loads(probe.stdout))
    ptrain = sh([str(PTRAIN), "--version"])
    v["ptrain"] = ptrain.stdout.strip() if ptrain.returncode == 0 else "unknown"
    if shutil.which("git") and (ROOT / ".git").exists():
        commit = sh(["git", "rev-parse", "--short", "HEAD"])
        dirty = sh(["git", "status", "--porcelain", "--untracked-files=no"])
        v["git"] = commit.stdout.strip() + (" (with uncommitted changes)" if dirty.stdout.strip() else "")
    else:
        v["git"] = (ROOT / "COMMIT").read_text().strip() if (ROOT / "COMMIT").exists() else "unknown"
    return v


# --------------------------------------------------------------------------
# Set-up


def ensure_environment(args):
    if "PTRAIN_TORCH_LIB" not in os.environ:
        raise SystemExit("run the benchmark through bench/run.sh (it sources scripts/env.sh)")
    if not args.no_build:
        print("building: the workspace (scripts/test.sh's build)")
        # scripts/test.sh's build: a package subset would relink the binary the tests run.
        cmd = ["cargo", "build", "--release", "--quiet", "--workspace", "--all-targets"]
        if subprocess.run(cmd, cwd=ROOT).returncode != 0:
            raise SystemExit("cargo build failed")
    for binary in (PTRAIN, BARE):
        if not binary.exists():
            raise SystemExit(f"{binary} is missing: build with cargo build --release -p ptrain -p ptrain-bench-bare")
    wants_lightning = not args.only or "lightning" in args.only.split(",")
    if wants_lightning and sh([str(PYTHON), "-c", "import lightning"]).returncode != 0:
        if args.no_install:
            raise SystemExit("Lightning is not installed: .venv/bin/pip install -r bench/requirements.txt")
        print("installing bench/requirements.txt into .venv")
        if subprocess.run([str(PYTHON), "-m", "pip", "install", "-q", "-r", "bench/requirements.txt"], cwd=ROOT).returncode != 0:
            raise SystemExit("pip install -r bench/requirements.txt failed")
    if args.threads <= 0:
        # libtorch's default, made explicit so that every side runs with it.
        probe = sh([str(PYTHON), "-c", "import torch; print(torch.get_num_threads())"])
        args.threads = int(probe.stdout.strip() or 1)


# --------------------------------------------------------------------------
# BENCHMARKS.md


def fmt_ms(s):
    return f"{s * 1e3:.3f} ms" if s is not None else "–"


def goal_text(goal):
    if not goal:
        return "–"
    return f"{'≤' if goal[0] == '<=' else '≥'} {goal[1]:g}"


def ratio_text(c, r):
    if r is None:
        return "–"
    unit = "×" if c.get("ratio") == "speedup" else ""
    return f"{r['ratio']:.3f}{unit}"


PENDING = "**pending**"


def model_table(model, spec, rows, result, device):
    stats = result["stats"] if result else {}
    comps = result["comparisons"] if result else {}
    lines = [f"### {spec['title']}", ""]
    if result:
        every = any(c["id"] == "plugins-every" for c in rows)
        lines.append(f"{result['steps']} steps per run" + (f" ({result['every_steps']} for the every-step row)" if every else "")
                     + f"; medians of {result['repeats']} alternating runs (spread: fastest–slowest run).")
        lines.append("")
    mfu = device == "cuda"
    head = "| | contender | what it does | median step time | spread | steps/s |" + (" MFU |" if mfu else "") + \
           " ratio | compared with | goal | met? |"
    lines += [head, "|" + "---|" * (head.count("|") - 1)]
    for c in rows:
        s = stats.get(c["id"], {})
        r = comps.get(c["id"])
        tag = c.get("tag", "")
        if not result:
            time_cells = f"{PENDING} | {PENDING} | {PENDING} |"
            mfu_cell = f" {PENDING} |" if mfu else ""
            ratio_cell = PENDING if c.get("ref") else "–"
            met = PENDING if c.get("goal") or (c["id"] == "torch" and device == "cpu") else "–"
        elif not s.get("runs"):
            time_cells = ("failed" if c["id"] in stats else "not run") + " | – | – |"
            mfu_cell = " – |" if mfu else ""
            ratio_cell, met = "–", "–"
        else:
            spread = f"{s['min_step_s'] * 1e3:.3f}–{s['max_step_s'] * 1e3:.3f} ms"
            time_cells = f"{fmt_ms(s['median_step_s'])} | {spread} | {s['steps_per_s']:.1f} |"
            mfu_cell = ""
            if mfu:
                ref = stats.get("ptrain-flops", {})
                if ref.get("flops_per_step") and ref.get("peak_tflops"):
                    mfu_cell = f" {ref['flops_per_step'] * s['steps_per_s'] / (ref['peak_tflops'] * 1e12):.1%} |"
                else:
                    mfu_cell = " – |"
            ratio_cell = ratio_text(c, r)
            met = "–" if not r or r["met"] is None else ("yes" if r["met"] else "**no**")
        goal = r["goal"] if r else (c.get("goal") or (speed_goal(model) if c["id"] == "torch" and device == "cpu" else None))
        note = c.get("note") or ("reference" if not c.get("ref") else "")
        lines.append(f"| {tag} | {c['label']} | {c['does']} | {time_cells}{mfu_cell} {ratio_cell} | {note} | "
                     f"{goal_text(goal)} | {met} |")
    lines.append("")
    if result:
        checks = result["loss_checks"]
        chk = checks.get("ptrain_vs_bare")
        if chk:
            first, last, ev = (chk["values"][k] for k in ("first_loss", "final_loss", "final_eval_loss"))
            verdict = "**identical, bit for bit**" if chk["identical"] else (
                f"**equal within CUDA's non-determinism** (largest relative difference {chk.get('max_rel_diff', 0):.2e}; "
                f"tolerances {CUDA_LOSS_TOLERANCE})" if chk.get("within_tolerance") else "**different**")
            lines.append(f"Losses, ptrain fast mode vs the bare loop (fused AdamW), over {chk['runs']} paired runs: {verdict} "
                         f"(first {first[0]!r} vs {first[1]!r}, final {last[0]!r} vs {last[1]!r}, "
                         f"final eval {ev[0]!r} vs {ev[1]!r}).")
        for key, chk in checks.items():
            if key != "ptrain_vs_bare" and chk:
                who, _, ref = key.partition("_vs_")
                label = next((c["label"] for c in rows if c["id"] == who), who)
                against = "the bare loop" if ref == "bare" else "fast mode"
                verdict = "identical" if chk["identical"] else (
                    "equal within CUDA's non-determinism" if chk.get("within_tolerance") else "**different**")
                lines.append(f"Losses, {label} vs {against}: {verdict} ({chk['runs']} runs).")
        for cid in ("bare-tch-adamw", "torch", "lightning"):
            s = stats.get(cid, {})
            if s.get("runs"):
                label = next(c["label"] for c in rows if c["id"] == cid)
                lines.append(f"{label}: final loss {s['final_loss']:.4f}, final eval loss {s['final_eval_loss']:.4f} "
                             f"(different random numbers or optimizer: close to ptrain's, not equal).")
        lines.append("")
    else:
        lines.append(f"Losses, ptrain fast mode vs the bare loop: {PENDING} (the harness checks they are identical, bit for bit).")
        lines.append("")
    return lines


def write_markdown(results, path, device_results=None):
    """BENCHMARKS.md from the results (None: the structure, with placeholders)."""
    cpu = results if results and results.get("device") == "cpu" else None
    gpu = device_results
    lines = ["# Benchmarks", "",
             "ptrain side by side with a bare tch loop, Python PyTorch (eager) and PyTorch Lightning, made by one command "
             "(`bench/run.sh`, see bench/README.md). Every contender trains the same model with the same sizes, batch, seed "
             "and step count, as a separate process; contenders alternate (each round runs each once, in a rotated order) "
             "and the tables give medians. A contender's step time is its training loop's wall time / steps, measured "
             "the same way everywhere: from just before the first step (after start-up, data generation, model and "
             "optimizer construction) to the end of the final evaluation, including loggers' and checkpoints' "
             "end-of-run flush (ptrain's `summary.json` `wall_s`).", "",
             "Ratios: *step time / reference's* for ptrain's own overheads (lower is better); *×* for how many times "
             "faster ptrain is (steps/s over steps/s, higher is better). Goals from the issue: (a) fast mode within 1% of "
             "the bare loop; (b) the six plugins at default cadences within 3% of fast mode; (d) at least 2× Python eager "
             "on the MLP and 1.2× on the tiny GPT, on the CPU; (e) at least 1.5× Lightning with TensorBoard and "
             "checkpoints. (c) shows what the cadences save: no goal. Wall-clock ratios within a few percent of 1 are "
             "at the edge of this VM's noise; for (a) and (b), the instruction counts per step under callgrind "
             "(*Instructions per step*, near the end, by `bench/instructions.sh`) are the finer measure.", ""]
    if not cpu:
        lines += ["> **Placeholders.** The figures below are pending: they come from `bench/run.sh --write` on a quiet "
                  "machine. Figures taken while other work loads the CPU are not comparable.", ""]
    lines += ["## CPU", ""]
    if cpu:
        m, v = cpu["machine"], cpu["versions"]
        physical = f" ({m['physical_cores']} physical)" if m.get("physical_cores") else ""
        lines += [f"Machine: {m['cpu']}, {m['logical_cores']} logical cores{physical}, {m['memory_gib']} GiB memory; "
                  f"GPU: {m['gpu']}; {m['os']}.",
                  f"libtorch intra-op threads: {cpu['threads']} on every side (ptrain `run.threads`, bare-tch the same key, "
                  f"Python `torch.set_num_threads`).",
                  f"Versions: {v.get('rustc')}, tch {v.get('tch')}, torch {v.get('torch')}, Lightning {v.get('lightning')}, "
                  f"Python {v.get('python')}, {v.get('ptrain')}, git {v.get('git')}.",
                  f"Made by: `{cpu['command']}` on {cpu['date']}" + (" — **--quick: a smoke test, not a measurement**" if cpu["quick"] else "") + ".",
                  ""]
    else:
        lines += [f"Machine: {PENDING} (CPU model from /proc/cpuinfo, cores, memory; GPU: none).",
                  f"Versions: {PENDING} (rustc, tch 0.24.0, torch 2.11.0, Lightning 2.6.6, Python 3.11).",
                  f"Made by: `bench/run.sh --write` — {PENDING}.", ""]
    for model, spec in MODELS["cpu"].items():
        rows = contenders("cpu", spec["plugins"])
        lines += model_table(model, spec, rows, cpu["models"].get(model) if cpu else None, "cpu")
    lines += ["## GPU", ""]
    # Figures from a lent GPU (gpu/lent.sh), kept by hand: a CPU-only --write keeps them.
    gpu_notes = BENCH / "gpu-measurements.md"
    if gpu_notes.exists() and not gpu:
        lines += [gpu_notes.read_text().rstrip(), ""]
    elif gpu:
        m, v = gpu["machine"], gpu["versions"]
        lines += [f"Machine: {m['gpu']}; host {m['cpu']}, {m['logical_cores']} logical cores. Versions as above; "
                  f"made by `{gpu['command']}` on {gpu['date']}.", ""]
        for model, spec in MODELS["cuda"].items():
            lines += model_table(model, spec, contenders("cuda", spec["plugins"]), gpu["models"].get(model), "cuda")
    else:
        lines += ["**Not measured**: no GPU was available. `bench/run.sh --device cuda --write` fills this table "
                  "(GPT-small from configs/gpu-gpt-small.toml, bf16 autocast, MFU from the flops plugin's FLOP count "
                  "and peak).", ""]
        for model, spec in MODELS["cuda"].items():
            lines += model_table(model, spec, contenders("cuda", spec["plugins"]), None, "cuda")
    lines += ["## What differs between the sides", "",
              "- **Data.** ptrain and the bare loops draw the same batches (ptrain_core's synthetic datasets, keyed by "
              "step), both inline on the training thread (ptrain's CPU default; the *num_workers=1* row uses a loader "
              "thread). The Python contenders generate data of "
              "the same shapes and recipe with numpy/torch (other random numbers), inline; their losses are close to "
              "ptrain's but not equal.",
              "- **Optimizer.** Fused AdamW everywhere (libtorch's `_fused_adamw_`, torch's `AdamW(fused=True)`), with "
              "weight decay on matrices and embeddings only, except the *tch nn::AdamW* row (libtorch's per-parameter "
              "C++ AdamW, decay on every parameter), shown for context. On the MLP the decay is 0 (Adam).",
              "- **Guard.** Only ptrain checks for non-finite losses (an on-device flag per step that skips the update, "
              "read every 10 steps); its cost is inside ratio (a). The *bare tch loop + non-finite guard* row writes the "
              "same guard out in the bare loop, to show what it costs apart from the rest of the framework.",
              "- **Logging and checkpoints.** In (e) both sides log scalars every 10 steps and histograms every 500 and "
              "save model + optimizer every 1000 steps and at the end; Lightning also records the learning rate "
              "through LearningRateMonitor, ptrain the learning rate, throughput and epoch.",
              "- **Progress.** ptrain (`--quiet`) still writes a log line every 50 steps; the bare loop and the eager "
              "script read the loss at that cadence; Lightning reads it for its logger every 10 steps.", ""]
    # Figures from other commands (micro-benchmarks, distributed), kept by hand.
    other = ROOT / "bench" / "other-measurements.md"
    if other.exists():
        lines += [other.read_text().rstrip(), ""]
    Path(path).write_text("\n".join(lines))


# --------------------------------------------------------------------------


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="few steps and 2 repeats: a smoke test of the harness")
    p.add_argument("--repeats", type=int, help="measured runs per contender (default 7, quick 2)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="cpu: MLP and tiny GPT; cuda: GPT-small in bf16")
    p.add_argument("--models", help="comma-separated subset (mlp,gpt / gpt-small)")
    p.add_argument("--only", help="comma-separated subset of contenders (ids: bare, bare-guard, bare-tch-adamw, ptrain, ptrain-loader, plugins-idle, plugins, "
                                  "plugins-every, torch, lightning, ptrain-tb, ptrain-flops)")
    p.add_argument("--steps", type=int, help="override the step count of every model")
    p.add_argument("--threads", type=int, default=0, help="libtorch intra-op threads on every side (0: libtorch's default)")
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--no-warmup", action="store_true", help="skip the untimed warm-up run of each contender")
    p.add_argument("--write", action="store_true", help="regenerate BENCHMARKS.md from this run")
    p.add_argument("--template", action="store_true", help="write BENCHMARKS.md with placeholders; run nothing")
    p.add_argument("--render", action="store_true",
                   help="rewrite BENCHMARKS.md from the saved bench/out/results*.json (and bench/other-measurements.md); run nothing")
    p.add_argument("--no-build", action="store_true", help="do not run cargo build first")
    p.add_argument("--no-install", action="store_true", help="do not pip install bench/requirements.txt when Lightning is missing")
    p.add_argument("--keep-runs", action="store_true", help="keep run directories (checkpoints, event files) under bench/out/runs")
    args = p.parse_args()

    if args.template:
        write_markdown(None, ROOT / "BENCHMARKS.md")
        print("wrote BENCHMARKS.md (placeholders)")
        return
    if args.render:
        write_markdown(_load(OUT / "results.json"), ROOT / "BENCHMARKS.md", _load(OUT / "results-cuda.json"))
        print("wrote BENCHMARKS.md from the saved results")
        return

    ensure_environment(args)
    repeats = args.repeats or (2 if args.quick else 7)
    models = MODELS[args.device]
    if args.models:
        models = {k: v for k, v in models.items() if k in args.models.split(",")}
    OUT.mkdir(parents=True, exist_ok=True)
    results = {"device": args.device, "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
               "command": "bench/run.sh " + " ".join(sys.argv[1:]), "quick": args.quick, "repeats": repeats,
               "threads": args.threads, "machine": machine_info(args.device), "versions": versions(), "models": {}}
    print(f"threads {args.threads}, {repeats} repeats; {results['machine']['cpu']}, {results['machine']['logical_cores']} cores")

    for model, spec in models.items():
        steps = args.steps or (spec["quick_steps"] if args.quick else spec["steps"])
        # (c) forces every plugin attachment, checkpoint saves included, to every
        # step: its steps are tens of times slower, so it runs fewer of them.
        every_steps = min(steps, spec["quick_every_steps"] if args.quick else spec["every_steps"])
        steps_of = lambda c: every_steps if c["id"] == "plugins-every" else steps  # noqa: E731
        rows = contenders(args.device, spec["plugins"])
        if args.only:
            wanted = set(args.only.split(","))
            rows = [c for c in rows if c["id"] in wanted]
        for c in rows:
            sets = c.get("sets", [])
            c["resolved_sets"] = every_step_sets(c["plugins"], idle=sets == "idle") if sets in ("every", "idle") else sets
        print(f"\n== {model}: {spec['title']}; {steps} steps")
        if not args.no_warmup:
            print("  warm-up (not timed)")
            for c in rows:
                run_one(c, model, spec, min(steps_of(c), 20), args, "warmup")
        samples = {c["id"]: [] for c in rows}
        for r in range(repeats):
            order = rows[r % len(rows):] + rows[:r % len(rows)]
            print(f"  round {r + 1}/{repeats}")
            for c in order:
                samples[c["id"]].append(run_one(c, model, spec, steps_of(c), args, f"r{r + 1}"))
        stats = {cid: summarize(s) for cid, s in samples.items()}
        comps = compare(rows, stats, samples, model, args.device)
        results["models"][model] = {"title": spec["title"], "config": spec["config"], "steps": steps,
                                    "every_steps": every_steps, "repeats": repeats,
                                    "contenders": {c["id"]: {"label": c["label"], "does": c["does"]} for c in rows},
                                    "every_step_sets": next((c["resolved_sets"] for c in rows if c["id"] == "plugins-every"), []),
                                    "stats": stats, "comparisons": comps, "loss_checks": loss_checks(samples, rows, args.device),
                                    "samples": samples}
        print(f"  medians ({model}):")
        for c in rows:
            s, r = stats[c["id"]], comps.get(c["id"])
            if not s.get("runs"):
                print(f"    {c['label']:<44} failed")
                continue
            extra = ""
            if r:
                met = "" if r["met"] is None else ("  goal met" if r["met"] else "  GOAL NOT MET")
                extra = f"  ratio {r['ratio']:.3f} ({r['note']}; paired {r['paired_median']:.3f}) {goal_text(r['goal'])}{met}"
            print(f"    {c['label']:<44} {s['median_step_s'] * 1e3:8.3f} ms/step {s['steps_per_s']:8.1f} steps/s{extra}")
        chk = results["models"][model]["loss_checks"].get("ptrain_vs_bare")
        if chk:
            print(f"  ptrain vs bare losses identical: {chk['identical']}, within tolerance: {chk['within_tolerance']} "
                  f"(largest relative difference {chk['max_rel_diff']:.2e}, {chk['runs']} runs)")

    out = OUT / ("results.json" if args.device == "cpu" else "results-cuda.json")
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nwrote {out.relative_to(ROOT)}")
    if args.write:
        cpu = results if args.device == "cpu" else _load(OUT / "results.json")
        gpu = results if args.device == "cuda" else _load(OUT / "results-cuda.json")
        write_markdown(cpu, ROOT / "BENCHMARKS.md", gpu)
        print("wrote BENCHMARKS.md")


def _load(path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


if __name__ == "__main__":
    main()
