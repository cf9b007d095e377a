"""GRPO side of tests/grpo.rs: makes a tokenizer with a ChatML template, a random Qwen2 policy
and scored rollouts with the real `tokenizers` and `transformers`; then says what TRL's
`GRPOTrainer` makes of them, training on the same rollouts (served by `rollout_func`, scored by
reward functions that hand back the rows' rewards). Nothing is downloaded. Each command prints
one JSON object.

  grpo.py make DIR GROUPS G SEED      DIR/policy (tokenizer + model) and DIR/rollouts.jsonl: GROUPS
                                      groups of G completions as token ids (prompts of one length,
                                      completions of 1-9 tokens, most ending with EOS), scored by two
                                      functions r0 and r1 (r1 sometimes null, one group all equal)
  grpo.py trl POLICY DATA STEPS JSON  GRPOTrainer (float32 on the CPU) on every group of DATA as one
                                      batch for STEPS steps, with the GRPOConfig arguments of JSON
                                      (and `reward_weights`): each step's loss (compute_loss's) and
                                      logged metrics
"""
import json
import os
import random
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import chat  # noqa: E402


def out(obj):
    print(json.dumps(obj))


def make(d, groups, g, seed):
    rng = random.Random(int(seed))
    policy = os.path.join(d, "policy")
    tok = chat.make_model(policy, rng, 300, 256, True, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2)
    eos, vocab = tok.token_to_id("<|im_end|>"), tok.get_vocab_size()
    word = lambda: rng.randrange(3, vocab)  # noqa: E731  (0-2 are the special tokens)
    rows = []
    for i in range(int(groups)):
        completions = []
        for _ in range(int(g)):
            ids = [word() for _ in range(rng.randint(1, 8))]
            if rng.random() < 0.7:
                ids.append(eos)
            completions.append(ids)
        if i == 1:
            r0 = [0.5] * int(g)
            r1 = [None] * int(g)
        else:
            r0 = [round(rng.gauss(0, 1), 3) for _ in range(int(g))]
            r1 = [None if rng.random() < 0.2 else float(rng.randint(0, 1)) for _ in range(int(g))]
        rows.append({"prompt_ids": [word() for _ in range(6)], "completion_ids": completions, "rewards": [r0, r1],
                     "answer": str(i)})
    with open(os.path.join(d, "rollouts.jsonl"), "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    out({"policy": policy, "groups": len(rows), "eos": eos})


def trl(policy, data, steps, settings):
    import torch
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    rows = [json.loads(line) for line in open(data) if line.strip()]
    settings = json.loads(settings)
    g = len(rows[0]["completion_ids"])

    def rollout(prompts, trainer):
        taken, out_ = {}, {"prompt_ids": [], "completion_ids": [], "logprobs": [], "r0": [], "r1": []}
        for p in prompts:
            i = int(p[1:])
            k = taken.get(i, 0)
            taken[i] = k + 1
            row = rows[i]
            out_["prompt_ids"].append(row["prompt_ids"])
            out_["completion_ids"].append(row["completion_ids"][k])
            out_["logprobs"].append([0.0] * len(row["completion_ids"][k]))
            out_["r0"].append(row["rewards"][0][k])
            out_["r1"].append(row["rewards"][1][k])
        return out_

    def r0(prompts, completions, r0, **kw):
        return r0

    def r1(prompts, completions, r1, **kw):
        return r1

    losses, logs = [], []

    class Trainer(GRPOTrainer):
        def compute_loss(self, *a, **kw):
            loss = super().compute_loss(*a, **kw)
            losses.append(loss.item())
            return loss

        def log(self, entries, *a, **kw):
            if "loss" in entries:
                logs.append({k: sum(v) / len(v) for k, v in self._metrics["train"].items() if v})
            return super().log(entries, *a, **kw)

    with tempfile.TemporaryDirectory() as d:
        args = GRPOConfig(output_dir=d, per_device_train_batch_size=len(rows) * g, num_generations=g, max_steps=int(steps),
                          use_cpu=True, bf16=False, report_to=[], logging_steps=1, save_strategy="no",
                          lr_scheduler_type="constant", weight_decay=0.0, max_grad_norm=1.0,
                          model_init_kwargs={"dtype": torch.float32}, **settings)
        t = Trainer(model=policy, reward_funcs=[r0, r1], args=args, rollout_func=rollout,
                    train_dataset=Dataset.from_list([{"prompt": f"g{i}"} for i in range(len(rows))]))
        t.train()
    out({"losses": losses, "logs": logs})


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    {"make": make, "trl": trl}[cmd](*args)
