#!/usr/bin/env bash
# Sets up everything (idempotent), builds the workspace and runs every test.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
scripts/bootstrap.sh
. scripts/env.sh
# A plugin crate's dependency graph alone (examples/plugin-entropy depends on exactly what an
# inline `ptrain plugins new` crate does): the workspace build compiles serde, syn, tch,
# abi_stable, zip, ndarray, ... with the features of the whole workspace, a plugin's smaller
# graph needs variants of its own; `ptrain plugins new` seeds its build cache with these, so a
# first plugin build compiles only plugin-api and the plugin (docs/plugins.md, section 9). Built
# before the workspace: both write the one libptrain_plugin_entropy.so, which the workspace's build
# must leave as its own (a later build, scripts/bundle.sh's, then compiles nothing).
cargo build --release -p ptrain-example-plugin-entropy
# One profile for the binary, the plugins, the tests and the benches: libtorch's
# bindings compile once.
cargo build --release --workspace --all-targets
# Tests that cannot check their point here (no right to mount, ...) say SKIP and
# are listed here after the run; .ci/run sets PTRAIN_TEST_NO_SKIPS, which fails them.
export PTRAIN_TEST_SKIPS="$root/target/test-skips.txt"
rm -f "$PTRAIN_TEST_SKIPS"
status=0
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --release --workspace --no-fail-fast "$@" || status=$?
else
  # One thread: tests seed libtorch's one global generator (nextest gives each its
  # own process).
  cargo test --release --workspace --no-fail-fast "$@" -- --test-threads=1 || status=$?
fi
if [ -s "$PTRAIN_TEST_SKIPS" ]; then
  echo "SKIPPED: $(wc -l <"$PTRAIN_TEST_SKIPS") test(s) could not check their point on this machine:" >&2
  sed 's/^/  /' "$PTRAIN_TEST_SKIPS" >&2
fi
exit "$status"
