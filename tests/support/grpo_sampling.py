"""Sampling side of tests/grpo_sampling.rs: makes a random Qwen2 policy with a ChatML tokenizer
and prompt rows with the real `tokenizers` and `transformers`, then says what transformers makes of
ptrain's sampled completions. Nothing is downloaded. Each command prints one JSON object.

  grpo_sampling.py make DIR SEED [KIND]      DIR/policy and DIR/prompts.jsonl: text prompts of two
                                             lengths and chat prompts, each with an `answer` column;
                                             KIND gemma2: the policy a Gemma 2 (soft caps, a sliding
                                             window of 6 in its first layer) of the same tokenizer
  grpo_sampling.py greedy POLICY DATA N      each row's prompt rendered as TRL renders it (a string as
                                             it is; messages with the chat template and the generation
                                             prompt) and transformers' greedy `generate` of N new tokens
                                             (stopped at EOS, which is kept)
  grpo_sampling.py greedy-padded POLICY DATA N
                                             the same, every prompt in one batch left-padded by the
                                             tokenizer (its `padding_side = "left"`), as TRL's
                                             GRPOTrainer generates; also how many rows were padded
  grpo_sampling.py processed POLICY RECORDS SETTINGS
                                             for each completion of RECORDS (ptrain's completions.jsonl),
                                             the log-probability of each sampled token under the
                                             distribution transformers' logits processors (the ones
                                             `generate` builds for SETTINGS, in its order) make of the
                                             model's logits at that position; the largest difference
                                             from ptrain's `logps` (SETTINGS' "bf16": true runs
                                             the model under CPU bf16 autocast)
"""
import json
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import chat  # noqa: E402
import hf  # noqa: E402


def out(obj):
    print(json.dumps(obj))


def make(d, seed, kind="qwen2"):
    rng = random.Random(int(seed))
    policy = os.path.join(d, "policy")
    tok = chat.make_model(policy, rng, 300, 256, True, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2)
    if kind == "gemma2":
        make_gemma2(policy, tok)
    rows = []
    for i in range(4):
        # Two prompts of each of two word counts: prompts of equal token length share a batch.
        rows.append({"prompt": " ".join(rng.choice(chat.WORDS) for _ in range(3 + 2 * (i % 2))), "answer": str(i)})
    for i in range(2):
        rows.append({"prompt": [{"role": "user", "content": chat.sentence(rng, 2, 6)}], "answer": 42})
    with open(os.path.join(d, "prompts.jsonl"), "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    out({"policy": policy, "rows": len(rows)})


def make_gemma2(policy, tok):
    """A random Gemma 2 over TOK's vocabulary in POLICY (replacing the Qwen2 there): its
    attention soft-capped and scaled by query_pre_attn_scalar, a window of 6 in the first
    layer, so that short prompts and completions reach past it."""
    import torch
    import transformers

    for name in os.listdir(policy):
        if name.endswith(".safetensors") or name == "config.json":
            os.remove(os.path.join(policy, name))
    config = transformers.Gemma2Config(
        vocab_size=tok.get_vocab_size(), hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=24, query_pre_attn_scalar=32, sliding_window=6,
        layer_types=["sliding_attention", "full_attention"], attn_logit_softcapping=2.0, final_logit_softcapping=3.0,
        max_position_embeddings=256, bos_token_id=None, eos_token_id=tok.token_to_id("<|im_end|>"), pad_token_id=None,
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    hf.perturb_gemma(model)
    model.save_pretrained(policy)


def load(policy):
    import torch
    import transformers

    # The fixture's tokenizer.json as it is: transformers 5's AutoTokenizer rebuilds a Qwen2
    # tokenizer from the model type, which splits digits where this tokenizer.json does not.
    tok = transformers.PreTrainedTokenizerFast.from_pretrained(policy)
    model = transformers.AutoModelForCausalLM.from_pretrained(policy, dtype=torch.float32).eval()
    return tok, model


def render(tok, prompt):
    if isinstance(prompt, str):
        return prompt
    return tok.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)


def greedy(policy, data, n):
    import torch

    tok, model = load(policy)
    rendered, completions = [], []
    for line in open(data):
        text = render(tok, json.loads(line)["prompt"])
        ids = tok(text, add_special_tokens=False, return_tensors="pt").input_ids
        with torch.no_grad():
            done = model.generate(ids, do_sample=False, max_new_tokens=int(n), eos_token_id=tok.eos_token_id,
                                  pad_token_id=tok.pad_token_id)
        rendered.append(text)
        completions.append(done[0, ids.shape[1]:].tolist())
    out({"rendered": rendered, "completions": completions})


def greedy_padded(policy, data, n):
    import torch

    tok, model = load(policy)
    rendered = [render(tok, json.loads(line)["prompt"]) for line in open(data)]
    tok.padding_side = "left"
    batch = tok(rendered, add_special_tokens=False, return_tensors="pt", padding=True)
    with torch.no_grad():
        done = model.generate(**batch, do_sample=False, max_new_tokens=int(n), eos_token_id=tok.eos_token_id,
                              pad_token_id=tok.pad_token_id)
    completions = []
    for row in done[:, batch.input_ids.shape[1]:].tolist():
        # After its EOS, a row holds pads until every row has ended.
        end = row.index(tok.eos_token_id) + 1 if tok.eos_token_id in row else len(row)
        completions.append(row[:end])
    padded = int((batch.attention_mask == 0).any(dim=1).sum())
    out({"rendered": rendered, "completions": completions, "padded": padded})


def processors(s):
    """The processors `generate` builds for sampling with these settings, in its order
    (GenerationMixin._get_logits_processor): the repetition penalty, then the warpers."""
    from transformers.generation import logits_process as lp

    chain = []
    if s.get("repetition_penalty", 1.0) != 1.0:
        chain.append(lp.RepetitionPenaltyLogitsProcessor(float(s["repetition_penalty"])))
    if s.get("temperature", 1.0) != 1.0:
        chain.append(lp.TemperatureLogitsWarper(float(s["temperature"])))
    if s.get("top_k", 0):
        chain.append(lp.TopKLogitsWarper(top_k=int(s["top_k"])))
    if s.get("top_p", 1.0) < 1.0:
        chain.append(lp.TopPLogitsWarper(top_p=float(s["top_p"])))
    if s.get("min_p") is not None:
        chain.append(lp.MinPLogitsWarper(min_p=float(s["min_p"])))
    return lp.LogitsProcessorList(chain)


def processed(policy, records, settings):
    import torch

    tok, model = load(policy)
    settings = json.loads(settings)
    # "bf16": the forward under CPU bf16 autocast, as accelerate runs a bf16 model.
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=bool(settings.pop("bf16", False)))
    chain = processors(settings)
    worst, tokens = 0.0, 0
    for line in open(records):
        r = json.loads(line)
        prompt = tok(r["prompt"], add_special_tokens=False).input_ids
        ids = torch.tensor([prompt + r["completion_ids"]])
        with torch.no_grad(), autocast:
            logits = model(ids).logits[0].float()
        for t, token in enumerate(r["completion_ids"]):
            at = len(prompt) + t
            scores = chain(ids[:, :at], logits[at - 1:at].clone())
            logp = torch.log_softmax(scores, dim=-1)[0, token].item()
            # A token these processors remove has -inf: a difference JSON can carry.
            worst = max(worst, min(abs(logp - r["logps"][t]), 1e30))
            tokens += 1
    out({"max_abs_diff": worst, "tokens": tokens, "processors": [type(p).__name__ for p in chain]})


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    {"make": make, "greedy": greedy, "greedy-padded": greedy_padded, "processed": processed}[cmd](*args)
