#!/usr/bin/env bash
# ptrain's validation kit: proves the training loop on a device in one call, and
# writes every figure and log under one folder. See docs/gpu.md.
#
#   gpu/validate.sh --check --python PY --out DIR              # ~30 s: CUDA seen? GPU name, driver vs libtorch, NCCL with one rank
#                                                              # (--check means --device cuda unless --device cpu is given)
#   gpu/validate.sh --device cuda --python PY --out DIR        # every step on the GPU (a few minutes)
#   gpu/validate.sh --device cpu --python PY --out DIR         # the same steps on the CPU, small sizes (CI runs this)
#
# PY is a Python with torch 2.11 (the device image's `python3`): the kit runs
# ptrain against that torch (LD_LIBRARY_PATH = its torch/lib; the binaries' run
# path points at the build machine's venv, which is not there). It runs from a
# bundle (scripts/bundle.sh: bin/ beside gpu/) or from a built checkout
# (target/release).
#
# DIR receives summary.txt (the table printed at the end, one row per step),
# summary.json (the same rows, with every figure) and validate.tar.gz (each
# step's log, summary.json and metrics; no checkpoints or traces). Exit code: 0
# when no step failed, 1 when one did, 2 on bad arguments.
set -uo pipefail

usage() { sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; }
device="" check=0 py="" out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --device) device="${2:-}"; shift 2 ;;
    --check) check=1; shift ;;
    --python) py="${2:-}"; shift 2 ;;
    --out) out="${2:-}"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "error: unknown argument \`$1\` (see --help)" >&2; exit 2 ;;
  esac
done
# The check asks about CUDA; the full run defaults to the CPU (what CI runs).
[ -n "$device" ] || { [ $check = 1 ] && device=cuda || device=cpu; }
case "$device" in cpu|cuda) ;; *) echo "error: --device must be cpu or cuda, not \`$device\`" >&2; exit 2 ;; esac
[ -n "$py" ] || { echo "error: --python PY is required (a Python with torch 2.11)" >&2; exit 2; }
[ -n "$out" ] || { echo "error: --out DIR is required" >&2; exit 2; }
command -v "$py" >/dev/null 2>&1 || { echo "error: --python \`$py\` is not a program" >&2; exit 2; }

root=$(cd "$(dirname "$0")/.." && pwd)
if [ -x "$root/bin/ptrain" ]; then bin="$root/bin" smoke="$root/bin/collectives"
else bin="$root/target/release" smoke="$root/target/release/examples/collectives"; fi
[ -x "$bin/ptrain" ] || { echo "error: no ptrain binary in $root/bin or $root/target/release (build, or run scripts/bundle.sh)" >&2; exit 2; }
torch_lib=$("$py" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))' 2>/dev/null) \
  || { echo "error: \`$py\` cannot import torch" >&2; exit 2; }
export LD_LIBRARY_PATH="$torch_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PTRAIN_PLUGIN_PATH="$bin"
mkdir -p "$out" || exit 2
out=$(cd "$out" && pwd)
work="$out/work"
rm -rf "$work" && mkdir -p "$work"
rows="$work/rows.tsv"
: >"$rows"
ptrain="$bin/ptrain"

# One row of the table: step, ok|FAIL|skip, figure, note.
row() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >>"$rows"; printf '  %-28s %-5s %s  %s\n' "$1" "$2" "$3" "$4"; }
# A JSON field of a file (dotted path), or "".
field() { "$py" - "$1" "$2" <<'EOF' 2>/dev/null
import json, sys
v = json.load(open(sys.argv[1]))
for k in sys.argv[2].split("."):
    v = v.get(k) if isinstance(v, dict) else None
print("" if v is None else v)
EOF
}
# Relative difference of two numbers, and whether it is within a bound: "0.0012 ok".
within() { "$py" -c "import sys; a,b,t=map(float,sys.argv[1:4]); r=abs(a-b)/max(abs(b),1e-12); print(f'{r:.3g}', 'ok' if r<=t else 'FAIL')" "$1" "$2" "$3" 2>/dev/null || echo "nan FAIL"; }

# ptrain run into $work/NAME: run NAME [args...]; returns ptrain's exit code.
run() {
  local name=$1; shift
  "$ptrain" run --run-dir "$work/$name" --quiet "$@" >"$work/$name.log" 2>&1
}

check() {
  echo "== check"
  "$py" - >"$work/check.json" 2>"$work/check.err" <<'EOF'
import ctypes, json, torch
r = {"torch": torch.__version__, "torch_cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available(),
     "device_count": torch.cuda.device_count() if torch.cuda.is_available() else 0}
if r["cuda_available"]:
    r["gpu"] = torch.cuda.get_device_name(0)
    r["capability"] = ".".join(map(str, torch.cuda.get_device_capability(0)))
try:
    v = ctypes.c_int()
    ctypes.CDLL("libcuda.so.1").cuDriverGetVersion(ctypes.byref(v))
    r["driver_cuda"] = f"{v.value // 1000}.{v.value % 1000 // 10}"
except OSError:
    r["driver_cuda"] = None
if r["torch_cuda"] and r["driver_cuda"]:
    need = tuple(map(int, r["torch_cuda"].split(".")[:2]))
    have = tuple(map(int, r["driver_cuda"].split(".")[:2]))
    r["driver_ok"] = have >= need
print(json.dumps(r))
EOF
  local c="$work/check.json"
  row "torch" "$( [ -s "$c" ] && echo ok || echo FAIL)" "$(field "$c" torch) (CUDA build $(field "$c" torch_cuda))" "$(head -c 200 "$work/check.err" | tr '\n\t' '  ')"
  if [ "$device" = cuda ]; then
    local seen; seen=$(field "$c" cuda_available)
    row "cuda seen" "$( [ "$seen" = True ] && echo ok || echo FAIL)" "$(field "$c" device_count) device(s): $(field "$c" gpu) (sm $(field "$c" capability))" ""
    local dok; dok=$(field "$c" driver_ok)
    row "driver vs libtorch" "$( [ "$dok" = True ] && echo ok || echo FAIL)" "driver CUDA $(field "$c" driver_cuda), libtorch CUDA $(field "$c" torch_cuda)" "the driver must support at least libtorch's CUDA"
  fi
  if [ "$device" = cuda ]; then
    # ptrain's own view: trains two steps and names the GPU (an empty name or a
    # refusal means the shim was built without CUDA).
    timeout 60 "$ptrain" run --config "$root/configs/tiny-gpt.toml" --device cuda --steps 2 --set train.eval_every=0 \
      --run-dir "$work/ptrain-cuda" --quiet >"$work/ptrain-cuda.log" 2>&1
    local rc=$? name; name=$(field "$work/ptrain-cuda/summary.json" device_name)
    row "ptrain on cuda" "$( [ $rc = 0 ] && [ -n "$name" ] && [ "$name" != cpu ] && echo ok || echo FAIL)" "device $name" "exit $rc; $(grep -m1 -E 'error|FAILED' "$work/ptrain-cuda.log" | cut -c1-160)"
  fi
  timeout 60 "$smoke" "$device" 1048576 >"$work/collectives.log" 2>&1
  local rc=$?
  local backend; backend=$([ "$device" = cuda ] && echo nccl || echo gloo)
  row "$backend, one rank" "$( [ $rc = 0 ] && echo ok || echo FAIL)" "$(grep -c ' ok ' "$work/collectives.log") of 5 ok (init, all-reduce, broadcast, reduce-scatter, all-gather)" "exit $rc; $(grep -m1 -E 'error|FAILED' "$work/collectives.log" | cut -c1-160)"
}

steps() {
  local cfg="$root/configs/tiny-gpt.toml" small=(--set model.dropout=0.0 --set train.eval_every=0)
  local n=20 n_bf16=40 n_plugins=60
  [ "$device" = cuda ] && n_bf16=200
  local s

  echo "== training"
  # fp32 on the device against fp32 on the CPU, from the same weights: a fresh run draws its
  # initial weights with the device's generator (CUDA's and the CPU's streams differ), so on
  # cuda the CPU side resumes the device's step-10 checkpoint (below, "GPU checkpoint on CPU").
  if [ "$device" = cpu ]; then
    run fp32 --config "$cfg" --device cpu --steps $n "${small[@]}" && s=ok || s=FAIL
    run fp32-cpu --config "$cfg" --device cpu --steps $n "${small[@]}"
    read -r rel st < <(within "$(field "$work/fp32/summary.json" final_loss)" "$(field "$work/fp32-cpu/summary.json" final_loss)" 1e-4)
    [ "$s" = ok ] && s=$st
    row "fp32 $n steps" "$s" "final loss $(field "$work/fp32/summary.json" final_loss), rel. diff to CPU $rel" "bound 1e-4"
  fi

  # bf16 autocast against fp32 on the device: within 2% after n_bf16 steps.
  run bf16 --config "$cfg" --device "$device" --steps $n_bf16 "${small[@]}" --set train.precision=\"bf16\" && s=ok || s=FAIL
  run bf16-ref --config "$cfg" --device "$device" --steps $n_bf16 "${small[@]}"
  read -r rel st < <(within "$(field "$work/bf16/summary.json" final_loss)" "$(field "$work/bf16-ref/summary.json" final_loss)" 0.02)
  [ "$s" = ok ] && s=$st
  row "bf16 $n_bf16 steps" "$s" "final loss $(field "$work/bf16/summary.json" final_loss) vs fp32 $(field "$work/bf16-ref/summary.json" final_loss), rel. $rel" "bound 2%"

  # A checkpoint at step 10 resumed to step 20 repeats the uninterrupted run's loss bit for bit.
  local ck=(--config "$cfg" --device "$device" "${small[@]}" --plugins checkpoint)
  run ckpt-whole "${ck[@]}" --steps 20
  run ckpt-half "${ck[@]}" --steps 10
  run ckpt-resumed "${ck[@]}" --steps 20 --resume "$work/ckpt-half" && s=ok || s=FAIL
  local a b; a=$(field "$work/ckpt-whole/summary.json" final_loss) b=$(field "$work/ckpt-resumed/summary.json" final_loss)
  [ -n "$a" ] && [ "$a" = "$b" ] || s=FAIL
  row "checkpoint + resume" "$s" "final loss $a (whole) vs $b (resumed at 10)" "bit for bit"
  if [ "$device" = cuda ]; then
    run ckpt-on-cpu --config "$cfg" --device cpu "${small[@]}" --steps 20 --resume "$work/ckpt-half" && s=ok || s=FAIL
    row "GPU checkpoint on CPU" "$s" "final loss $(field "$work/ckpt-on-cpu/summary.json" final_loss)" "resumes and trains on the CPU"
    # Steps 11-20 on the CPU against the same steps on the device: fp32 within 1e-4.
    read -r rel st < <(within "$(field "$work/ckpt-whole/summary.json" final_loss)" "$(field "$work/ckpt-on-cpu/summary.json" final_loss)" 1e-4)
    [ "$s" = ok ] && s=$st
    row "fp32 steps 11-20 vs CPU" "$s" "final loss $(field "$work/ckpt-whole/summary.json" final_loss) on $(field "$work/ckpt-whole/summary.json" device_name), $(field "$work/ckpt-on-cpu/summary.json" final_loss) on the CPU, rel. $rel" "bound 1e-4; both from the device's step-10 weights"
  fi

  echo "== distributed"
  local torchrun=("$py" -m torch.distributed.run --no-python --standalone)
  "${torchrun[@]}" --nproc-per-node 1 "$ptrain" run --config "$cfg" --device "$device" --steps $n "${small[@]}" \
    --run-dir "$work/torchrun-1" --quiet >"$work/torchrun-1.log" 2>&1 && s=ok || s=FAIL
  row "torchrun, 1 rank" "$s" "final loss $(field "$work/torchrun-1/summary.json" final_loss)" "world size $(field "$work/torchrun-1/summary.json" world_size)"
  # Two ranks: on the CPU over Gloo; on two GPUs over NCCL; on one GPU both ranks share
  # cuda:0 over Gloo (NCCL refuses two ranks on one device), which still runs every shard
  # mode's code on CUDA tensors (gathers, reduce-scatters as all-reduces, bf16 autocast).
  local gpus; gpus=$(field "$work/check.json" device_count) over=() how=""
  if [ "$device" = cuda ] && [ "${gpus:-0}" -lt 2 ]; then over=(--set 'dist.backend="gloo"') how=" (one GPU, Gloo)"; fi
  local two=("${torchrun[@]}" --nproc-per-node 2 "$ptrain" run --config "$cfg" --device "$device" --steps $n "${small[@]}" "${over[@]}" --quiet)
  for shard in none optimizer gradients parameters; do
    "${two[@]}" --set dist.shard=\"$shard\" --run-dir "$work/torchrun-2-$shard" >"$work/torchrun-2-$shard.log" 2>&1 && s=ok || s=FAIL
    row "torchrun, 2 ranks, $shard$how" "$s" "final loss $(field "$work/torchrun-2-$shard/summary.json" final_loss)" \
      "$(field "$work/torchrun-2-$shard/summary.json" world_size) ranks, shard $(field "$work/torchrun-2-$shard/summary.json" shard)"
  done
  # ZeRO-3 follows plain data parallelism: the same 20 steps within 1e-4 (fp32).
  read -r rel s < <(within "$(field "$work/torchrun-2-parameters/summary.json" final_loss)" "$(field "$work/torchrun-2-none/summary.json" final_loss)" 1e-4)
  row "parameters vs none, 2 ranks$how" "$s" "final loss rel. $rel" "bound 1e-4"
  # ZeRO-3 in bf16 (the blocks gathered in bf16, float32 masters and reduction) follows plain data
  # parallelism in bf16, and gathers a block in about half the bytes of the fp32 run above. The
  # bound: on the CPU these 20 steps differ by 1.2e-3 (the fp32 runs' 6e-6, from the reduction
  # order, moves bf16 roundings; float32 gathers cast by autocast give the same losses bit for bit).
  for shard in none parameters; do
    "${two[@]}" --set dist.shard=\"$shard\" --set train.precision=\"bf16\" --run-dir "$work/torchrun-2-bf16-$shard" \
      >"$work/torchrun-2-bf16-$shard.log" 2>&1
  done
  local bf="$work/torchrun-2-bf16-parameters/summary.json" half
  read -r rel s < <(within "$(field "$bf" final_loss)" "$(field "$work/torchrun-2-bf16-none/summary.json" final_loss)" 5e-3)
  half=$("$py" -c "import json, sys; a, b = (json.load(open(p))['gathered_block_bytes'][0] for p in sys.argv[1:]); print(f'{a / b:.3f}' if 0 < a <= 0.6 * b else 'FAIL')" \
    "$bf" "$work/torchrun-2-parameters/summary.json" 2>/dev/null || echo FAIL)
  [ "$half" = FAIL ] && s=FAIL
  row "2 ranks, parameters, bf16 vs none, bf16$how" "$s" "final loss rel. $rel; a block gathered: ${half}x fp32's bytes" "bound 5e-3; at most 0.6x"
  # ZeRO-3 with the optimizer offloaded to the host and bf16 autocast (gathers in the compute dtype).
  "${two[@]}" --set dist.shard=\"parameters\" --set dist.offload_optimizer=true --set train.precision=\"bf16\" \
    --run-dir "$work/torchrun-2-offload" >"$work/torchrun-2-offload.log" 2>&1 && s=ok || s=FAIL
  row "2 ranks, parameters, offload, bf16$how" "$s" "final loss $(field "$work/torchrun-2-offload/summary.json" final_loss)" \
    "optimizer_state_bytes $(field "$work/torchrun-2-offload/summary.json" optimizer_state_bytes)"

  echo "== plugins"
  local plugins=checkpoint,csv,early-stop,flops,health,jsonl,perf,tensorboard,trace,wandb
  run plugins --config "$cfg" --device "$device" --steps $n_plugins "${small[@]}" --plugins $plugins --strict-plugins && s=ok || s=FAIL
  local p="$work/plugins/summary.json"
  local loaded; loaded=$("$py" -c "import json, sys; print(','.join(p['name'] for p in json.load(open(sys.argv[1]))['plugins_loaded']))" "$p" 2>/dev/null)
  [ "$loaded" = "$plugins" ] || s=FAIL
  row "every plugin, defaults" "$s" "$loaded" "failures: $(field "$p" plugin_failures); $(ls "$work/plugins/traces" 2>/dev/null | wc -l) trace file(s)"
  local mfu; mfu=$(field "$p" plugins.flops.mfu)
  row "flops: MFU" "$( [ -n "$mfu" ] && echo ok || echo FAIL)" "MFU $mfu, $(field "$p" plugins.flops.achieved_tflops) of $(field "$p" plugins.flops.peak_tflops) TFLOP/s" "peak: $(field "$p" plugins.flops.peak_source)"
  # The flops plugin's count against 6N per token plus attention (12 L T d),
  # N without the position embedding (a lookup, not a matmul).
  local expect; expect=$("$py" -c "
import json, sys
s = json.load(open(sys.argv[1])); L, d, T = 2, 64, 32
print(6 * (s['parameters'] - T * d) + 12 * L * T * d)" "$p" 2>/dev/null)
  read -r rel st < <(within "$(field "$p" plugins.flops.flops_per_token)" "${expect:-0}" 0.05)
  row "flops: count vs 6N+attn" "$st" "$(field "$p" plugins.flops.flops_per_token) vs $expect FLOP/token, rel. $rel" "bound 5%"

  finetune
  if [ "$device" = cuda ]; then
    echo "== GPT-2 small"
    run gpt-small --config "$root/configs/gpu-gpt-small.toml" --steps 50 --set train.eval_every=0 --plugins flops,perf && s=ok || s=FAIL
    local g="$work/gpt-small/summary.json"
    [ -n "$(field "$g" device_name)" ] && [ -n "$(field "$g" plugins.flops.mfu)" ] || s=FAIL
    row "gpu-gpt-small 50 steps" "$s" "$(field "$g" parameters) params, MFU $(field "$g" plugins.flops.mfu), peak $(field "$g" peak_memory_bytes) B" "$(field "$g" device_name); $(field "$g" tokens_per_s) tokens/s"
  fi
}

# The fine-tuning path: a random Qwen2 that transformers makes (tests/support/hf.py and
# chat.py), its logits against transformers' on the same device, then chat rows packed,
# with activation checkpointing, LoRA and the chunked loss, each against the plain run.
finetune() {
  echo "== fine-tuning"
  local ft="$work/ft" s rel st a b
  local sup="$root/tests/support"
  mkdir -p "$ft"
  "$py" "$sup/hf.py" make-llama qwen2 "$ft/qwen2" >"$work/ft-make.log" 2>&1 \
    && "$py" "$sup/hf.py" make-tokens "$ft/tokens.bin" 20000 >>"$work/ft-make.log" 2>&1 \
    && "$py" "$sup/chat.py" make "$ft/chat" 64 1 >>"$work/ft-make.log" 2>&1
  if [ $? != 0 ]; then
    row "qwen2 made by transformers" FAIL "" "$(tail -n 1 "$work/ft-make.log" | cut -c1-160)"
    return
  fi
  local lm=(--set data.kind=tokens --set "data.path=$ft/tokens.bin" --set "model.init_from=$ft/qwen2"
    --set data.max_seq_len=64 --set data.batch_size=4 --set train.eval_batches=1)
  # `ptrain logits` computes on the CPU: the logits against transformers' there; on the
  # device, the first training loss (a function of every logit) against transformers'
  # loss on the same device, in fp32 and under bf16 autocast.
  "$ptrain" logits --split train --step 1 --out "$ft/qwen2.probe" "${lm[@]}" >"$work/ft-logits.log" 2>&1
  "$py" "$sup/hf.py" compare-logits "$ft/qwen2" "$ft/qwen2.probe" >"$work/ft-compare-cpu.json" 2>>"$work/ft-logits.log"
  local diff; diff=$(field "$work/ft-compare-cpu.json" max_abs_diff)
  s=$("$py" -c "import sys; print('ok' if float(sys.argv[1]) <= 1e-4 else 'FAIL')" "$diff" 2>/dev/null || echo FAIL)
  row "qwen2 logits vs HF (cpu)" "$s" "max |diff| $diff (logits up to $(field "$work/ft-compare-cpu.json" logit_scale))" "bound 1e-4; fp32"
  local prec bound
  for prec in fp32 bf16; do
    local hf_flags=() ours=()
    [ "$device" = cuda ] && hf_flags+=(--cuda)
    bound=1e-5; [ "$device" = cuda ] && bound=1e-3
    if [ $prec = bf16 ]; then hf_flags+=(--bf16); ours=(--set train.precision=\"bf16\"); bound=0.01; fi
    "$py" "$sup/hf.py" compare-logits "$ft/qwen2" "$ft/qwen2.probe" "${hf_flags[@]}" >"$work/ft-compare-$prec.json" 2>>"$work/ft-logits.log"
    run ft-$prec --device "$device" --steps 1 "${lm[@]}" "${ours[@]}" && s=ok || s=FAIL
    read -r rel st < <(within "$(field "$work/ft-$prec/summary.json" first_loss)" "$(field "$work/ft-compare-$prec.json" hf_loss)" $bound)
    [ "$s" = ok ] && s=$st
    row "qwen2 $prec loss vs HF" "$s" "$(field "$work/ft-$prec/summary.json" first_loss) vs $(field "$work/ft-compare-$prec.json" hf_loss), rel. $rel" "bound $bound; the same batch, transformers on the same device"
  done

  local chat=(--device "$device" --set model.kind=llama --set "model.init_from=$ft/chat" --set data.kind=chat
    --set "data.path=$ft/chat/chat.jsonl" --set "data.tokens_cache=$ft/cache" --set data.packing=true
    --set data.max_seq_len=256 --set data.batch_size=2 --set train.eval_every=0 --set optim.warmup_steps=0)
  run ft-chat --steps 20 "${chat[@]}" && s=ok || s=FAIL
  a=$(field "$work/ft-chat/summary.json" first_loss) b=$(field "$work/ft-chat/summary.json" final_loss)
  "$py" -c "import sys; sys.exit(0 if float(sys.argv[2]) < float(sys.argv[1]) else 1)" "$a" "$b" 2>/dev/null || s=FAIL
  row "chat rows, packed" "$s" "loss $a -> $b, $(field "$work/ft-chat/summary.json" trained_tokens) trained tokens" "20 steps; the loss falls"

  run ft-ckpt --steps 20 "${chat[@]}" --set train.activation_checkpointing=\"full\" && s=ok || s=FAIL
  a=$(field "$work/ft-chat/summary.json" final_loss) b=$(field "$work/ft-ckpt/summary.json" final_loss)
  [ -n "$a" ] && [ "$a" = "$b" ] || s=FAIL
  row "activation checkpointing" "$s" "final loss $b vs $a without" "bit for bit"
  local cfg="$root/configs/tiny-gpt.toml"
  run ckpt-dropout --config "$cfg" --device "$device" --steps 10 --set train.eval_every=0 --set model.dropout=0.1 --set train.activation_checkpointing=\"full\" && s=ok || s=FAIL
  run ckpt-dropout-ref --config "$cfg" --device "$device" --steps 10 --set train.eval_every=0 --set model.dropout=0.1
  a=$(field "$work/ckpt-dropout-ref/summary.json" final_loss) b=$(field "$work/ckpt-dropout/summary.json" final_loss)
  [ -n "$a" ] && [ "$a" = "$b" ] || s=FAIL
  row "checkpointing, dropout" "$s" "final loss $b vs $a without" "bit for bit: the recompute draws the same masks"

  run ft-lora --steps 20 "${chat[@]}" --set lora.rank=8 --set lora.alpha=16.0 && s=ok || s=FAIL
  a=$(field "$work/ft-chat/summary.json" first_loss) b=$(field "$work/ft-lora/summary.json" first_loss)
  [ -n "$a" ] && [ "$a" = "$b" ] || s=FAIL
  row "lora" "$s" "first loss $b (base $a), final $(field "$work/ft-lora/summary.json" final_loss)" "B = 0 at the start: the base's first loss exactly"

  run ft-chunk --steps 20 "${chat[@]}" --set train.loss_chunk=64 && s=ok || s=FAIL
  read -r rel st < <(within "$(field "$work/ft-chunk/summary.json" final_loss)" "$(field "$work/ft-chat/summary.json" final_loss)" 1e-4)
  [ "$s" = ok ] && s=$st
  row "chunked loss" "$s" "final loss $(field "$work/ft-chunk/summary.json" final_loss), rel. $rel to whole logits" "bound 1e-4"

  # DPO (docs/preference.md): preference pairs, each prompt once per pair, LoRA whose
  # reference is the base with the adapters off: the first loss is ln 2 exactly.
  if "$py" "$sup/dpo.py" make "$ft/dpo" 32 1 >>"$work/ft-make.log" 2>&1; then
    run ft-dpo --device "$device" --steps 20 --set model.kind=llama --set "model.init_from=$ft/dpo/policy" --set data.kind=preference \
      --set "data.path=$ft/dpo/conv.jsonl" --set data.packing=true --set data.batch_size=4 --set train.eval_every=0 \
      --set optim.warmup_steps=0 --set optim.lr=1e-2 --set lora.rank=8 && s=ok || s=FAIL
    a=$(field "$work/ft-dpo/summary.json" first_loss) b=$(field "$work/ft-dpo/summary.json" final_loss)
    "$py" -c "import sys, math, struct; f = struct.unpack('f', struct.pack('f', math.log(2)))[0]; sys.exit(0 if float(sys.argv[1]) == f and float(sys.argv[2]) < f else 1)" "$a" "$b" 2>/dev/null || s=FAIL
  else
    s=FAIL a="" b=""
  fi
  row "dpo, lora, packed" "$s" "loss $a -> $b" "20 steps; ln 2 exactly at the start (reference = adapters off), then falls"
}

started=$(date +%s)
echo "ptrain validation kit: device $device, python $py, out $out"
check
[ "$check" = 1 ] || steps
elapsed=$(( $(date +%s) - started ))

# The table, the rows as JSON, and the logs.
{
  echo "ptrain validation, device $device, $(date -u +%Y-%m-%dT%H:%M:%SZ), ${elapsed} s, $("$ptrain" --version 2>/dev/null)"
  printf '%-28s %-5s %s\n' step result figure
  awk -F'\t' '{ printf "%-28s %-5s %s%s\n", $1, $2, $3, ($4 == "" ? "" : "  (" $4 ")") }' "$rows"
} >"$out/summary.txt"
"$py" - "$rows" "$device" "$elapsed" >"$out/summary.json" <<'EOF'
import json, sys
rows = [dict(zip(("step", "result", "figure", "note"), l.rstrip("\n").split("\t"))) for l in open(sys.argv[1]) if l.strip()]
print(json.dumps({"device": sys.argv[2], "elapsed_s": int(sys.argv[3]), "rows": rows}, indent=1))
EOF
failed=$(awk -F'\t' '$2 == "FAIL"' "$rows" | wc -l)
tar -czf "$out/validate.tar.gz" -C "$out" --exclude='checkpoints' --exclude='traces' --exclude='wandb' --exclude='tensorboard' work
rm -rf "$work"
echo
cat "$out/summary.txt"
echo "wrote $out/summary.txt, $out/summary.json, $out/validate.tar.gz; $failed step(s) failed"
[ "$failed" -eq 0 ]
