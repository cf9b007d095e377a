#!/usr/bin/env bash
# A Qwen3-MoE shape on the CPU (bench/moe.py: 0.49B parameters, 32 experts, top 4) trained by
# ptrain and by a plain PyTorch loop over transformers' Qwen3MoeForCausalLM (with its router
# loss), on the same weights (made by transformers; ptrain starts from them with
# model.init_from) and the same batch (ptrain's first, dumped with `ptrain logits`), AdamW with
# clipping, fp32, one thread each, run one after the other. transformers' experts run as its
# grouped_mm implementation (its default) and as its eager loop over the experts.
# Prints a Markdown table for BENCHMARKS.md.
#
#   bench/moe.sh --no-build --steps 4 --batch 2 [--impls "grouped_mm eager"]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
. scripts/env.sh

steps=4 batch=2 threads=1 build=1 impls="grouped_mm eager"
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) steps="$2"; shift 2 ;;
    --batch) batch="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --impls) impls="$2"; shift 2 ;;
    --no-build) build=0; shift ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
py="$root/.venv/bin/python"
out="$root/target/tmp/bench-moe"
mkdir -p "$out"
[ "$build" = 1 ] && cargo build --release --bin ptrain >&2
ptrain="$root/target/release/ptrain"
model="$out/qwen3-moe-shaped" tokens="$out/tokens.bin"
[ -f "$model/config.json" ] || "$py" bench/moe.py make "$model" "$tokens"
common=(--device cpu --set "run.threads=$threads" --set "model.init_from=$model" --set data.kind=tokens --set "data.path=$tokens"
  --set data.max_seq_len=512 --set "data.batch_size=$batch" --set optim.lr=1e-4 --set optim.min_lr=0 --set optim.warmup_steps=0
  --set optim.schedule=constant --set train.eval_every=0 --set train.eval_batches=1 --set data.val_fraction=0)
"$ptrain" logits --split train --step 1 --out "$out/batch.safetensors" "${common[@]:2}" >&2

json() { "$py" -c "import json,sys; d=json.loads(sys.stdin.read().strip().splitlines()[-1]); print($1)"; }
rm -rf "$out/run"
"$ptrain" run --quiet --steps "$steps" --run-dir "$out/run" --plugins jsonl --set plugins.jsonl.every=1 "${common[@]}" >&2
# Steps after the first, from the per-step times the jsonl sink logs.
ours=$("$py" -c "
import json
rows = [json.loads(l) for l in open('$out/run/metrics.jsonl') if 'time/step_s' in l]
s = json.load(open('$out/run/summary.json'))
t = sum(r['time/step_s'] for r in rows[1:])
print((len(rows) - 1) / t, (len(rows) - 1) * $batch * 512 / t, s['first_loss'], s['peak_memory_bytes'] / 2**20)")
read -r o_sps o_tps o_loss o_mem <<<"$ours"
echo "| contender | steps/s | tokens/s | ptrain / it | first loss | peak MiB |"
echo "| --- | --- | --- | --- | --- | --- |"
printf '| ptrain | %.4f | %.1f | | %.6f | %.0f |\n' "$o_sps" "$o_tps" "$o_loss" "$o_mem"
for impl in $impls; do
  r=$("$py" bench/moe.py loop "$model" "$out/batch.safetensors" "$steps" "$threads" "$impl" 2>/dev/null | tail -n 1)
  printf '| transformers (%s) | %.4f | %.1f | **%.2fx** | %.6f | %.0f |\n' "$impl" "$(echo "$r" | json 'd["steps_per_s"]')" \
    "$(echo "$r" | json 'd["tokens_per_s"]')" "$(echo "$o_tps / $(echo "$r" | json 'd["tokens_per_s"]')" | bc -l)" \
    "$(echo "$r" | json 'd["first_loss"]')" "$(echo "$r" | json 'd["peak_rss_mb"]')"
done
