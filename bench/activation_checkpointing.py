"""The transformers side of bench/activation_checkpointing.sh: a GPT-2 of the given
shape (bytes: vocabulary 256, no dropout), saved for ptrain to start from
(`make`), and trained on random tokens with and without
`gradient_checkpointing_enable()` (`train`), printing one JSON line: steps/s over
the steps after the first, the last loss and the process's peak RSS."""

import json
import resource
import sys
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel


def make(model_dir, layers, width, heads, context):
    config = GPT2Config(vocab_size=256, n_positions=int(context), n_embd=int(width), n_layer=int(layers), n_head=int(heads),
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, activation_function="gelu_new")
    torch.manual_seed(0)
    GPT2LMHeadModel(config).save_pretrained(model_dir)


def train(model_dir, batch, steps, threads, checkpointing):
    torch.set_num_threads(int(threads))
    model = GPT2LMHeadModel.from_pretrained(model_dir, attn_implementation="sdpa")
    model.train()
    model.config.use_cache = False  # decoding cache: unused in training, and refused with checkpointing
    if checkpointing == "1":
        model.gradient_checkpointing_enable()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    x = torch.randint(0, 256, (int(batch), model.config.n_positions))
    times = []
    for _ in range(int(steps)):
        start = time.perf_counter()
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
    timed = times[1:] or times
    print(json.dumps({"steps_per_s": len(timed) / sum(timed), "final_loss": loss.item(),
                      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


if __name__ == "__main__":
    {"make": make, "train": train}[sys.argv[1]](*sys.argv[2:])
