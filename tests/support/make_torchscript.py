"""Writes a scripted MLP classifier for ptrain's TorchScript model tests.

usage: make_torchscript.py OUT.pt IN_FEATURES CLASSES [RAISE_AT]

With RAISE_AT, the module raises a RuntimeError in its RAISE_AT-th training
forward pass (evaluation passes do not count): a model that fails mid-run.
"""
import sys

import torch


class Classifier(torch.nn.Module):
    def __init__(self, inputs: int, classes: int):
        super().__init__()
        self.hidden = torch.nn.Linear(inputs, 64)
        self.out = torch.nn.Linear(64, classes)
        self.drop = torch.nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.drop(torch.relu(self.hidden(x))))


class Raising(Classifier):
    def __init__(self, inputs: int, classes: int, raise_at: int):
        super().__init__(inputs, classes)
        self.raise_at = raise_at
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            self.calls += 1
            if self.calls == self.raise_at:
                raise RuntimeError("the module raises in training forward pass " + str(self.calls))
        return self.out(self.drop(torch.relu(self.hidden(x))))


if __name__ == "__main__":
    out, inputs, classes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    torch.manual_seed(0)
    if len(sys.argv) > 4:
        module = Raising(inputs, classes, int(sys.argv[4]))
    else:
        module = Classifier(inputs, classes)
    torch.jit.script(module).save(out)
