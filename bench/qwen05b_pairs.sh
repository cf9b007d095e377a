#!/usr/bin/env bash
# Issue 41: ptrain and transformers/peft one after the other on the Qwen2-0.5B shape (bench/memory.sh's model,
# made by `bench/memory.sh --case qwen2-0.5b` or `bench/memory.py make`), each run's peak RSS, steps/s, setup_s
# and page faults appended to bench/out/qwen05b/results.txt with the time and load average. Phases, in the order
# given:
#   load    3 x (ptrain --steps 1, its setup_s; transformers' import and from_pretrained), page cache warm
#   loraload  the same with LoRA r=16 (ptrain lora.rank=16; peft's get_peft_model after from_pretrained)
#   b1      batch 1 x 512, 6 steps: full, + checkpointing, LoRA r=16 + checkpointing (+ loss_chunk = 1024)
#   b1full  batch 1 x 512, 6 steps: full fine-tuning, one run a side (b1's first pair alone)
#   b4full  batch 4 x 512, 4 steps: full fine-tuning, two runs a side, alternating
#   b4rest  batch 4 x 512, 4 steps: + checkpointing, LoRA r=16 + checkpointing
#   lora    LoRA r=16 without checkpointing against peft + checkpointing: batch 1 (6 steps), batch 4 (4 steps)
#   lorab1  lora's batch-1 pair alone
# Both sides time the same work: transformers' loop the steps alone (bench/memory.py hf: from before the first
# step to after the last), ptrain the steps alone too: its summary's steps_per_s, steps / wall_s, where wall_s
# starts after set-up (docs/summary.md says which interval each `_s` field covers), with data.val_fraction = 0: no
# evaluation, which the loop does not do either; steps / (setup_s + wall_s), set-up included, is logged beside it.
# Before 2026-11-28 20:18 UTC ptrain's figure was summary.json's steps_per_s after a final evaluation of one batch;
# from then until 2026-11-29 it was steps / (wall_s - setup_s), which took set-up off twice (issue 63, item 9:
# BENCHMARKS.md restates those rows from the recorded figures).
# Run it on a quiet machine: bench/qwen05b_pairs.sh load loraload b1 b4full b4rest lora
set -u
[ $# -gt 0 ] || { echo "usage: bench/qwen05b_pairs.sh PHASE... (load loraload b1 b1full b4full b4rest lora lorab1)" >&2; exit 2; }
for phase in "$@"; do
  case $phase in load | loraload | b1 | b1full | b4full | b4rest | lora | lorab1) ;;
  *) echo "bench/qwen05b_pairs.sh: unknown phase $phase (known: load loraload b1 b1full b4full b4rest lora lorab1)" >&2; exit 2 ;; esac
done
cd "$(dirname "$0")/.."
. scripts/env.sh
B=$PWD/target/release/ptrain PY=$PWD/.venv/bin/python
M=$PWD/bench/out/memory/model-24-896-4864-151936
O=$PWD/bench/out/qwen05b; mkdir -p $O
R=$O/results.txt
[ -f $M/config.json ] || $PY bench/memory.py make $M 24 896 151936 512 4864 >&2
log() { echo "$(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg) | $*" | tee -a $R; }
p() { # name batch steps sets...
  local name=$1 batch=$2 steps=$3; shift 3; local sets=()
  for s in "$@"; do sets+=(--set "$s"); done
  /usr/bin/time -f "%e s wall %R minflt" -o $O/time-$name "$B" run --quiet --device cpu --steps $steps --run-dir $O/p-$name --overwrite \
    --set run.threads=2 --set model.init_from=$M --set data.kind=synthetic --set data.batch_size=$batch \
    --set data.max_seq_len=512 --set data.val_fraction=0 "${sets[@]}" >/dev/null 2>&1
  log "ptrain $name b$batch s$steps: $($PY -c "
import json; s=json.load(open('$O/p-$name/summary.json'))
print('peak %.0f MiB, %.4f steps/s, %.4f with setup, setup %.2f s, wall %.2f s, first %.4f last %.4f, trainable %d' % (s['peak_memory_bytes']/2**20, s['steps_per_s'], s['steps']/(s['setup_s']+s['wall_s']), s['setup_s'], s['wall_s'], s['first_loss'], s['final_loss'], s['trainable_parameters']))") $(cat $O/time-$name)"
}
h() { # name batch steps flags...
  local name=$1 batch=$2 steps=$3; shift 3
  local r; r=$($PY bench/memory.py hf $M $steps $batch 512 2 "$@" 2>/dev/null | tail -1)
  log "hf $name b$batch s$steps: $r"
}
warm() { cat $M/*.safetensors > /dev/null; }
loads() { # name "hf_load.py flags" ptrain sets...: three pairs, the page cache warm before each run
  local name=$1 flags=$2; shift 2
  for i in 1 2 3; do warm; p $name$i 1 1 "$@"; warm; log "hf_$name $i: $($PY bench/hf_load.py $M $flags 2>/dev/null | tail -1)"; done
}
b1full() { p full 1 6; h full 1 6; }
lorab1() { p lora 1 6 lora.rank=16 lora.alpha=32; h peft-gc 1 6 --gc --lora 16; }
for phase in "$@"; do case $phase in
load) loads load "" ;;
loraload) loads loraload "--lora 16" lora.rank=16 lora.alpha=32 ;;
b4full) p full4a 4 4; h full4a 4 4; p full4b 4 4; h full4b 4 4 ;;
b1full) b1full ;;
b1) b1full; p ac 1 6 train.activation_checkpointing=full; h gc 1 6 --gc
    p lora-ac 1 6 train.activation_checkpointing=full lora.rank=16 lora.alpha=32; h peft-gc 1 6 --gc --lora 16
    p lora-ac-chunk 1 6 train.activation_checkpointing=full lora.rank=16 lora.alpha=32 train.loss_chunk=1024 ;;
b4rest) p ac4 4 4 train.activation_checkpointing=full; h gc4 4 4 --gc
    p lora-ac4 4 4 train.activation_checkpointing=full lora.rank=16 lora.alpha=32; h peft-gc4 4 4 --gc --lora 16 ;;
lorab1) lorab1 ;;
lora) lorab1; p lora4 4 4 lora.rank=16 lora.alpha=32; h peft-gc4 4 4 --gc --lora 16 ;;
esac; log "done $phase"; done
