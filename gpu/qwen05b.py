"""The size people train, on one GPU: a Qwen2-0.5B-shaped model (24 layers, width 896, 14 heads,
2 KV heads, intermediate 4864, vocabulary 151,936, tied head) made by transformers, and the
plain PyTorch loop over transformers' Qwen2ForCausalLM that ptrain is measured against
(gpu/lent.sh runs ptrain on the same weights and data).

  qwen05b.py make MODEL_DIR TOKENS_FILE [--tiny]      the model (save_pretrained) and random token ids
  qwen05b.py hf MODEL_DIR TOKENS_FILE BATCH SEQ STEPS  transformers + torch.optim.AdamW(fused), bf16 autocast

`hf` prints one JSON line: tokens/s over every step (the first included, as ptrain's summary
counts it), tokens/s after 3 warm-up steps, the first and last loss and the peak CUDA memory.
"""
import json
import sys
import time

import numpy as np
import torch

SHAPE = dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
             num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
             tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 1e6},
             rms_norm_eps=1e-6, bos_token_id=None, eos_token_id=None, pad_token_id=None)
TINY = dict(SHAPE, vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2)


def make(model_dir, tokens_file, tiny=False):
    from transformers import AutoModelForCausalLM, Qwen2Config

    shape = TINY if tiny else SHAPE
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(Qwen2Config(**shape)).save_pretrained(model_dir)
    # uint16 ids (ptrain's data.kind = "tokens" form): the first 65,536 of the vocabulary.
    high = min(shape["vocab_size"], 65536)
    np.random.default_rng(0).integers(0, high, 4_000_000, dtype=np.uint16).tofile(tokens_file)


def hf(model_dir, tokens_file, batch, seq, steps):
    from transformers import AutoModelForCausalLM

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa").to(dev)
    model.train()
    data = torch.from_numpy(np.fromfile(tokens_file, dtype=np.uint16).astype(np.int64))
    gen = torch.Generator().manual_seed(0)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                            lr=1e-5, betas=(0.9, 0.95), eps=1e-8, fused=dev.type == "cuda")
    losses = []
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    sync()
    start = time.perf_counter()
    warm = None
    for step in range(steps):
        at = torch.randint(0, data.numel() - seq - 1, (batch,), generator=gen)
        window = torch.stack([data[i:i + seq + 1] for i in at.tolist()]).pin_memory() if dev.type == "cuda" else \
            torch.stack([data[i:i + seq + 1] for i in at.tolist()])
        window = window.to(dev, non_blocking=True)
        inputs, targets = window[:, :-1], window[:, 1:]
        opt.zero_grad(set_to_none=True)
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            logits = model(inputs).logits
        loss = torch.nn.functional.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.detach())
        if step == 2:
            sync()
            warm = time.perf_counter()
    sync()
    end = time.perf_counter()
    tokens = batch * seq
    r = {"tokens_per_s": tokens * steps / (end - start), "first_loss": losses[0].item(), "final_loss": losses[-1].item(),
         "parameters": sum(p.numel() for p in model.parameters())}
    if warm is not None and steps > 3:
        r["tokens_per_s_after_3"] = tokens * (steps - 3) / (end - warm)
    if dev.type == "cuda":
        r["peak_memory_bytes"] = torch.cuda.max_memory_allocated()
        r["gpu"] = torch.cuda.get_device_name(0)
    print(json.dumps(r), flush=True)


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "make":
        make(args[0], args[1], tiny="--tiny" in args)
    elif cmd == "hf":
        hf(args[0], args[1], int(args[2]), int(args[3]), int(args[4]))
    else:
        sys.exit(f"unknown command {cmd}")
