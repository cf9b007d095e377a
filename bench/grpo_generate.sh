#!/usr/bin/env bash
# GRPO with generation: ptrain (`data.kind = "prompts"`, its key/value-cache sampler) against TRL's
# GRPOTrainer (transformers' `generate`), each sampling G completions of at most COMPLETION tokens
# for each text prompt of about PROMPT tokens, scored by TRL's quickstart length reward (ptrain's
# `kind = "length"`), then learning on them: the same random Qwen2 (LAYERS x WIDTH, a 300-token BPE
# vocabulary, so completions rarely end before COMPLETION), batches of BATCH completions, dapo, beta = 0,
# temperature 1; on the CPU in fp32 with THREADS threads each, on CUDA under bf16 autocast on both
# sides; ptrain once with a row per completion and once with `data.packing = true` (each group one
# sequence). Prints a Markdown table for BENCHMARKS.md: steps/s (the first step left out on both
# sides), the share of the timed steps spent sampling, peak memory (RSS on the CPU; on CUDA the
# device's peak allocation).
#
#   bench/grpo_generate.sh              # 4 layers x 512, prompts ~32 tokens, completions <= 64, batch 16 (2 groups of 8), 5 steps
#   bench/grpo_generate.sh --tiny       # a dry run: 1 layer x 64, completions <= 8, 2 steps
#   bench/grpo_generate.sh --device cuda --layers 24 --width 1024 --prompt 64 --completion 256 --batch 64
#
# From the GPU bundle (gpu/lent.sh's grpo step) PTRAIN_BIN_DIR names the binaries and PTRAIN_PYTHON
# the interpreter; otherwise this checkout's release build and .venv.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
[ -n "${PTRAIN_BIN_DIR:-}" ] || . scripts/env.sh

layers=4 width=512 prompt=32 completion=64 batch=16 g=8 steps=5 threads=1 target=20 device=cpu
while [ $# -gt 0 ]; do
  case "$1" in
    --layers) layers="$2"; shift 2 ;;
    --width) width="$2"; shift 2 ;;
    --prompt) prompt="$2"; shift 2 ;;
    --completion) completion="$2"; shift 2 ;;
    --batch) batch="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --device) device="$2"; shift 2 ;;
    --tiny) layers=1 width=64 prompt=8 completion=8 steps=2; shift ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
py="${PTRAIN_PYTHON:-$root/.venv/bin/python}"
bin="${PTRAIN_BIN_DIR:-$root/target/release}"
precision=fp32; [ "$device" = cpu ] || precision=bf16
out="$root/bench/out/grpo-generate"
d="$out/$layers-$width-$prompt"
mkdir -p "$d"
rows=$(( batch / g * (steps + 1) ))
[ -f "$d/prompts.jsonl" ] || "$py" bench/grpo.py make-prompts "$d" "$layers" "$width" "$prompt" "$rows" >&2
cat > "$out/grpo.toml" <<TOML
[run]
threads = $threads
log_every = 1
[train]
precision = "$precision"
[model]
kind = "llama"
init_from = "$d/model"
[data]
kind = "prompts"
path = "$d/prompts.jsonl"
batch_size = $batch
max_seq_len = $(( prompt * 3 + completion + 16 ))
[grpo]
num_generations = $g
max_completion_length = $completion
temperature = 1.0
beta = 0.0
[[grpo.rewards]]
name = "length"
kind = "length"
target = $target
[optim]
lr = 1e-6
schedule = "constant"
warmup_steps = 0
TOML

echo "Qwen2 $layers layers x $width wide; text prompts of ~$prompt tokens, completions <= $completion tokens; batch $batch completions ($g per group); $steps steps timed (after 1); $threads threads; $device, $precision; dapo, beta 0, temperature 1."
echo
echo "| side | steps/s | sampling share | peak memory MiB |"
echo "| --- | --- | --- | --- |"
# ptrain twice: each completion its own row (as TRL), then each group one sequence
# (`data.packing = true`: the prompt run once per group in the learning step).
for packing in false true; do
  rm -rf "$out/run"
  "$bin/ptrain" run --quiet --device "$device" --config "$out/grpo.toml" --steps $((steps + 1)) --run-dir "$out/run" \
    --plugins jsonl --set plugins.jsonl.every=1 --set data.packing=$packing >&2
  # Steps 2.. from the per-step rows: their step times and the rollout stage's share of them.
  "$py" - "$out/run" "$packing" <<'PY'
import json, sys
run, packing = sys.argv[1], sys.argv[2] == "true"
rows = [r for r in map(json.loads, open(f"{run}/metrics.jsonl")) if r["step"] >= 2 and "time/step_s" in r]
step_s = sum(r["time/step_s"] for r in rows)
sampling_s = sum(r["train/timing/sampling_s"] for r in rows)
peak = json.load(open(f"{run}/summary.json"))["peak_memory_bytes"] / 2**20
name = "ptrain, data.packing" if packing else "ptrain"
print("| %s | %.3f | %.2f | %.0f |" % (name, len(rows) / step_s, sampling_s / step_s, peak))
PY
done
theirs=$(TRL_EXPERIMENTAL_SILENCE=1 "$py" bench/grpo.py trl-generate "$d" "$steps" "$batch" "$g" "$threads" "$completion" "$target" "$device" 2>/dev/null | tail -n 1)
"$py" -c "import json; t=json.loads('$theirs'); print('| TRL GRPOTrainer | %.3f | %.2f | %.0f |' % (t['steps_per_s'], t['sampling_share'], t['peak_rss_mib']))"
