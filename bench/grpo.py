"""GRPO on the CPU, the TRL side of bench/grpo.sh: makes a random Qwen2 of LAYERS x WIDTH over a
300-token BPE vocabulary and scored rollouts (prompts of PROMPT tokens, completions of up to
COMPLETION tokens, G per group), then times TRL's GRPOTrainer training on them (served by
`rollout_func`, no generation): steps/s with the first step left out, peak RSS.

  grpo.py make DIR LAYERS WIDTH PROMPT COMPLETION GROUPS G
  grpo.py trl DIR STEPS BATCH G THREADS BETA

With generation (bench/grpo_generate.sh): text prompts of about PROMPT tokens, and TRL's
GRPOTrainer sampling them with transformers' `generate` (its own path, no rollout_func), scored by
TRL's quickstart length reward; steps/s with the first step left out, the share of the timed
steps spent in `generate`, peak RSS.

  grpo.py make-prompts DIR LAYERS WIDTH PROMPT ROWS
  grpo.py trl-generate DIR STEPS BATCH G THREADS COMPLETION TARGET [DEVICE]

DEVICE cuda: TRL on the GPU under bf16 autocast (GRPOConfig(bf16=True), the weights in float32, as
ptrain's train.precision = "bf16"), each step's end timed after a device synchronisation, and the
peak memory the device's peak allocation.
"""
import json
import os
import random
import resource
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "support"))
import chat  # noqa: E402


def make(d, layers, width, prompt, completion, groups, g):
    rng = random.Random(1)
    tok = chat.make_model(os.path.join(d, "model"), rng, 300, 2048, False, hidden_size=int(width), intermediate_size=int(width) * 3,
                          num_hidden_layers=int(layers), num_attention_heads=max(1, int(width) // 64), num_key_value_heads=max(1, int(width) // 256))
    eos, vocab = tok.token_to_id("<|im_end|>"), tok.get_vocab_size()
    with open(os.path.join(d, "rollouts.jsonl"), "w") as f:
        for _ in range(int(groups)):
            comps = [[rng.randrange(3, vocab) for _ in range(rng.randint(int(completion) // 2, int(completion) - 1))] + [eos] for _ in range(int(g))]
            rewards = [float(rng.randint(0, 1)) for _ in range(int(g))]
            f.write(json.dumps({"prompt_ids": [rng.randrange(3, vocab) for _ in range(int(prompt))], "completion_ids": comps, "rewards": rewards}) + "\n")


def make_prompts(d, layers, width, prompt, rows):
    rng = random.Random(1)
    tok = chat.make_model(os.path.join(d, "model"), rng, 300, 2048, False, hidden_size=int(width), intermediate_size=int(width) * 3,
                          num_hidden_layers=int(layers), num_attention_heads=max(1, int(width) // 64), num_key_value_heads=max(1, int(width) // 256))
    with open(os.path.join(d, "prompts.jsonl"), "w") as f:
        for _ in range(int(rows)):
            text = ""
            while len(tok.encode(text).ids) < int(prompt):
                text += chat.sentence(rng, 3, 12) + " "
            f.write(json.dumps({"prompt": text.strip()}) + "\n")


def trl_generate(d, steps, batch, g, threads, completion, target, device="cpu"):
    import torch
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer
    from transformers import TrainerCallback

    torch.set_num_threads(int(threads))
    rows = [json.loads(line) for line in open(os.path.join(d, "prompts.jsonl"))]

    def reward_len(completions, **kw):
        return [-abs(int(target) - len(c)) for c in completions]

    times, generating = [], []

    cuda = device == "cuda"

    class Clock(TrainerCallback):
        def on_step_end(self, *a, **kw):
            if cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter())

    args = GRPOConfig(output_dir=os.path.join(d, "trl-out"), per_device_train_batch_size=int(batch), num_generations=int(g),
                      max_completion_length=int(completion), max_steps=int(steps) + 1, use_cpu=not cuda, bf16=cuda, report_to=[],
                      logging_steps=1000, save_strategy="no", learning_rate=1e-6, lr_scheduler_type="constant", beta=0.0,
                      model_init_kwargs={"dtype": torch.float32}, dataloader_num_workers=0, seed=1)
    t = GRPOTrainer(model=os.path.join(d, "model"), reward_funcs=[reward_len], args=args, callbacks=[Clock()],
                    train_dataset=Dataset.from_list(rows))
    generate = t.model.generate

    def timed_generate(*a, **kw):
        started = time.perf_counter()
        out = generate(*a, **kw)
        generating.append((started, time.perf_counter()))
        return out

    t.model.generate = timed_generate
    t.train()
    timed = times[-1] - times[0]
    sampling = sum(b - a for a, b in generating if a >= times[0])
    peak = torch.cuda.max_memory_allocated() / 2**20 if cuda else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"steps_per_s": (len(times) - 1) / timed, "sampling_share": sampling / timed, "peak_rss_mib": peak}))


def trl(d, steps, batch, g, threads, beta="0.0"):
    import torch
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer
    from transformers import TrainerCallback

    torch.set_num_threads(int(threads))
    rows = [json.loads(line) for line in open(os.path.join(d, "rollouts.jsonl"))]

    def rollout(prompts, trainer):
        taken, out = {}, {"prompt_ids": [], "completion_ids": [], "logprobs": [], "r": []}
        for p in prompts:
            i = int(p[1:])
            k = taken.get(i, 0)
            taken[i] = k + 1
            out["prompt_ids"].append(rows[i]["prompt_ids"])
            out["completion_ids"].append(rows[i]["completion_ids"][k])
            out["logprobs"].append([0.0] * len(rows[i]["completion_ids"][k]))
            out["r"].append(rows[i]["rewards"][k])
        return out

    def r(prompts, completions, r, **kw):
        return r

    times = []

    class Clock(TrainerCallback):
        def on_step_end(self, *a, **kw):
            times.append(time.perf_counter())

    args = GRPOConfig(output_dir=os.path.join(d, "trl-out"), per_device_train_batch_size=int(batch), num_generations=int(g),
                      max_steps=int(steps) + 1, use_cpu=True, bf16=False, report_to=[], logging_steps=1000, save_strategy="no",
                      learning_rate=1e-6, lr_scheduler_type="constant", beta=float(beta), model_init_kwargs={"dtype": torch.float32}, dataloader_num_workers=0)
    t = GRPOTrainer(model=os.path.join(d, "model"), reward_funcs=[r], args=args, rollout_func=rollout, callbacks=[Clock()],
                    train_dataset=Dataset.from_list([{"prompt": f"g{i}"} for i in range(len(rows))]))
    t.train()
    steps_per_s = (len(times) - 1) / (times[-1] - times[0])
    print(json.dumps({"steps_per_s": steps_per_s, "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


if __name__ == "__main__":
    {"make": make, "trl": trl, "make-prompts": make_prompts, "trl-generate": trl_generate}[sys.argv[1]](*sys.argv[2:])
