#!/usr/bin/env bash
# What logging every step to a local `mlflow server` costs ptrain, next to fast mode,
# and what the Python client's log_metrics loop manages on the same server.
#   bench/mlflow.sh [--steps N] [--repeats N] [--threads N] [--workers N] [--no-build]
# Prints the rows of BENCHMARKS.md's "MLflow: logging every step". See bench/mlflow.py.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh
exec "$PTRAIN_PYTHON" bench/mlflow.py "$@"
