"""Rank launch, communicator groups and the long-lived rank pool.

The names below are loaded on first use: importing ``suite.runtime.pool`` (what a spawned rank does first,
to find its entry point) must not import torch, so a rank sets its parent-death signal within
milliseconds of starting rather than after torch's import (seconds on a loaded machine).
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .context import RankContext, current
    from .device import CudaUnavailable, Platform, require_cuda, select_platform
    from .pool import RankError, RankFailure, RankPool

__all__ = ["RankContext", "current", "CudaUnavailable", "Platform", "require_cuda", "select_platform",
           "RankPool", "RankFailure", "RankError"]

_WHERE = {"RankContext": "context", "current": "context", "CudaUnavailable": "device", "Platform": "device",
          "require_cuda": "device", "select_platform": "device", "RankPool": "pool", "RankFailure": "pool",
          "RankError": "pool"}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        value = getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
