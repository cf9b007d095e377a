# Environment for building and running ptrain against the project-local libtorch.
# Source it: `. scripts/env.sh`. Safe to source repeatedly.
_ptrain_root=$(cd "$(dirname "${BASH_SOURCE[0]:-$0}")/.." && pwd)
export PTRAIN_ROOT="$_ptrain_root"
export VIRTUAL_ENV="${PTRAIN_VENV:-$_ptrain_root/.venv}"
case ":$PATH:" in *":$VIRTUAL_ENV/bin:"*) ;; *) export PATH="$VIRTUAL_ENV/bin:$PATH" ;; esac
# `ptrain` itself: this checkout's release build (after `cargo build --release`).
case ":$PATH:" in *":$_ptrain_root/target/release:"*) ;; *) export PATH="$_ptrain_root/target/release:$PATH" ;; esac
# torch-sys asks this venv's python where libtorch lives (tch's LIBTORCH_USE_PYTORCH mode).
export LIBTORCH_USE_PYTORCH=1
_ptrain_torch_lib=$(ls -d "$VIRTUAL_ENV"/lib/python3*/site-packages/torch/lib 2>/dev/null | head -n 1)
if [ -n "$_ptrain_torch_lib" ]; then
  export PTRAIN_TORCH_LIB="$_ptrain_torch_lib"
  case ":${LD_LIBRARY_PATH:-}:" in *":$_ptrain_torch_lib:"*) ;; *) export LD_LIBRARY_PATH="$_ptrain_torch_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ;; esac
fi
export PTRAIN_PYTHON="$VIRTUAL_ENV/bin/python"
# The interpreter the `python` plugin embeds (pyo3 builds against its libpython).
export PYO3_PYTHON="$PTRAIN_PYTHON"
unset _ptrain_root _ptrain_torch_lib
