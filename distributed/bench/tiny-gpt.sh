#!/usr/bin/env bash
# Step time of the tiny GPT (configs/tiny-gpt.toml) on the CPU: 1 rank vs 2 Gloo ranks
# with the same per-rank batch (16), one thread per rank, alternating rounds.
#   distributed/bench/tiny-gpt.sh [rounds=5] [steps=200]
# Prints the median ms/step of each, and rank 0's collective ms/step for 2 ranks.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
. scripts/env.sh
rounds=${1:-5}
steps=${2:-200}
bin=target/release/ptrain
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
args=(run --config configs/tiny-gpt.toml --device cpu --quiet --steps "$steps" --set run.threads=1)
for i in $(seq "$rounds"); do
  PTRAIN_LOG=warn "$bin" "${args[@]}" --run-dir "$out/one-$i" >/dev/null
  PTRAIN_LOG=warn "$bin" launch --nproc 2 -- "${args[@]}" --run-dir "$out/two-$i" >/dev/null
done
python3 - "$out" "$rounds" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def runs(kind):
    return [json.load(open(f"{out}/{kind}-{i}/summary.json")) for i in range(1, rounds + 1)]
for kind, label in [("one", "1 rank "), ("two", "2 ranks")]:
    s = runs(kind)
    ms = [1000 * r["wall_s"] / r["steps"] for r in s]
    coll = [1000 * r["collective_s"] / r["steps"] for r in s]
    print(f"{label}: {statistics.median(ms):6.2f} ms/step (runs: {', '.join(f'{m:.2f}' for m in ms)}), "
          f"collective {statistics.median(coll):5.2f} ms/step, {statistics.median(r['samples_per_s'] for r in s):6.0f} samples/s, "
          f"{s[0]['parameters']} parameters")
PY
