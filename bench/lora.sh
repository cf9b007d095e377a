#!/usr/bin/env bash
# LoRA on the CPU: ptrain's [lora] against peft's get_peft_model on the same model (a random Qwen2 of
# Qwen2-0.5B's width: 896 wide, intermediate 4864, 14 heads, 2 KV heads, vocabulary 151,936, tied;
# LAYERS decoder layers) and the same batch shape (BATCH x SEQ ids below 256), rank 8 on every
# projection, AdamW on the adapters, fp32: peak RSS, steps/s and trainable parameters. The issue 24
# table's LoRA row. Prints a Markdown table for BENCHMARKS.md. Run it on a quiet machine.
#
#   bench/lora.sh                              # 4 layers, batch 4 x 512, 5 steps, all cores
#   bench/lora.sh --layers 24 --batch 8 --seq 1024 --steps 3
#   bench/lora.sh --tiny                       # a dry run: 1 layer 64 wide, vocabulary 1000, 2 x 32
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
. scripts/env.sh

layers=4 width=896 inter=4864 vocab=151936 heads=14 kv=2 batch=4 seq=512 steps=5 rank=8 alpha=16 threads=$(nproc) build=1
while [ $# -gt 0 ]; do
  case "$1" in
    --layers) layers="$2"; shift 2 ;;
    --batch) batch="$2"; shift 2 ;;
    --seq) seq="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --rank) rank="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --tiny) layers=1 width=64 inter=96 vocab=1000 heads=4 kv=2 batch=2 seq=32 steps=2; shift ;;
    --no-build) build=0; shift ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
py="$root/.venv/bin/python"
out="$root/bench/out/lora"
model="$out/model-$layers-$width-$vocab"
mkdir -p "$out"
[ "$build" = 1 ] && cargo build --release --workspace --all-targets >&2
ptrain="$root/target/release/ptrain"
[ -f "$model/config.json" ] || "$py" bench/lora.py make "$model" "$layers" "$width" "$inter" "$vocab" "$heads" "$kv" >&2

rm -rf "$out/run"
"$ptrain" run --quiet --device cpu --steps "$steps" --run-dir "$out/run" --set "run.threads=$threads" --set "model.init_from=$model" \
  --set data.kind=synthetic --set "data.batch_size=$batch" --set "data.max_seq_len=$seq" --set train.eval_every=0 --set train.eval_batches=1 \
  --set optim.lr=1e-4 --set optim.weight_decay=0 --set optim.warmup_steps=0 --set optim.schedule=constant \
  --set "lora.rank=$rank" --set "lora.alpha=$alpha" >&2
read -r o_sps o_mem o_loss o_params <<<"$("$py" -c "import json; s=json.load(open('$out/run/summary.json')); print(s['steps_per_s'], s['peak_memory_bytes']/2**20, s['final_loss'], s['trainable_parameters'])")"
theirs=$("$py" bench/lora.py peft "$model" "$steps" "$batch" "$seq" "$threads" "$rank" "$alpha" 2>/dev/null | tail -n 1)
json() { echo "$theirs" | "$py" -c "import json,sys; d=json.loads(sys.stdin.read()); print($1)"; }

echo "Qwen2 $layers layers x $width wide, vocabulary $vocab; batch $batch x $seq; rank $rank, alpha $alpha; $steps steps, $threads threads ($(nproc) cores)."
echo
echo "| LoRA | peak RSS MiB | steps/s | trainable parameters | last loss |"
echo "| --- | --- | --- | --- | --- |"
printf '| ptrain [lora] | %.0f | %.3f | %s | %.4f |\n' "$o_mem" "$o_sps" "$o_params" "$o_loss"
printf '| peft get_peft_model | %.0f | %.3f | %s | %.4f |\n' "$(json 'd["peak_rss_mb"]')" "$(json 'd["steps_per_s"]')" "$(json 'd["trainable"]')" "$(json 'd["last_loss"]')"
