#!/usr/bin/env bash
# Sets up everything (idempotent), builds ptrain and its plugins, and trains on the
# embedded default configuration (CUDA when available, else the CPU). Extra
# arguments go to `ptrain run`, e.g. scripts/run.sh --plugins jsonl,tensorboard
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
cargo build --release --workspace
exec target/release/ptrain run "$@"
