"""What both harnesses share: the selection (``suite/selection.py``) and the runner's options.

pytest-benchmark takes its selection as ``--fleetbench-*`` options (``conftest.py``); asv runs the
benchmarks in processes of its own and passes them no arguments, so for asv the selection comes
from the environment.  These are the only environment variables the benchmarks read (``fleetbench
nightly`` sets them for its asv stage):

==============================  ==================================================================
FLEETBENCH_BENCH_CASES          case names or globs, comma-separated
FLEETBENCH_BENCH_TAGS           case tags, comma-separated (default: ``smoke``)
FLEETBENCH_BENCH_MODELS         models, comma-separated (every case of each)
FLEETBENCH_BENCH_WORLDS         world sizes, comma-separated (default one: 2 on CPU, every GPU on CUDA)
FLEETBENCH_BENCH_DEVICE         cpu | cuda (default: cuda where torch sees a GPU)
FLEETBENCH_BENCH_SIZE           full | cpu | tiny (default: the device's)
FLEETBENCH_BENCH_CONFIG         a TOML file of strategy fields applied on top of every case
FLEETBENCH_BENCH_SET            ``KEY=VALUE`` strategy fields, separated by ``;``
FLEETBENCH_BENCH_ROUNDS/_STEPS  windows per process, steps per window (default: ``fleetbench run``'s, 5 / 5)
FLEETBENCH_BENCH_PROCESSES      asv: processes whose samples are pooled (default 2)
==============================  ==================================================================
"""
from __future__ import annotations

import os

from suite.runner import RunOptions
from suite.selection import Resolved, Selection

__all__ = ["split_csv", "env_selection", "make_selection", "run_options", "STEPS", "ROUNDS"]

# Steps per timed window and windows: ``fleetbench run``'s defaults (tests/test_bench_conventions.py checks
# that run's command line says the same).
STEPS, ROUNDS = RunOptions.steps, RunOptions.rounds


def split_csv(text: str | None, sep: str = ",") -> list[str]:
    return [t.strip() for t in (text or "").split(sep) if t.strip()]


def make_selection(cases=(), tags=(), worlds=(), device=None, size=None, config=None, sets=(), models=()) -> Selection:
    """The harnesses' selection: by default the smoke cases (a minute on a 2-core machine)."""
    return Selection(cases=tuple(cases), tags=tuple(tags), models=tuple(models), worlds=tuple(worlds),
                     device=device or None, size=size or None, config=config or None, sets=tuple(sets),
                     default_tag="smoke")


def env_selection() -> Selection:
    """The selection the FLEETBENCH_BENCH_* variables state (see the table above)."""
    env = os.environ.get
    return make_selection(split_csv(env("FLEETBENCH_BENCH_CASES")), split_csv(env("FLEETBENCH_BENCH_TAGS")),
                          [int(w) for w in split_csv(env("FLEETBENCH_BENCH_WORLDS"))], env("FLEETBENCH_BENCH_DEVICE"),
                          env("FLEETBENCH_BENCH_SIZE"), env("FLEETBENCH_BENCH_CONFIG"),
                          split_csv(env("FLEETBENCH_BENCH_SET"), ";"), split_csv(env("FLEETBENCH_BENCH_MODELS")))


def run_options(resolved: Resolved, steps: int, rounds: int, check: bool = True, timeout: float = 600.0):
    """The runner's options for a benchmark harness, on the selection's platform and size."""
    return RunOptions(size=resolved.size, steps=steps, rounds=rounds, check=check, timeout=timeout,
                      device=resolved.device, backend=resolved.backend, utilization=False,
                      baseline_overrides=resolved.selection.sets)
