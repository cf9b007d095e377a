#!/usr/bin/env bash
# DPO on the CPU: ptrain against TRL's DPOTrainer on the same random Qwen2 (LAYERS layers, WIDTH wide,
# a 300-token BPE vocabulary), the same plain preference pairs (answers of about 32 tokens) and the same
# steps (BATCH pairs each, fp32, one thread each by default): pairs/s (the first step left out) and peak
# RSS, for prompts of about 64 and 512 tokens, with and without the precomputed reference; ptrain both
# with each pair as two rows (as TRL) and with the prompt once per pair (data.packing). Prints a
# Markdown table for BENCHMARKS.md. Run it on a quiet machine.
#
#   bench/dpo.sh                               # 4 layers x 512, batch 4, 10 steps, 1 thread
#   bench/dpo.sh --layers 8 --width 896 --steps 20 --threads 4
#   bench/dpo.sh --prompts 64                 # the 64-token prompts only
#   bench/dpo.sh --tiny                        # a dry run: 1 layer 64 wide, prompts of 16 and 32, 3 steps
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
. scripts/env.sh

layers=4 width=512 batch=4 steps=10 threads=1 build=1 prompts="64 512"
while [ $# -gt 0 ]; do
  case "$1" in
    --layers) layers="$2"; shift 2 ;;
    --width) width="$2"; shift 2 ;;
    --batch) batch="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --tiny) layers=1 width=64 batch=2 steps=3 prompts="16 32"; shift ;;
    --prompts) prompts="$2"; shift 2 ;;
    --no-build) build=0; shift ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
py="$root/.venv/bin/python"
out="$root/bench/out/dpo"
mkdir -p "$out"
[ "$build" = 1 ] && cargo build --release -p ptrain >&2
ptrain="$root/target/release/ptrain"
pairs=$(( batch * (steps + 1) ))

echo "Qwen2 $layers layers x $width wide; plain pairs, answers ~32 tokens; batch $batch pairs; $steps steps timed (after 1); $threads threads ($(nproc) cores); fp32."
echo
echo "| prompt tokens | reference | side | pairs/s | peak RSS MiB |"
echo "| --- | --- | --- | --- | --- |"
for prompt in $prompts; do
  d="$out/p$prompt-$layers-$width"
  [ -f "$d/pairs.jsonl" ] || "$py" bench/dpo.py make "$d" "$layers" "$width" "$prompt" "$pairs" >&2
  for pre in false true; do
    for packing in false true; do
      rm -rf "$out/run"
      "$ptrain" run --quiet --device cpu --steps $((steps + 1)) --run-dir "$out/run" --set "run.threads=$threads" \
        --set model.kind=llama --set "model.init_from=$d/model" --set data.kind=preference --set "data.path=$d/pairs.jsonl" \
        --set "data.val_path=$d/pairs.jsonl" --set "data.batch_size=$batch" --set "data.packing=$packing" --set "data.tokens_cache=$out/cache" \
        --set train.eval_every=0 --set train.eval_batches=1 --set optim.lr=1e-6 --set optim.schedule=constant --set optim.warmup_steps=0 \
        --set "dpo.precompute_reference=$pre" >&2
      read -r sps mem <<<"$("$py" -c "import json; s=json.load(open('$out/run/summary.json')); print(s['steps_per_s'], s['peak_memory_bytes']/2**20)")"
      side="ptrain"; [ "$packing" = true ] && side="ptrain, prompt once per pair"
      printf '| %s | %s | %s | %.2f | %.0f |\n' "$prompt" "$([ $pre = true ] && echo precomputed || echo live)" "$side" "$("$py" -c "print($sps * $batch)")" "$mem"
    done
    flag=(); [ "$pre" = true ] && flag=(--precompute)
    theirs=$("$py" bench/dpo.py trl "$d" "$steps" "$batch" "$threads" "${flag[@]}" 2>/dev/null | tail -n 1)
    printf '| %s | %s | TRL DPOTrainer | %.2f | %.0f |\n' "$prompt" "$([ $pre = true ] && echo precomputed || echo live)" \
      "$(echo "$theirs" | "$py" -c "import json,sys; print(json.loads(sys.stdin.read())['pairs_per_s'])")" \
      "$(echo "$theirs" | "$py" -c "import json,sys; print(json.loads(sys.stdin.read())['peak_rss_mb'])")"
  done
done
