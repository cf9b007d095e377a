"""TRL side of bench/dpo.sh: a random Qwen2 with a small BPE tokenizer and plain preference pairs
whose prompts are about PROMPT tokens, and DPOTrainer's pairs/s and peak RSS on them.

  dpo.py make DIR LAYERS WIDTH PROMPT PAIRS   DIR/model (tokenizer + Qwen2), DIR/pairs.jsonl
  dpo.py trl DIR STEPS BATCH THREADS [--precompute]
"""
import json
import os
import random
import resource
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "support"))
import chat  # noqa: E402


def make(d, layers, width, prompt, pairs):
    rng = random.Random(1)
    heads = max(1, int(width) // 64)
    chat.make_model(os.path.join(d, "model"), rng, 300, 4096, False, hidden_size=int(width), intermediate_size=4 * int(width),
                    num_hidden_layers=int(layers), num_attention_heads=heads, num_key_value_heads=max(1, heads // 2))
    with open(os.path.join(d, "pairs.jsonl"), "w") as f:
        for _ in range(int(pairs)):
            n = int(prompt)
            good = " " + chat.sentence(rng, 30, 34)
            bad = " " + chat.sentence(rng, 30, 34)
            f.write(json.dumps({"prompt": chat.sentence(rng, n, n) + " ?", "chosen": good, "rejected": bad}) + "\n")


def trl(d, steps, batch, threads, precompute=False):
    import tempfile

    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import DPOConfig, DPOTrainer

    torch.set_num_threads(int(threads))
    rows = [json.loads(line) for line in open(os.path.join(d, "pairs.jsonl"))]
    model_dir = os.path.join(d, "model")
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with tempfile.TemporaryDirectory() as out:
        args = DPOConfig(output_dir=out, per_device_train_batch_size=int(batch), max_steps=int(steps) + 1, learning_rate=1e-6,
                         lr_scheduler_type="constant", report_to=[], use_cpu=True, save_strategy="no", logging_steps=1,
                         precompute_ref_log_probs=precompute, max_length=None, dataloader_num_workers=0, disable_tqdm=True,
                         bf16=False)  # TRL turns bf16 autocast on by default, on the CPU too: fp32 as ptrain
        t = DPOTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows), processing_class=tok)
        marks = []

        from transformers import TrainerCallback

        class Clock(TrainerCallback):
            def on_step_end(self, *a, **k):
                marks.append(time.perf_counter())

        t.add_callback(Clock())
        t.train()
    # The first step warms up: pairs/s over the others.
    elapsed = marks[-1] - marks[0]
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"pairs_per_s": int(batch) * (len(marks) - 1) / elapsed, "peak_rss_mb": peak}))


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "make":
        make(*args)
    elif cmd == "trl":
        trl(*args[:4], precompute="--precompute" in args)
    else:
        sys.exit(f"unknown command {cmd}")
