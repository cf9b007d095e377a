"""Hugging Face side of tests/hf.rs: makes models, tokenizers and data with the real
`transformers` and `tokenizers` packages, and checks what ptrain wrote with them.
Nothing is downloaded. Each command prints one JSON object (or nothing).

  hf.py make-model DIR                       random GPT-2 (2 layers, 2 heads, 64 wide, vocab 512,
                                             128 positions), every parameter perturbed, save_pretrained
  hf.py make-llama KIND DIR [TOKENIZER_JSON|-] [--bf16-sharded] [--large]
                                             a random llama (untied, llama3 rope scaling), qwen2 (q/k/v
                                             bias, tied, GQA 4:2), qwen3 (q/k norm, head_dim 24 != 64/4)
                                             or mistral, every parameter perturbed, save_pretrained; with a
                                             tokenizer: its vocabulary, tokenizer.json and eos id beside it;
                                             --large: 12 layers 768 wide (about 100M parameters)
  hf.py make-gemma KIND DIR [TOKENIZER_JSON|-] [--4x]
                                             a random gemma2 (alternating sliding and full layers, window 8,
                                             attention and final logits soft-capped at 2 and 3) or gemma3
                                             (q/k norms, three sliding layers to one full, local RoPE base 1e4,
                                             global 1e6), query_pre_attn_scalar 32 != head_dim 24, every
                                             parameter perturbed by N(0, 0.2) so that each feature changes the
                                             logits (the post-norms by 4 more, so that greedy generation varies),
                                             save_pretrained; with a tokenizer: its vocabulary, tokenizer.json and
                                             eos id beside it; --4x: config.json in the 4.x form
  hf.py make-moe KIND DIR [TOKENIZER_JSON|-] [--fused]
                                             a random qwen3_moe (q/k norms, head_dim 24, norm_topk_prob
                                             false) or mixtral (top-k renormalised), 2 layers 64 wide, 4
                                             experts of width 32, top 2, router_aux_loss_coef 0.02, every
                                             parameter perturbed, save_pretrained (one tensor per expert);
                                             --fused: model.safetensors with the stacked experts
                                             (mlp.experts.gate_up_proj) as transformers 5 holds them
  hf.py make-tokens FILE N                   N random ids < 512 as a nanoGPT uint16 .bin
  hf.py make-text FILE LINES SEED            varied UTF-8 text (blank lines, indents, accents)
  hf.py make-jsonl FILE ROWS SEED            rows {"text": ...}
  hf.py train-tokenizer TEXT OUT VOCAB [--prefix-space]
                                             byte-level BPE trained on TEXT, saved as tokenizer.json
  hf.py make-wordlevel OUT TEXT N            a word-level tokenizer of N ids ("w0".."w{N-2}", [UNK]) and
                                             a TEXT using its largest ids
  hf.py reshape DIR TENSOR                   rewrites DIR/model.safetensors with TENSOR transposed
  hf.py drop-tensor DIR TENSOR               rewrites DIR/model.safetensors without TENSOR
  hf.py add-chat-template DIR                a ChatML chat_template in DIR/tokenizer_config.json
  hf.py chat-ids DIR TEXT [SYSTEM]           apply_chat_template([system: SYSTEM,] [user: TEXT], add_generation_prompt=True)
  hf.py compare-logits MODEL_DIR PROBE [--bf16] [--cuda] [--features] [--router]
                                             transformers' logits and loss on PROBE's batch vs ptrain's
                                             (--bf16: transformers' loss under bf16 autocast; --cuda: on
                                             the GPU, as gpu/validate.sh --device cuda compares; --features:
                                             a Gemma's "features", transformers' logits with each feature off
                                             in turn, as their largest distance from PROBE's logits; --router:
                                             with output_router_logits, the loss with the router term
                                             and aux_loss as hf_aux_loss)
  hf.py generate MODEL_DIR IDS N             model.generate(do_sample=False, max_new_tokens=N) from the
                                             comma-separated prompt IDS: the new ids
  hf.py check-ids TOKENIZER SOURCE CACHE [--jsonl FIELD EOS]
                                             the Python tokenizer's ids vs ptrain's cached ids
  hf.py load-export DIR PROBE [SOURCE]       AutoModelForCausalLM.from_pretrained(DIR): loading report,
                                             warnings, logits vs PROBE's; its tokenizer vs SOURCE's
  hf.py lr-schedule LR WARMUP STEPS          the learning rate of each of STEPS optimizer steps under
                                             Trainer with TrainingArguments(learning_rate=LR,
                                             warmup_steps=WARMUP: a ratio below 1), lr_scheduler_type linear
  hf.py training-defaults                    TrainingArguments()'s optimizer and schedule defaults
"""
import json
import logging
import random
import sys
import warnings

import numpy as np


def out(obj):
    print(json.dumps(obj))


def make_model(d):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=512, n_positions=128))
    # Fresh biases are 0 and layer-norm weights 1: perturb everything so that a
    # misplaced or untransposed tensor cannot go unnoticed.
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    model.save_pretrained(d)


LLAMA_KINDS = {
    # Llama 3.1-style: untied head, llama3 rope scaling that matters within 128 positions.
    "llama": dict(
        cls="LlamaConfig",
        num_key_value_heads=2,
        tie_word_embeddings=False,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        },
        rms_norm_eps=1e-5,
    ),
    # Qwen2: biases on q/k/v, tied embeddings, GQA 4:2.
    "qwen2": dict(cls="Qwen2Config", num_key_value_heads=2, tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
    # Qwen3: per-head q/k RMSNorm, head_dim not hidden / heads.
    "qwen3": dict(cls="Qwen3Config", num_key_value_heads=2, head_dim=24, tie_word_embeddings=False, rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
    "mistral": dict(cls="MistralConfig", num_key_value_heads=1, sliding_window=None, tie_word_embeddings=False),
}


def tiny_config_of(kinds, kind, tokenizer):
    """KIND's config class in KINDS and the rest of its spec, and the vocabulary size and
    end-of-text id of the tokenizer file TOKENIZER ("-": none: 512 tokens, no end), and
    the tokenizer (None for "-")."""
    import transformers

    spec = dict(kinds[kind])
    cls = getattr(transformers, spec.pop("cls"))
    tokenizer = None if tokenizer == "-" else tokenizer
    if not tokenizer:
        return cls, spec, 512, None, None
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(tokenizer)
    return cls, spec, tok.get_vocab_size(), tok.token_to_id("<|endoftext|>"), tokenizer


def save_tokenizer(d, tokenizer):
    """The tokenizer file TOKENIZER (if any) beside the model saved in D, as the hub has it."""
    import shutil

    if tokenizer:
        shutil.copy(tokenizer, f"{d}/tokenizer.json")
        with open(f"{d}/tokenizer_config.json", "w") as f:
            json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>", "model_max_length": 128}, f)


def make_llama(kind, d, tokenizer=None, *flags):
    import torch
    import transformers

    cls, spec, vocab, eos, tokenizer = tiny_config_of(LLAMA_KINDS, kind, tokenizer)
    size = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4)
    if "--large" in flags:
        size = dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12)
    config = cls(
        vocab_size=vocab,
        **size,
        max_position_embeddings=128,
        bos_token_id=None,
        eos_token_id=eos,
        pad_token_id=None,
        **spec,
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    # Fresh biases are 0 and norm weights 1: perturb everything so that a misplaced
    # tensor cannot go unnoticed.
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    if "--bf16-sharded" in flags:
        # Hub checkpoints: bf16 weights in several files with an index.
        model.to(torch.bfloat16).save_pretrained(d, max_shard_size="100KB")
    else:
        model.save_pretrained(d)
    save_tokenizer(d, tokenizer)


SLIDING, FULL = "sliding_attention", "full_attention"

GEMMA_KINDS = {
    "gemma2": dict(cls="Gemma2Config", layer_types=[SLIDING, FULL, SLIDING, FULL], attn_logit_softcapping=2.0, final_logit_softcapping=3.0),
    "gemma3": dict(
        cls="Gemma3TextConfig",
        layer_types=[SLIDING, SLIDING, SLIDING, FULL],
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6}, "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}},
    ),
}


def make_gemma(kind, d, tokenizer=None, *flags):
    import torch
    import transformers

    cls, spec, vocab, eos, tokenizer = tiny_config_of(GEMMA_KINDS, kind, tokenizer)
    config = cls(
        vocab_size=vocab, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        head_dim=24, query_pre_attn_scalar=32, sliding_window=8, max_position_embeddings=128, bos_token_id=None, eos_token_id=eos,
        pad_token_id=None, **spec,
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    perturb_gemma(model)
    model.save_pretrained(d)
    if "--4x" in flags:
        with open(f"{d}/config.json") as f:
            c = json.load(f)
        if kind == "gemma3":
            rope = c.pop("rope_parameters")
            c["rope_theta"], c["rope_local_base_freq"] = rope["full_attention"]["rope_theta"], rope["sliding_attention"]["rope_theta"]
            c["rope_scaling"], c["sliding_window_pattern"] = None, 4
            c.pop("layer_types")
            c.pop("_sliding_window_pattern", None)
        else:
            c["rope_theta"] = c.pop("rope_parameters")["rope_theta"]
        c["torch_dtype"] = c.pop("dtype")
        with open(f"{d}/config.json", "w") as f:
            json.dump(c, f)
    save_tokenizer(d, tokenizer)


def perturb_gemma(model):
    """Fresh Gemma norms are 0 (they scale by 1 + weight): perturbs every weight, and
    enough that the soft caps, the window and the scales each change the logits; the
    sub-layers' output norms 5x, so that the blocks, not the copied token embedding (the
    head is tied), decide what greedy generation continues with."""
    import torch

    with torch.no_grad():
        for name, p in model.named_parameters():
            p.add_(torch.randn_like(p) * 0.2 + (4.0 if ".post_" in name else 0.0))


def gemma_features(model, probe):
    """For each Gemma feature, the largest distance of PROBE's logits from transformers'
    with that feature turned off."""
    import copy

    import torch
    from transformers import AutoModelForCausalLM

    ours = probe["logits"]

    def logits(m):
        with torch.no_grad():
            return m(probe["inputs"]).logits

    def without(**changes):
        config = copy.deepcopy(model.config)
        for key, value in changes.items():
            setattr(config, key, value)
        m = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        m.load_state_dict(model.state_dict())
        return (logits(m.eval()) - ours).abs().max().item()

    c = model.config
    report = {
        "sliding_window": without(layer_types=[FULL] * c.num_hidden_layers),
        "query_pre_attn_scalar": without(query_pre_attn_scalar=c.head_dim),
    }
    if c.model_type == "gemma2":
        report["attn_logit_softcapping"] = without(attn_logit_softcapping=None)
        report["final_logit_softcapping"] = without(final_logit_softcapping=None)
    else:
        rope = copy.deepcopy(c.rope_parameters)
        rope["sliding_attention"]["rope_theta"] = rope["full_attention"]["rope_theta"]
        report["rope_local_base_freq"] = without(rope_parameters=rope)
    scale = model.model.embed_tokens.embed_scale.clone()
    with torch.no_grad():
        model.model.embed_tokens.embed_scale.fill_(1.0)
    report["embed_scale"] = (logits(model) - ours).abs().max().item()
    with torch.no_grad():
        model.model.embed_tokens.embed_scale.copy_(scale)
    return report


MOE_KINDS = {
    "qwen3_moe": dict(cls="Qwen3MoeConfig", head_dim=24, moe_intermediate_size=32, num_experts=4, norm_topk_prob=False),
    # norm_topk_prob as transformers' default (False); a shared expert wider than the routed ones.
    "qwen2_moe": dict(cls="Qwen2MoeConfig", moe_intermediate_size=32, shared_expert_intermediate_size=48, num_experts=4),
    "mixtral": dict(cls="MixtralConfig", intermediate_size=32, num_local_experts=4),
}

# Flags of make-moe: dense blocks (4 blocks; 1 and 3 with experts), routing noise.
MOE_FLAGS = {
    "--mlp-only": dict(num_hidden_layers=4, mlp_only_layers=[0, 2]),
    "--sparse-step": dict(num_hidden_layers=4, decoder_sparse_step=2),
    "--jitter": dict(router_jitter_noise=0.2),
}


def make_moe(kind, d, tokenizer=None, *flags):
    import torch
    import transformers

    cls, spec, vocab, eos, tokenizer = tiny_config_of(MOE_KINDS, kind, tokenizer)
    spec.setdefault("intermediate_size", 96)
    spec.setdefault("num_hidden_layers", 2)
    for flag in flags:
        spec.update(MOE_FLAGS.get(flag, {}))
    config = cls(
        vocab_size=vocab, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, num_experts_per_tok=2,
        router_aux_loss_coef=0.02, max_position_embeddings=128, bos_token_id=None, eos_token_id=eos, pad_token_id=None, **spec,
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    # Perturb everything (the routers most, so that tokens spread over the experts).
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.add_(torch.randn_like(p) * (1.0 if ".gate." in name or name.endswith("gate.weight") else 0.05))
    model.save_pretrained(d)
    if "--fused" in flags:
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, f"{d}/model.safetensors", metadata={"format": "pt"})
    save_tokenizer(d, tokenizer)


def make_tokens(path, n):
    rng = np.random.default_rng(0)
    rng.integers(0, 512, int(n), dtype=np.uint16).tofile(path)


WORDS = ["the", "model", "tokenizer", "naïve", "café", "über", "data", "12", "2024", "x=y+1;", "(ok)", "—", "日本", "emoji🙂", "it's", "we'll"]


def text_lines(n, seed):
    rng = random.Random(int(seed))
    lines = []
    for _ in range(int(n)):
        r = rng.random()
        if r < 0.1:
            lines.append("")
        else:
            indent = "    " if r < 0.2 else (" " if r < 0.25 else "")
            sep = "  " if r > 0.95 else " "
            lines.append(indent + sep.join(rng.choice(WORDS) for _ in range(rng.randint(1, 14))))
    return lines


def make_text(path, n, seed):
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(text_lines(n, seed)) + "\n")


def make_jsonl(path, n, seed):
    with open(path, "w", encoding="utf-8") as f:
        lines = text_lines(int(n) * 3, seed)
        for i in range(int(n)):
            f.write(json.dumps({"id": i, "text": "\n".join(lines[3 * i : 3 * i + 3])}) + "\n")


def train_tokenizer(text, path, vocab, *flags):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space="--prefix-space" in flags)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=int(vocab), special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train([text], trainer)
    tok.save(path)


def make_wordlevel(path, text, n):
    from tokenizers import Tokenizer, models, pre_tokenizers

    n = int(n)
    vocab = {f"w{i}": i for i in range(n - 1)}
    vocab["[UNK]"] = n - 1
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(path)
    rng = random.Random(3)
    with open(text, "w") as f:
        for _ in range(4000):
            f.write(" ".join(f"w{rng.choice([rng.randrange(n - 1), n - 2, n - 3])}" for _ in range(8)) + " unknown\n")


def reshape(d, name):
    from safetensors.torch import load_file, save_file

    tensors = load_file(f"{d}/model.safetensors")
    tensors[name] = tensors[name].t().contiguous()
    save_file(tensors, f"{d}/model.safetensors", metadata={"format": "pt"})


def drop_tensor(d, name):
    from safetensors.torch import load_file, save_file

    tensors = load_file(f"{d}/model.safetensors")
    del tensors[name]
    save_file(tensors, f"{d}/model.safetensors", metadata={"format": "pt"})


CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'].strip() + '<|im_end|>' + '\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def add_chat_template(d):
    with open(f"{d}/tokenizer_config.json") as f:
        config = json.load(f)
    config["chat_template"] = CHATML
    with open(f"{d}/tokenizer_config.json", "w") as f:
        json.dump(config, f)


def chat_ids(d, text, system=None):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(d)
    messages = ([{"role": "system", "content": system}] if system is not None else []) + [{"role": "user", "content": text}]
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    out({"ids": list(ids)})


class Captured(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def load_model(d):
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    transformers.logging.set_verbosity_warning()
    handler = Captured()
    logging.getLogger("transformers").addHandler(handler)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model, info = AutoModelForCausalLM.from_pretrained(d, output_loading_info=True, dtype=torch.float32)
    model.eval()
    messages = handler.messages + [str(w.message) for w in caught]
    info = {k: sorted(map(str, v)) for k, v in info.items()}
    return model, info, messages


def compare_logits(model_dir, probe_path, *flags):
    import contextlib

    import torch
    from safetensors.torch import load_file

    device = "cuda" if "--cuda" in flags else "cpu"
    probe = {k: v.to(device) for k, v in load_file(probe_path).items()}
    model, _, _ = load_model(model_dir)
    model.to(device)
    inputs, targets = probe["inputs"], probe["targets"]
    bf16 = torch.autocast(device, dtype=torch.bfloat16) if "--bf16" in flags else contextlib.nullcontext()
    with torch.no_grad():
        logits = model(inputs).logits
        # transformers' own loss: labels are the window of inputs followed by the
        # last target; the model shifts them itself.
        window = torch.cat([inputs, targets[:, -1:]], dim=1)
        with bf16:
            hf_loss = model(window, labels=window).loss
        if "--router" in flags:
            # Over exactly the probe's positions and targets (shift_labels: already shifted),
            # so the router sees the tokens ptrain's forward saw.
            routed = model(inputs, labels=targets, shift_labels=targets, output_router_logits=True)
    report = {
        "max_abs_diff": (logits - probe["logits"]).abs().max().item(),
        "logit_scale": logits.abs().max().item(),
        "hf_loss": hf_loss.item(),
        "probe_loss": probe["loss"].item(),
        "shape": list(logits.shape),
    }
    if "--router" in flags:
        report["hf_loss_with_aux"], report["hf_aux_loss"] = routed.loss.item(), routed.aux_loss.item()
        report["probe_aux_loss"] = probe["aux_loss"].item() if "aux_loss" in probe else None
    if "--features" in flags:
        report["features"] = gemma_features(model, {k: v.cpu() for k, v in probe.items()})
    out(report)


def check_ids(tok_path, source, cache, *rest):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(tok_path)
    if rest and rest[0] == "--jsonl":
        field, eos = rest[1], rest[2]
        eos_id = tok.token_to_id(eos)
        ids = []
        with open(source, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    ids += tok.encode(json.loads(line)[field]).ids + [eos_id]
    else:
        with open(source, encoding="utf-8") as f:
            ids = tok.encode(f.read()).ids
    dtype = np.uint32 if cache.endswith(".u32") else np.uint16
    ours = np.fromfile(cache, dtype=dtype).astype(np.int64).tolist()
    mismatch = next((i for i, (a, b) in enumerate(zip(ids, ours)) if a != b), None)
    out({"equal": ids == ours, "python": len(ids), "ptrain": len(ours), "first_mismatch": mismatch, "vocab": tok.get_vocab_size()})


def load_export(d, probe_path, source=None):
    import torch
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    model, info, messages = load_model(d)
    probe = load_file(probe_path)
    with torch.no_grad():
        logits = model(probe["inputs"]).logits
    report = {
        "info": info,
        "messages": messages,
        "max_abs_diff": (logits - probe["logits"]).abs().max().item(),
        "tied": model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr(),
        "activation": next((getattr(model.config, k) for k in ("activation_function", "hidden_act", "hidden_activation") if hasattr(model.config, k)), None),
        "class": type(model).__name__,
        "parameters": sum(p.numel() for p in model.parameters()),
    }
    try:
        tok = AutoTokenizer.from_pretrained(d)
        from tokenizers import Tokenizer

        sample = "the café über 2024\n  it's"
        # Against the tokenizer the run used: a tokenizer.json as the tokenizers
        # library reads it, or a model directory as transformers loads it; without
        # one, against the exported file as the tokenizers library reads it.
        if source and source.endswith(".json"):
            expected = Tokenizer.from_file(source).encode(sample).ids
        elif source:
            expected = AutoTokenizer.from_pretrained(source)(sample)["input_ids"]
        else:
            expected = Tokenizer.from_file(f"{d}/tokenizer.json").encode(sample).ids
        report["tokenizer_matches"] = tok(sample)["input_ids"] == expected
    except Exception as e:  # reported, the test decides
        report["tokenizer_error"] = f"{type(e).__name__}: {e}"
    out(report)


def generate(model_dir, ids, n):
    import torch

    model, _, _ = load_model(model_dir)
    prompt = torch.tensor([[int(i) for i in ids.split(",")]])
    with torch.no_grad():
        new = model.generate(prompt, do_sample=False, max_new_tokens=int(n))[0, prompt.shape[1] :]
    out({"ids": new.tolist(), "eos": model.generation_config.eos_token_id})


def training_args(**kwargs):
    import tempfile

    from transformers import TrainingArguments

    return TrainingArguments(output_dir=tempfile.mkdtemp(), report_to="none", **kwargs)


def lr_schedule(lr, warmup, steps):
    """What Trainer does: create_optimizer_and_scheduler(max_steps), then per step
    optimizer.step() at the group's current lr, then lr_scheduler.step()."""
    import torch
    from transformers import get_scheduler

    steps = int(steps)
    args = training_args(learning_rate=float(lr), warmup_steps=float(warmup), max_steps=steps)
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.AdamW([param], lr=args.learning_rate)
    scheduler = get_scheduler(
        args.lr_scheduler_type, optimizer, num_warmup_steps=args.get_warmup_steps(steps), num_training_steps=steps
    )
    lrs = []
    for _ in range(steps):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    out({"scheduler": str(args.lr_scheduler_type.value), "warmup": args.get_warmup_steps(steps), "lrs": lrs})


def training_defaults():
    a = training_args()
    out({
        "schedule": str(a.lr_scheduler_type.value), "warmup_steps": a.warmup_steps, "weight_decay": a.weight_decay,
        "beta1": a.adam_beta1, "beta2": a.adam_beta2, "eps": a.adam_epsilon, "grad_clip": a.max_grad_norm,
        "accum_steps": a.gradient_accumulation_steps,
    })


COMMANDS = {
    "lr-schedule": lr_schedule,
    "training-defaults": training_defaults,
    "make-model": make_model,
    "make-llama": make_llama,
    "make-gemma": make_gemma,
    "make-moe": make_moe,
    "generate": generate,
    "make-tokens": make_tokens,
    "make-text": make_text,
    "make-jsonl": make_jsonl,
    "train-tokenizer": train_tokenizer,
    "make-wordlevel": make_wordlevel,
    "reshape": reshape,
    "drop-tensor": drop_tensor,
    "add-chat-template": add_chat_template,
    "chat-ids": chat_ids,
    "compare-logits": compare_logits,
    "check-ids": check_ids,
    "load-export": load_export,
}

if __name__ == "__main__":
    COMMANDS[sys.argv[1]](*sys.argv[2:])
