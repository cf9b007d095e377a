#!/usr/bin/env bash
# ptrain's per-step overhead in instructions, which unlike time does not move
# with the machine's noise: each contender runs N1 and N2 steps under callgrind
# and the difference, over N2 - N1, is what one more training step costs (set-up,
# the final eval and exit cancel out). Counts every thread, workers included.
#   bench/instructions.sh [mlp|gpt] [N1 N2]      (default: mlp 50 250; ~25 min)
# Prints a Markdown table. Needs valgrind (apt-get install valgrind).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh
command -v valgrind >/dev/null || { echo "bench/instructions.sh: needs valgrind (apt-get install valgrind)" >&2; exit 2; }
model=${1:-mlp} n1=${2:-50} n2=${3:-250}
case $model in
    mlp) plugins=(tensorboard wandb flops dataset-metrics perf checkpoint); data=(--set data.synthetic_len=4096) ;;
    gpt) plugins=(tensorboard wandb flops perf checkpoint); data=() ;;
    *) echo "bench/instructions.sh: model is mlp or gpt, not $model" >&2; exit 2 ;;
esac
# scripts/test.sh's build: a narrower package selection unifies other features and relinks
# the binary (the tests' and this script's would then differ); after the tests' build this
# compiles nothing.
cargo build --release --quiet --workspace --all-targets
common=(--config "bench/configs/$model.toml" --set run.threads=1 "${data[@]}")
list=$(IFS=,; echo "${plugins[*]}")
# Every scheduled attachment moved beyond the run: the plugins are loaded, never due.
idle=()
for p in "${plugins[@]}"; do
    for a in $(target/release/ptrain plugins info "$p" | awk '$2 == "hook" && $3 != "run_start" && $3 != "run_end" {print $1}'); do
        k="plugins.$p.$a"
        idle+=(--set "$k.every=1000000000" --set "$k.every_secs=0" --set "$k.first_step=false" --set "$k.at_end=false" --set "$k.at_eval=false" --set "$k.at_checkpoint=false")
    done
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
count() { # variant steps -> instructions
    local cmd
    case $1 in
        bare) cmd=(target/release/bare-tch "${common[@]}") ;;
        fast) cmd=(target/release/ptrain run "${common[@]}" --run-dir "$work/$1-$2") ;;
        idle) cmd=(target/release/ptrain run "${common[@]}" --run-dir "$work/$1-$2" --plugins "$list" "${idle[@]}") ;;
        plugins) cmd=(target/release/ptrain run "${common[@]}" --run-dir "$work/$1-$2" --plugins "$list") ;;
    esac
    valgrind --tool=callgrind --callgrind-out-file=/dev/null "${cmd[@]}" --steps "$2" --quiet >/dev/null 2>"$work/err"
    grep -o 'Collected : [0-9]*' "$work/err" | awk '{print $3}'
}
echo "| $model | instructions per step | / bare loop | / fast mode |"
echo "|---|---:|---:|---:|"
for v in bare fast idle plugins; do
    per=$(( ($(count $v "$n2") - $(count $v "$n1")) / (n2 - n1) ))
    [ $v = bare ] && bare=$per
    [ $v = fast ] && fast=$per
    echo "| $v | $per | $(awk "BEGIN {printf \"%.4f\", $per / $bare}") | $( [ $v = bare ] && echo - || awk "BEGIN {printf \"%.4f\", $per / $fast}") |"
done
