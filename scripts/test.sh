#!/usr/bin/env bash
# Sets up everything (idempotent), builds the workspace and runs every test.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
scripts/bootstrap.sh
. scripts/env.sh
# One profile for the binary, the plugins, the tests and the benches: libtorch's
# bindings compile once.
cargo build --release --workspace --all-targets
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --release --workspace --no-fail-fast "$@"
else
  cargo test --release --workspace --no-fail-fast "$@"
fi
