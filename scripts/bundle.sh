#!/usr/bin/env bash
# The validation kit in one folder, small enough for the device tool (at most 64
# MiB travels): stripped copies of the ptrain binary, the plugins, the bare-tch
# benchmark loop and the one-rank collective smoke program, plus the configs, the
# bench scripts, the tests' Python helpers and gpu/validate.sh. See docs/gpu.md.
#
#   scripts/bundle.sh OUT_DIR              # builds the workspace first, as scripts/test.sh does
#   scripts/bundle.sh --no-build OUT_DIR   # uses target/release as it is
#
# The build is scripts/test.sh's own (`--workspace --all-targets`, release): a narrower package
# selection unifies other features and relinks the binary the tests run, so after the tests'
# build the bundle's build compiles nothing.
#
# Stripping uses `strip --strip-debug` on copies: the symbol table stays (a
# backtrace still names functions), the DWARF line tables go. target/ keeps its
# line tables ([profile.release] debug = "line-tables-only"): development builds
# want file:line in panic backtraces; the bundle and installs do not need them.
set -euo pipefail
build=1
while [ $# -gt 0 ]; do
  case "$1" in
    --no-build) build=0; shift ;;
    -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
    -*) echo "error: unknown option \`$1\`" >&2; exit 2 ;;
    *) break ;;
  esac
done
[ $# -eq 1 ] || { echo "usage: scripts/bundle.sh [--no-build] OUT_DIR" >&2; exit 2; }
root=$(cd "$(dirname "$0")/.." && pwd)
out=$1
plugins=(checkpoint csv dataset-metrics early-stop flops health jsonl mlflow perf tensorboard trace wandb)
if [ "$build" = 1 ]; then
  . "$root/scripts/env.sh"
  (cd "$root" && cargo build --release --workspace --all-targets)
fi
# PTRAIN_RELEASE_DIR: another build directory (the tests pass theirs).
rel="${PTRAIN_RELEASE_DIR:-${CARGO_TARGET_DIR:-$root/target}/release}"
for f in "$rel/ptrain" "$rel/bare-tch" "$rel/examples/collectives"; do
  [ -x "$f" ] || { echo "error: $f is missing: build first (without --no-build this script does)" >&2; exit 2; }
done
command -v strip >/dev/null || { echo "error: \`strip\` (binutils) is needed" >&2; exit 2; }

rm -rf "$out"
mkdir -p "$out/bin" "$out/gpu" "$out/tests/support" "$out/bench/configs"
# Plugins beside the binary: ptrain looks for them in its own directory.
# The executables lose their symbol tables too (about 9 MiB: the Parquet and Arrow
# readers put the bundle over the device's 64 MiB otherwise); a panic's backtrace
# on the device then shows addresses, not names. The plugins keep theirs.
strip --strip-all -o "$out/bin/ptrain" "$rel/ptrain"
strip --strip-all -o "$out/bin/bare-tch" "$rel/bare-tch"
strip --strip-all -o "$out/bin/collectives" "$rel/examples/collectives"
for p in "${plugins[@]}"; do
  so="$rel/libptrain_plugin_${p//-/_}.so"
  [ -f "$so" ] || { echo "error: $so is missing: build first" >&2; exit 2; }
  strip --strip-debug -o "$out/bin/$(basename "$so")" "$so"
done
cp -r "$root/configs" "$out/"
cp "$root"/bench/*.py "$root"/bench/*.sh "$root"/bench/*.md "$root"/bench/requirements.txt "$out/bench/"
cp "$root"/bench/configs/* "$out/bench/configs/"
cp "$root"/tests/support/*.py "$out/tests/support/"
cp "$root"/gpu/*.sh "$root"/gpu/*.py "$out/gpu/"
cp "$root/docs/gpu.md" "$out/README.md"
cp "$root/Cargo.lock" "$out/"
# The commit the binaries were built from (bench/run.py reports it; a bundle has no .git).
(cd "$root" && git describe --always --dirty 2>/dev/null || echo unknown) >"$out/COMMIT"
bytes=$(du -sb "$out" | cut -f1)
awk -v b="$bytes" -v n="$(find "$out" -type f | wc -l)" -v o="$out" 'BEGIN { printf "bundle %s: %d files, %.1f MiB (%d bytes)\n", o, n, b / 1048576, b }'
