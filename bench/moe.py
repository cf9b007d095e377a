"""The Python side of bench/moe.sh: a Qwen3-MoE-shaped model made by transformers (8 layers,
width 1024, 16 heads of 64, 4 KV heads, 32 experts of width 512, top 4, vocabulary 32,000,
untied head: 0.49B parameters, 0.10B active per token), and the same training steps in a
plain PyTorch loop over Qwen3MoeForCausalLM (with its router loss, output_router_logits=True).

  moe.py make MODEL_DIR TOKENS_FILE          the model (save_pretrained) and 2M random token ids
  moe.py loop MODEL_DIR BATCH STEPS THREADS IMPL
                                             a plain loop (AdamW, clipping 1.0) on BATCH's inputs,
                                             transformers' experts implementation IMPL
                                             (grouped_mm, its default here, or eager)

BATCH is a `ptrain logits --split train --step 1` file: the batch ptrain trains on first. Each
command prints one JSON line: steps/s and tokens/s after the first step, the first loss, peak RSS.
"""
import json
import resource
import sys
import time

import numpy as np
import torch

SHAPE = dict(
    vocab_size=32000, hidden_size=1024, intermediate_size=2816, moe_intermediate_size=512, num_hidden_layers=8,
    num_attention_heads=16, num_key_value_heads=4, head_dim=64, num_experts=32, num_experts_per_tok=4,
    norm_topk_prob=True, router_aux_loss_coef=0.001, max_position_embeddings=512, tie_word_embeddings=False,
    bos_token_id=None, eos_token_id=None, pad_token_id=None,
)


def out(obj):
    obj["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(obj), flush=True)


def make(model_dir, tokens_file):
    from transformers import AutoModelForCausalLM, Qwen3MoeConfig

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(Qwen3MoeConfig(**SHAPE))
    print(sum(p.numel() for p in model.parameters()), file=sys.stderr)
    model.save_pretrained(model_dir)
    np.random.default_rng(0).integers(0, SHAPE["vocab_size"], 2_000_000, dtype=np.uint16).tofile(tokens_file)


def loop(model_dir, batch, steps, threads, impl):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(int(threads))
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa", experts_implementation=impl)
    model.train()
    b = load_file(batch)
    inputs, targets = b["inputs"], b["targets"]
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}], lr=1e-4, betas=(0.9, 0.95), eps=1e-8)
    first, start = None, None
    for _ in range(int(steps)):
        opt.zero_grad(set_to_none=True)
        loss = model(inputs, labels=targets, shift_labels=targets, output_router_logits=True).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if first is None:
            first, start = loss.item(), time.perf_counter()
    timed = int(steps) - 1
    elapsed = time.perf_counter() - start
    out({"steps_per_s": timed / elapsed, "tokens_per_s": timed * inputs.numel() / elapsed, "first_loss": first})


if __name__ == "__main__":
    {"make": make, "loop": loop}[sys.argv[1]](*sys.argv[2:])
