"""The harness's error measure: max |a - b| / max(max |b|, SCALE_FLOOR) per tensor, worst over tensors.

nan or inf anywhere is a failure (an infinite error).

Why the floor: a tensor whose values are all near zero (a BatchNorm bias a few steps after its
zero initialisation) turns floating-point summation-order noise into huge relative errors.
Measured here: summing the same four shards' gradients in the opposite order moves such a
bias (max |b| = 6e-5) by 4e-3 *relative* after 4 steps, while every absolute difference in
the model stays near 1e-7.  Dividing by max(max |b|, 1e-2) keeps the measure relative for
ordinary weights and absolute-like for tensors near zero, as ``allclose``'s atol does.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import torch

__all__ = ["rel_error", "worst_error", "finite_le", "max_finite", "SCALE_FLOOR"]

SCALE_FLOOR = 1e-2


def rel_error(a: torch.Tensor, b: torch.Tensor, floor: float = SCALE_FLOOR) -> float:
    """max |a - b| / max(max |b|, floor); inf if anything is not finite or the shapes differ.  A sparse tensor (an
    ``nn.Embedding(sparse=True)``'s gradient) is compared as the dense tensor it stands for."""
    a = _dense(a.detach()).to(torch.float64)
    b = _dense(b.detach()).to(torch.float64)
    if a.shape != b.shape:
        return math.inf
    if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
        return math.inf
    if a.numel() == 0:
        return 0.0
    diff = (a - b).abs().max().item()
    return diff / max(b.abs().max().item(), floor)


def _dense(t: torch.Tensor) -> torch.Tensor:
    return t.to_dense() if t.layout != torch.strided else t


def worst_error(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> tuple[float, str]:
    """Worst :func:`rel_error` over the tensors of ``b`` (a tensor missing from ``a`` is inf)."""
    worst, where = 0.0, ""
    for name, tb in b.items():
        err = rel_error(a[name], tb) if name in a else math.inf
        if not (err <= worst):  # also true for nan
            worst, where = (err if err == err else math.inf), name
    return worst, where


def finite_le(value: float, bound: float) -> bool:
    """value <= bound, and value finite (nan and inf fail, unlike max(0.0, nan))."""
    return isinstance(value, (int, float)) and math.isfinite(value) and value <= bound


def max_finite(values: Iterable[float]) -> float:
    """The largest value, inf if any value is nan or inf (``max`` would drop a nan)."""
    out = 0.0
    for v in values:
        if not math.isfinite(v):
            return math.inf
        out = v if v > out else out
    return out
