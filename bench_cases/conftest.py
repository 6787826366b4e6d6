"""pytest-benchmark set-up: the case matrix as parameters, a session-scoped rank pool, machine info.

Options (also settable through FLEETBENCH_BENCH_CASES / _TAGS / _WORLDS, comma-separated):
``--fleetbench-case`` (name or glob, repeatable), ``--fleetbench-tag`` (default smoke),
``--fleetbench-world`` (repeatable; default each case's world sizes), ``--fleetbench-steps``
(K steps per timed round), ``--fleetbench-rounds``, ``--fleetbench-no-check``.
"""
from __future__ import annotations

import os

import pytest

from bench_cases._matrix import env_selection, selected_matrix

CALL_TIMEOUT = float(os.environ.get("FLEETBENCH_BENCH_CALL_TIMEOUT", "600"))


def pytest_addoption(parser):
    g = parser.getgroup("fleetbench")
    g.addoption("--fleetbench-case", action="append", default=[], help="case name or glob (repeatable)")
    g.addoption("--fleetbench-tag", action="append", default=[], help="cases with this tag (default: smoke)")
    g.addoption("--fleetbench-world", action="append", type=int, default=[], help="world size (repeatable)")
    g.addoption("--fleetbench-steps", type=int, default=5, help="steps per timed round (default 5)")
    g.addoption("--fleetbench-rounds", type=int, default=5, help="timed rounds (default 5)")
    g.addoption("--fleetbench-no-check", action="store_true", help="skip the correctness verdict")


def _selection(config):
    cases, tags, worlds = env_selection()
    return (config.getoption("fleetbench_case") or cases, config.getoption("fleetbench_tag") or tags,
            config.getoption("fleetbench_world") or worlds)


def pytest_generate_tests(metafunc):
    if "case_world" in metafunc.fixturenames:
        try:
            pairs = selected_matrix(*_selection(metafunc.config))
        except ValueError as exc:
            raise pytest.UsageError(str(exc)) from None
        pairs.sort(key=lambda cw: cw[1])  # one world size after the other: one pool alive at a time
        metafunc.parametrize("case_world", pairs, ids=[f"{c.name}@{w}" for c, w in pairs])


class _Pools:
    """One RankPool (and its case runner) per world size, started on first use; the previous world's is closed."""

    def __init__(self, config):
        self.config = config
        self.pool = None
        self._runner = None

    def get(self, world: int):
        from bench_cases._matrix import bench_device
        from suite.runtime import RankPool

        if self.pool is not None and self.pool.nproc != world:
            self.close()
        if self.pool is None:
            self.pool = RankPool(world, device=bench_device()[0], timeout=CALL_TIMEOUT, pg_timeout=120.0)
        return self.pool

    def runner(self, world: int):
        from bench_cases._matrix import run_options
        from suite.runner import CaseRunner

        pool = self.get(world)
        if self._runner is None or self._runner.launcher is not pool:
            opts = run_options(self.config.getoption("fleetbench_steps"), self.config.getoption("fleetbench_rounds"),
                               check=not self.config.getoption("fleetbench_no_check"), timeout=CALL_TIMEOUT)
            self._runner = CaseRunner(pool, world, opts)
        return self._runner

    def close(self):
        if self.pool is not None:
            self.pool.close()
            self.pool = None
        self._runner = None


@pytest.fixture(scope="session")
def rank_pools(pytestconfig):
    pools = _Pools(pytestconfig)
    yield pools
    pools.close()


def pytest_benchmark_update_machine_info(config, machine_info):
    """torch, CUDA and NCCL versions; GPU names and clocks through NVML (or why there are none)."""
    from suite.measure.metadata import collect

    meta = collect()
    machine_info["torch"] = meta["torch"]
    machine_info["cuda"] = meta["cuda"]
    machine_info["nccl"] = meta["nccl"]
    machine_info["gpu"] = meta["gpu"]
    machine_info["fleetbench"] = meta
