"""Benchmark figure sets: one module per figure, each with DESCRIPTION, Options, measure and render (the contract:
suite/cli/figures.py)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PoolOptions:
    """What a figure timed on `fleetbench figures`' rank pool takes, its defaults stated once: the pool's ranks,
    interleaved rounds of windows, steps a window, and the bound on each multi-rank call (seconds).  A figure's
    ``Options`` subclasses it and adds its own fields."""

    nproc: int = 2
    rounds: int = 7
    steps: int = 5
    timeout: float = 1800.0
