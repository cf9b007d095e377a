#!/usr/bin/env bash
# Tokenizing 100 MB of text: ptrain (`ptrain tokenize`, the tokenizers crate) against the
# Python tokenizers package's encode_batch / encode_batch_fast, on the same file, the same
# tokenizer and the same cores. Prints a Markdown table for BENCHMARKS.md.
#
#   bench/tokenize.sh                      # 100 MB generated text, a 32k byte-level BPE trained on it, all cores
#   bench/tokenize.sh --cores 0-1 --repeats 5
#   bench/tokenize.sh --text corpus.txt --tokenizer models/gpt2/tokenizer.json
#
# Nothing is downloaded. For GPT-2's own tokenizer, fetch it first:
#   hf download openai-community/gpt2 tokenizer.json --local-dir models/gpt2
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
. scripts/env.sh

mb=100 repeats=3 cores="" text="" tokenizer="" build=1
while [ $# -gt 0 ]; do
  case "$1" in
    --mb) mb="$2"; shift 2 ;;
    --repeats) repeats="$2"; shift 2 ;;
    --cores) cores="$2"; shift 2 ;;
    --text) text="$2"; shift 2 ;;
    --tokenizer) tokenizer="$2"; shift 2 ;;
    --no-build) build=0; shift ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -n "$cores" ] || cores="0-$(($(nproc) - 1))"
ncores=$(taskset -c "$cores" nproc)
py="$root/.venv/bin/python"
out="$root/bench/out/tokenize"
mkdir -p "$out"
[ "$build" = 1 ] && cargo build --release --workspace --all-targets >&2

if [ -z "$text" ]; then
  text="$out/text-${mb}mb.txt"
  [ -f "$text" ] || "$py" bench/tokenize_text.py make-text "$text" "$mb"
fi
if [ -z "$tokenizer" ]; then
  tokenizer="$out/bpe-32k.json"
  [ -f "$tokenizer" ] || "$py" bench/tokenize_text.py train-tokenizer "$text" "$tokenizer" 32000
fi
export RAYON_NUM_THREADS="$ncores" TOKENIZERS_PARALLELISM=true

median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
ptrain_rates=() ptrain_walls=() py_rates=() py_fast_rates=() tokens="" py_tokens=""
for i in $(seq "$repeats"); do
  cache="$(mktemp -d "$out/cache.XXXX")"
  start=$(date +%s.%N)
  row=$(taskset -c "$cores" target/release/ptrain tokenize --json --set data.kind=text \
    --set "data.path=$text" --set "data.tokenizer=$tokenizer" --set "data.tokens_cache=$cache" | head -1)
  end=$(date +%s.%N)
  rm -rf "$cache"
  tokens=$(echo "$row" | "$py" -c 'import json,sys; print(json.load(sys.stdin)["tokens"])')
  ptrain_rates+=("$(echo "$row" | "$py" -c 'import json,sys; print(json.load(sys.stdin)["tokens_per_s"])')")
  ptrain_walls+=("$(echo "$tokens $start $end" | awk '{print $1 / ($3 - $2)}')")
  rep=$(taskset -c "$cores" "$py" bench/tokenize_text.py encode "$tokenizer" "$text")
  py_tokens=$(echo "$rep" | "$py" -c 'import json,sys; print(json.load(sys.stdin)["encode_batch"]["tokens"])')
  py_rates+=("$(echo "$rep" | "$py" -c 'import json,sys; print(json.load(sys.stdin)["encode_batch"]["tokens_per_s"])')")
  py_fast_rates+=("$(echo "$rep" | "$py" -c 'import json,sys; print(json.load(sys.stdin)["encode_batch_fast"]["tokens_per_s"])')")
  echo "round $i: ptrain ${ptrain_rates[-1]} tokens/s, Python encode_batch ${py_rates[-1]} tokens/s" >&2
done
if [ "$tokens" != "$py_tokens" ]; then
  echo "token counts differ: ptrain $tokens, Python $py_tokens" >&2
  exit 1
fi
p=$(printf '%s\n' "${ptrain_rates[@]}" | median)
pw=$(printf '%s\n' "${ptrain_walls[@]}" | median)
q=$(printf '%s\n' "${py_rates[@]}" | median)
qf=$(printf '%s\n' "${py_fast_rates[@]}" | median)
bytes=$(stat -c %s "$text")
echo
echo "$(basename "$text") ($((bytes / 1000000)) MB, $tokens tokens), tokenizer $(basename "$tokenizer"), cores $cores ($ncores threads), medians of $repeats:"
echo
echo "| | tokens/s | ratio |"
echo "| --- | ---: | ---: |"
printf '| ptrain tokenize (encoding and writing the cache) | %.0f | %.2f |\n' "$p" "$(echo "$p $q" | awk '{print $1/$2}')"
printf '| ptrain tokenize, whole process (start-up, hashing, tokenizer load) | %.0f | %.2f |\n' "$pw" "$(echo "$pw $q" | awk '{print $1/$2}')"
printf '| Python tokenizers encode_batch | %.0f | 1 |\n' "$q"
printf '| Python tokenizers encode_batch_fast | %.0f | %.2f |\n' "$qf" "$(echo "$qf $q" | awk '{print $1/$2}')"
