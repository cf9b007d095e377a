#!/usr/bin/env bash
# The health / trace / early-stop benchmark (issue 16): the seeds' way of watching
# a run against the plugins at their default cadences, and the trace plugin
# outside its windows against fast mode. Builds what it runs first.
#   bench/health_trace.sh [--repeats 7] [--threads 1] [--models mlp,gpt] [--steps N]
# See bench/health_trace.py.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh
cargo build --release --workspace --all-targets  # the tests' build: a package subset would relink the binary
exec "$PTRAIN_PYTHON" bench/health_trace.py "$@"
