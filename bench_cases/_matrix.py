"""What both harnesses share: the case selection, a case resolved at a world size, the runner's options."""
from __future__ import annotations

import os
from collections.abc import Iterable

from suite.cases import Case, matrix, select_cases
from suite.config import ConfigError, StrategyConfig

__all__ = ["selected_matrix", "resolve", "split_csv", "env_selection", "bench_device", "run_options"]


def split_csv(text: str | None) -> list[str]:
    return [t.strip() for t in (text or "").split(",") if t.strip()]


def selected_matrix(cases: Iterable[str] = (), tags: Iterable[str] = (), worlds: Iterable[int] = ()) -> list:
    """(case, world) pairs: the named cases (globs) or tagged ones, at the given world sizes (default: each case's)."""
    chosen = select_cases(list(cases), list(tags) or ([] if cases else ["smoke"]))
    return matrix(chosen, list(worlds) or None)


def resolve(case: Case, world: int):
    """The case with its validated config at ``world`` ranks (``skip`` set when it cannot run there)."""
    from suite.runner import ResolvedCase

    cfg = StrategyConfig.from_dict(case.config)
    why = case.applies_to_world(world)
    if why is None:
        try:
            cfg.check_world(world)
        except ConfigError as exc:
            why = str(exc)
    return ResolvedCase(case, cfg, why)


def env_selection() -> tuple[list, list, list]:
    """(cases, tags, worlds) from FLEETBENCH_BENCH_CASES / _TAGS / _WORLDS (comma-separated)."""
    return (split_csv(os.environ.get("FLEETBENCH_BENCH_CASES")), split_csv(os.environ.get("FLEETBENCH_BENCH_TAGS")),
            [int(w) for w in split_csv(os.environ.get("FLEETBENCH_BENCH_WORLDS"))])


def bench_device() -> tuple[str, str]:
    """(device type, backend) of the benchmark's ranks: CUDA wherever it is available (never a silent CPU run)."""
    import torch

    return ("cuda", "nccl") if torch.cuda.is_available() else ("cpu", "gloo")


def run_options(steps: int, rounds: int, check: bool = True, timeout: float = 600.0):
    """The runner's options for a benchmark harness (size from FLEETBENCH_BENCH_SIZE, else the device's default)."""
    from suite.models import default_size
    from suite.runner import RunOptions

    device, backend = bench_device()
    size = os.environ.get("FLEETBENCH_BENCH_SIZE") or default_size(device)
    return RunOptions(size=size, steps=steps, rounds=rounds, check=check, timeout=timeout, device=device,
                      backend=backend, utilization=False)
