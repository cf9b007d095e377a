"""Instruction-data side of tests/chat.rs: makes a chat model, tokenizer and rows with
the real `tokenizers` and `transformers`, and checks ptrain's ids, masks and losses
against `transformers` and TRL's `SFTTrainer`. Nothing is downloaded. Each command
prints one JSON object.

  chat.py make DIR ROWS SEED         a byte-level BPE tokenizer with ChatML special tokens and a
                                     ChatML template with {% generation %} marks (TRL's
                                     assistant_only_loss reads them), a random Qwen2 (2 layers, GQA
                                     4:2, tied) of its vocabulary, and rows: chat.jsonl (messages),
                                     sharegpt.jsonl (the same rows as conversations/from/value),
                                     pc.jsonl (plain prompt/completion), conv_pc.jsonl (message lists)
  chat.py masks DIR DATA KIND ROWS [--trim-after-end-of-turn]
                                     TRL's input_ids and labels of DATA (kind chat: assistant_only_loss;
                                     prompt_completion: completion_only_loss) vs ptrain's cached .rows
                                     file ROWS; also apply_chat_template's ids for chat rows
                                     (--trim-after-end-of-turn: TRL's trained tokens after the last
                                     <|im_end|> are left out first)
  chat.py runs ROWS                  rows, trained tokens and the most trained runs in one row
  chat.py first-loss DIR DATA KIND   SFTTrainer's loss (its collator, its compute_loss) of one batch
                                     holding every row of DATA
  chat.py row-losses DIR DUMP        each packed row's mean loss in ptrain's dump (batch0/...) vs
                                     transformers' loss of the row alone: the largest difference
  chat.py compare-grads A B [B2]     the largest difference between A's gradients and B's (the mean
                                     of B and B2's: two ranks' dumps)
"""
import json
import os
import random
import struct
import sys
import tempfile

import numpy as np

WORDS = ["the", "cat", "sat", "on", "a", "mat", "why", "is", "sky", "blue", "because", "light", "scatters", "tell", "me",
         "about", "rust", "and", "python", "models", "learn", "to", "stop", "when", "done", "yes", "no", "maybe", "42",
         "hello", "there", "friend", "how", "are", "you", "fine", "thanks", "what", "time", "it", "now"]

CHATML = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['role'] == 'assistant' %}"
    "{% generation %}{{- message['content'] + '<|im_end|>' }}{% endgeneration %}{{- '\\n' }}"
    "{%- else %}{{- message['content'] + '<|im_end|>' + '\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def out(obj):
    print(json.dumps(obj))


def sentence(rng, lo, hi):
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))


def conversation(rng):
    messages = []
    if rng.random() < 0.4:
        messages.append({"role": "system", "content": sentence(rng, 2, 8)})
    for _ in range(rng.randint(1, 3)):
        messages.append({"role": "user", "content": sentence(rng, 1, 12)})
        messages.append({"role": "assistant", "content": sentence(rng, 1, 16)})
    return messages


def make_model(d, rng, vocab, positions, perturb, **shape):
    """A ChatML byte-level BPE tokenizer of `vocab` ids trained on random sentences, and a
    random Qwen2 of `shape` (tied head) over its vocabulary, saved in `d`."""
    import torch
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    os.makedirs(d, exist_ok=True)
    corpus = os.path.join(d, "corpus.txt")
    with open(corpus, "w") as f:
        for _ in range(10 * vocab):
            f.write(sentence(rng, 3, 30) + "\n")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train([corpus], trainer)
    tok.save(f"{d}/tokenizer.json")
    with open(f"{d}/tokenizer_config.json", "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
                   "model_max_length": positions, "chat_template": CHATML}, f)
    config = transformers.Qwen2Config(vocab_size=tok.get_vocab_size(), max_position_embeddings=positions, tie_word_embeddings=True,
                                      bos_token_id=None, eos_token_id=tok.token_to_id("<|im_end|>"), pad_token_id=None, **shape)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    if perturb:
        # Fresh biases are 0 and norm weights 1: perturb everything so that a misplaced
        # tensor cannot go unnoticed.
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.05)
    model.save_pretrained(d)
    return tok


def make(d, rows, seed):
    rng = random.Random(int(seed))
    convs = [conversation(rng) for _ in range(int(rows))]
    tok = make_model(d, rng, 300, 256, True, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2)
    with open(f"{d}/chat.jsonl", "w") as f:
        for c in convs:
            f.write(json.dumps({"messages": c}) + "\n")
    names = {"user": "human", "assistant": "gpt", "system": "system"}
    with open(f"{d}/sharegpt.jsonl", "w") as f:
        for c in convs:
            f.write(json.dumps({"conversations": [{"from": names[m["role"]], "value": m["content"]} for m in c]}) + "\n")
    with open(f"{d}/pc.jsonl", "w") as f:
        for _ in range(int(rows)):
            f.write(json.dumps({"prompt": sentence(rng, 1, 15) + " ?", "completion": " " + sentence(rng, 1, 20)}) + "\n")
    with open(f"{d}/conv_pc.jsonl", "w") as f:
        for c in convs:
            f.write(json.dumps({"prompt": c[:-1], "completion": c[-1:]}) + "\n")
    out({"vocab": tok.get_vocab_size()})


def read_rows(path):
    """ptrain's .rows cache: PTRROWS2, rows, tokens, u32 words (id | trained << 31), u64 offsets,
    u32 trained counts."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"PTRROWS2", path
    n, tokens = struct.unpack_from("<QQ", data, 8)
    words = np.frombuffer(data, dtype="<u4", count=tokens, offset=24)
    offsets = np.frombuffer(data, dtype="<u8", count=n + 1, offset=24 + 4 * tokens)
    ids, mask = (words & 0x7FFFFFFF).astype(np.int64), (words >> 31).astype(np.uint8)
    return [(ids[offsets[i]:offsets[i + 1]].tolist(), mask[offsets[i]:offsets[i + 1]].tolist()) for i in range(n)]


def sft(d, data, kind, dataset=None, **extra):
    from datasets import load_dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    tok = AutoTokenizer.from_pretrained(d)
    model = AutoModelForCausalLM.from_pretrained(d, dtype="float32")
    args = SFTConfig(output_dir=tempfile.mkdtemp(), report_to=[], use_cpu=True, max_length=None, shuffle_dataset=False,
                     assistant_only_loss=(kind == "chat"), dataset_num_proc=None, bf16=False, **extra)  # fp32, as ptrain
    ds = dataset if dataset is not None else load_dataset("json", data_files=data, split="train")
    return SFTTrainer(model=model, args=args, train_dataset=ds, processing_class=tok), tok, ds


def masks(d, data, kind, rows_file, *flags):
    trainer, tok, ds = sft(d, data, kind)
    end_of_turn = tok.convert_tokens_to_ids("<|im_end|>")
    ours = read_rows(rows_file)
    theirs = [(r["input_ids"], r["labels"]) for r in trainer.train_dataset]
    assert len(ours) == len(theirs), (len(ours), len(theirs))
    id_rows = mask_rows = trained = 0
    first_bad = None
    for i, ((ids, mask), (tids, labels)) in enumerate(zip(ours, theirs)):
        if ids != list(tids):
            id_rows += 1
            first_bad = first_bad or {"row": i, "ours": ids, "trl": list(tids)}
            continue
        theirs_trained = [l != -100 for l in labels]
        if "--trim-after-end-of-turn" in flags and end_of_turn in ids:
            last = len(ids) - 1 - ids[::-1].index(end_of_turn)
            theirs_trained = [t and j <= last for j, t in enumerate(theirs_trained)]
        # Position 0 is never a target: compare from 1.
        if [bool(m) for m in mask[1:]] != theirs_trained[1:]:
            mask_rows += 1
            first_bad = first_bad or {"row": i, "ours": mask, "trl": [int(l != -100) for l in labels]}
        trained += sum(mask[1:])
    template_rows = 0
    if kind == "chat":
        for (ids, _), row in zip(ours, ds):
            expected = tok.apply_chat_template(row["messages"], tokenize=True)
            if hasattr(expected, "keys"):
                expected = expected["input_ids"]
            template_rows += list(expected) != ids
    out({"rows": len(ours), "id_mismatches": id_rows, "mask_mismatches": mask_rows, "template_mismatches": template_rows,
         "trained": trained, "first_bad": first_bad})


def runs(rows_file):
    rows = read_rows(rows_file)
    most, trained = 0, 0
    for _, mask in rows:
        starts = sum(1 for j in range(1, len(mask)) if mask[j] and not mask[j - 1])
        most = max(most, starts)
        trained += sum(mask[1:])
    out({"rows": len(rows), "trained": trained, "max_runs_per_row": most})


def first_loss(d, data, kind):
    import torch

    rows = sum(1 for line in open(data) if line.strip())
    trainer, _, _ = sft(d, data, kind, per_device_train_batch_size=rows)
    batch = next(iter(trainer.get_train_dataloader()))
    trainer.model.eval()  # dropout is 0 anyway; no randomness either way
    with torch.no_grad():
        loss = trainer.compute_loss(trainer.model, batch)
    out({"loss": float(loss), "rows": rows, "trained": int((batch["labels"][:, 1:] != -100).sum())})


def row_losses(d, dump):
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(d, dtype="float32").eval()
    t = load_file(dump)
    inputs, targets, token_loss = t["batch0/inputs"], t["batch0/targets"], t["batch0/token_loss"]
    # Rows start where positions restart (not by the segment ids, which
    # debug.packing_cross_talk merges): padding is a last row with no trained token.
    segs = (t["batch0/positions"] == 0).long().cumsum(1)
    worst, rows, multi = 0.0, 0, 0
    for b in range(inputs.shape[0]):
        ids = sorted(set(segs[b].tolist()))
        multi += len(ids) > 1
        for k in ids:
            where = segs[b] == k
            x, y = inputs[b][where], targets[b][where]
            trained = y != -100
            if not trained.any():
                continue
            with torch.no_grad():
                logits = model(input_ids=x[None]).logits[0]
            theirs = torch.nn.functional.cross_entropy(logits[trained], y[trained]).item()
            ours = token_loss[b][where][trained].mean().item()
            worst = max(worst, abs(theirs - ours))
            rows += 1
    out({"max_diff": worst, "rows": rows, "packed_sequences": multi})


def compare_grads(a, b, b2=None):
    from safetensors.torch import load_file

    ta, tb = load_file(a), load_file(b)
    tb2 = load_file(b2) if b2 else None
    worst, rel, n = 0.0, 0.0, 0
    for name, g in ta.items():
        if not name.startswith("grad/"):
            continue
        other = tb[name] if tb2 is None else (tb[name] + tb2[name]) / 2
        diff = (g - other).abs().max().item()
        worst = max(worst, diff)
        rel = max(rel, diff / max(g.abs().max().item(), 1e-12))
        n += 1
    out({"max_abs": worst, "max_rel": rel, "tensors": n})


COMMANDS = {"make": make, "masks": masks, "runs": runs, "first-loss": first_loss, "row-losses": row_losses, "compare-grads": compare_grads}

if __name__ == "__main__":
    COMMANDS[sys.argv[1]](*sys.argv[2:])
