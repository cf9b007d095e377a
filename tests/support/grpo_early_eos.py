"""A variant of grpo_sampling.py's policy for tests/grpo_sampled_runs.rs, whose greedy completions
end at once for some prompts and run on for the others, so that data-parallel ranks sampling
different prompts decode different numbers of tokens. Each command prints one JSON object.

  grpo_early_eos.py make DIR SEED SCALE      grpo_sampling.py's DIR/policy and DIR/prompts.jsonl of
                                             SEED, the policy's head untied from its token embedding
                                             (the embedding, and so the prompts' hidden states, as they
                                             were) and the head's EOS row times SCALE; also each
                                             prompt's greedy completion length in transformers (up to
                                             16 new tokens). Seed 5, scale 3.5: [16, 1, 16, 1, 16, 1]
                                             (scales from 3 to 3.75 give the same; 2.5 ends only two
                                             prompts at once, 4 five)
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import grpo_sampling  # noqa: E402


def make(d, seed, scale):
    import contextlib
    import io

    import torch
    import transformers

    with contextlib.redirect_stdout(io.StringIO()):
        grpo_sampling.make(d, seed)
    policy = os.path.join(d, "policy")
    tok, tied = grpo_sampling.load(policy)
    state = {k: v.clone() for k, v in tied.state_dict().items()}
    eos = tok.eos_token_id
    head = state["model.embed_tokens.weight"].clone()
    head[eos] *= float(scale)
    state["lm_head.weight"] = head
    config = tied.config
    config.tie_word_embeddings = False
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    model.load_state_dict(state, strict=True)
    model.save_pretrained(policy)
    lengths = []
    for line in open(os.path.join(d, "prompts.jsonl")):
        ids = tok(grpo_sampling.render(tok, json.loads(line)["prompt"]), add_special_tokens=False, return_tensors="pt").input_ids
        with torch.no_grad():
            done = model.generate(ids, do_sample=False, max_new_tokens=16, eos_token_id=eos, pad_token_id=tok.pad_token_id)
        lengths.append(done.shape[1] - ids.shape[1])
    grpo_sampling.out({"policy": policy, "greedy_lengths": lengths})


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    {"make": make}[cmd](*args)
