"""Python side of bench/chat_tokenize.sh: 1,000,000 chat rows in JSON Lines and Parquet, a
tokenizer with Qwen2.5's chat template, and the reference: `datasets.map` of
`apply_chat_template` on the same rows, the same tokenizer and the same cores.

  chat_rows.py make DIR ROWS            DIR/tokenizer (a 32k byte-level BPE trained on generated text,
                                        ChatML special tokens, Qwen2.5's stock template from TRL's
                                        package), DIR/rows.jsonl and DIR/rows.parquet (ROWS conversations:
                                        an optional system prompt, 1-3 user/assistant turns)
  chat_rows.py map DIR DATA PROCS       datasets.load_dataset(DATA) then .map(apply_chat_template) with
                                        num_proc=PROCS into a fresh cache; prints JSON: rows, tokens,
                                        seconds (load, map), rows/s, peak RSS of the process tree
"""
import json
import os
import random
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def make(d, rows):
    import itertools

    import pyarrow.json as pj
    import pyarrow.parquet as pq
    from tokenizers import AddedToken, Tokenizer

    import tokenize_text

    os.makedirs(f"{d}/tokenizer", exist_ok=True)
    text = f"{d}/text.txt"
    if not os.path.exists(text):
        tokenize_text.make_text(text, 30)
    tok_file = f"{d}/tokenizer/tokenizer.json"
    tokenize_text.train_tokenizer(text, tok_file, 32000)
    tok = Tokenizer.from_file(tok_file)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in ("<|im_start|>", "<|im_end|>")])
    tok.save(tok_file)
    templates = os.path.join(os.path.dirname(__import__("trl").__file__), "chat_templates")
    json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
               "chat_template": open(f"{templates}/qwen2_5.jinja").read()}, open(f"{d}/tokenizer/tokenizer_config.json", "w"))
    lines = [line.strip() for line in itertools.islice(open(text), 200000) if line.strip()]
    rng = random.Random(0)
    with open(f"{d}/rows.jsonl", "w") as f:
        for _ in range(int(rows)):
            messages = [{"role": "system", "content": rng.choice(lines)}] if rng.random() < 0.3 else []
            for _ in range(rng.randint(1, 3)):
                messages.append({"role": "user", "content": " ".join(rng.choices(lines, k=rng.randint(1, 2)))})
                messages.append({"role": "assistant", "content": " ".join(rng.choices(lines, k=rng.randint(1, 6)))})
            f.write(json.dumps({"messages": messages}, ensure_ascii=False) + "\n")
    table = pj.read_json(f"{d}/rows.jsonl", read_options=pj.ReadOptions(block_size=64 << 20))
    pq.write_table(table, f"{d}/rows.parquet")
    print(json.dumps({"rows": int(rows), "jsonl_bytes": os.path.getsize(f"{d}/rows.jsonl"), "parquet_bytes": os.path.getsize(f"{d}/rows.parquet")}))


def peak_rss(stop, out):
    """The largest summed RSS of this process and its children, sampled every 50 ms."""
    import psutil

    me = psutil.Process()
    while not stop.is_set():
        total = 0
        for p in [me] + me.children(recursive=True):
            try:
                total += p.memory_info().rss
            except psutil.Error:
                pass
        out[0] = max(out[0], total)
        time.sleep(0.05)


def map_rows(d, data, procs):
    cache = tempfile.mkdtemp(dir=d)
    os.environ["HF_DATASETS_CACHE"] = cache
    from datasets import load_dataset
    from transformers import AutoTokenizer

    stop, peak = threading.Event(), [0]
    watcher = threading.Thread(target=peak_rss, args=(stop, peak), daemon=True)
    watcher.start()
    tok = AutoTokenizer.from_pretrained(f"{d}/tokenizer")
    started = time.perf_counter()
    ds = load_dataset("parquet" if data.endswith(".parquet") else "json", data_files=data, split="train", cache_dir=cache)
    loaded = time.perf_counter()

    def encode(row):
        return {"input_ids": tok.apply_chat_template(row["messages"], tokenize=True)["input_ids"]}

    out = ds.map(encode, num_proc=int(procs) if int(procs) > 1 else None, remove_columns=ds.column_names)
    done = time.perf_counter()
    tokens = sum(len(ids) for ids in out.with_format("arrow")["input_ids"].to_pylist()) if len(out) <= 200000 else None
    stop.set()
    watcher.join()
    print(json.dumps({"rows": len(out), "tokens": tokens, "load_s": loaded - started, "map_s": done - loaded,
                      "rows_per_s": len(out) / (done - started), "map_rows_per_s": len(out) / (done - loaded), "peak_rss_mb": peak[0] / 2**20}))


if __name__ == "__main__":
    {"make": make, "map": map_rows}[sys.argv[1]](*sys.argv[2:])
