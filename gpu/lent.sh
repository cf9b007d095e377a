#!/usr/bin/env bash
# Everything a lent GPU runs, in one call of the device tool (a lent device has 15 minutes in
# all, its start included, so there is one call and no second chance). From the bundle:
#
#   bundle/gpu/lent.sh OUT [SECONDS]     # device tool: carry ["bundle"], timeout_s = SECONDS + 30
#   bundle/gpu/lent.sh --smoke OUT       # the same steps on the CPU at toy sizes (checks this script)
#   LENT_STEPS=sdpa,qwen05b bundle/gpu/lent.sh OUT 300    # only some steps (a second call)
#
# In order, each step capped so that the whole ends within SECONDS (default 530) and what ran
# comes back: nvidia-smi; validate.sh --check; validate.sh --device cuda; which SDPA kernel
# takes the packed-row mask (sdpa_backends.py); a Qwen2-0.5B-shaped model in bf16, ptrain
# (chunked loss, whole logits, with plugins) against a plain transformers loop on the same
# weights and data (qwen05b.py); bench/run.py's GPT-small table (bare tch, ptrain fast mode,
# with plugins, PyTorch eager). OUT gets summary.txt (every step's table and figures) and
# lent.tar.gz (the logs and summaries, no weights or checkpoints). Steps (LENT_STEPS, comma-separated;
# default all but trace and diag): check, validate, sdpa, qwen05b (LENT_QWEN: its ptrain variants,
# default chunked,whole,plugins; also lora (r = 16) and ac (full activation checkpointing)), bench, phases (GPT-small fast mode, with the logging plugins, and
# with the checkpoint plugin, each with perf's per-phase times), trace (a Kineto trace of
# GPT-small's steps 10-12), diag (whether libtorch_cuda loads by dlopen alone), trl (TRL's
# SFTTrainer on the qwen05b step's model and tokens, without and with Liger-Kernel: gpu/trl_sft.py;
# the image lacks TRL and Liger, so carry their wheels in the bundle first: gpu/wheels.sh bundle/wheels),
# grpo (GRPO with generation, ptrain as rows and packed against TRL's GRPOTrainer with `generate`, bf16:
# bench/grpo_generate.sh --device cuda on a 24 x 1024 Qwen2, 64 completions of <= 256 tokens a step;
# needs the TRL wheels too).
set -uo pipefail
smoke=0
[ "${1:-}" = --smoke ] && { smoke=1; shift; }
[ $# -ge 1 ] || { echo "usage: gpu/lent.sh [--smoke] OUT [SECONDS]" >&2; exit 2; }
dest=$1 budget=${2:-530}
here=$(cd "$(dirname "$0")/.." && pwd)
if [ -x "$here/bin/ptrain" ]; then bin="$here/bin"; else bin="$here/target/release"; fi
py=${PTRAIN_PYTHON:-python3}
deadline=$(( $(date +%s) + budget ))
# A step's time limit: its own cap, or what is left less a margin for packing up.
cap() { local l=$(( deadline - $(date +%s) - 15 )); [ "$l" -lt 1 ] && l=1; [ "$1" -lt "$l" ] && echo "$1" || echo "$l"; }
o=$(mktemp -d /tmp/lent.XXXX)
log() { echo "== $(date -u +%H:%M:%S) $*" | tee -a "$o/steps.txt"; }
export PYTHONUNBUFFERED=1
torch_lib=$("$py" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))') || exit 2
export LD_LIBRARY_PATH="$torch_lib" PTRAIN_TORCH_LIB="$torch_lib" PTRAIN_PLUGIN_PATH="$bin"
dev=cuda; [ $smoke = 1 ] && dev=cpu
steps_wanted=",${LENT_STEPS:-check,validate,sdpa,qwen05b,grpo,trl,bench,phases},"
# Wheels carried with the bundle (gpu/wheels.sh): installed apart, for the trl step.
if ls "$here"/wheels/*.whl >/dev/null 2>&1; then
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/lent-site "$here"/wheels/*.whl \
    >/tmp/lent-wheels.log 2>&1 && export PYTHONPATH="/tmp/lent-site${PYTHONPATH:+:$PYTHONPATH}"
fi
want() { [[ "$steps_wanted" == *",$1,"* ]]; }
# Logs how a step that ran exited (steps LENT_STEPS leaves out log nothing).
exited() { log "  $1 exited $2"; }

log "nvidia-smi"
nvidia-smi >"$o/nvidia-smi.txt" 2>&1 || true
if want diag; then
  log "diag: libtorch_cuda by dlopen"
  "$py" -c "import ctypes; ctypes.CDLL('libtorch_cuda.so'); print('libtorch_cuda.so loads by dlopen')" >"$o/diag.txt" 2>&1
  readelf -d "$bin/bare-tch" 2>/dev/null | grep NEEDED >>"$o/diag.txt"
fi
if want check; then
  log "check"
  timeout "$(cap 90)" "$here/gpu/validate.sh" --check --device "$dev" --python "$py" --out "$o/check" >"$o/check.log" 2>&1
  exited check $?
fi
if [ $smoke = 0 ] && want validate; then
  log "validate --device cuda"
  timeout "$(cap 300)" "$here/gpu/validate.sh" --device cuda --python "$py" --out "$o/cuda" >"$o/cuda.log" 2>&1
  exited validate $?
fi
if [ $smoke = 0 ] && want sdpa; then
  log "sdpa backends"
  timeout "$(cap 60)" "$py" "$here/gpu/sdpa_backends.py" >"$o/sdpa.json" 2>"$o/sdpa.err"
  exited sdpa $?
fi

want qwen05b && log "qwen2-0.5B shape"
q="$o/qwen05b" w=$(mktemp -d /tmp/lent-work.XXXX)
mkdir -p "$q"
batch=4 seq=2048 steps=30 tiny=()
[ $smoke = 1 ] && batch=2 seq=64 steps=5 tiny=(--tiny)
{ want qwen05b || want trl; } && timeout "$(cap 90)" "$py" "$here/gpu/qwen05b.py" make "$w/model" "$w/tokens.bin" "${tiny[@]}" >"$q/make.log" 2>&1
common=(--device "$dev" --steps "$steps" --quiet --set model.kind=\"llama\" --set "model.init_from=\"$w/model\""
  --set data.kind=\"tokens\" --set "data.path=\"$w/tokens.bin\"" --set "data.max_seq_len=$seq" --set "data.batch_size=$batch"
  --set train.precision=\"bf16\" --set optim.lr=1e-5 --set optim.schedule=\"constant\" --set optim.warmup_steps=0
  --set train.eval_every=0 --set train.eval_batches=1)
variants=(chunked whole plugins)
[ -n "${LENT_QWEN:-}" ] && read -r -a variants <<<"${LENT_QWEN//,/ }"
want qwen05b || variants=()
for variant in "${variants[@]}"; do
  extra=()
  [ $variant = whole ] && extra=(--set train.loss_chunk=0)
  [ $variant = plugins ] && extra=(--plugins flops,perf,tensorboard,checkpoint)
  [ $variant = lora ] && extra=(--set lora.rank=16)
  [ $variant = ac ] && extra=(--set train.activation_checkpointing=\"full\")
  timeout "$(cap 90)" "$bin/ptrain" run "${common[@]}" "${extra[@]}" --run-dir "$w/ptrain-$variant" >"$q/ptrain-$variant.log" 2>&1
  echo "exit $?" >>"$q/ptrain-$variant.log"
  cp "$w/ptrain-$variant/summary.json" "$q/ptrain-$variant.json" 2>/dev/null
done
if want qwen05b; then
  timeout "$(cap 120)" "$py" "$here/gpu/qwen05b.py" hf "$w/model" "$w/tokens.bin" "$batch" "$seq" "$steps" >"$q/hf.json" 2>"$q/hf.err"
  exited "qwen05b's transformers loop" $?
fi

if want grpo; then
  log "grpo with generation"
  shape=(--device cuda --layers 24 --width 1024 --prompt 64 --completion 256 --batch 64 --steps 5)
  [ $smoke = 1 ] && shape=(--tiny)
  PTRAIN_BIN_DIR="$bin" PTRAIN_PYTHON="$py" timeout "$(cap 240)" "$here/bench/grpo_generate.sh" "${shape[@]}" >"$o/grpo.md" 2>"$o/grpo.err"
  exited grpo $?
fi

tv=(plain); [ $smoke = 0 ] && tv=(plain liger)
want trl && log "trl sft"
for variant in "${tv[@]}"; do
  want trl || break
  liger=(); [ $variant = liger ] && liger=(--liger)
  timeout "$(cap 150)" "$py" "$here/gpu/trl_sft.py" "$w/model" "$w/tokens.bin" "$batch" "$seq" "$steps" "${liger[@]}" >"$q/trl-$variant.json" 2>"$q/trl-$variant.err"
  exited "trl $variant" $?
done

if [ $smoke = 0 ] && want bench; then
  log "bench/run.py gpt-small"
  PTRAIN_BIN_DIR="$bin" PTRAIN_PYTHON="$py" timeout "$(cap 240)" "$py" "$here/bench/run.py" --device cuda --no-build --no-install \
    --repeats 2 --no-warmup --steps 100 --only bare,ptrain,plugins,torch >"$o/bench.log" 2>&1
  exited bench $?
  cp "$here"/bench/out/results*.json "$o/" 2>/dev/null
fi
# GPT-small's step apart from start-up and the final save: perf's per-phase times (steps 2 on).
g="$o/phases"; mkdir -p "$g"
gs=(--config "$here/configs/gpu-gpt-small.toml" --quiet --set train.eval_every=0)
[ $smoke = 1 ] && gs=(--config "$here/configs/tiny-gpt.toml" --quiet --set train.eval_every=0)
gsteps=150; [ $smoke = 1 ] && gsteps=20
want phases && log "phases"
for variant in fast loggers checkpoint; do
  want phases || break
  p=perf; [ $variant = loggers ] && p=perf,tensorboard,wandb,flops; [ $variant = checkpoint ] && p=perf,checkpoint
  timeout "$(cap 60)" "$bin/ptrain" run "${gs[@]}" --steps $gsteps --device "$dev" --plugins "$p" --run-dir "$w/phases-$variant" >"$g/$variant.log" 2>&1
  cp "$w/phases-$variant/summary.json" "$g/$variant.json" 2>/dev/null
done
if want trace; then
  log "trace"
  timeout "$(cap 60)" "$bin/ptrain" run "${gs[@]}" --steps 14 --device "$dev" --plugins trace --run-dir "$w/trace" >"$o/trace.log" 2>&1
  exited trace $?
  cp -r "$w/trace/traces" "$o/traces" 2>/dev/null
fi
log "done"

# One readable file with every figure, then the logs.
{
  cat "$o/steps.txt"; echo
  for f in "$o/check/summary.txt" "$o/cuda/summary.txt"; do [ -f "$f" ] && { cat "$f"; echo; }; done
  [ -f "$o/cuda/summary.txt" ] || { [ -f "$o/cuda/work/rows.tsv" ] && { echo "validate cut short; rows so far:"; cat "$o/cuda/work/rows.tsv"; echo; }; }
  [ -s "$o/sdpa.json" ] && { echo "sdpa:"; cat "$o/sdpa.json"; echo; }
  [ -s "$o/grpo.md" ] && { echo "grpo with generation (bench/grpo_generate.sh):"; cat "$o/grpo.md"; echo; }
  echo "qwen2-0.5B shape, batch $batch x $seq, $steps steps, bf16 autocast:"
  for v in "${variants[@]}"; do
    "$py" - "$q/ptrain-$v.json" "$v" <<'EOF' 2>/dev/null || echo "ptrain $v: no summary"
import json, sys
s = json.load(open(sys.argv[1]))
print(f"ptrain {sys.argv[2]}: {s.get('tokens_per_s')} tokens/s, peak {s.get('peak_memory_bytes')} B, loss {s.get('first_loss')} -> {s.get('final_loss')}, wall {s.get('wall_s')} s, {s.get('parameters')} params")
EOF
  done
  echo "transformers loop: $(cat "$q/hf.json" 2>/dev/null)"
  tail -n 3 "$q/hf.err" 2>/dev/null
  for v in "${tv[@]}"; do
    want trl && { echo "trl sft $v: $(tail -n 1 "$q/trl-$v.json" 2>/dev/null)"; [ -s "$q/trl-$v.json" ] || tail -n 3 "$q/trl-$v.err"; }
  done
  echo; tail -n 40 "$o/bench.log" 2>/dev/null
  [ -f "$o/diag.txt" ] && { echo "diag:"; cat "$o/diag.txt"; }
  for v in fast loggers checkpoint; do
    "$py" - "$g/$v.json" "$v" <<'EOF' 2>/dev/null
import json, sys
s = json.load(open(sys.argv[1])); p = s["plugins"]["perf"]
print(f"gpt-small {sys.argv[2]}: wall {s['wall_s']:.2f} s for {s['steps']} steps, steady {p['per_step_s']}, {p['tokens_per_s']:.0f} tokens/s steady, checkpoint_wait_s {s.get('checkpoint_wait_s')}, stalls {s.get('plugin_stalls')}")
EOF
  done
  ls -la "$o/traces" 2>/dev/null
} >"$o/summary.txt" 2>&1
mkdir -p "$dest"
cp "$o/summary.txt" "$dest/summary.txt"
tar -czf "$dest/lent.tar.gz" -C "$o" --exclude='*.safetensors' --exclude='checkpoints' --exclude='*.pt' . 2>/dev/null
rm -rf "$o" "$w"
cat "$dest/summary.txt"
