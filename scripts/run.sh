#!/usr/bin/env bash
# Sets up everything (idempotent), builds ptrain and its plugins, and trains on the
# embedded default configuration (CUDA when available, else the CPU). Extra
# arguments go to `ptrain run`, e.g. scripts/run.sh --plugins jsonl,tensorboard
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
scripts/bootstrap.sh
. scripts/env.sh
cargo build --release --workspace
exec target/release/ptrain run "$@"
