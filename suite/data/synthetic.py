"""Deterministic, seeded synthetic data: uint8 images with labels, token sequences, and
masked token sequences.

The same seed gives the same bytes on every rank and every machine.  Images are a noisy
copy of a per-class template (so models learn and losses fall); token sequences follow a
seeded Markov chain (so next-token prediction is learnable); masked sequences follow such a
chain too, with about 15% of the positions replaced by a [MASK] id (masked-LM pre-training).
A global batch is drawn per step from a reshuffled permutation and split into contiguous
per-rank shards, so every rank has the same number of samples.
"""
from __future__ import annotations

from typing import Any

import torch

__all__ = ["move", "SyntheticImages", "SyntheticTokens", "SyntheticMaskedTokens", "IGNORE_INDEX", "make_dataset",
           "normalize", "step_indices", "shard",
           "IMAGE_MEAN", "IMAGE_STD"]

IMAGE_MEAN = 0.5
IMAGE_STD = 0.25


class SyntheticImages:
    kind = "images"

    def __init__(self, size: int = 2048, seed: int = 0, image_size: int = 16, channels: int = 3, classes: int = 10,
                 signal: float = 0.6):
        """``signal``: the template's share of each pixel (the rest is noise); lower is harder."""
        if not 0.0 < signal <= 1.0:
            raise ValueError(f"signal={signal!r}: the template's share of a pixel, in (0, 1]")
        g = torch.Generator().manual_seed(seed)
        templates = torch.rand(classes, channels, image_size, image_size, generator=g)
        self.targets = torch.randint(0, classes, (size,), generator=g)
        noise = torch.rand(size, channels, image_size, image_size, generator=g)
        images = signal * templates[self.targets] + (1.0 - signal) * noise
        self.inputs = (images * 255).round().clamp(0, 255).to(torch.uint8)
        self.size = size

    def __len__(self) -> int:
        return self.size

    def get(self, indices: torch.Tensor):
        """Raw samples: uint8 images and int64 labels."""
        return self.inputs[indices], self.targets[indices]


class SyntheticTokens:
    kind = "tokens"

    def __init__(self, size: int = 2048, seed: int = 0, vocab: int = 128, seq_len: int = 32):
        g = torch.Generator().manual_seed(seed)
        # A sparse random transition table: each token has 4 likely successors.
        succ = torch.randint(0, vocab, (vocab, 4), generator=g)
        seqs = torch.empty(size, seq_len + 1, dtype=torch.int64)
        seqs[:, 0] = torch.randint(0, vocab, (size,), generator=g)
        for t in range(1, seq_len + 1):
            pick = torch.randint(0, 4, (size,), generator=g)
            seqs[:, t] = succ[seqs[:, t - 1], pick]
        self.inputs = seqs[:, :-1].contiguous()
        self.targets = seqs[:, 1:].contiguous()
        self.size = size

    def __len__(self) -> int:
        return self.size

    def get(self, indices: torch.Tensor):
        return self.inputs[indices], self.targets[indices]


IGNORE_INDEX = -100  # the target of an unmasked position (cross-entropy's ignore_index)


class SyntheticMaskedTokens:
    """Masked-LM samples: ``inputs`` has [MASK] (``mask_id``) at the masked positions; ``targets``
    holds the original token there and ``IGNORE_INDEX`` (-100) everywhere else.

    The original sequences follow a seeded Markov chain over every id but ``mask_id`` (so the
    masked tokens are predictable from their neighbours and [MASK] never occurs as content).
    Each position is masked with probability ``mask_prob``; a sequence that drew no masked
    position gets one at a random place, so every sample contributes to the loss (a batch with
    no target would make cross-entropy's mean 0/0 = nan).  Deterministic for a seed.
    """

    kind = "masked_tokens"

    def __init__(self, size: int = 2048, seed: int = 0, vocab: int = 128, seq_len: int = 32,
                 mask_id: int | None = None, mask_prob: float = 0.15):
        if vocab < 2:
            raise ValueError(f"vocab={vocab!r}: needs at least one content id besides [MASK]")
        mask_id = vocab - 1 if mask_id is None else mask_id
        if not 0 <= mask_id < vocab:
            raise ValueError(f"mask_id={mask_id!r}: must be an id of the vocabulary [0, {vocab})")
        if not 0.0 < mask_prob < 1.0:
            raise ValueError(f"mask_prob={mask_prob!r}: a probability in (0, 1)")
        g = torch.Generator().manual_seed(seed)
        content = vocab - 1  # ids other than mask_id, numbered 0..content-1
        succ = torch.randint(0, content, (content, 4), generator=g)
        seqs = torch.empty(size, seq_len, dtype=torch.int64)
        seqs[:, 0] = torch.randint(0, content, (size,), generator=g)
        for t in range(1, seq_len):
            pick = torch.randint(0, 4, (size,), generator=g)
            seqs[:, t] = succ[seqs[:, t - 1], pick]
        tokens = seqs + (seqs >= mask_id).to(torch.int64)  # skip over mask_id
        masked = torch.rand(size, seq_len, generator=g) < mask_prob
        fallback = torch.randint(0, seq_len, (size,), generator=g)
        none = ~masked.any(dim=1)
        masked[none, fallback[none]] = True
        self.inputs = torch.where(masked, torch.full_like(tokens, mask_id), tokens)
        self.targets = torch.where(masked, tokens, torch.full_like(tokens, IGNORE_INDEX))
        self.mask_id = mask_id
        self.vocab = vocab
        self.size = size

    def __len__(self) -> int:
        return self.size

    def get(self, indices: torch.Tensor):
        return self.inputs[indices], self.targets[indices]


def make_dataset(spec, size: int = 2048, seed: int = 0):
    """The dataset a :class:`suite.models.ModelSpec` trains on: ``size`` samples drawn from ``seed``."""
    return spec.dataset(size, seed)


# Multipliers, never divisors: on CUDA, ``tensor / python_number`` is computed as ``a * (1/b)``
# (aten/src/ATen/native/cuda/BinaryDivTrueKernel.cu, the CPU-scalar branch: "may lose one bit"),
# while the CPU kernel divides, so ``x / 255.0`` gives a different float on 126 of the 256 byte
# values (and the old normalization ``(x / 255 - 0.5) / 0.25`` on 111).  A multiplication by a
# constant rounds the same on both (the constant is cast to float32 on both: MulFunctor<opmath_t>
# in BinaryMulKernel.cu), and ``- 0.5`` is ``a + alpha * b`` with an exact product, so host and
# device normalization are one formula, bit for bit (tests/test_reader.py).
_TO_UNIT = 1.0 / 255.0
_INV_STD = 1.0 / IMAGE_STD


def normalize(images: torch.Tensor) -> torch.Tensor:
    """uint8 images to normalized float32, the same bits on the host and on a device."""
    return (images.to(torch.float32) * _TO_UNIT - IMAGE_MEAN) * _INV_STD


def move(batch: Any, device, dtype: torch.dtype | None = None) -> Any:
    """``batch`` on ``device``: a tensor, or a tuple, list or dict of them (nested), the same shape of container
    back; floating-point tensors in ``dtype`` when given (the float64 check).  Anything else is kept as it is."""
    if isinstance(batch, torch.Tensor):
        batch = batch.to(device)
        return batch.to(dtype) if dtype is not None and batch.is_floating_point() else batch
    if isinstance(batch, dict):
        return type(batch)((k, move(v, device, dtype)) for k, v in batch.items())
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a named tuple
        return type(batch)(*(move(v, device, dtype) for v in batch))
    if isinstance(batch, (tuple, list)):
        return type(batch)(move(v, device, dtype) for v in batch)
    return batch


def prepare(dataset, raw_inputs: Any, device, dtype: torch.dtype | None = None) -> Any:
    """A dataset's raw inputs ready for the model on ``device``: images normalized to float32, anything else (a
    tensor, or a tuple, list or dict of them) moved as it is (:func:`move`); floats in ``dtype`` when given."""
    if dataset.kind == "images":
        return move(normalize(raw_inputs.to(device)), device, dtype)
    return move(raw_inputs, device, dtype)


def step_indices(dataset_size: int, step: int, global_batch: int, seed: int = 0) -> torch.Tensor:
    """The global batch of ``step`` (0-based): a fresh permutation per step (reshuffled inputs)."""
    if global_batch > dataset_size:
        raise ValueError(f"global batch {global_batch} is larger than the dataset ({dataset_size} samples)")
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    return torch.randperm(dataset_size, generator=g)[:global_batch]


def shard(indices: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """Rank ``rank``'s contiguous share; the global batch must split evenly."""
    n = indices.numel()
    if n % world:
        raise ValueError(f"global batch {n} does not split evenly over {world} ranks")
    per = n // world
    return indices[rank * per:(rank + 1) * per]
