#!/usr/bin/env bash
# Instruction tuning on the CPU: a small Qwen2 (4 layers, width 256, GQA 8:2, vocabulary 4,000) on
# 2,000 chat rows of mixed lengths, trained on the assistant turns by ptrain and by TRL's SFTTrainer,
# each padded and packed, on the same cores: steps/s, trained tokens/s, the last loss and peak memory.
# Both start from the same weights (made by transformers) and read the same rows; the trained tokens
# are the same rule (checked in tests/chat.rs). Prints a Markdown table for BENCHMARKS.md. Run it on
# a quiet machine.
#
#   bench/chat.sh                         # 20 steps, padded batch 8, packed batch 4 x 512, all cores
#   bench/chat.sh --steps 40 --threads 2
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
. scripts/env.sh

steps=20 threads=$(nproc) build=1
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) steps="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --no-build) build=0; shift ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
py="$root/.venv/bin/python"
out="$root/bench/out/chat"
mkdir -p "$out"
[ "$build" = 1 ] && cargo build --release --workspace --all-targets >&2
ptrain="$root/target/release/ptrain"
model="$out/model"
[ -f "$model/config.json" ] || "$py" bench/chat.py make "$model" 2000 >&2
common=(--device cpu --set "run.threads=$threads" --set "model.init_from=$model" --set data.kind=chat --set "data.path=$model/chat.jsonl"
  --set "data.tokens_cache=$out/cache" --set data.max_seq_len=512 --set optim.lr=1e-4 --set optim.min_lr=0 --set optim.warmup_steps=0
  --set optim.schedule=constant --set optim.weight_decay=0 --set optim.grad_clip=1.0 --set train.eval_every=0 --set train.eval_batches=1
  --set data.val_fraction=0.01)
"$ptrain" tokenize "${common[@]:2}" >&2  # the cache, so set-up is the same for every ptrain run

json() { "$py" -c "import json,sys; d=json.loads(sys.stdin.read().strip().splitlines()[-1]); print($1)"; }
rows=()
for mode in padded packed; do
  if [ "$mode" = padded ]; then batch=8 pack=false flag="" maxlen=513; else batch=4 pack=true flag="--packing" maxlen=512; fi
  rm -rf "$out/run-$mode"
  "$ptrain" run --quiet --steps "$steps" --run-dir "$out/run-$mode" --set "data.batch_size=$batch" --set "data.packing=$pack" "${common[@]}" >&2
  s="$out/run-$mode/summary.json"
  read -r o_sps o_tps o_loss o_mem <<<"$("$py" -c "import json; s=json.load(open('$s')); print(s['steps_per_s'], s['trained_tokens_per_s'], s['final_loss'], s['peak_memory_bytes']/2**20)")"
  theirs=$("$py" bench/chat.py trl "$model" "$model/chat.jsonl" "$steps" "$batch" "$maxlen" "$threads" $flag 2>/dev/null | tail -n 1)
  t_sps=$(echo "$theirs" | json 'd["steps_per_s"]'); t_tps=$(echo "$theirs" | json 'd["trained_tokens_per_s"]')
  t_loss=$(echo "$theirs" | json 'd["last_loss"]'); t_mem=$(echo "$theirs" | json 'd["peak_rss_mb"]')
  rows+=("$(printf '| %s (batch %s) | %.2f / %.2f | %.0f / %.0f | **%.2fx** | %.4f / %.4f | %.0f / %.0f |' \
    "$mode" "$batch" "$o_sps" "$t_sps" "$o_tps" "$t_tps" "$(echo "$o_tps / $t_tps" | bc -l)" "$o_loss" "$t_loss" "$o_mem" "$t_mem")")
done

echo "Steps: $steps, threads: $threads, max_seq_len 512 ($(nproc) cores)."
echo
echo "| batches | steps/s ptrain / TRL | trained tokens/s ptrain / TRL | ptrain vs TRL | loss after $steps steps ptrain / TRL | peak RSS MiB ptrain / TRL |"
echo "| --- | --- | --- | --- | --- | --- |"
printf '%s\n' "${rows[@]}"
att=$("$py" bench/chat.py attention "$threads" 2>/dev/null | tail -n 1)
echo
echo "Packed attention, 4 x 512 positions, 8 heads of 32, forward and backward ($(echo "$att" | json 'd["rows"]') rows): one SDPA call with a block-diagonal causal mask $(echo "$att" | json 'round(d["mask_ms"], 1)') ms; one causal call per row $(echo "$att" | json 'round(d["per_row_ms"], 1)') ms."
