"""The harness's error measure: max |a - b| / max |b| per tensor, worst over tensors; nan/inf fail."""
from __future__ import annotations

import math
from typing import Iterable, Mapping

import torch

__all__ = ["rel_error", "worst_error", "finite_le"]


def rel_error(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |b| (max |a - b| where b is all zeros); inf if anything is not finite."""
    a = a.detach().to(torch.float64)
    b = b.detach().to(torch.float64)
    if a.shape != b.shape:
        return math.inf
    if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
        return math.inf
    if a.numel() == 0:
        return 0.0
    diff = (a - b).abs().max().item()
    scale = b.abs().max().item()
    return diff / scale if scale > 0 else diff


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
