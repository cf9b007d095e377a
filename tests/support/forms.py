"""Instruction data in the forms and shapes people have (tests/instruction_forms.rs): the same
rows written by `datasets` (to_parquet, save_to_disk, to_json) and pandas, ShareGPT and Alpaca
rows with their OpenAI-form equivalents (LLaMA-Factory's conversion), tool-calling rows with
Qwen2.5's own template; and the checks of ptrain's encodings against `transformers`'
apply_chat_template (with tools) and TRL's SFTTrainer masks and first loss. Nothing is
downloaded. Each command prints one JSON object.

  forms.py forms SRC N OUT          the first N rows of SRC/chat.jsonl in every form under OUT;
                                    alpaca.json + alpaca_messages.jsonl; sharegpt.json
  forms.py tools-model DIR ROWS SEED a tokenizer and random Qwen2 with Qwen2.5's stock chat template
                                    (TRL's copy), DIR/marked the same with TRL's training variant
                                    ({% generation %} marks); rows: tools.jsonl (tools a list,
                                    arguments objects), tools_str.jsonl (JSON strings), tools.parquet,
                                    sharegpt_tools.json + sharegpt_tools_messages.jsonl
  forms.py check DIR KIND [--qwen-newlines] DATA ROWS [DATA ROWS ...]
                                    per pair: TRL's ids and masks of DATA (read with datasets) vs
                                    ptrain's cached ROWS, and apply_chat_template(messages, tools) of
                                    each row; --qwen-newlines: TRL's extra newline before and after
                                    each trained turn (its Qwen2.5 training template) left out first
  forms.py tool-spans DIR DATA ROWS no trained text holds a tool response; every tool call is trained
  forms.py first-loss DIR DATA KIND SFTTrainer's loss of one batch of every row of DATA
"""
import glob
import gzip
import json
import os
import random
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import chat  # noqa: E402

out = chat.out


def load(data):
    """DATA as `datasets` reads it: JSON (lines or an array), Parquet, a save_to_disk directory
    (a DatasetDict's train split), or a directory of train* shards."""
    from datasets import load_dataset, load_from_disk

    if os.path.isdir(data):
        if os.path.exists(f"{data}/state.json") or os.path.exists(f"{data}/dataset_dict.json"):
            ds = load_from_disk(data)
            return ds["train"] if hasattr(ds, "keys") else ds
        files = sorted(glob.glob(f"{data}/train*"))
        return load_dataset("parquet" if files[0].endswith(".parquet") else "json", data_files=files, split="train")
    return load_dataset("parquet" if data.endswith(".parquet") else "json", data_files=data, split="train")


def raw_rows(data):
    """The rows as json.loads reads them (JSON Lines), else as datasets reads them."""
    if data.endswith(".jsonl"):
        return [json.loads(line) for line in open(data) if line.strip()]
    return list(load(data))


def forms(src, n, dst):
    from datasets import Dataset, DatasetDict
    import pandas as pd
    import pyarrow as pa

    os.makedirs(dst, exist_ok=True)
    lines = [line for line in open(f"{src}/chat.jsonl") if line.strip()][: int(n)]
    rows = [json.loads(line) for line in lines]
    text = "".join(lines)
    open(f"{dst}/rows.jsonl", "w").write(text)
    open(f"{dst}/bom.jsonl", "w", encoding="utf-8-sig").write(text)
    with gzip.open(f"{dst}/rows.jsonl.gz", "wt") as f:
        f.write(text)
    with pa.CompressedOutputStream(f"{dst}/rows.jsonl.zst", "zstd") as f:
        f.write(text.encode())
    ds = Dataset.from_list(rows)
    ds.to_json(f"{dst}/lines.json")  # JSON Lines, though named .json
    pd.DataFrame(rows).to_json(f"{dst}/array.json", orient="records", force_ascii=False, indent=2)
    ds.to_parquet(f"{dst}/rows.parquet")
    os.makedirs(f"{dst}/shards", exist_ok=True)
    for i in range(3):
        ds.shard(3, i, contiguous=True).to_parquet(f"{dst}/shards/train-{i:05d}-of-00003.parquet")
    ds.select(range(2)).to_parquet(f"{dst}/shards/test-00000-of-00001.parquet")
    ds.save_to_disk(f"{dst}/saved")
    DatasetDict({"train": ds, "test": ds.select(range(2))}).save_to_disk(f"{dst}/dict")
    names = {"user": "human", "assistant": "gpt", "system": "system"}
    sharegpt = [{"conversations": [{"from": names[m["role"]], "value": m["content"]} for m in r["messages"]]} for r in rows]
    json.dump(sharegpt, open(f"{dst}/sharegpt.json", "w"), indent=1)
    alpaca(dst, int(n))
    out({"rows": len(rows)})


def alpaca(dst, n):
    """Alpaca rows and the messages LLaMA-Factory's AlpacaDatasetConverter makes of them: history
    pairs, one user turn of the non-empty instruction and input joined by a newline, the output;
    the system prompt (when not empty) first."""
    rng = random.Random(5)
    rows, messages = [], []
    for i in range(n):
        row = {"instruction": chat.sentence(rng, 1, 8), "input": chat.sentence(rng, 1, 6) if i % 2 else "",
               "output": chat.sentence(rng, 1, 12), "system": chat.sentence(rng, 2, 5) if i % 3 == 0 else "",
               "history": [[chat.sentence(rng, 1, 5), chat.sentence(rng, 1, 5)]] if i % 4 == 1 else []}
        rows.append(row)
        m = [{"role": "system", "content": row["system"]}] if row["system"] else []
        for user, assistant in row["history"]:
            m += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
        m.append({"role": "user", "content": "\n".join(q for q in (row["instruction"], row["input"]) if q)})
        m.append({"role": "assistant", "content": row["output"]})
        messages.append({"messages": m})
    json.dump(rows, open(f"{dst}/alpaca.json", "w"), indent=2)
    with open(f"{dst}/alpaca_messages.jsonl", "w") as f:
        for m in messages:
            f.write(json.dumps(m) + "\n")


TOOLS = [{"type": "function", "function": {"name": name, "description": description, "parameters": {
    "type": "object", "properties": {"query": {"type": "string", "description": "what to look up"}}, "required": ["query"]}}}
    for name, description in [("search", "Search the web for a query"), ("weather", "Current weather & forecast for a place"),
                              ("calc", "Evaluate an arithmetic <expression>")]]


def tool_conversation(rng):
    tools = rng.sample(TOOLS, rng.randint(1, 3))
    messages = [{"role": "system", "content": chat.sentence(rng, 2, 6)}] if rng.random() < 0.3 else []
    messages.append({"role": "user", "content": chat.sentence(rng, 2, 10) + " ?"})
    if rng.random() < 0.8:
        calls = [{"type": "function", "function": {"name": rng.choice(tools)["function"]["name"],
                                                   "arguments": {"query": chat.sentence(rng, 1, 4)}}} for _ in range(rng.randint(1, 2))]
        messages.append({"role": "assistant", "content": rng.choice([None, "", chat.sentence(rng, 1, 5)]), "tool_calls": calls})
        for call in calls:
            messages.append({"role": "tool", "content": "result: " + chat.sentence(rng, 1, 8)})
    messages.append({"role": "assistant", "content": chat.sentence(rng, 1, 12)})
    if rng.random() < 0.3:
        messages += [{"role": "user", "content": chat.sentence(rng, 1, 6)}, {"role": "assistant", "content": chat.sentence(rng, 1, 8)}]
    return {"messages": messages, "tools": tools}


def stringified(row):
    """The same row with its tools and tool-call arguments as JSON strings."""
    row = json.loads(json.dumps(row))
    for m in row["messages"]:
        for call in m.get("tool_calls") or []:
            call["function"]["arguments"] = json.dumps(call["function"]["arguments"])
    row["tools"] = json.dumps(row["tools"])
    return row


def sharegpt_tools(row):
    """LLaMA-Factory's ShareGPT form of a tool row (function_call / observation turns, the tools a
    JSON string), and the OpenAI-form row ptrain makes of it."""
    turns, messages = [], []
    names = {"user": "human", "assistant": "gpt", "system": "system", "tool": "observation"}
    for m in row["messages"]:
        if m.get("tool_calls"):
            calls = [c["function"] for c in m["tool_calls"]]
            turns.append({"from": "function_call", "value": json.dumps(calls[0] if len(calls) == 1 else calls)})
            messages.append({"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": c} for c in calls]})
        else:
            turns.append({"from": names[m["role"]], "value": m["content"]})
            messages.append({"role": m["role"], "content": m["content"]})
    tools = [t["function"] for t in row["tools"]]
    return {"conversations": turns, "tools": json.dumps(tools)}, {"messages": messages, "tools": tools}


def tools_model(d, rows, seed):
    from datasets import load_dataset
    from transformers import AutoTokenizer

    rng = random.Random(int(seed))
    convs = [tool_conversation(rng) for _ in range(int(rows))]
    chat.make_model(d, rng, 400, 2048, True, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2)
    # transformers 5 loads a qwen2 model's tokenizer with Qwen2's own pre-tokenizer (digits one
    # by one) whatever tokenizer.json says: save that one, so that both sides read the same.
    AutoTokenizer.from_pretrained(d).backend_tokenizer.save(f"{d}/tokenizer.json")
    templates = os.path.join(os.path.dirname(__import__("trl").__file__), "chat_templates")
    config = json.load(open(f"{d}/tokenizer_config.json"))
    config["chat_template"] = open(f"{templates}/qwen2_5.jinja").read()
    json.dump(config, open(f"{d}/tokenizer_config.json", "w"))
    os.makedirs(f"{d}/marked", exist_ok=True)
    for f in ("config.json", "model.safetensors", "tokenizer.json", "generation_config.json"):
        if os.path.exists(f"{d}/{f}"):
            shutil.copy(f"{d}/{f}", f"{d}/marked/{f}")
    config["chat_template"] = open(f"{templates}/qwen2_5_training.jinja").read()
    json.dump(config, open(f"{d}/marked/tokenizer_config.json", "w"))
    with open(f"{d}/tools.jsonl", "w") as f:
        for c in convs:
            f.write(json.dumps(c) + "\n")
    with open(f"{d}/tools_str.jsonl", "w") as f:
        for c in convs:
            f.write(json.dumps(stringified(c)) + "\n")
    load_dataset("json", data_files=f"{d}/tools.jsonl", split="train").to_parquet(f"{d}/tools.parquet")
    pairs = [sharegpt_tools(c) for c in convs]
    json.dump([p[0] for p in pairs], open(f"{d}/sharegpt_tools.json", "w"))
    with open(f"{d}/sharegpt_tools_messages.jsonl", "w") as f:
        for p in pairs:
            f.write(json.dumps(p[1]) + "\n")
    out({"rows": len(convs), "tool_calls": sum(1 for c in convs for m in c["messages"] if m.get("tool_calls"))})


def tools_of(row):
    tools = row.get("tools")
    return json.loads(tools) if isinstance(tools, str) else tools


def trim_qwen_newlines(ids, trained, tok):
    """TRL's Qwen2.5 training template marks '\\n' + content + '<|im_end|>\\n': the newline after
    `assistant` (part of the generation prompt) and the one after <|im_end|> (never generated).
    Returns the mask without them and how many were taken out."""
    end = tok.convert_tokens_to_ids("<|im_end|>")
    trained = list(trained)
    taken = 0
    i = 0
    while i < len(trained):
        if not trained[i]:
            i += 1
            continue
        j = i
        while j < len(trained) and trained[j]:
            j += 1
        if tok.decode([ids[i]]) == "\n":
            trained[i] = False
            taken += 1
        run = range(i, j)
        last = max((k for k in run if ids[k] == end), default=None)
        for k in run:
            if last is not None and k > last:
                trained[k] = False
                taken += 1
        i = j
    return trained, taken


def check(d, kind, *args):
    from transformers import AutoTokenizer

    newlines = "--qwen-newlines" in args
    args = [a for a in args if a != "--qwen-newlines"]
    tok = AutoTokenizer.from_pretrained(d)
    reports = []
    for data, rows_file in zip(args[::2], args[1::2]):
        trainer, _, _ = chat.sft(d, None, kind, dataset=load(data))
        ours = chat.read_rows(rows_file)
        theirs = [(r["input_ids"], r["labels"]) for r in trainer.train_dataset]
        assert len(ours) == len(theirs), (data, len(ours), len(theirs))
        ids_bad = mask_bad = template_bad = trained = taken = turns = 0
        first_bad = None
        for i, ((ids, mask), (tids, labels), row) in enumerate(zip(ours, theirs, raw_rows(data))):
            expected = tok.apply_chat_template(row["messages"], tools=tools_of(row), tokenize=True) if kind == "chat" else ids
            if hasattr(expected, "keys"):
                expected = expected["input_ids"]
            template_bad += list(expected) != ids
            if ids != list(tids):
                ids_bad += 1
                first_bad = first_bad or {"data": data, "row": i, "ours": ids, "trl": list(tids)}
                continue
            want = [label != -100 for label in labels]
            if newlines:
                want, n = trim_qwen_newlines(ids, want, tok)
                taken += n
                turns += sum(1 for m in row["messages"] if m["role"] == "assistant")
            if [bool(m) for m in mask[1:]] != want[1:]:
                mask_bad += 1
                first_bad = first_bad or {"data": data, "row": i, "ours": mask, "trl": [int(w) for w in want]}
            trained += sum(mask[1:])
        reports.append({"data": data, "rows": len(ours), "id_mismatches": ids_bad, "template_mismatches": template_bad,
                        "mask_mismatches": mask_bad, "trained": trained, "trl_extra_per_turn": taken / max(turns, 1),
                        "first_bad": first_bad})
    out({"reports": reports})


def tool_spans(d, data, rows_file):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(d)
    responses_trained = calls = calls_trained = 0
    for (ids, mask), row in zip(chat.read_rows(rows_file), raw_rows(data)):
        runs, run = [], []
        for i, m in enumerate(mask):
            if m and i > 0:
                run.append(ids[i])
            elif run:
                runs.append(tok.decode(run))
                run = []
        if run:
            runs.append(tok.decode(run))
        trained_text = "\x00".join(runs)
        for m in row["messages"]:
            if m["role"] == "tool" and m["content"] in trained_text:
                responses_trained += 1
        responses_trained += trained_text.count("<tool_response>")
        n = sum(len(m.get("tool_calls") or []) for m in row["messages"])
        calls += n
        calls_trained += min(n, trained_text.count("<tool_call>"))
    out({"tool_responses_trained": responses_trained, "tool_calls": calls, "tool_calls_trained": calls_trained})


def first_loss(d, data, kind):
    import torch

    ds = load(data)
    trainer, _, _ = chat.sft(d, None, kind, dataset=ds, per_device_train_batch_size=len(ds))
    batch = next(iter(trainer.get_train_dataloader()))
    trainer.model.eval()
    with torch.no_grad():
        loss = trainer.compute_loss(trainer.model, batch)
    out({"loss": float(loss), "rows": len(ds), "trained": int((batch["labels"][:, 1:] != -100).sum())})


COMMANDS = {"forms": forms, "tools-model": tools_model, "check": check, "tool-spans": tool_spans, "first-loss": first_loss}



def bad_columnar(parquet, saved, typed, dict_dir):
    """A Parquet file whose row 2 has an unknown role; a save_to_disk dataset with an extra
    column; a Parquet file with a timestamp column; a DatasetDict without a train split."""
    from datasets import Dataset, DatasetDict
    import pyarrow as pa
    import pyarrow.parquet as pq

    def row(role):
        return {"messages": [{"role": "user", "content": "hi"}, {"role": role, "content": "yo"}]}

    Dataset.from_list([row("assistant"), row("assistant"), row("robot")]).to_parquet(parquet)
    Dataset.from_list([dict(row("assistant"), source="a"), dict(row("assistant"), source="b")]).save_to_disk(saved)
    table = pa.table({"messages": [row("assistant")["messages"]], "when": pa.array([0], type=pa.timestamp("s"))})
    pq.write_table(table, typed)
    ds = Dataset.from_list([row("assistant")])
    DatasetDict({"test": ds, "validation": ds}).save_to_disk(dict_dir)
    out({"ok": True})


COMMANDS["bad-columnar"] = bad_columnar


if __name__ == "__main__":
    COMMANDS[sys.argv[1]](*sys.argv[2:])
