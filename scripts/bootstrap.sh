#!/usr/bin/env bash
# Idempotent set-up of everything ptrain needs on a fresh Debian machine:
#   - Debian packages: a C++ toolchain, libgloo-dev (Gloo headers for the c10d shim),
#     libgoogle-perftools-dev (tcmalloc, linked into the binary: build.rs) and libpython3-dev
#     (the shared libpython the `python` plugin embeds: plugins/python);
#   - a project-local .venv with PyPI torch==2.11.0 (libtorch for tch) and the pinned test tools.
# Only package registries are contacted. Re-running does nothing when all is in place.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv="${PTRAIN_VENV:-$root/.venv}"
reqs="$root/scripts/requirements.txt"

# The .venv (~6 GB) and a cold release build (~10-15 GB of target/) need room; a full disk fails
# later inside pip or the linker with a traceback that does not say so.
free_gb=$(df -Pk "$root" | awk 'NR==2 {print int($4 / 1048576)}')
if [ "${free_gb:-0}" -lt 25 ]; then
  echo "bootstrap: warning: only ${free_gb} GB free on $(df -P "$root" | awk 'NR==2 {print $6}'); the .venv and a cold build need about 25 GB" >&2
fi

need_debs=()
for pkg in libgloo-dev g++ pkg-config libgoogle-perftools-dev libpython3-dev; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need_debs+=("$pkg")
done
if [ ${#need_debs[@]} -gt 0 ]; then
  echo "bootstrap: installing Debian packages: ${need_debs[*]}"
  sudo_cmd=""; [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${need_debs[@]}" >/dev/null
fi

stamp="$venv/.ptrain-requirements"
if [ -x "$venv/bin/python" ] && [ -f "$stamp" ] && cmp -s "$stamp" "$reqs"; then
  echo "bootstrap: $venv is up to date"
else
  [ -x "$venv/bin/python" ] || { echo "bootstrap: creating $venv"; python3 -m venv "$venv"; }
  echo "bootstrap: installing $(grep -c '==' "$reqs") pinned packages into $venv (torch is ~4.6 GB the first time)"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$reqs"
  cp "$reqs" "$stamp"
fi
"$venv/bin/python" - <<'PY'
import torch
assert torch.__version__.split("+")[0] == "2.11.0", torch.__version__
print(f"bootstrap: torch {torch.__version__} at {torch.__path__[0]}")
PY
