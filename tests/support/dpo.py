"""Preference side of tests/dpo.rs: makes a tokenizer with a ChatML template, a random
Qwen2 policy and a *different* random Qwen2 reference of its vocabulary, and preference
pairs, with the real `tokenizers` and `transformers`; then says what TRL's `DPOTrainer`
makes of them. Nothing is downloaded. Each command prints one JSON object.

  dpo.py make DIR PAIRS SEED          DIR/policy (tokenizer + model), DIR/reference (the policy's
                                      weights perturbed: another model), and pairs:
                                      conv.jsonl (prompt/chosen/rejected message lists, some with a
                                      system prompt or earlier turns), plain.jsonl (strings),
                                      implicit.jsonl (chosen/rejected whole conversations, no prompt)
  dpo.py first-step POLICY REF DATA LOSS BETA [--precompute]
                                      DPOTrainer's loss and its six metrics on one batch holding every
                                      pair of DATA, before any update (REF "-": no ref_model); and under
                                      "plain", the same from transformers' own forward of each model
  dpo.py load EXPORT [BASE]           loads ptrain's export: a full model with transformers, or (BASE
                                      given) adapters with peft over BASE; missing and unexpected keys
  dpo.py batch POLICY DATA DUMP       whether the rows of ptrain's first batch (a debug dump of one
                                      batch holding every pair) are TRL's collated rows: the same
                                      inputs and the same trained targets, pair by pair
"""
import json
import os
import random
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import chat  # noqa: E402

SIX = ["rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins", "logps/chosen", "logps/rejected"]
# DPOTrainer's mean over the batch's completion tokens of the logits averaged over the vocabulary.
LOGITS = ["logits/chosen", "logits/rejected"]


def out(obj):
    print(json.dumps(obj))


def differing(rng, lo, hi, other):
    while True:
        s = chat.sentence(rng, lo, hi)
        if s != other:
            return s


def make(d, pairs, seed):
    import torch
    import transformers

    rng = random.Random(int(seed))
    policy = os.path.join(d, "policy")
    chat.make_model(policy, rng, 300, 256, True, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2)
    model = transformers.AutoModelForCausalLM.from_pretrained(policy, dtype=torch.float32)
    torch.manual_seed(int(seed) + 1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    model.save_pretrained(os.path.join(d, "reference"))
    conv, plain, implicit = [], [], []
    for _ in range(int(pairs)):
        prompt = []
        if rng.random() < 0.4:
            prompt.append({"role": "system", "content": chat.sentence(rng, 2, 8)})
        if rng.random() < 0.3:
            prompt += [{"role": "user", "content": chat.sentence(rng, 1, 8)}, {"role": "assistant", "content": chat.sentence(rng, 1, 8)}]
        prompt.append({"role": "user", "content": chat.sentence(rng, 1, 12)})
        good = chat.sentence(rng, 1, 16)
        bad = differing(rng, 1, 16, good)
        answer = lambda text: [{"role": "assistant", "content": text}]  # noqa: E731
        conv.append({"prompt": prompt, "chosen": answer(good), "rejected": answer(bad)})
        implicit.append({"chosen": prompt + answer(good), "rejected": prompt + answer(bad)})
        good = " " + chat.sentence(rng, 1, 20)
        plain.append({"prompt": chat.sentence(rng, 1, 15) + " ?", "chosen": good, "rejected": " " + differing(rng, 1, 20, good[1:])})
    for name, rows in [("conv", conv), ("plain", plain), ("implicit", implicit)]:
        with open(os.path.join(d, f"{name}.jsonl"), "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    out({"policy": policy, "pairs": int(pairs)})


def trainer(policy, ref, data, loss_type="sigmoid", beta=0.1, precompute=False, out_dir=None):
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import DPOConfig, DPOTrainer

    rows = [json.loads(line) for line in open(data) if line.strip()]
    tok = AutoTokenizer.from_pretrained(policy)
    model = AutoModelForCausalLM.from_pretrained(policy, dtype=torch.float32)
    ref_model = None if ref == "-" else AutoModelForCausalLM.from_pretrained(ref, dtype=torch.float32)
    args = DPOConfig(output_dir=out_dir, per_device_train_batch_size=len(rows), beta=float(beta), loss_type=[loss_type], report_to=[],
                     use_cpu=True, precompute_ref_log_probs=precompute, max_length=None, save_strategy="no", logging_steps=1,
                     bf16=False)
    t = DPOTrainer(model=model, ref_model=ref_model, args=args, train_dataset=Dataset.from_list(rows), processing_class=tok)
    return t, rows


def plain(policy, ref, batch, loss_type, beta):
    """DPOTrainer's loss and metrics of `batch`, from `transformers`' own forward of each model (no TRL)."""
    import torch
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM

    mask = batch["completion_mask"]

    def logps(path):
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        with torch.no_grad():
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.float()
        lp = torch.log_softmax(logits[:, :-1], -1).gather(2, batch["input_ids"][:, 1:, None])[..., 0]
        return (lp * mask[:, 1:]).sum(1).chunk(2)

    (c, r), (rc, rr) = logps(policy), logps(ref)
    cr, rr_ = c - rc, r - rr
    delta = cr - rr_
    if loss_type == "sigmoid":
        loss = -F.logsigmoid(beta * delta)
    elif loss_type == "hinge":
        loss = torch.relu(1 - beta * delta)
    else:
        cm, rm = mask.chunk(2)
        loss = (cr / cm.sum(1).clamp(min=1.0) - rr_ / rm.sum(1).clamp(min=1.0) - 1 / (2 * beta)) ** 2
    rewards = (beta * cr, beta * rr_)
    metrics = {"rewards/chosen": rewards[0].mean(), "rewards/rejected": rewards[1].mean(),
               "rewards/accuracies": (rewards[0] > rewards[1]).float().mean(), "rewards/margins": (rewards[0] - rewards[1]).mean(),
               "logps/chosen": c.mean(), "logps/rejected": r.mean()}
    return {"loss": loss.mean().item(), **{k: v.item() for k, v in metrics.items()}}


def first_step(policy, ref, data, loss_type, beta, precompute=False):
    import torch

    with tempfile.TemporaryDirectory() as d:
        t, rows = trainer(policy, ref, data, loss_type, beta, precompute, d)
        batch = next(iter(t.get_train_dataloader()))
        t.model.train()  # dropout is 0: the mode only picks the metrics' bucket
        with torch.no_grad():
            loss = t.compute_loss(t.model, batch)
        metrics = {k: v[-1] for k, v in t._metrics["train"].items()}
    out({"loss": float(loss), "pairs": len(rows), **{k: float(metrics[k]) for k in SIX + LOGITS},
         "plain": plain(policy, ref, batch, loss_type, float(beta))})


def batch(policy, data, dump):
    from safetensors.torch import load_file

    with tempfile.TemporaryDirectory() as d:
        t, rows = trainer(policy, policy, data, out_dir=d)
        theirs = next(iter(t.get_train_dataloader()))
    labels = theirs["input_ids"].masked_fill(theirs["completion_mask"] == 0, -100)
    inputs, targets = theirs["input_ids"][:, :-1], labels[:, 1:]
    pad = t.processing_class.pad_token_id
    ours = load_file(dump)
    our_inputs, our_targets = ours["batch0/inputs"], ours["batch0/targets"]

    def pairs(x, y, pad_id):
        n = x.shape[0] // 2
        # Padding inputs differ (TRL pads with pad_token_id): compare where trained or before.
        def row(i):
            keep = int((y[i] != -100).nonzero().max()) + 1
            return (tuple(x[i][:keep].tolist()), tuple(y[i][:keep].tolist()))
        return sorted((row(i), row(n + i)) for i in range(n))

    a, b = pairs(inputs, targets, pad), pairs(our_inputs, our_targets, 0)
    out({"equal": a == b, "pairs": len(a), "trained": int((targets != -100).sum()), "our_trained": int((our_targets != -100).sum()),
         "first_diff": next((str((x, y)) for x, y in zip(a, b) if x != y), None)})


def load(export, base=None):
    import torch
    from transformers import AutoModelForCausalLM

    if base is None:
        _, info = AutoModelForCausalLM.from_pretrained(export, dtype=torch.float32, output_loading_info=True)
        out({"missing": sorted(info["missing_keys"]), "unexpected": sorted(info["unexpected_keys"])})
        return
    from peft import PeftModel

    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32), export)
    b = [p.abs().max().item() for n, p in model.named_parameters() if "lora_B" in n]
    out({"missing": [], "unexpected": [], "adapters": len(b), "max_lora_b": max(b) if b else 0.0})


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "make":
        make(*args)
    elif cmd == "first-step":
        first_step(*args[:5], precompute="--precompute" in args)
    elif cmd == "batch":
        batch(*args)
    elif cmd == "load":
        load(*args)
    else:
        sys.exit(f"unknown command {cmd}")
