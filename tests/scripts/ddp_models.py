"""Models of the kinds torch's own DDP tests train (torch/testing/_internal/distributed/distributed_test.py), as a user
would wrap them for `fleetbench run --model tests.scripts.ddp_models:FACTORY` (tests/test_ddp_verdicts.py).

- ``make_sparse``: an ``nn.Embedding(sparse=True)`` and a linear head (torch's ``SparseGradientModule`` uses an
  ``EmbeddingBag(sparse=True)``): sparse gradients.
- ``make_unused``: ``UnusedParamTwoLinLayerNet``, whose ``c`` no forward uses, declared ``find_unused_parameters``.
- ``make_branchy`` / ``make_branchy_declared``: ``ControlFlowToyModel``'s second layer, used only when the batch says
  so (here: the sum of the batch's first feature is positive), so ranks take different branches; without and with
  ``find_unused_parameters`` declared.
- ``make_differs``: ``EmbeddingNetDifferentParams``: a build told the rank builds a wider model on rank 0.
- ``make_two_inputs``: a model of two inputs (torch's ``Task``/``UnusedParamModule`` take ``forward(x, rank)``): the
  dataset gives a tuple, the model takes it as its two arguments.
- ``make_bn_nothing_to_fuse``: ``BatchNormNet``: BatchNorm followed by a reshape and a linear layer (no ReLU after it):
  compute fusion has nothing to fuse.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from suite.models import ModelSpec

FEATURES, CLASSES = 10, 10


class Blobs:
    """Seeded Gaussian blobs (features, labels)."""

    kind = "other"

    def __init__(self, n: int, seed: int):
        g = torch.Generator().manual_seed(seed)
        centers = torch.randn(CLASSES, FEATURES, generator=g) * 2
        self.targets = torch.randint(0, CLASSES, (n,), generator=g)
        self.inputs = centers[self.targets] + torch.randn(n, FEATURES, generator=g)

    def __len__(self) -> int:
        return len(self.targets)

    def get(self, indices):
        return self.inputs[indices], self.targets[indices]


class Ids:
    """Seeded token ids (4 per sample) and labels."""

    kind = "other"

    def __init__(self, n: int, seed: int, vocab: int = 12):
        g = torch.Generator().manual_seed(seed)
        self.inputs = torch.randint(0, vocab, (n, 4), generator=g)
        self.targets = self.inputs[:, 0] % 4

    def __len__(self) -> int:
        return len(self.targets)

    def get(self, indices):
        return self.inputs[indices], self.targets[indices]


def _spec(name: str, build, data=Blobs, **kw) -> ModelSpec:
    return ModelSpec(name, build, F.cross_entropy, lambda n, seed: data(n, seed), data="other",
                     size=kw.pop("size", "tiny"), per_rank_batch=4, dataset_size=64, **kw)


class SparseNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(12, 8, sparse=True)
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        return self.fc(self.embedding(x).mean(1))


def make_sparse(size: str = "tiny") -> ModelSpec:
    return _spec("sparse", SparseNet, Ids, size=size)


class UnusedParamTwoLinLayerNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(FEATURES, CLASSES, bias=False)
        self.b = nn.Linear(FEATURES, CLASSES, bias=False)
        self.c = nn.Linear(5, 5, bias=False)  # never used: its gradient stays None

    def forward(self, x):
        return self.a(x) + self.b(x)


def make_unused(size: str = "tiny") -> ModelSpec:
    return _spec("unused", UnusedParamTwoLinLayerNet, size=size, find_unused_parameters=True)


class ControlFlow(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin1 = nn.Linear(FEATURES, CLASSES, bias=False)
        self.lin2 = nn.Linear(CLASSES, CLASSES, bias=False)

    def forward(self, x):
        h = F.relu(self.lin1(x))
        if x[:, 0].sum() > 0:  # the batch decides: ranks with different shards take different branches
            h = self.lin2(h)
        return h


def make_branchy(size: str = "tiny") -> ModelSpec:
    return _spec("branchy", ControlFlow, size=size)


def make_branchy_declared(size: str = "tiny") -> ModelSpec:
    return _spec("branchy_declared", ControlFlow, size=size, find_unused_parameters=True)


class EmbeddingNetDifferentParams(nn.Module):
    def __init__(self, rank: int):
        super().__init__()
        width = 16 if rank == 0 else 8
        self.embedding = nn.Linear(FEATURES, width)
        self.lin = nn.Linear(width, CLASSES)

    def forward(self, x):
        return self.lin(self.embedding(x))


def make_differs(size: str = "tiny") -> ModelSpec:
    return _spec("differs", lambda rank: EmbeddingNetDifferentParams(rank), size=size)


class Pairs(Blobs):
    """Each sample is two tensors: the features and their squares."""

    def get(self, indices):
        x = self.inputs[indices]
        return (x, x * x), self.targets[indices]


class TwoInputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.x = nn.Linear(FEATURES, CLASSES)
        self.z = nn.Linear(FEATURES, CLASSES)

    def forward(self, x, z):
        return self.x(x) + self.z(z)


def make_two_inputs(size: str = "tiny") -> ModelSpec:
    return _spec("two_inputs", TwoInputs, Pairs, size=size)


class BatchNormNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(FEATURES, 40, bias=False)
        self.bn = nn.BatchNorm1d(4)
        self.fc2 = nn.Linear(40, CLASSES, bias=False)

    def forward(self, x):
        x = torch.reshape(self.fc1(x), (-1, 4, 10))
        x = self.bn(x)
        return self.fc2(torch.reshape(x, (-1, 40)))


def make_bn_nothing_to_fuse(size: str = "tiny") -> ModelSpec:
    return _spec("bn_nothing_to_fuse", BatchNormNet, size=size)
