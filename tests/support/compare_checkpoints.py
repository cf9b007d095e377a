"""Loads checkpoints with Python's safetensors and prints a JSON report.

usage: compare_checkpoints.py CKPT_DIR [OTHER_CKPT_DIR]
With one directory: names, shapes and finiteness of model and optimizer tensors.
With two: whether every tensor is bitwise equal between them.
"""
import json
import sys

import torch
from safetensors.torch import load_file


def load(ckpt):
    return load_file(f"{ckpt}/model.safetensors"), load_file(f"{ckpt}/optimizer.safetensors")


model, optim = load(sys.argv[1])
report = {
    "model": {k: list(v.shape) for k, v in model.items()},
    "optimizer_keys": sorted(optim),
    "finite": all(bool(torch.isfinite(v).all()) for v in list(model.values()) + list(optim.values())),
    "numel": sum(v.numel() for v in model.values()),
}
if len(sys.argv) > 2:
    other_model, other_optim = load(sys.argv[2])
    report["model_equal"] = model.keys() == other_model.keys() and all(torch.equal(model[k], other_model[k]) for k in model)
    report["optimizer_equal"] = optim.keys() == other_optim.keys() and all(torch.equal(optim[k], other_optim[k]) for k in optim)
print(json.dumps(report))
