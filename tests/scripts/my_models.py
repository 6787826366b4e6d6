"""A user's own model, outside suite/: what `fleetbench run --model my_models:make_spec` imports.

The README's worked example has the same shape: a factory taking the size and returning a
ModelSpec (builder, loss, synthetic data, batch).
"""
from __future__ import annotations

import torch
from torch import nn

from suite.models import ModelSpec


class TwoLayer(nn.Module):
    def __init__(self, features: int, hidden: int, classes: int):
        super().__init__()
        self.fc1 = nn.Linear(features, hidden)
        self.fc2 = nn.Linear(hidden, classes)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


class Blobs:
    """Seeded Gaussian blobs: ``get(indices)`` returns (features, labels), as suite's datasets do."""

    kind = "other"

    def __init__(self, n: int, seed: int, features: int = 32, classes: int = 4):
        g = torch.Generator().manual_seed(seed)
        centers = torch.randn(classes, features, generator=g) * 3
        self.targets = torch.randint(0, classes, (n,), generator=g)
        self.inputs = centers[self.targets] + torch.randn(n, features, generator=g)

    def __len__(self) -> int:
        return len(self.targets)

    def get(self, indices):
        return self.inputs[indices], self.targets[indices]


def make_spec(size: str = "cpu") -> ModelSpec:
    hidden = {"full": 4096, "cpu": 256, "tiny": 64}[size]
    return ModelSpec("two_layer", lambda: TwoLayer(32, hidden, 4), nn.functional.cross_entropy,
                     lambda n, seed: Blobs(n, seed), data="other", size=size, per_rank_batch=8, dataset_size=256)


def not_a_spec(size: str = "cpu"):
    return {"model": "nope"}
