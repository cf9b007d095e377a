#!/usr/bin/env bash
# train.activation_checkpointing on the CPU: peak memory and steps/s of a 12-layer GPT-2
# (bytes, width 384, 6 heads) on BATCH x 1024 positions with none / full / every_n, and
# transformers' GPT2LMHeadModel of the same weights and batch without and with
# gradient_checkpointing_enable(). Prints a Markdown table for BENCHMARKS.md.
# Run it on a quiet machine; the figures of a loaded one mean nothing.
#
#   bench/activation_checkpointing.sh                     # 12 layers, context 1024, batch 4, 3 steps
#   bench/activation_checkpointing.sh --layers 2 --context 64 --width 32 --heads 2 --batch 2 --steps 2  # a dry run
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
. scripts/env.sh

layers=12 context=1024 width=384 heads=6 batch=4 steps=3 every=2 threads=$(nproc)
while [ $# -gt 0 ]; do
  case "$1" in
    --layers) layers="$2"; shift 2 ;;
    --context) context="$2"; shift 2 ;;
    --width) width="$2"; shift 2 ;;
    --heads) heads="$2"; shift 2 ;;
    --batch) batch="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --every) every="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
py="$root/.venv/bin/python"
out="$root/bench/out/activation_checkpointing"
mkdir -p "$out"
ptrain="$root/target/release/ptrain"
model="$out/model-$layers-$width-$context"
[ -e "$model/config.json" ] || "$py" bench/activation_checkpointing.py make "$model" "$layers" "$width" "$heads" "$context"
rows=()
for mode in none full every_n; do
  rm -rf "$out/run-$mode"
  "$ptrain" run --quiet --device cpu --steps "$steps" --run-dir "$out/run-$mode" --set "run.threads=$threads" \
    --set model.kind=gpt --set "model.init_from=$model" --set model.dropout=0.0 --set data.kind=synthetic \
    --set "data.batch_size=$batch" --set "data.max_seq_len=$context" --set train.eval_every=0 --set train.eval_batches=1 \
    --set "train.activation_checkpointing=$mode" --set "train.activation_checkpointing_every=$every" >&2
  label="$mode"; [ "$mode" = every_n ] && label="every_n ($every)"
  rows+=("$("$py" -c "
import json; s=json.load(open('$out/run-$mode/summary.json'))
print('| ptrain, %s | %.0f | %.3f | %.4f |' % ('$label', s['peak_memory_bytes']/2**20, s['steps_per_s'], s['final_loss']))")")
done
for ckpt in 0 1; do
  label="transformers"; [ "$ckpt" = 1 ] && label="transformers, gradient_checkpointing_enable()"
  rows+=("$("$py" bench/activation_checkpointing.py train "$model" "$batch" "$steps" "$threads" "$ckpt" | "$py" -c "
import json, sys; s=json.loads(sys.stdin.read())
print('| %s | %.0f | %.3f | %.4f |' % ('$label', s['peak_rss_mb'], s['steps_per_s'], s['final_loss']))")")
done
echo "GPT-2 shape: $layers layers, width $width, $heads heads, vocabulary 256; batch $batch x $context positions, $steps steps, $threads threads ($(nproc) cores)."
echo "Peak memory is the process's peak RSS (ptrain: summary.json peak_memory_bytes); transformers' steps/s leave out the first step."
echo
echo "| run | peak memory MiB | steps/s | last loss |"
echo "| --- | --- | --- | --- |"
printf '%s\n' "${rows[@]}"
