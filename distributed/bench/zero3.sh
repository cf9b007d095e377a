#!/usr/bin/env bash
# The four sharding stages on the CPU: 2 Gloo ranks (ptrain launch), one thread each, dist.shard = none /
# optimizer / gradients / parameters (and parameters with reshard_after_forward = false, and with
# offload_optimizer = true), for
#   gpt100m:    a GPT of 14 layers, width 768, 12 heads, context 256, bytes (about 99M parameters), batch 2 per rank
#   qwen2-0.5b: the Qwen2-0.5B shape (24 layers, width 896, 14 heads, 2 KV heads, intermediate 4864, vocabulary
#               151,936, tied head, q/k/v biases: 494M parameters), 1 x 128 positions per rank
#   [MODES="none parameters ..."] [PRECISION=bf16] [PTRAIN_BIN=path] distributed/bench/zero3.sh [rounds=1] [steps=4] [models="gpt100m qwen2-0.5b"] [layers=full]
# `layers` overrides both models' depth (a check at small size: `distributed/bench/zero3.sh 1 2 "gpt100m qwen2-0.5b" 2`).
# Prints per model and mode: median ms/step, rank 0's ms/step in collectives, each rank's peak RSS (and its peak
# once the model was loaded, before the optimizer's buffers: `rank_load_peak_memory_bytes`) and the bytes
# it holds between steps (parameters, gradient, optimizer state), all from summary.json, and the bytes one step
# sends per rank by the formula (ring algorithms, W = 2: all-reduce 2(W-1)/W x 4N, all-gather and reduce-scatter
# (W-1)/W x 4N each; on Gloo a reduce-scatter is an all-reduce). PRECISION=bf16: every run in train.precision = "bf16"
# (parameters gathers its blocks in bf16: the formula counts the gathers at 2 bytes an element, unit 0's too, which
# stays float32, so it is a lower bound there), and `gathered_block_bytes` (the largest block gathered) is printed.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
. scripts/env.sh
rounds=${1:-1}
steps=${2:-4}
models=${3:-gpt100m qwen2-0.5b}
layers=${4:-}
# PTRAIN_BIN: another build's binary (another checkout's target/release/ptrain), to compare.
bin=${PTRAIN_BIN:-target/release/ptrain}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
common=(run --device cpu --quiet --steps "$steps" --set run.threads=1 --set train.eval_every=0 --set train.eval_batches=1
  --set model.dropout=0.0 --set train.precision="${PRECISION:-fp32}")
depth() { [ -n "$layers" ] && echo "$layers" || echo "$1"; }
args_for() {
  case $1 in
    gpt100m) echo --set model.kind=gpt --set model.n_layer="$(depth 14)" --set model.n_embd=768 --set model.n_head=12 \
      --set model.block_size=256 --set data.batch_size=2 ;;
    qwen2-0.5b) echo --set model.kind=llama --set model.n_layer="$(depth 24)" --set model.n_embd=896 --set model.n_head=14 \
      --set model.llama.n_kv_head=2 --set model.llama.intermediate_size=4864 --set model.vocab_size=151936 \
      --set model.llama.tie_embeddings=true --set model.llama.qkv_bias=true --set model.llama.rope_theta=1000000.0 \
      --set model.block_size=128 --set data.batch_size=1 ;;
  esac
}
modes=${MODES:-none optimizer gradients parameters parameters-kept parameters-offload}
for i in $(seq "$rounds"); do
  for model in $models; do
    for mode in $modes; do
      # shellcheck disable=SC2046
      set -- $(args_for "$model")
      case $mode in
        parameters-kept) shard=(--set dist.shard=parameters --set dist.reshard_after_forward=false) ;;
        parameters-offload) shard=(--set dist.shard=parameters --set dist.offload_optimizer=true) ;;
        *) shard=(--set dist.shard=$mode) ;;
      esac
      PTRAIN_LOG=warn "$bin" launch --nproc 2 -- "${common[@]}" "$@" "${shard[@]}" --run-dir "$out/$model-$mode-$i" >/dev/null
    done
  done
done
python3 - "$out" "$rounds" "$models" "$modes" "${PRECISION:-fp32}" <<'PY'
import json, statistics, sys
out, rounds, models, modes, precision = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4].split(), sys.argv[5]
mib = lambda b: f"{b / 2**20:.0f}"
W = 2
for model in models:
    for mode in modes:
        s = [json.load(open(f"{out}/{model}-{mode}-{i}/summary.json")) for i in range(1, rounds + 1)]
        ms = [1000 * r["wall_s"] / r["steps"] for r in s]
        coll = [1000 * r["collective_s"] / r["steps"] for r in s]
        r = s[0]
        n = 4 * r["trainable_parameters"]
        ring = (W - 1) / W * n
        gather = ring / 2 if precision == "bf16" else ring
        formula = {"none": 2 * ring, "optimizer": 3 * ring, "gradients": 2 * ring, "parameters": 2 * gather + ring,
                   "parameters-kept": gather + ring, "parameters-offload": 2 * gather + ring}[mode]
        gloo = formula + (ring if mode.startswith("parameters") or mode == "gradients" else 0)
        print(f"{model:10} {mode:15} {r['parameters']:>10} params: {statistics.median(ms):9.1f} ms/step "
              f"(collectives {statistics.median(coll):8.1f}); per rank MiB: peak RSS "
              f"{'/'.join(map(mib, r['rank_peak_memory_bytes']))} (loaded: {'/'.join(map(mib, r.get('rank_load_peak_memory_bytes', [])))}), parameters {'/'.join(map(mib, r['parameter_bytes']))}, "
              f"gradient {'/'.join(map(mib, r['gradient_bytes']))}, optimizer {'/'.join(map(mib, r['optimizer_state_bytes']))}, "
              f"largest block gathered {'/'.join(map(mib, r.get('gathered_block_bytes', [])))}; "
              f"sent per step and rank by the formula {mib(formula)} MiB ({mib(gloo)} on Gloo)")
PY
