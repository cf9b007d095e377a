"""The Python side of bench/chat.sh: the model, tokenizer and chat rows, and TRL's
SFTTrainer (padded and packed) on them.

  chat.py make DIR ROWS            a byte-level BPE tokenizer (4,000 ids, ChatML specials, a ChatML
                                   template with {% generation %} marks), a random Qwen2 (4 layers,
                                   width 256, 8 heads, 2 KV heads, intermediate 704, tied) and ROWS
                                   conversations of mixed lengths (1-3 turns, answers of 1-200 words)
  chat.py trl DIR DATA STEPS BATCH MAXLEN THREADS [--packing]
                                   SFTTrainer(assistant_only_loss) for STEPS steps: steps/s, trained
                                   tokens/s, the last loss and the peak RSS, as JSON
  chat.py attention THREADS          packed attention (4 x 512, 8 heads of 32) forward and backward: one
                                     SDPA call with a block-diagonal mask vs one causal call per row
"""
import json
import os
import random
import resource
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "support"))
import chat as tests_chat  # noqa: E402  the test helper's words and template

sentence = tests_chat.sentence


def out(obj):
    obj["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(obj))


def make(d, rows):
    rng = random.Random(0)
    tests_chat.make_model(d, rng, 4000, 1024, False, hidden_size=256, intermediate_size=704, num_hidden_layers=4,
                          num_attention_heads=8, num_key_value_heads=2)
    with open(f"{d}/chat.jsonl", "w") as f:
        for _ in range(int(rows)):
            messages = []
            if rng.random() < 0.3:
                messages.append({"role": "system", "content": sentence(rng, 2, 10)})
            for _ in range(rng.randint(1, 3)):
                messages.append({"role": "user", "content": sentence(rng, 2, 30)})
                messages.append({"role": "assistant", "content": sentence(rng, 1, rng.choice([10, 40, 200]))})
            f.write(json.dumps({"messages": messages}) + "\n")
    out({"rows": int(rows)})


def trl(d, data, steps, batch, max_len, threads, *flags):
    import torch
    from datasets import load_dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import SFTConfig, SFTTrainer

    torch.set_num_threads(int(threads))
    packing = "--packing" in flags
    tok = AutoTokenizer.from_pretrained(d)
    model = AutoModelForCausalLM.from_pretrained(d, dtype="float32", attn_implementation="sdpa")
    args = SFTConfig(output_dir=tempfile.mkdtemp(), report_to=[], use_cpu=True, max_length=int(max_len), packing=packing,
                     assistant_only_loss=True, per_device_train_batch_size=int(batch), max_steps=int(steps), logging_steps=1,
                     learning_rate=1e-4, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0,
                     save_strategy="no", dataloader_num_workers=0, seed=0,
                     bf16=False)  # TRL turns bf16 autocast on by default, on the CPU too: fp32 as ptrain
    trainer = SFTTrainer(model=model, args=args, train_dataset=load_dataset("json", data_files=data, split="train"), processing_class=tok)

    trained = [0]
    compute_loss = trainer.compute_loss

    def counting(model, inputs, *a, **kw):
        trained[0] += int((inputs["labels"][..., 1:] != -100).sum())
        return compute_loss(model, inputs, *a, **kw)

    trainer.compute_loss = counting
    times = {}

    class Clock(TrainerCallback):
        def on_train_begin(self, *a, **kw):
            times["start"] = time.perf_counter()

        def on_train_end(self, *a, **kw):
            times["end"] = time.perf_counter()

    trainer.add_callback(Clock())
    trainer.train()
    elapsed = times["end"] - times["start"]
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    out({"steps_per_s": int(steps) / elapsed, "trained_tokens_per_s": trained[0] / elapsed, "trained_tokens": trained[0],
         "last_loss": losses[-1], "wall_s": elapsed})


def attention(threads, seq=512, batch=4, heads=8, dim=32, reps=20):
    """Packed attention two ways, forward and backward, on the same rows: one SDPA call with
    a block-diagonal causal mask [B, 1, T, T] (what ptrain does), or one causal SDPA call
    per row (what a variable-length kernel does in one launch; libtorch's CPU build has none)."""
    import torch

    torch.set_num_threads(int(threads))
    torch.manual_seed(0)
    rng = random.Random(0)
    lens = []
    for _ in range(batch):
        row, left = [], seq
        while left > 16:
            n = min(left, rng.choice([20, 60, 150, 300]))
            row.append(n)
            left -= n
        lens.append(row)
    q, k, v = (torch.randn(batch, heads, seq, dim, requires_grad=True) for _ in range(3))
    seg = torch.zeros(batch, seq, dtype=torch.long)
    for b, row in enumerate(lens):
        at = 0
        for i, n in enumerate(row):
            seg[b, at:at + n] = i + 1
            at += n
    mask = (seg[:, :, None] == seg[:, None, :]) & torch.ones(seq, seq, dtype=torch.bool).tril()
    mask = mask[:, None]

    def masked():
        torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask).sum().backward()

    def per_row():
        outs = []
        for b, row in enumerate(lens):
            at = 0
            for n in row:
                sl = slice(at, at + n)
                outs.append(torch.nn.functional.scaled_dot_product_attention(q[b:b + 1, :, sl], k[b:b + 1, :, sl], v[b:b + 1, :, sl], is_causal=True).sum())
                at += n
        torch.stack(outs).sum().backward()

    result = {}
    for name, fn in [("mask", masked), ("per_row", per_row)]:
        fn()
        start = time.perf_counter()
        for _ in range(int(reps)):
            fn()
        result[f"{name}_ms"] = (time.perf_counter() - start) / int(reps) * 1e3
    result["rows"] = sum(len(r) for r in lens)
    out(result)


COMMANDS = {"make": make, "trl": trl, "attention": attention}

if __name__ == "__main__":
    COMMANDS[sys.argv[1]](*sys.argv[2:])
