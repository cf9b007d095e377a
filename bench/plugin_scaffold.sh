#!/usr/bin/env bash
# How long the first `cargo build --release` of each `ptrain plugins new` template takes
# on this machine's ptrain build, and what it had to compile.
#   bench/plugin_scaffold.sh            (prints a Markdown table; a few minutes)
# For the figures in BENCHMARKS.md, run it on a quiet machine right after
# `cargo build --release --workspace --all-targets`. The crates build in a fresh plugin
# build cache (PTRAIN_HOME in a temporary directory), which `ptrain plugins new` seeds from
# ptrain's build (not timed): the first tensor-reading plugin compiles tch and plugin-api
# once into it (their features depend on the whole dependency graph; torch-sys is reused),
# and every later one finds them ("again" rows).
# The builds run without scripts/env.sh's variables, as in an author's shell.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh
cargo build --release --quiet --workspace --all-targets
ptrain=$PWD/target/release/ptrain
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export PTRAIN_HOME=$work/ptrain-home

echo "| template | wall time | torch-sys | compiled |"
echo "|---|---|---|---|"
measure() {  # label name [--sink]
    local label=$1 name=$2 dir=$work/$2
    shift 2
    "$ptrain" plugins new "$name" "$@" --dir "$dir" >/dev/null
    local start end
    start=$(date +%s.%N)
    (cd "$dir" && env -u LIBTORCH_USE_PYTORCH -u VIRTUAL_ENV -u LD_LIBRARY_PATH cargo build --release -v) >"$dir.log" 2>&1 \
        || { cat "$dir.log" >&2; exit 1; }
    end=$(date +%s.%N)
    local torch compiled
    if grep -q 'Fresh torch-sys' "$dir.log"; then torch=reused
    elif grep -q 'Compiling torch-sys' "$dir.log"; then torch=compiled
    else torch="not used"; fi
    compiled=$(grep -oP '^\s+Compiling \K\S+' "$dir.log" | paste -sd' ' -)
    printf '| %s | %.1f s | %s | %s |\n' "$label" "$(echo "$end - $start" | bc)" "$torch" "$compiled"
}
measure "inline (reads gradients)" gradwatch
measure "inline, again" gradwatch-again
measure "sink (CSV)" csvsink --sink
measure "sink, again" csvsink-again --sink
