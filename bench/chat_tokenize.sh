#!/usr/bin/env bash
# Tokenizing 1,000,000 chat rows (generated; Qwen2.5's chat template, a 32k byte-level BPE), in
# JSON Lines and in Parquet: `ptrain tokenize` (ids and trained-token masks, every core, into the
# cache) against `datasets.load_dataset(...).map(apply_chat_template, num_proc=cores)` (ids only)
# on the same rows, tokenizer and cores. Rows/s from the start of reading to the last row
# written, and the peak memory (ptrain: the process's maximum RSS; Python: the summed RSS of the
# process and its map workers). Prints a Markdown table for BENCHMARKS.md. Run it on a quiet
# machine; nothing is downloaded.
#
#   bench/chat_tokenize.sh                     # 1,000,000 rows, every core
#   bench/chat_tokenize.sh --rows 20000 --cores 0-1
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
. scripts/env.sh

rows=1000000 cores="" build=1
while [ $# -gt 0 ]; do
  case "$1" in
    --rows) rows="$2"; shift 2 ;;
    --cores) cores="$2"; shift 2 ;;
    --no-build) build=0; shift ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -n "$cores" ] || cores="0-$(($(nproc) - 1))"
ncores=$(taskset -c "$cores" nproc)
py="$root/.venv/bin/python"
out="$root/bench/out/chat-tokenize-$rows"
mkdir -p "$out"
[ "$build" = 1 ] && cargo build --release --workspace --all-targets >&2
[ -f "$out/rows.parquet" ] || "$py" bench/chat_rows.py make "$out" "$rows" >&2
export RAYON_NUM_THREADS="$ncores" TOKENIZERS_PARALLELISM=true

json() { "$py" -c "import json,sys; d=json.loads(sys.stdin.read().strip().splitlines()[$1]); print($2)"; }
table=()
for form in jsonl parquet; do
  cache="$(mktemp -d "$out/cache.XXXX")"
  start=$(date +%s.%N)
  report=$(taskset -c "$cores" /usr/bin/time -f "%M" -o "$out/rss" target/release/ptrain tokenize --json \
    --set model.kind=llama --set data.kind=chat --set "data.path=$out/rows.$form" \
    --set "data.tokenizer=$out/tokenizer/tokenizer.json" --set "data.tokens_cache=$cache" --set data.val_fraction=0.0001 \
    --set model.block_size=32768)
  end=$(date +%s.%N)
  rm -rf "$cache"
  ours=$(echo "$report" | json 0 'd["rows_per_s"]')
  tokens=$(echo "$report" | json 0 'd["tokens"]')
  ours_wall=$(echo "$rows $start $end" | awk '{print $1 / ($3 - $2)}')
  ours_mb=$(awk '{print $1 / 1024}' "$out/rss")
  theirs=$(taskset -c "$cores" "$py" bench/chat_rows.py map "$out" "$out/rows.$form" "$ncores" 2>/dev/null | tail -n 1)
  rm -rf "$out"/tmp*
  t_rate=$(echo "$theirs" | json -1 'd["rows_per_s"]'); t_mb=$(echo "$theirs" | json -1 'd["peak_rss_mb"]')
  t_tokens=$(echo "$theirs" | json -1 'd["tokens"]')
  if [ "$t_tokens" != None ] && [ "$t_tokens" != "$tokens" ]; then
    echo "token counts differ: ptrain $tokens, apply_chat_template $t_tokens" >&2
    exit 1
  fi
  table+=("$(printf '| %s | %.0f | %.0f | %.0f | **%.2fx** | %.0f / %.0f |' "$form" "$ours" "$ours_wall" "$t_rate" \
    "$(echo "$ours_wall / $t_rate" | bc -l)" "$ours_mb" "$t_mb")")
  echo "$form: ptrain $ours rows/s ($ours_wall with start-up), $tokens tokens; datasets.map $t_rate rows/s" >&2
done
echo
echo "$rows rows, cores $cores ($ncores), tokenizer 32k BPE with Qwen2.5's template:"
echo
echo "| form | ptrain rows/s (encoding) | ptrain rows/s (whole process) | datasets.map rows/s | ratio (whole process) | peak RSS MiB ptrain / Python |"
echo "| --- | ---: | ---: | ---: | ---: | --- |"
printf '%s\n' "${table[@]}"
