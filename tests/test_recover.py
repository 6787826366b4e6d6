"""Recover everywhere: a rank error in a prepared case (the path pytest-benchmark, asv and ab's trial servers time
through: ``CaseRunner.prepare``, ``PreparedCase.window/metrics/close``) rebuilds the world before the next case,
under gloo as under NCCL.  Without it, the collective a peer left queued pairs with the next case's first one: under
gloo the next case waits out the process-group timeout and the world stays broken for every later call.

A pool of its own (2 ranks, a short process-group timeout): a world broken by a failing version of the code must
not reach the session's pools."""
from __future__ import annotations

import pytest

from suite.run_spec import RunFacts, RunOptions, Selection
from suite.runner import CaseRunner, StaleCase
from suite.runtime import RankError, RankPool
from suite.selection import resolve
from tests.scripts.faulty_model import arm_on_rank

FAULTY = "tests.scripts.faulty_model:make_spec"


@pytest.fixture(scope="module")
def own_pool():
    pool = RankPool(2, timeout=60, pg_timeout=10, num_threads=1)
    yield pool
    pool.close()


def test_a_rank_error_between_two_prepared_cases_is_followed_by_a_clean_case(own_pool):
    faulty = resolve(Selection(models=(FAULTY,), cases=("*/overlap",), worlds=(2,), device="cpu", size="tiny"))
    clean = resolve(Selection(cases=("mlp/plain",), worlds=(2,), device="cpu", size="tiny"))
    (broken,), (good,) = faulty.at[2], clean.at[2]
    opts = RunOptions(steps=2, rounds=2, warmup=1, utilization=False)
    runner = CaseRunner(own_pool, 2, opts, metadata={}, facts=RunFacts(backend="gloo", size="tiny", device="cpu"))
    first = runner.prepare(broken)
    assert len(first.window()) == 2  # a healthy window first
    own_pool.run(arm_on_rank)
    with pytest.raises(RankError, match="injected rank error"):
        first.window()
    assert runner.generation == 1 and first.stale
    with pytest.raises(StaleCase, match="prepare the case again"):
        first.window()  # its engine went with the old world: refused at once, not a hang
    first.close()  # a no-op: the rebuilt world dropped it

    check = runner.check(good)  # the next case: its check against the single-process reference passes
    assert check is not None and not isinstance(check, Exception) and check.verdict == "pass", check
    second = runner.prepare(good)
    answers = second.window()
    assert len(answers) == 2 and all(a.window_s > 0 for a in answers)
    rec = runner.record(good, check, second.metrics())
    second.close()
    assert rec.status == "ok" and rec.verdict == "pass" and len(rec.metrics.window_s) == 1, rec.error


# ---- a pool's world rebuilt in place; the runner rebuilds it -------------------------------------------------------
_PENDING: list = []


def leave_one_queued_on_rank() -> int:
    """Rank 0 queues an allreduce rank 1 never joins (as an NCCL rank's asynchronous launch leaves it)."""
    import torch
    import torch.distributed as dist

    if dist.get_rank() == 0:
        _PENDING.append(dist.all_reduce(torch.full((1,), 100.0), async_op=True))
        return 0
    raise ValueError("boom on rank 1")


def reduce_rank_on_rank() -> float:
    import torch
    import torch.distributed as dist

    t = torch.full((1,), float(dist.get_rank() + 1))
    dist.all_reduce(t)
    return t.item()


def test_a_rank_pool_world_is_rebuilt_in_place_after_a_rank_error(own_pool):
    """The rank pool's side (the single-host GPU nightly): `rebuild_world_on_rank` on every rank, then the next
    allreduce sums what it was sent.  The module's own pool: the orphaned collective must not reach the session's."""
    from suite.runtime.pool import RankError
    from suite.runtime.torchrun import rebuild_world_on_rank

    with pytest.raises(RankError, match="boom on rank 1"):
        own_pool.run(leave_one_queued_on_rank)
    assert own_pool.run(rebuild_world_on_rank, {"tag": "test"}) == [True, True]
    assert own_pool.run(reduce_rank_on_rank, timeout=60) == [3.0, 3.0]


def test_the_runner_rebuilds_the_world_after_a_rank_error_under_nccl_and_gloo():
    from suite.measure.timing import rebuild_on_rank
    from suite.run_spec import RunFacts, RunOptions
    from suite.runner import CaseRunner
    from suite.runtime.pool import RankError
    from tests.fakes import FakeLauncher
    from tests.fakes import resolved as _rc

    class Launcher(FakeLauncher):
        def run(self, fn, kwargs=None, timeout=None):
            if fn is rebuild_on_rank:
                self.calls.append("rebuild")
                return [True, True]
            names = [v["name"] for v in kwargs["variants"]] if kwargs and "variants" in kwargs else []
            if len(names) > 2:
                self.calls.append(names)
                raise RankError("time_on_rank raised on rank(s) [1]", {1: "boom"})
            return super().run(fn, kwargs, timeout)

    for backend in ("nccl", "gloo"):  # gloo too: an orphaned collective breaks its world (tests/test_recover.py)
        launcher = Launcher()
        runner = CaseRunner(launcher, 2, RunOptions(check=False, utilization=False), metadata={},
                            facts=RunFacts(backend=backend))
        runner.run_model([_rc("mlp/plain"), _rc("mlp/overlap"), _rc("mlp/fusion")], lambda *a: None)
        assert launcher.calls[0] == ["plain", "overlap", "fusion"]
        assert launcher.calls[1] == "rebuild", (backend, launcher.calls)  # before the next call
