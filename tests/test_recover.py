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
