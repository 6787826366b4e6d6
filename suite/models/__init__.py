"""Reference models, sized for CPU by default; ``scale`` > 1 makes them GPU-sized.

``get_model(name)`` returns a :class:`ModelSpec`: how to build the module, its loss and the
synthetic data it trains on.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from .mlp import WideMLP
from .resnet import SmallResNet
from .transformer import TinyTransformer, lm_loss

__all__ = ["ModelSpec", "get_model", "MODELS"]


@dataclass(frozen=True)
class ModelSpec:
    name: str
    data: str  # "images" | "tokens"
    build: Callable[[int], nn.Module]  # scale -> module
    loss_fn: Callable
    image_size: int = 16
    num_classes: int = 10
    vocab: int = 128
    seq_len: int = 32
    has_batchnorm: bool = False

    def make(self, seed: int, scale: int = 1, device="cpu") -> nn.Module:
        """The model, initialised from ``seed`` (identical for an identical seed)."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return self.build(scale).to(device)


def _ce(out, target):
    return nn.functional.cross_entropy(out, target)


MODELS: dict[str, ModelSpec] = {
    "resnet": ModelSpec("resnet", "images", lambda s: SmallResNet(width=16 * s, blocks=2 * s), _ce,
                        has_batchnorm=True),
    "mlp": ModelSpec("mlp", "images", lambda s: WideMLP(3 * 16 * 16, width=1024 * s, depth=4), _ce),
    "transformer": ModelSpec("transformer", "tokens",
                             lambda s: TinyTransformer(d_model=64 * s, ff=128 * s, layers=2 * s), lm_loss),
}


def get_model(name: str) -> ModelSpec:
    if name not in MODELS:
        raise ValueError(f"model {name!r} is unknown; allowed: {', '.join(MODELS)}")
    return MODELS[name]
