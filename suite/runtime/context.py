"""Who this process is in the world: rank, sizes, platform; set once when the rank starts."""
from __future__ import annotations

from dataclasses import dataclass

from .device import Platform

__all__ = ["RankContext", "current", "set_current"]


@dataclass(frozen=True)
class RankContext:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    platform: Platform
    torchrun: bool = False
    pg_timeout: float = 60.0
    threads: int = 1


_CURRENT: RankContext | None = None


def set_current(ctx: RankContext | None) -> None:
    global _CURRENT
    _CURRENT = ctx


def current() -> RankContext:
    if _CURRENT is None:
        raise RuntimeError(
            "no rank context: this code runs inside a rank started by fleetbench (RankPool, `fleetbench run`) "
            "or torchrun; call suite.runtime.launch.init_from_env() first in your own script"
        )
    return _CURRENT
