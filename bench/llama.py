"""The Python side of bench/llama.sh: a Qwen2-shaped model made by transformers, and the same
training steps in a plain PyTorch loop and in transformers.Trainer, and model.generate.

  llama.py make MODEL_DIR TOKENS_FILE        the model (save_pretrained) and 2M random token ids
  llama.py loop MODEL_DIR BATCH STEPS fp32|bf16 THREADS
                                             a plain loop (AdamW, clipping 1.0) on BATCH's inputs
  llama.py trainer MODEL_DIR BATCH STEPS fp32|bf16 THREADS
                                             transformers.Trainer on the same batch, repeated
  llama.py generate MODEL_DIR PROMPT_LEN NEW THREADS
                                             greedy model.generate of NEW tokens

BATCH is a `ptrain logits --split train --step 1` file: the batch ptrain trains on first. Each
command prints one JSON line: steps/s (or tokens/s), the first loss, peak RSS.
"""
import json
import resource
import sys
import time

import numpy as np
import torch

SHAPE = dict(
    vocab_size=32000,
    hidden_size=512,
    intermediate_size=1408,
    num_hidden_layers=8,
    num_attention_heads=8,
    num_key_value_heads=2,
    max_position_embeddings=512,
    tie_word_embeddings=True,
    rope_parameters={"rope_type": "default", "rope_theta": 1e6},
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
)


def out(obj):
    obj["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(obj), flush=True)


def load(model_dir, threads):
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(int(threads))
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa")
    return model


def make(model_dir, tokens_file):
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(Qwen2Config(**SHAPE)).save_pretrained(model_dir)
    np.random.default_rng(0).integers(0, SHAPE["vocab_size"], 2_000_000, dtype=np.uint16).tofile(tokens_file)


def first_batch(path):
    from safetensors.torch import load_file

    b = load_file(path)
    return b["inputs"], b["targets"]


def loss_of(model, inputs, targets):
    logits = model(inputs).logits
    return torch.nn.functional.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))


def loop(model_dir, batch, steps, precision, threads):
    model = load(model_dir, threads)
    model.train()
    inputs, targets = first_batch(batch)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}], lr=1e-4, betas=(0.9, 0.95), eps=1e-8)
    cast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16")
    first = None
    start = time.perf_counter()
    for _ in range(int(steps)):
        opt.zero_grad(set_to_none=True)
        with cast:
            loss = loss_of(model, inputs, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if first is None:
            first = loss.item()
    elapsed = time.perf_counter() - start
    out({"steps_per_s": int(steps) / elapsed, "first_loss": first, "final_loss": loss.item()})


def trainer(model_dir, batch, steps, precision, threads):
    from transformers import Trainer, TrainerCallback, TrainingArguments

    model = load(model_dir, threads)
    inputs, targets = first_batch(batch)
    # labels for transformers' own shifted loss: the window followed by the last target.
    window = torch.cat([inputs, targets[:, -1:]], dim=1)

    class Repeat(torch.utils.data.Dataset):
        def __len__(self):
            return 1_000_000

        def __getitem__(self, i):
            row = window[i % window.shape[0]]
            return {"input_ids": row, "labels": row}

    losses = []

    class Losses(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "loss" in logs:
                losses.append(logs["loss"])

    args = TrainingArguments(
        output_dir="/tmp/ptrain-bench-trainer",
        per_device_train_batch_size=window.shape[0],
        max_steps=int(steps),
        learning_rate=1e-4,
        weight_decay=0.1,
        adam_beta2=0.95,
        max_grad_norm=1.0,
        lr_scheduler_type="constant",
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        bf16=precision == "bf16",
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    t = Trainer(model=model, args=args, train_dataset=Repeat(), callbacks=[Losses()])
    start = time.perf_counter()
    t.train()
    elapsed = time.perf_counter() - start
    out({"steps_per_s": int(steps) / elapsed, "first_loss": losses[0] if losses else None})


def generate(model_dir, prompt_len, new, threads):
    model = load(model_dir, threads)
    model.eval()
    prompt = torch.arange(1, int(prompt_len) + 1).unsqueeze(0)
    with torch.no_grad():
        model.generate(prompt, do_sample=False, max_new_tokens=4)  # warm-up
        start = time.perf_counter()
        ids = model.generate(prompt, do_sample=False, max_new_tokens=int(new), min_new_tokens=int(new))
        elapsed = time.perf_counter() - start
    out({"tokens_per_s": (ids.shape[1] - int(prompt_len)) / elapsed, "new": ids.shape[1] - int(prompt_len)})


if __name__ == "__main__":
    {"make": make, "loop": loop, "trainer": trainer, "generate": generate}[sys.argv[1]](*sys.argv[2:])
