"""The optimizer a config asks for: torch.optim (per-parameter), or the fused flat one."""
from __future__ import annotations

import torch

from ..compute.fused_optim import build_fused_optimizer
from ..config import StrategyConfig

__all__ = ["build_optimizer", "torch_optimizer"]


def torch_optimizer(params, config: StrategyConfig, **impl) -> torch.optim.Optimizer:
    """torch.optim's optimizer for ``config`` (``impl``: foreach=…/fused=… for benchmarks)."""
    params = [p for p in params if p.requires_grad]
    if config.optimizer == "sgd":
        return torch.optim.SGD(params, lr=config.lr, weight_decay=config.weight_decay, **impl)
    if config.optimizer == "momentum":
        return torch.optim.SGD(params, lr=config.lr, momentum=config.momentum, weight_decay=config.weight_decay,
                               **impl)
    if config.optimizer == "adam":
        return torch.optim.Adam(params, lr=config.lr, weight_decay=config.weight_decay, **impl)
    raise ValueError(f"optimizer={config.optimizer!r}")  # unreachable: the config validated it


def build_optimizer(model: torch.nn.Module, config: StrategyConfig, grad_sync: object | None = None):
    if config.fuse_all_optimizer_ops:
        return build_fused_optimizer(model, config, grad_sync)
    return torch_optimizer(model.parameters(), config)
