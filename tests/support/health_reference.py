"""The health plugin's figures computed in float64 from tensors ptrain dumped with
`[debug] dump_tensors_at`, for tests/health.rs.

Usage: health_reference.py FILE:GROUP_DEPTH [FILE:GROUP_DEPTH ...]. Prints one JSON
object: {FILE: {"total": figures, "groups": {group: figures}}}, where figures are
grad_norm, param_norm, update_ratio (||updated - param|| / ||param||),
grad_zero_frac and grad_nonfinite_frac. A group is a parameter's module path (its
name less the last component) cut to GROUP_DEPTH components (0: all of it).
"""

import json
import math
import sys

import torch
from safetensors.torch import load_file


def group_of(name, depth):
    parts = name.split(".")
    module = parts[:-1] if len(parts) > 1 else parts
    keep = len(module) if depth == 0 else min(depth, len(module))
    return ".".join(module[:keep])


def figures(sums):
    n = max(sums["numel"], 1)
    p = math.sqrt(sums["p2"])
    return {
        "grad_norm": math.sqrt(sums["g2"]),
        "param_norm": p,
        "update_ratio": math.sqrt(sums["u2"]) / p if p > 0 else 0.0,
        "grad_zero_frac": sums["zeros"] / n,
        "grad_nonfinite_frac": sums["nonfinite"] / n,
    }


def reference(path, depth):
    tensors = load_file(path)
    names = sorted(k[len("param/") :] for k in tensors if k.startswith("param/"))
    keys = ["g2", "p2", "u2", "zeros", "nonfinite", "numel"]
    total = dict.fromkeys(keys, 0.0)
    groups = {}
    for name in names:
        p = tensors["param/" + name].double()
        g = tensors.get("grad/" + name)
        g = torch.zeros_like(p) if g is None else g.double()
        u = tensors["updated/" + name].double()
        stats = {
            "g2": float((g * g).sum()),
            "p2": float((p * p).sum()),
            "u2": float(((u - p) ** 2).sum()),
            "zeros": float((g == 0).sum()),
            "nonfinite": float((~torch.isfinite(g)).sum()),
            "numel": float(g.numel()),
        }
        group = groups.setdefault(group_of(name, depth), dict.fromkeys(keys, 0.0))
        for k in keys:
            total[k] += stats[k]
            group[k] += stats[k]
    return {"total": figures(total), "groups": {g: figures(s) for g, s in groups.items()}}


def main():
    out = {}
    for arg in sys.argv[1:]:
        path, depth = arg.rsplit(":", 1)
        out[path] = reference(path, int(depth))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
