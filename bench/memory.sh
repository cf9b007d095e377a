#!/usr/bin/env bash
# Issue 24's table: peak memory and steps/s of full fine-tuning, + activation checkpointing,
# + the chunked loss, and LoRA, in ptrain and in transformers (a plain loop on
# Qwen2ForCausalLM with activation_checkpointing_enable() and peft LoRA), on the same random
# Qwen2 (bench/memory.py make) and the same batch shape, CPU, float32, AdamW.
# Prints a Markdown table for BENCHMARKS.md. Run it on a quiet machine.
#
#   bench/memory.sh                        # 12 layers of 384, vocabulary 32,000, 1 x 1024, 3 steps
#   bench/memory.sh --layers 2 --width 128 --vocab 1000 --seq 64 --steps 2   # a dry run
#   bench/memory.sh --case qwen2-0.5b [--batch 4]   # Qwen2-0.5B's shape (issue 41): 24 layers of 896,
#                                      # intermediate 4,864, vocabulary 151,936; 1 x 512, 4 steps, LoRA r=16
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
. scripts/env.sh

layers=12 width=384 vocab=32000 seq=1024 batch=1 steps=3 rank=8 chunk=1024 threads=$(nproc) intermediate=
while [ $# -gt 0 ]; do
  case "$1" in
    --case)
      [ "$2" = qwen2-0.5b ] || { echo "bench/memory.sh: unknown case $2 (known: qwen2-0.5b)" >&2; exit 2; }
      layers=24 width=896 vocab=151936 intermediate=4864 seq=512 steps=4 rank=16; shift 2 ;;
    --intermediate) intermediate="$2"; shift 2 ;;
    --layers) layers="$2"; shift 2 ;;
    --width) width="$2"; shift 2 ;;
    --vocab) vocab="$2"; shift 2 ;;
    --seq) seq="$2"; shift 2 ;;
    --batch) batch="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --rank) rank="$2"; shift 2 ;;
    --chunk) chunk="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    *) echo "bench/memory.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
py="$root/.venv/bin/python"
out="$root/bench/out/memory"
intermediate=${intermediate:-$((width * 11 / 4))}
model="$out/model-$layers-$width-$intermediate-$vocab"
mkdir -p "$out"
[ -f "$model/config.json" ] || "$py" bench/memory.py make "$model" "$layers" "$width" "$vocab" "$seq" "$intermediate" >&2

ptrain() { # name, extra --set values -> "MiB|steps/s|last loss|trainable"
  local name=$1; shift
  local sets=()
  for s in "$@"; do sets+=(--set "$s"); done
  "$root/target/release/ptrain" run --quiet --device cpu --steps "$steps" --run-dir "$out/ptrain-$name" --overwrite \
    --set "run.threads=$threads" --set "model.init_from=$model" --set data.kind=synthetic --set "data.batch_size=$batch" \
    --set "data.max_seq_len=$seq" --set train.eval_every=0 --set train.eval_batches=1 "${sets[@]}" >&2
  "$py" -c "
import json; s=json.load(open('$out/ptrain-$name/summary.json'))
print('%.0f|%.3f|%.4f|%s' % (s['peak_memory_bytes']/2**20, s['steps_per_s'], s['final_loss'], s.get('trainable_parameters', s['parameters'])))"
}
hf() { # flags -> the same
  "$py" bench/memory.py hf "$model" "$steps" "$batch" "$seq" "$threads" "$@" 2>/dev/null | tail -1 | "$py" -c "
import json, sys; r=json.load(sys.stdin)
print('%.0f|%.3f|%.4f|%s' % (r['peak_rss_mb'], r['steps_per_s'], r['last_loss'], r['trainable']))"
}
row() { # label, ptrain result, transformers result, transformers label
  IFS='|' read -r pm ps pl pt <<<"$2"
  IFS='|' read -r hm hs hl ht <<<"$3"
  printf '| %s | %s | %s | %s | %s | %s | %s | %s | %sx | %sx |\n' "$1" "$pm" "$ps" "$pt" "$4" "$hm" "$hs" "$ht" \
    "$(awk "BEGIN { printf \"%.2f\", $pm / $hm }")" "$(awk "BEGIN { printf \"%.2f\", $ps / $hs }")"
}
lora=("lora.rank=$rank" "lora.alpha=$((2 * rank))")
full_p=$(ptrain full)
full_h=$(hf)
ac_p=$(ptrain ac train.activation_checkpointing=full)
ac_h=$(hf --gc)
# Vocabularies of 65,536 and more chunk the loss by default (train.loss_chunk unset): no row of its own.
[ "$vocab" -lt 65536 ] && chunk_p=$(ptrain ac-chunk train.activation_checkpointing=full "train.loss_chunk=$chunk")
lora_p=$(ptrain lora train.activation_checkpointing=full "${lora[@]}")
lora_every_p=$(ptrain lora-every2 train.activation_checkpointing=every_n train.activation_checkpointing_every=2 "${lora[@]}")
lora_h=$(hf --gc --lora "$rank")
lora_none_p=$(ptrain lora-none "${lora[@]}")
lora_none_h=$(hf --lora "$rank")

echo "Random Qwen2: $layers layers of $width ($((width / 64)) heads, 2 KV heads, intermediate $intermediate), vocabulary $vocab, tied; batch $batch x $seq;"
echo "$steps steps, AdamW, float32, $threads threads ($(nproc) cores). Peak memory: the process's peak RSS. ptrain's loss is chunked"
echo "by default from a vocabulary of 65,536 (train.loss_chunk unset), and one rank releases its gradients between steps."
echo
echo "| ptrain | peak MiB | steps/s | trainable | transformers | peak MiB | steps/s | trainable | memory ptrain/transformers | speed ptrain/transformers |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
row "full fine-tuning" "$full_p" "$full_h" "full fine-tuning"
row "+ activation_checkpointing = full" "$ac_p" "$ac_h" "+ activation_checkpointing_enable()"
[ "$vocab" -lt 65536 ] && row "+ loss_chunk = $chunk" "$chunk_p" "$ac_h" "(no chunked loss: as above)"
row "LoRA r=$rank + activation_checkpointing = full" "$lora_p" "$lora_h" "peft LoRA r=$rank + checkpointing"
row "LoRA r=$rank + every_n = 2" "$lora_every_p" "$lora_h" "(as above)"
row "LoRA r=$rank, no checkpointing" "$lora_none_p" "$lora_none_h" "peft LoRA r=$rank, no checkpointing"
row "LoRA r=$rank, no checkpointing" "$lora_none_p" "$lora_h" "peft LoRA r=$rank + checkpointing"
