"""Writes a scripted MLP classifier for ptrain's TorchScript model test.

usage: make_torchscript.py OUT.pt IN_FEATURES CLASSES
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


if __name__ == "__main__":
    out, inputs, classes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    torch.manual_seed(0)
    torch.jit.script(Classifier(inputs, classes)).save(out)
