"""Choosing the gradient communication a config asks for (the one place that knows every GradSync)."""
from __future__ import annotations

import torch

from ..config import StrategyConfig
from .bucketed import BucketedGradSync
from .grad_sync import GradSync, NoGradSync, PlainGradSync

__all__ = ["build_grad_sync", "uses_buckets"]


def uses_buckets(config: StrategyConfig) -> bool:
    """Whether ``config``'s gradients go through buckets (:class:`BucketedGradSync`): fusion, overlap, several
    communicators or the hierarchy."""
    return config.data_parallel == "suite" and (
        config.fuse_all_reduce_ops
        or not config.sync_nccl_allreduce
        or config.nccl_comm_num > 1
        or config.use_hierarchical_allreduce
    )


def build_grad_sync(model: torch.nn.Module, config: StrategyConfig, group=None) -> GradSync | None:
    """The gradient communication the config asks for (None for DDP, which does its own)."""
    if config.data_parallel == "none":
        return NoGradSync(model, config, group)
    if config.data_parallel == "ddp":
        return None
    if uses_buckets(config):
        return BucketedGradSync(model, config, group)
    return PlainGradSync(model, config, group)
