#!/usr/bin/env bash
# train.loss_chunk on the CPU: peak memory and steps/s of a Qwen2-0.5B-shaped head (vocabulary
# 151,936, width 896; 2 decoder layers, 14 heads, 2 KV heads) on BATCH x 1024 positions, with the
# whole logits (loss_chunk = 0) and a chunk at a time. Prints a Markdown table for BENCHMARKS.md.
# Run it on a quiet machine: a step of 8 x 1024 positions is a few TFLOP on 2 cores.
#
#   bench/loss_chunk.sh                   # batch 8, 2 steps, chunks of 0 (off) and 1024
#   bench/loss_chunk.sh --batch 2 --steps 2 --chunks "0 512 2048"
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
. scripts/env.sh

batch=8 steps=2 chunks="0 1024" threads=$(nproc)
while [ $# -gt 0 ]; do
  case "$1" in
    --batch) batch="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --chunks) chunks="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
py="$root/.venv/bin/python"
out="$root/bench/out/loss_chunk"
mkdir -p "$out"
ptrain="$root/target/release/ptrain"
rows=()
for chunk in $chunks; do
  rm -rf "$out/run-$chunk"
  "$ptrain" run --quiet --device cpu --steps "$steps" --run-dir "$out/run-$chunk" --set "run.threads=$threads" \
    --set model.kind=llama --set model.vocab_size=151936 --set model.n_embd=896 --set model.n_head=14 --set model.llama.n_kv_head=2 \
    --set model.llama.intermediate_size=4864 --set model.n_layer=2 --set model.block_size=1024 --set model.llama.tie_embeddings=true \
    --set data.kind=synthetic --set "data.batch_size=$batch" --set train.eval_every=0 --set train.eval_batches=1 \
    --set "train.loss_chunk=$chunk" >&2
  rows+=("$("$py" -c "
import json; s=json.load(open('$out/run-$chunk/summary.json'))
print('| %s | %.0f | %.3f | %.4f |' % ('$chunk' if '$chunk' != '0' else '0 (whole logits)', s['peak_memory_bytes']/2**20, s['steps_per_s'], s['final_loss']))")")
done
echo "Batch $batch x 1024 positions, vocabulary 151,936, width 896, $steps steps, $threads threads ($(nproc) cores)."
echo
echo "| train.loss_chunk | peak memory MiB | steps/s | last loss |"
echo "| --- | --- | --- | --- |"
printf '%s\n' "${rows[@]}"
