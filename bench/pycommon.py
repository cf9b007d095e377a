"""What the Python contenders of the benchmark share: the configuration, the
learning-rate schedule, the data and the two models, written to match ptrain's.

The configuration is read from the same TOML files ptrain reads: the embedded
default (configs/default.toml), the benchmark's file (bench/configs/*.toml), then
`--set section.key=value` overrides, so every contender trains the same sizes.

Matched exactly: architectures and parameter layout (nanoGPT's GPT with a tied
head, Linear+ReLU MLP), initialisation scheme, batch shapes, step count, the
warmup + cosine schedule, AdamW's hyper-parameters and weight-decay groups
(matrices and embeddings only), global-norm clipping, the loss-read and
evaluation cadences.

Not matched: the random numbers. The data follow the same recipes as ptrain's
synthetic generators (Gaussian clusters per named dataset; sentences from the
same word lists) but are drawn with numpy/torch generators, and the initial
weights come from torch's generator, so the losses are close to ptrain's but
not equal.
"""

import argparse
import json
import math
import pathlib
import random
import tomllib

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

ROOT = pathlib.Path(__file__).resolve().parent.parent


# --------------------------------------------------------------------------
# Configuration


def _merge(base, layer):
    """Deep merge as ptrain does: tables key by key, anything else replaced."""
    for key, value in layer.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = value


def _parse_value(raw):
    """A `--set` value: TOML if it parses, else a bare string (ptrain's rule)."""
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw


def load_config(path=None, sets=()):
    """The resolved configuration, as a dict of sections."""
    config = tomllib.loads((ROOT / "configs" / "default.toml").read_text())
    if path:
        _merge(config, tomllib.loads(pathlib.Path(path).read_text()))
    for assignment in sets:
        key, _, raw = assignment.partition("=")
        *sections, last = [k.strip() for k in key.split(".")]
        layer = cursor = {}
        for s in sections:
            cursor = cursor.setdefault(s, {})
        cursor[last] = _parse_value(raw.strip())
        _merge(config, layer)
    return config


def common_args(description):
    """The flags every Python contender takes (a subset of `ptrain run`'s)."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--config", help="TOML layered over configs/default.toml")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    p.add_argument("--steps", type=int, help="optimizer steps (train.steps)")
    p.add_argument("--seed", type=int, help="run.seed")
    p.add_argument("--device", help="cpu | cuda (run.device)")
    p.add_argument("--out", help="write the result as JSON here")
    p.add_argument("--run-dir", help="where logs and checkpoints go (Lightning)")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    return p


def resolve(args):
    """Config from parsed common args; sets threads and seeds torch."""
    sets = list(args.set)
    if args.steps is not None:
        sets.append(f"train.steps={args.steps}")
    if args.seed is not None:
        sets.append(f"run.seed={args.seed}")
    if args.device:
        sets.append(f'run.device="{args.device}"')
    config = load_config(args.config, sets)
    threads = config["run"]["threads"]
    if threads > 0:
        torch.set_num_threads(threads)
    torch.manual_seed(config["run"]["seed"])
    want = config["run"]["device"]
    cuda = torch.cuda.is_available() and want in ("auto", "cuda")
    if want == "cuda" and not cuda:
        raise SystemExit("run.device = cuda but CUDA is not available")
    device = torch.device("cuda" if cuda else "cpu")
    return config, device


def write_result(path, result):
    if path:
        pathlib.Path(path).write_text(json.dumps(result, indent=2) + "\n")


# --------------------------------------------------------------------------
# Schedule


def lr_at(config, step):
    """ptrain's warmup + cosine schedule (core/src/optim/schedule.rs), step from 1."""
    o, total = config["optim"], config["train"]["steps"]
    peak, low, warmup = o["lr"], o["min_lr"], o["warmup_steps"]
    if step <= warmup:
        return peak * step / (warmup + 1)
    if o["schedule"] != "cosine" or total <= warmup:
        return peak
    progress = min((step - warmup) / (total - warmup), 1.0)
    return low + 0.5 * (1.0 + math.cos(math.pi * progress)) * (peak - low)


# --------------------------------------------------------------------------
# Data. Each dataset makes batches inline, on the training thread, from data
# generated at set-up (as ptrain's synthetic datasets are).


class Classification:
    """ptrain's synthetic classification mix: per named dataset, Gaussian clusters
    whose noise grows with the dataset's index; batches draw a dataset by weight,
    then a row uniformly."""

    def __init__(self, config, device):
        d, seed = config["data"], config["run"]["seed"]
        f, c = max(d["synthetic_features"], 1), max(d["synthetic_classes"], 2)
        specs = [(s["name"], s.get("weight", 1.0)) for s in d["datasets"]] or [("synthetic", 1.0)]
        rows = min(max(d["synthetic_len"] // 16, 256), 16384)
        rng = np.random.default_rng(seed)
        train_x, train_y, val_x, val_y = [], [], [], []
        for i, _ in enumerate(specs):
            centers = rng.standard_normal((c, f)).astype(np.float32)
            noise = (0.25 + 0.25 * i) * math.sqrt(f)
            labels = rng.integers(0, c, rows)
            x = centers[labels] + noise * rng.standard_normal((rows, f)).astype(np.float32)
            cut = rows - min(max(math.ceil(rows * d["val_fraction"]), 1), max(rows - 1, 1))
            train_x.append(x[:cut]), train_y.append(labels[:cut])
            val_x.append(x[cut:]), val_y.append(labels[cut:])
        self.features, self.classes, self.batch_size = f, c, d["batch_size"]
        self.names = [s[0] for s in specs]
        self.weights = torch.tensor([max(s[1], 0.0) for s in specs], dtype=torch.float)
        self.splits = {}
        for split, xs, ys in (("train", train_x, train_y), ("val", val_x, val_y)):
            sizes = torch.tensor([len(y) for y in ys])
            offsets = torch.cumsum(sizes, 0) - sizes
            x = torch.from_numpy(np.concatenate(xs)).to(device)
            y = torch.from_numpy(np.concatenate(ys)).long().to(device)
            self.splits[split] = (x, y, sizes, offsets)
        self.device = device
        self.generator = torch.Generator().manual_seed(seed + 1)

    def batch(self, split="train", generator=None):
        """(inputs [B, F], targets [B], dataset ids [B])."""
        g = generator or self.generator
        x, y, sizes, offsets = self.splits[split]
        ids = torch.multinomial(self.weights, self.batch_size, replacement=True, generator=g)
        rows = (torch.rand(self.batch_size, generator=g) * sizes[ids]).long() + offsets[ids]
        rows = rows.to(self.device)
        return x[rows], y[rows], ids.to(self.device)


SUBJECTS = ["the cat", "a dog", "the model", "my friend", "the river", "a small bird", "the teacher", "our team"]
VERBS = ["sees", "likes", "follows", "builds", "finds", "watches", "helps", "carries"]
OBJECTS = ["the ball", "a red box", "the old tree", "some bread", "the long road", "a quiet song", "the garden", "its shadow"]
ENDINGS = [".", " today.", " again.", " at night.", " in the morning.", " with care."]


def synthetic_text(seed, length):
    """Sentences from ptrain's word lists (core/src/data/tokens.rs), as bytes."""
    rng = random.Random(seed)
    out = bytearray()
    while len(out) < length:
        s = f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)}{rng.choice(ENDINGS)}"
        s += "\n" if rng.randrange(5) == 0 else " "
        out += (s[0].upper() + s[1:]).encode()
    return bytes(out[:length])


class TokenWindows:
    """Random windows of `block_size + 1` bytes over generated text; the last
    `val_fraction` of the text is held out (ptrain's split rule)."""

    def __init__(self, config, device):
        d, m, seed = config["data"], config["model"], config["run"]["seed"]
        self.seq_len = min(d["max_seq_len"], m["block_size"]) if d["max_seq_len"] > 0 else m["block_size"]
        text = synthetic_text(seed, max(d["synthetic_len"], 4 * self.seq_len + 8))
        n = len(text)
        cut = n - min(max(int(n * d["val_fraction"]), self.seq_len + 2), n // 2)
        tokens = torch.frombuffer(bytearray(text), dtype=torch.uint8).long()
        self.splits = {"train": tokens[:cut].to(device), "val": tokens[cut:].to(device)}
        self.batch_size, self.device = d["batch_size"], device
        self.offsets = torch.arange(self.seq_len + 1, device=device)
        self.generator = torch.Generator().manual_seed(seed + 1)

    def batch(self, split="train", generator=None):
        """(inputs [B, T], targets [B, T], None)."""
        g = generator or self.generator
        tokens = self.splits[split]
        starts = torch.randint(0, len(tokens) - self.seq_len, (self.batch_size,), generator=g).to(self.device)
        windows = tokens[starts[:, None] + self.offsets]
        return windows[:, :-1].contiguous(), windows[:, 1:].contiguous(), None


def dataset(config, device):
    return Classification(config, device) if config["model"]["kind"] == "mlp" else TokenWindows(config, device)


# --------------------------------------------------------------------------
# Models, laid out as ptrain's (core/src/model/{mlp,gpt}.rs)


class Mlp(nn.Module):
    def __init__(self, dims):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims, dims[1:]))
        # tch's default Linear init (ptrain's MLP): Kaiming-uniform weights with the
        # ReLU gain, bound sqrt(6 / fan_in), where torch's default uses 1 / sqrt(fan_in).
        # The biases' U(+-1/sqrt(fan_in)) is the same in both.
        for layer in self.layers:
            nn.init.kaiming_uniform_(layer.weight, nonlinearity="relu")

    def forward(self, x):
        x = self.layers[0](x)
        for layer in self.layers[1:]:
            x = layer(F.relu(x))
        return x


class Block(nn.Module):
    def __init__(self, m):
        super().__init__()
        d, bias = m["n_embd"], m["gpt"]["bias"]
        self.n_head, self.dropout = m["n_head"], m["dropout"]
        self.ln_1 = nn.LayerNorm(d)
        self.c_attn = nn.Linear(d, 3 * d, bias=bias)
        self.attn_proj = nn.Linear(d, d, bias=bias)
        self.ln_2 = nn.LayerNorm(d)
        self.c_fc = nn.Linear(d, 4 * d, bias=bias)
        self.mlp_proj = nn.Linear(4 * d, d, bias=bias)
        # GPT-2's scaled init of the residual projections, as ptrain.
        proj_std = 0.02 / math.sqrt(2 * m["n_layer"])
        for layer, std in ((self.c_attn, 0.02), (self.attn_proj, proj_std), (self.c_fc, 0.02), (self.mlp_proj, proj_std)):
            nn.init.normal_(layer.weight, 0.0, std)
            if layer.bias is not None:
                nn.init.zeros_(layer.bias)

    def forward(self, x):
        b, t, d = x.shape
        p = self.dropout if self.training else 0.0
        q, k, v = self.c_attn(self.ln_1(x)).split(d, 2)
        heads = lambda z: z.view(b, t, self.n_head, d // self.n_head).transpose(1, 2)  # noqa: E731
        y = F.scaled_dot_product_attention(heads(q), heads(k), heads(v), dropout_p=p, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(b, t, d)
        x = x + F.dropout(self.attn_proj(y), self.dropout, self.training)
        h = F.gelu(self.c_fc(self.ln_2(x)))
        return x + F.dropout(self.mlp_proj(h), self.dropout, self.training)


class Gpt(nn.Module):
    def __init__(self, m):
        super().__init__()
        self.dropout = m["dropout"]
        self.wte = nn.Embedding(m["vocab_size"], m["n_embd"])
        self.wpe = nn.Embedding(m["block_size"], m["n_embd"])
        nn.init.normal_(self.wte.weight, 0.0, 0.02)
        nn.init.normal_(self.wpe.weight, 0.0, 0.02)
        self.h = nn.ModuleList(Block(m) for _ in range(m["n_layer"]))
        self.ln_f = nn.LayerNorm(m["n_embd"])

    def forward(self, idx):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = F.dropout(self.wte(idx) + self.wpe(pos), self.dropout, self.training)
        for block in self.h:
            x = block(x)
        # The head shares the token embedding (weight tying), as in ptrain and GPT-2.
        return F.linear(self.ln_f(x), self.wte.weight)


def model(config, data):
    m = config["model"]
    if m["kind"] == "mlp":
        input_dim = m["mlp"]["input_dim"] or data.features
        classes = m["mlp"]["num_classes"] or data.classes
        return Mlp([input_dim, *m["mlp"]["hidden"], classes])
    if m["kind"] == "gpt":
        return Gpt(m)
    raise SystemExit(f"model.kind = {m['kind']}: the Python contenders implement mlp and gpt")


def loss_fn(logits, targets):
    """Mean cross entropy, flattening the sequence for language models."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def param_groups(module, config):
    """ptrain's AdamW groups: decay on matrices and embeddings (dim >= 2) only."""
    params = [p for p in module.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    rest = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": config["optim"]["weight_decay"]}]
    if rest:
        groups.append({"params": rest, "weight_decay": 0.0})
    return groups


def adamw(module, config, device):
    """torch's fused AdamW (one kernel per group, as ptrain's), ptrain's hyper-parameters."""
    o = config["optim"]
    if o["name"] != "adamw":
        raise SystemExit("the Python contenders implement optim.name = adamw only")
    return torch.optim.AdamW(
        param_groups(module, config), lr=o["lr"], betas=(o["beta1"], o["beta2"]), eps=o["eps"], fused=True
    )


def autocast(config, device):
    """bf16 autocast on CUDA when train.precision = bf16, as ptrain; else a no-op."""
    on = device.type == "cuda" and config["train"]["precision"] == "bf16"
    return torch.autocast("cuda", dtype=torch.bfloat16, enabled=on)


def eval_generator(config, i):
    """A fixed generator for held-out batch `i`: every evaluation sees the same batches."""
    return torch.Generator().manual_seed(config["run"]["seed"] * 7919 + i)


@torch.no_grad()
def evaluate(module, data, config, device):
    """(loss, accuracy or None) over `train.eval_batches` held-out batches, read once (as ptrain)."""
    was_training = module.training
    module.eval()
    sums = torch.zeros(2, dtype=torch.float64, device=device)
    batches = max(config["train"]["eval_batches"], 1)
    for i in range(batches):
        x, y, _ = data.batch("val", eval_generator(config, i))
        with autocast(config, device):
            logits = module(x)
        sums[0] += loss_fn(logits, y).double()
        if logits.dim() == 2:  # classification: accuracy too, as ptrain
            sums[1] += (logits.argmax(-1) == y).sum().double()
    module.train(was_training)
    loss, correct = sums.tolist()
    accuracy = correct / (batches * data.batch_size) if isinstance(data, Classification) else None
    return loss / batches, accuracy
