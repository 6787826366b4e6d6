"""Deterministic synthetic datasets and the readers that feed them to the engine."""
from .synthetic import make_dataset, normalize, shard, step_indices

__all__ = ["make_dataset", "normalize", "shard", "step_indices"]
