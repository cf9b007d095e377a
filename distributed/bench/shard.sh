#!/usr/bin/env bash
# Sharded data parallelism on the CPU: 2 Gloo ranks (ptrain launch), one thread each,
# dist.shard = none / optimizer / gradients, alternating rounds, for
#   tiny: configs/tiny-gpt.toml (about 0.1M parameters), batch 16 per rank
#   24m:  a GPT of 6 layers, 8 heads, width 576, context 128 (about 24M parameters), batch 4 per rank
#   distributed/bench/shard.sh [rounds=3] [steps=100]     (24m runs steps/10 steps)
# Prints per model and mode: median ms/step, rank 0's collective ms/step, and per-rank
# optimizer state, gradient held between steps and gradient at the reduction (MiB),
# all from summary.json.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
. scripts/env.sh
rounds=${1:-3}
steps=${2:-100}
bin=target/release/ptrain
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
common=(run --device cpu --quiet --set run.threads=1 --set train.eval_every=0 --set train.eval_batches=1)
tiny=("${common[@]}" --config configs/tiny-gpt.toml --steps "$steps" --set data.batch_size=16)
big=("${common[@]}" --steps "$((steps / 10))" --set model.n_layer=6 --set model.n_head=8 --set model.n_embd=576
  --set model.block_size=128 --set data.batch_size=4)
for i in $(seq "$rounds"); do
  for mode in none optimizer gradients; do
    PTRAIN_LOG=warn "$bin" launch --nproc 2 -- "${tiny[@]}" --set dist.shard=$mode --run-dir "$out/tiny-$mode-$i" >/dev/null
    PTRAIN_LOG=warn "$bin" launch --nproc 2 -- "${big[@]}" --set dist.shard=$mode --run-dir "$out/24m-$mode-$i" >/dev/null
  done
done
python3 - "$out" "$rounds" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
mib = lambda b: f"{b / 2**20:.2f}"
for model in ["tiny", "24m"]:
    for mode in ["none", "optimizer", "gradients"]:
        s = [json.load(open(f"{out}/{model}-{mode}-{i}/summary.json")) for i in range(1, rounds + 1)]
        ms = [1000 * r["wall_s"] / r["steps"] for r in s]
        coll = [1000 * r["collective_s"] / r["steps"] for r in s]
        r = s[0]
        print(f"{model:4} {mode:9} {r['parameters']:>10} params: {statistics.median(ms):8.2f} ms/step "
              f"(runs: {', '.join(f'{m:.2f}' for m in ms)}), collective {statistics.median(coll):7.2f} ms/step; "
              f"per rank MiB: optimizer {'/'.join(map(mib, r['optimizer_state_bytes']))}, "
              f"gradient {'/'.join(map(mib, r['gradient_bytes']))}, "
              f"at reduction {'/'.join(map(mib, r['gradient_peak_bytes']))}")
PY
