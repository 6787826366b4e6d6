"""Benchmark figure sets: one module per figure, each with DESCRIPTION, Options, measure and render (the contract:
suite/cli/figures.py)."""
from __future__ import annotations

from dataclasses import dataclass

from ..run_spec import MAX_ROUNDS, MAX_STEPS, WEEK
from ..validate import spec


@dataclass(frozen=True)
class PoolOptions:
    """What a figure timed on `fleetbench figures`' rank pool takes, its defaults and bounds stated once (each
    field's metadata, ``suite/validate.py``: `fleetbench figures` checks the options given by them): the pool's
    ranks, interleaved rounds of windows, steps a window, and the bound on each multi-rank call (seconds).  A
    figure's ``Options`` subclasses it and adds its own fields."""

    nproc: int = spec(2, "ranks (default: the set's own)", ge=1)
    rounds: int = spec(7, "interleaved rounds (default: the set's own)", ge=1, le=MAX_ROUNDS)
    steps: int = spec(5, "steps per timed window (default: the set's own)", ge=1, le=MAX_STEPS)
    timeout: float = spec(1800.0, "bound on each multi-rank call, seconds (default: the set's own)", gt=0.0,
                          le=float(WEEK), unit="seconds", note="a week")
