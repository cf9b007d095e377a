#!/usr/bin/env bash
# GRPO on the CPU: ptrain against TRL's GRPOTrainer training on the same scored rollouts (TRL's served
# by rollout_func: the learning side of a step, no generation on either side), the same random Qwen2
# (LAYERS x WIDTH, a 300-token BPE vocabulary), the same batch of BATCH completions in groups of G,
# dapo, beta = 0 (and beta = 0.04: a reference forward per step), fp32, THREADS threads each, ptrain as
# rows and with `data.packing` (each group one sequence): steps/s (the first step left out) and peak
# RSS. Prints a Markdown table for BENCHMARKS.md.
#
#   bench/grpo.sh                         # 4 layers x 512, prompts 64, completions < 128, batch 16 (2 groups of 8), 10 steps
#   bench/grpo.sh --tiny                  # a dry run: 1 layer x 64, 3 steps
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
. scripts/env.sh

layers=4 width=512 prompt=64 completion=128 batch=16 g=8 steps=10 threads=1
while [ $# -gt 0 ]; do
  case "$1" in
    --layers) layers="$2"; shift 2 ;;
    --width) width="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --tiny) layers=1 width=64 prompt=16 completion=16 steps=3; shift ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
py="$root/.venv/bin/python"
out="$root/bench/out/grpo"
d="$out/$layers-$width-$prompt-$completion"
mkdir -p "$d"
groups=$(( batch / g * (steps + 1) ))
[ -f "$d/rollouts.jsonl" ] || "$py" bench/grpo.py make "$d" "$layers" "$width" "$prompt" "$completion" "$groups" "$g" >&2
ptrain="$root/target/release/ptrain"

echo "Qwen2 $layers layers x $width wide; prompts $prompt tokens, completions < $completion; batch $batch completions ($g per group); $steps steps timed (after 1); $threads threads; fp32; dapo."
echo
echo "| beta | side | steps/s | peak RSS MiB |"
echo "| --- | --- | --- | --- |"
for beta in 0.0 0.04; do
  # A row per completion (as TRL), then each group one sequence (`data.packing`: its prompt once).
  for packing in false true; do
    rm -rf "$out/run"
    "$ptrain" run --quiet --device cpu --steps $((steps + 1)) --run-dir "$out/run" --set "run.threads=$threads" \
      --set model.kind=llama --set "model.init_from=$d/model" --set data.kind=rollouts --set "data.path=$d/rollouts.jsonl" \
      --set "data.batch_size=$batch" --set "grpo.num_generations=$g" --set "grpo.beta=$beta" --set optim.lr=1e-6 \
      --set optim.schedule=constant --set optim.warmup_steps=0 --set "data.packing=$packing" >&2
    side=ptrain; [ $packing = true ] && side="ptrain, data.packing"
    "$py" -c "import json; s=json.load(open('$out/run/summary.json')); print('| $beta | $side | %.3f | %.0f |' % (s['steps_per_s'], s['peak_memory_bytes']/2**20))"
  done
  theirs=$(TRL_EXPERIMENTAL_SILENCE=1 "$py" bench/grpo.py trl "$d" "$steps" "$batch" "$g" "$threads" "$beta" 2>/dev/null | tail -n 1)
  "$py" -c "import json; t=json.loads('$theirs'); print('| $beta | TRL GRPOTrainer | %.3f | %.0f |' % (t['steps_per_s'], t['peak_rss_mib']))"
done
