#!/usr/bin/env bash
# The Python packages gpu/lent.sh's `trl` step needs that the lent GPU machine's image lacks
# (docs/gpu.md): TRL and its `datasets` (with dill and multiprocess), and Liger-Kernel, as
# wheels for the image's Python 3.12 on x86-64 Linux, downloaded here (PyPI is reachable
# from this host, nothing is from the device). About 2 MiB; the image's pyarrow, fsspec,
# accelerate and transformers serve them (a mismatch shows as the step's import error).
#
#   gpu/wheels.sh DIR        # then carry DIR with the bundle: lent.sh installs DIR/*.whl
#
# The versions are the ones this repository's .venv tests against (TRL 1.16.0, datasets
# 5.2.0), and Liger-Kernel 0.8.5 (the release current with torch 2.11 and Triton 3.6).
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: gpu/wheels.sh DIR" >&2; exit 2; }
dir=$1
py=${PTRAIN_PYTHON:-python3}
mkdir -p "$dir"
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 any; do platforms+=(--platform "$p"); done
"$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${platforms[@]}" -d "$dir" \
  trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 liger-kernel==0.8.5
ls -la "$dir"
