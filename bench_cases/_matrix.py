"""What both harnesses share: the case selection, a case's validated config, its verdict."""
from __future__ import annotations

import os
from typing import Iterable, Optional

from suite.cases import Case, matrix, select_cases
from suite.config import ConfigError, StrategyConfig

__all__ = ["selected_matrix", "case_config", "verdict_of", "split_csv"]


def split_csv(text: Optional[str]) -> list[str]:
    return [t.strip() for t in (text or "").split(",") if t.strip()]


def selected_matrix(cases: Iterable[str] = (), tags: Iterable[str] = (), worlds: Iterable[int] = ()) -> list:
    """(case, world) pairs: the named cases (globs) or tagged ones, at the given world sizes (default: each case's)."""
    chosen = select_cases(list(cases), list(tags) or ([] if cases else ["smoke"]))
    return matrix(chosen, list(worlds) or None)


def case_config(case: Case, world: int) -> tuple[Optional[StrategyConfig], Optional[str]]:
    """The case's validated config at ``world`` ranks, or (None, why it cannot run there)."""
    why = case.applies_to_world(world)
    if why:
        return None, why
    try:
        cfg = StrategyConfig.from_dict(case.config)
        cfg.check_world(world)
    except ConfigError as exc:
        return None, str(exc)
    return cfg, None


def verdict_of(launcher, case: Case, cfg: StrategyConfig, steps: int = 3, timeout: float = 600.0) -> dict:
    """The correctness verdict of a case (the harness's check); an error is a verdict, not a crash."""
    from suite.check.harness import run_check

    try:
        res = run_check(launcher, case.model, cfg, steps=steps, timeout=timeout)
    except Exception as exc:  # noqa: BLE001 - reported in the benchmark's extra_info
        return {"verdict": "error", "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"}
    return {"verdict": res.verdict, "param_error": res.param_error, "loss_error": res.loss_error,
            "message": res.message}


def env_selection() -> tuple[list, list, list]:
    """(cases, tags, worlds) from FLEETBENCH_BENCH_CASES / _TAGS / _WORLDS (comma-separated)."""
    return (split_csv(os.environ.get("FLEETBENCH_BENCH_CASES")), split_csv(os.environ.get("FLEETBENCH_BENCH_TAGS")),
            [int(w) for w in split_csv(os.environ.get("FLEETBENCH_BENCH_WORLDS"))])
