#!/usr/bin/env bash
# The llama kind on the CPU: a Qwen2-shaped model (8 layers, width 512, 8 heads, 2 KV heads,
# intermediate 1408, vocabulary 32,000, context 512, tied head) trained by ptrain, by a plain
# PyTorch loop over transformers' Qwen2ForCausalLM, and by transformers.Trainer: the same
# weights (made by transformers, ptrain starts from them with model.init_from), the same
# first batch (ptrain's, dumped with `ptrain logits`), AdamW with clipping, fp32 and bf16
# autocast. Then greedy generation: `ptrain generate` against model.generate.
# Prints a Markdown table for BENCHMARKS.md. Run it on a quiet machine.
#
#   bench/llama.sh                      # 8 steps per contender, batch 2 x 512, all cores
#   bench/llama.sh --steps 12 --batch 4 --threads 2
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
. scripts/env.sh

steps=8 batch=2 threads=$(nproc) build=1
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) steps="$2"; shift 2 ;;
    --batch) batch="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --no-build) build=0; shift ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
py="$root/.venv/bin/python"
out="$root/bench/out/llama"
mkdir -p "$out"
[ "$build" = 1 ] && cargo build --release --workspace --all-targets >&2
ptrain="$root/target/release/ptrain"
model="$out/qwen2-shaped" tokens="$out/tokens.bin"
[ -f "$model/config.json" ] || "$py" bench/llama.py make "$model" "$tokens"
common=(--device cpu --set "run.threads=$threads" --set "model.init_from=$model" --set data.kind=tokens --set "data.path=$tokens"
  --set data.max_seq_len=512 --set "data.batch_size=$batch" --set optim.lr=1e-4 --set optim.min_lr=0 --set optim.warmup_steps=0
  --set optim.schedule=constant --set train.eval_every=0 --set train.eval_batches=1)
"$ptrain" logits --split train --step 1 --out "$out/batch.safetensors" "${common[@]:2}" >&2

json() { "$py" -c "import json,sys; d=json.loads(sys.stdin.read().strip().splitlines()[-1]); print($1)"; }
rows=()
for precision in fp32 bf16; do
  rm -rf "$out/run-$precision"
  "$ptrain" run --quiet --steps "$steps" --run-dir "$out/run-$precision" --set "train.precision=$precision" "${common[@]}" >&2
  s="$out/run-$precision/summary.json"
  ours=$("$py" -c "import json; s=json.load(open('$s')); print(s['steps_per_s'], s['first_loss'], s['peak_memory_bytes']/2**20)")
  loop=$("$py" bench/llama.py loop "$model" "$out/batch.safetensors" "$steps" "$precision" "$threads")
  trainer=$("$py" bench/llama.py trainer "$model" "$out/batch.safetensors" "$steps" "$precision" "$threads" 2>/dev/null | tail -n 1)
  read -r o_sps o_loss o_mem <<<"$ours"
  l_sps=$(echo "$loop" | json 'd["steps_per_s"]'); l_loss=$(echo "$loop" | json 'd["first_loss"]'); l_mem=$(echo "$loop" | json 'd["peak_rss_mb"]')
  t_sps=$(echo "$trainer" | json 'd["steps_per_s"]'); t_loss=$(echo "$trainer" | json 'd["first_loss"]'); t_mem=$(echo "$trainer" | json 'd["peak_rss_mb"]')
  rows+=("$(printf '| %s | %.3f | %.3f | %.3f | **%.2fx** | %.2fx | %.6f / %.6f / %.4f | %.0f / %.0f / %.0f |' \
    "$precision" "$o_sps" "$l_sps" "$t_sps" "$(echo "$o_sps / $l_sps" | bc -l)" "$(echo "$o_sps / $t_sps" | bc -l)" \
    "$o_loss" "$l_loss" "$t_loss" "$o_mem" "$l_mem" "$t_mem")")
done

gen_rows=()
for new in 64 256; do
  ours=$("$ptrain" generate --device cpu --checkpoint "$model" --prompt-ids "$(seq -s, 1 32)" --max-new-tokens "$new" --temperature 0 --json 2>/dev/null)
  theirs=$("$py" bench/llama.py generate "$model" 32 "$new" "$threads" 2>/dev/null | tail -n 1)
  o=$(echo "$ours" | json 'd["tokens_per_s"]'); t=$(echo "$theirs" | json 'd["tokens_per_s"]')
  gen_rows+=("$(printf '| 32 + %s | %.1f | %.1f | **%.2fx** |' "$new" "$o" "$t" "$(echo "$o / $t" | bc -l)")")
done

cat <<EOT
Qwen2-shaped model, batch $batch x 512 tokens, $steps steps each, $threads threads ($(nproc) cores), torch $("$py" -c 'import torch; print(torch.__version__)'), transformers $("$py" -c 'import transformers; print(transformers.__version__)').
Steps/s over all $steps steps (the first included, for every contender). Memory: ptrain's summary peak (RSS) / the Python processes' peak RSS, MiB.

| precision | ptrain steps/s | plain loop | Trainer | ptrain / loop | ptrain / Trainer | first loss: ptrain / loop / Trainer | peak MiB: ptrain / loop / Trainer |
| --- | --- | --- | --- | --- | --- | --- | --- |
$(printf '%s\n' "${rows[@]}")

Greedy generation (ptrain's key/value cache against model.generate's), tokens/s after the prompt:

| prompt + new tokens | ptrain generate | model.generate | ratio |
| --- | --- | --- | --- |
$(printf '%s\n' "${gen_rows[@]}")
EOT
