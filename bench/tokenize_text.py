"""Python side of bench/tokenize.sh.
(Not named tokenize.py: scripts run from bench/ would import it instead of the standard library's tokenize.)

  tokenize_text.py make-text OUT MB                 MB megabytes of varied English-like text (no download)
  tokenize_text.py train-tokenizer TEXT OUT VOCAB   byte-level BPE (GPT-2 style) trained on TEXT's first 20 MB
  tokenize_text.py encode TOKENIZER TEXT            the tokenizers package's encode_batch (and encode_batch_fast)
                                               on TEXT cut as ptrain cuts it; prints JSON
"""
import itertools
import json
import random
import sys
import time

PIECE = 128 * 1024  # ptrain's piece size (core/src/data/tokenize.rs)
BATCH = 8 * 1024 * 1024  # text handed to the thread pool at once, as ptrain


def make_text(out, mb):
    rng = random.Random(0)
    syllables = ["ka", "lo", "ter", "in", "ma", "sur", "pe", "da", "ri", "on", "vel", "at", "es", "qu", "ni", "bo"]
    # A Zipf-like vocabulary: a few very common words, a long tail.
    words = ["the", "of", "and", "to", "a", "in", "is", "that", "for", "it", "was", "on", "with", "as", "by"]
    words += ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 4))) for _ in range(30000)]
    # Cumulative once: random.choices would sum the 30k weights again on every call.
    cum_weights = list(itertools.accumulate(1.0 / (i + 1) for i in range(len(words))))
    target = int(float(mb) * 1024 * 1024)
    size = 0
    with open(out, "w", encoding="utf-8") as f:
        while size < target:
            sentence = " ".join(rng.choices(words, cum_weights=cum_weights, k=rng.randint(4, 30)))
            sentence = sentence[0].upper() + sentence[1:] + rng.choice([".", ".", ".", "?", "!", ", 1984.", " (see 3.2)."])
            line = sentence + ("\n\n" if rng.random() < 0.2 else "\n")
            f.write(line)
            size += len(line.encode())


def train_tokenizer(text, out, vocab):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    with open(text, encoding="utf-8") as f:
        sample = f.read(20 * 1024 * 1024)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=int(vocab), special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(sample.splitlines(keepends=True), trainer)
    tok.save(out)


def pieces(text):
    """ptrain's cuts: after a newline between two non-whitespace characters, every ~PIECE."""
    out, start, at = [], 0, PIECE
    while True:
        nl = text.find("\n", at)
        if nl < 0 or nl + 1 >= len(text):
            break
        if nl > 0 and not text[nl - 1].isspace() and not text[nl + 1].isspace():
            out.append(text[start : nl + 1])
            start, at = nl + 1, nl + 1 + PIECE
        else:
            at = nl + 1
    out.append(text[start:])
    return out


def encode(tok_path, text_path):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(tok_path)
    with open(text_path, encoding="utf-8") as f:
        text = f.read()
    parts = pieces(text)
    per_batch = max(1, BATCH // PIECE)
    report = {"bytes": len(text.encode()), "pieces": len(parts)}
    for name in ["encode_batch", "encode_batch_fast"]:
        fn = getattr(tok, name)
        started = time.perf_counter()
        tokens = 0
        for i in range(0, len(parts), per_batch):
            tokens += sum(len(e.ids) for e in fn(parts[i : i + per_batch], add_special_tokens=False))
        seconds = time.perf_counter() - started
        report[name] = {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds}
    print(json.dumps(report))


if __name__ == "__main__":
    {"make-text": make_text, "train-tokenizer": train_tokenizer, "encode": encode}[sys.argv[1]](*sys.argv[2:])
