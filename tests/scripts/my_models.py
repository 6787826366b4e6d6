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


# oneDNN's message where the CPU has no bf16 LSTM kernel (torch's CPU builds on CPUs without AVX512-BF16).
ONEDNN_LSTM = "could not create a primitive descriptor for the LSTM forward propagation primitive"


class Tagger(nn.Module):
    """A real LSTM classifier.  Under bf16 autocast on CPU it raises oneDNN's message for a missing bf16 LSTM
    kernel: where the kernel is missing the LSTM itself raises it; where this torch build has it (AVX512-BF16,
    as on the machine these tests were written on) a stand-in raises the same message after the real call, so
    the outcome does not depend on the CPU."""

    def __init__(self, features: int, hidden: int, classes: int):
        super().__init__()
        self.lstm = nn.LSTM(features, hidden, batch_first=True)
        self.head = nn.Linear(hidden, classes)

    def forward(self, x):
        out, _ = self.lstm(x)
        if x.device.type == "cpu" and torch.is_autocast_enabled("cpu") \
                and torch.get_autocast_dtype("cpu") == torch.bfloat16:
            raise RuntimeError(ONEDNN_LSTM)  # the stand-in (see the class docstring)
        return self.head(out[:, -1])


class Sequences(Blobs):
    """Blobs as sequences of 4 steps of 8 features."""

    def __init__(self, n: int, seed: int):
        super().__init__(n, seed)
        self.inputs = self.inputs.reshape(n, 4, 8)


def make_lstm(size: str = "cpu") -> ModelSpec:
    hidden = {"full": 1024, "cpu": 128, "tiny": 16}[size]
    return ModelSpec("lstm", lambda: Tagger(8, hidden, 4), nn.functional.cross_entropy,
                     lambda n, seed: Sequences(n, seed), data="other", size=size, per_rank_batch=8, dataset_size=256)


class Spare(TwoLayer):
    """A parameter the forward never uses: no gradient in any step."""

    def __init__(self, features: int, hidden: int, classes: int):
        super().__init__(features, hidden, classes)
        self.spare = nn.Linear(hidden, classes)


def make_spare(size: str = "cpu") -> ModelSpec:
    return ModelSpec("spare", lambda: Spare(32, 16, 4), nn.functional.cross_entropy, lambda n, seed: Blobs(n, seed),
                     data="other", size=size, per_rank_batch=8, dataset_size=256)


class Buggy(TwoLayer):
    """An ordinary bug: a shape mismatch in the forward (an error, never skipped)."""

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)) @ torch.ones(3, 3))


def make_buggy(size: str = "cpu") -> ModelSpec:
    return ModelSpec("buggy", lambda: Buggy(32, 16, 4), nn.functional.cross_entropy, lambda n, seed: Blobs(n, seed),
                     data="other", size=size, per_rank_batch=8, dataset_size=256)


# ---- randomness: dropout the check replays, noise it cannot ------------------------------------------------------
class Tokens:
    """Seeded random token sequences (next-token targets), as suite's token datasets."""

    kind = "other"

    def __init__(self, n: int, seed: int, vocab: int = 32, seq: int = 8):
        g = torch.Generator().manual_seed(seed)
        data = torch.randint(0, vocab, (n, seq + 1), generator=g)
        self.inputs, self.targets = data[:, :-1], data[:, 1:]

    def __len__(self) -> int:
        return len(self.inputs)

    def get(self, indices):
        return self.inputs[indices], self.targets[indices]


class DropPath(nn.Module):
    """Stochastic depth: each sample's residual branch dropped with probability ``p`` (timm's DropPath)."""

    def __init__(self, p: float):
        super().__init__()
        self.p = p

    def forward(self, x):
        if not self.training or self.p == 0:
            return x
        keep = torch.rand((x.shape[0],) + (1,) * (x.dim() - 1), device=x.device) >= self.p
        return x * keep / (1 - self.p)


class DropoutBlock(nn.Module):
    """A small Transformer LM: one block with ``nn.Dropout(p)`` in attention (on its weights and after its
    projection) and in the MLP, as published models have it, and DropPath(p) on the MLP's branch."""

    def __init__(self, p: float, vocab: int = 32, d: int = 16):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.attn_drop, self.resid_drop = nn.Dropout(p), nn.Dropout(p)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d), nn.Dropout(p))
        self.drop_path = DropPath(p)
        self.head = nn.Linear(d, vocab)

    def forward(self, tokens):
        x = self.embed(tokens)
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)
        t = tokens.shape[1]
        mask = torch.ones(t, t, dtype=torch.bool, device=tokens.device).triu(1)
        weights = (q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5).masked_fill(mask, float("-inf")).softmax(-1)
        x = x + self.resid_drop(self.proj(self.attn_drop(weights) @ v))
        x = x + self.drop_path(self.mlp(self.ln2(x)))
        return self.head(x)


def lm_loss(logits, targets):
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def _block(name: str, p: float, size: str) -> ModelSpec:
    return ModelSpec(name, lambda: DropoutBlock(p), lm_loss, lambda n, seed: Tokens(n, seed), data="other",
                     size=size, per_rank_batch=4, dataset_size=64)


def make_dropout(size: str = "cpu") -> ModelSpec:
    """nn.Dropout(0.1) in attention and MLP, DropPath(0.1): the check replays every rank's masks."""
    return _block("dropout", 0.1, size)


def make_no_dropout(size: str = "cpu") -> ModelSpec:
    """The same block at p=0."""
    return _block("no_dropout", 0.0, size)


class Noisy(TwoLayer):
    """Noise from a private generator seeded from the OS (unseeded by anyone): two identical runs differ."""

    def __init__(self, features: int, hidden: int, classes: int):
        super().__init__(features, hidden, classes)
        self.noise = torch.Generator()
        self.noise.seed()

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        return self.fc2(h + 0.1 * torch.randn(h.shape, generator=self.noise).to(h.device))


def make_noisy(size: str = "cpu") -> ModelSpec:
    return ModelSpec("noisy", lambda: Noisy(32, 16, 4), nn.functional.cross_entropy, lambda n, seed: Blobs(n, seed),
                     data="other", size=size, per_rank_batch=8, dataset_size=256)


class Normed(TwoLayer):
    """BatchNorm between the layers, and a factory that does not say so (has_batchnorm left False)."""

    def __init__(self, features: int, hidden: int, classes: int):
        super().__init__(features, hidden, classes)
        self.bn = nn.BatchNorm1d(hidden)

    def forward(self, x):
        return self.fc2(torch.relu(self.bn(self.fc1(x))))


def make_normed(size: str = "cpu") -> ModelSpec:
    return ModelSpec("normed", lambda: Normed(32, 16, 4), nn.functional.cross_entropy, lambda n, seed: Blobs(n, seed),
                     data="other", size=size, per_rank_batch=8, dataset_size=256)
