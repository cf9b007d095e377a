#!/usr/bin/env bash
# ptrain's benchmarks in one command: sets up the libtorch environment
# (scripts/env.sh) and runs bench/run.py with the project venv's python.
#   bench/run.sh [--quick] [--write] [--device cuda] [--repeats N] ...
# See bench/README.md.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh
exec "$PTRAIN_PYTHON" bench/run.py "$@"
