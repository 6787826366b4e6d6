"""pytest-benchmark set-up: the case matrix as parameters, a session-scoped rank pool, machine info.

Options (pytest has a command line, so no environment variable is read here; asv's are in ``_matrix.py``):
``--fleetbench-case`` (name or glob, repeatable), ``--fleetbench-tag`` (default smoke), ``--fleetbench-model``,
``--fleetbench-world`` (repeatable; default one: 2 on CPU, every GPU on CUDA), ``--fleetbench-device``,
``--fleetbench-size``, ``--fleetbench-config``, ``--fleetbench-set`` (repeatable), ``--fleetbench-steps``
(K steps per timed window), ``--fleetbench-rounds`` (timed windows; both default to ``fleetbench run``'s),
``--fleetbench-no-check``, ``--fleetbench-timeout`` (bound on each multi-rank call, seconds).  The selection
is resolved once (``suite/selection.py``), as ``fleetbench run`` resolves its own: a case named without
``--fleetbench-world`` runs at the one default world size.

Parameters are ``case`` (the case's name, a string) and ``world`` (an int), so the saved JSON holds
``"params": {"case": "mlp/plain", "world": 2}`` and test ids read ``test_step[mlp/plain@2]``.  Each
benchmark's ``group`` is its model and world size (``mlp@2``): pytest-benchmark prints one table per group,
so only cases that share a baseline are compared side by side.  The unit, one training step, is said in
``extra_info`` and in a note after the tables.
"""
from __future__ import annotations

import pytest

from bench_cases._matrix import ROUNDS, STEPS, make_selection


def what_a_round_is(k: int | str) -> str:
    return (f"one training step: the mean step of one timed window of {k} steps on every rank between two "
            f"barriers (the slowest rank's window / {k}), timed by the ranks' own clocks, without the round trip "
            f"from pytest to the ranks")


class Timed:
    """The benchmarks that ran: (group, steps per window) each, for the note after pytest-benchmark's tables."""

    def __init__(self) -> None:
        self.runs: list[tuple[str, int]] = []

    def add(self, group: str, steps: int) -> None:
        self.runs.append((group, steps))

    round = staticmethod(what_a_round_is)


_TIMED = pytest.StashKey[Timed]()
_RESOLVED = pytest.StashKey[object]()


def pytest_addoption(parser):
    g = parser.getgroup("fleetbench")
    g.addoption("--fleetbench-case", action="append", default=[], help="case name or glob (repeatable)")
    g.addoption("--fleetbench-tag", action="append", default=[], help="cases with this tag (default: smoke)")
    g.addoption("--fleetbench-model", action="append", default=[], help="every case of this model (repeatable)")
    g.addoption("--fleetbench-world", action="append", type=int, default=[],
                help="world size (repeatable; default one: 2 on CPU, every GPU on CUDA)")
    g.addoption("--fleetbench-device", choices=("cpu", "cuda"), help="default: cuda where torch sees a GPU")
    g.addoption("--fleetbench-size", choices=("full", "cpu", "tiny"), help="model size (default: the device's)")
    g.addoption("--fleetbench-config", help="TOML file of strategy fields applied on top of every case")
    g.addoption("--fleetbench-set", action="append", default=[], metavar="KEY=VALUE",
                help="a strategy field applied on top of every case (repeatable)")
    g.addoption("--fleetbench-steps", type=int, default=STEPS,
                help=f"steps per timed window (default {STEPS}, as fleetbench run)")
    g.addoption("--fleetbench-rounds", type=int, default=ROUNDS,
                help=f"timed windows, pytest-benchmark's rounds (default {ROUNDS}, as fleetbench run)")
    g.addoption("--fleetbench-no-check", action="store_true", help="skip the correctness verdict")
    g.addoption("--fleetbench-timeout", type=float, default=600.0, help="bound on each multi-rank call, seconds")


def resolved(config):
    """The selection of the options (then the environment), resolved once per session."""
    if _RESOLVED not in config.stash:
        from suite.config import ConfigError

        opt = config.getoption
        sel = make_selection(opt("fleetbench_case"), opt("fleetbench_tag"), opt("fleetbench_world"),
                             opt("fleetbench_device"), opt("fleetbench_size"), opt("fleetbench_config"),
                             opt("fleetbench_set"), opt("fleetbench_model"))
        try:
            config.stash[_RESOLVED] = sel.resolve()
        except ConfigError as exc:
            raise pytest.UsageError(str(exc)) from None
    return config.stash[_RESOLVED]


def pytest_generate_tests(metafunc):
    if {"case", "world"} <= set(metafunc.fixturenames):
        pairs = resolved(metafunc.config).matrix()  # world by world: one pool alive at a time
        metafunc.parametrize(["case", "world"], [(rc.case.name, w) for rc, w in pairs],
                             ids=[f"{rc.case.name}@{w}" for rc, w in pairs])


class _Pools:
    """One RankPool (and its case runner) per world size, started on first use; the previous world's is closed."""

    def __init__(self, config):
        self.config = config
        self.pool = None
        self._runner = None

    def get(self, world: int):
        from suite.runtime import RankPool

        if self.pool is not None and self.pool.nproc != world:
            self.close()
        if self.pool is None:
            self.pool = RankPool(world, device=resolved(self.config).device,
                                 timeout=self.config.getoption("fleetbench_timeout"), pg_timeout=120.0)
        return self.pool

    def runner(self, world: int):
        from bench_cases._matrix import run_options
        from suite.runner import CaseRunner

        pool = self.get(world)
        if self._runner is None or self._runner.launcher is not pool:
            opt = self.config.getoption
            opts = run_options(resolved(self.config), opt("fleetbench_steps"), opt("fleetbench_rounds"),
                               check=not opt("fleetbench_no_check"), timeout=opt("fleetbench_timeout"))
            self._runner = CaseRunner(pool, world, opts)
        return self._runner

    def close(self):
        if self.pool is not None:
            self.pool.close()
            self.pool = None
        self._runner = None


@pytest.fixture(scope="session")
def selection(pytestconfig):
    """The resolved selection (suite.selection.Resolved): the cases' configs at each world size."""
    return resolved(pytestconfig)


@pytest.fixture(scope="session")
def rank_pools(pytestconfig):
    pools = _Pools(pytestconfig)
    yield pools
    pools.close()


@pytest.fixture
def timed(pytestconfig) -> Timed:
    """Where a benchmark notes its group and steps per window, and says what a round is."""
    return pytestconfig.stash.setdefault(_TIMED, Timed())


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter):
    """After pytest-benchmark's tables: what their rounds measured."""
    timed = terminalreporter.config.stash.get(_TIMED, None)
    if timed is None or not timed.runs:
        return
    steps = " or ".join(str(k) for k in sorted({k for _, k in timed.runs}))
    tr = terminalreporter
    tr.section("fleetbench: what the tables above measure", sep="-")
    tr.write_line(f"Each round (Min, Max, Mean, Median ..., in the unit shown; OPS = steps/s) is "
                  f"{what_a_round_is(steps)}.")
    tr.write_line("extra_info holds each rank's windows (rank_window_s), the slowest rank's (window_s) and every "
                  "rank's step times (step_times_s), in seconds.")
    tr.write_line("One table per group, MODEL@WORLD: compare cases within a group only; "
                  "`fleetbench run` states speedups over plain with intervals.")


def pytest_benchmark_update_machine_info(config, machine_info):
    """torch, CUDA and NCCL versions; GPU names and clocks through NVML (or why there are none)."""
    from suite.measure.metadata import collect

    meta = collect()
    machine_info["torch"] = meta["torch"]
    machine_info["cuda"] = meta["cuda"]
    machine_info["nccl"] = meta["nccl"]
    machine_info["gpu"] = meta["gpu"]
    machine_info["fleetbench"] = meta
