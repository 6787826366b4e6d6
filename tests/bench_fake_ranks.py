"""A pytest plugin for ``pytest bench_cases -p tests.bench_fake_ranks``: a pytest-benchmark session without ranks.

``suite.runtime.RankPool`` is replaced by :class:`FakeRankPool`, which answers the memory probe and runs the
**real** rank-side timing call, ``suite.measure.timing.time_on_rank`` (and through it the one interleaving loop,
``interleaved_rounds``), once per rank in this process, over fake engines (:class:`FakeTimedCase`, in place of
``TimedCase``; the workload is a stand-in holding the rank).  Any other rank function is refused, so a session that
times cases otherwise (``prepare_case``/``run_window``, one case at a time) fails.  Every call the pool gets and
every window a fake engine runs (rank, variant, steps, recorded or warm-up, in order) are written as JSON to the
file named by ``FAKE_RANKS_LOG`` when the session ends (``tests/test_bench_sessions.py`` reads it).

A fake window's seconds are :func:`window_s`: a step time of the variant's own (:data:`STEP_S`), a little more each
window, a little more on rank 1, so each case's windows are told apart from every other's.
"""
from __future__ import annotations

import json
import os

STEP_S = {"plain": 0.010, "overlap": 0.008, "fusion": 0.009, "compute_fusion": 0.007}  # seconds per step
LOG: dict = {"pools": [], "calls": [], "windows": []}
_RANK = [0]


def window_s(variant: str, index: int, rank: int, steps: int) -> float:
    """The seconds of the ``index``-th recorded window of ``variant`` on ``rank``."""
    return steps * (STEP_S.get(variant, 0.02) + 0.0005 * index) + 0.0001 * rank


class _Workload:
    def __init__(self, spec):
        self.spec, self.rank = spec, _RANK[0]


class FakeTimedCase:
    """Stands for ``suite.measure.timing.TimedCase``: logs each window, records :func:`window_s` for it."""

    def __init__(self, name, config, wl):
        self.name, self.wl, self.windows, self.steps, self.span = name, wl, [], 1, None

    def window(self, n: int, record: bool = True):
        LOG["windows"].append({"rank": self.wl.rank, "variant": self.name, "steps": n, "record": record})
        if record:
            self.steps = n
            self.windows.append(window_s(self.name, len(self.windows), self.wl.rank, n))

    def result(self):
        from suite.measure.timing import VariantTiming

        steps = [w / self.steps for w in self.windows for _ in range(self.steps)]
        return VariantTiming(windows=list(self.windows), step_times=steps, losses=[1.0] * len(steps), threads=1,
                             comm_calls_per_step={}, comm_bytes_per_step={}, host_syncs=0, describe={},
                             peak_memory_bytes=1, peak_memory_kind="fake")


class FakeRankPool:
    def __init__(self, nproc, **kw):
        self.nproc = nproc
        LOG["pools"].append(nproc)

    def run(self, fn, kwargs=None, timeout=None):
        from suite.measure import timing

        kwargs = kwargs or {}
        LOG["calls"].append({"fn": fn.__name__, "variants": [v["name"] for v in kwargs.get("variants", ())],
                             "rounds": kwargs.get("rounds"), "steps": kwargs.get("steps"), "world": self.nproc})
        if fn.__name__ == "free_memory_on_rank":
            return [2**40] * self.nproc
        if fn is not timing.time_on_rank:
            raise AssertionError(f"the fake rank pool runs time_on_rank only, not {fn.__name__}")
        saved = timing.workload, timing.TimedCase
        timing.workload, timing.TimedCase = _Workload, FakeTimedCase
        try:
            answers = []
            for rank in range(self.nproc):  # every rank in turn, the real rank function
                _RANK[0] = rank
                answers.append(fn(**kwargs))
            return answers
        finally:
            timing.workload, timing.TimedCase = saved

    def close(self):
        pass


def pytest_configure(config):
    import suite.runtime

    suite.runtime.RankPool = FakeRankPool


def pytest_unconfigure(config):
    path = os.environ.get("FAKE_RANKS_LOG")
    if path:
        with open(path, "w") as fh:
            json.dump(LOG, fh)
