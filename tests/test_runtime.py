"""The rank pool: results in rank order, errors with tracebacks, and no hang when a rank dies or sticks."""
from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from suite.check.harness import check_on_rank
from suite.runtime import RankError, RankFailure, RankPool
from suite.runtime.probes import allreduce_rank_sum, sleep_then_allreduce, whoami
from suite.workload import WorkloadSpec


def test_pool_runs_on_every_rank(pool2):
    out = pool2.run(whoami)
    assert [o["rank"] for o in out] == [0, 1]
    assert {o["world_size"] for o in out} == {2}
    assert pool2.run(allreduce_rank_sum) == [1.0, 1.0]


def test_exception_on_one_rank_is_reported_with_its_traceback(pool2):
    with pytest.raises((RankError, RankFailure)) as info:
        pool2.run(check_on_rank, {"workload_spec": WorkloadSpec("no-such-model"), "config": {}})
    assert "no-such-model" in str(info.value)
    assert pool2.run(allreduce_rank_sum) == [1.0, 1.0]


def test_rank_killed_inside_a_collective_is_reported_and_the_pool_recovers(pool2):
    pool2.start()
    victim = pool2.pids[1]
    restarts = pool2.restarts
    # Rank 0 enters the allreduce at once; rank 1 sleeps first and is killed while rank 0 waits in it.
    threading.Timer(1.0, lambda: os.kill(victim, signal.SIGKILL)).start()
    t0 = time.monotonic()
    with pytest.raises(RankFailure) as info:
        pool2.run(sleep_then_allreduce, {"seconds": 60, "sleeper": 1}, timeout=45)
    elapsed = time.monotonic() - t0
    assert info.value.ranks == [1], str(info.value)
    assert "died" in str(info.value) and "sleep_then_allreduce" in str(info.value)
    assert elapsed < 45, f"the failure took {elapsed:.1f}s, past the call's bound"
    # The pool restarts on the next call and runs another case.
    assert pool2.run(allreduce_rank_sum) == [1.0, 1.0]
    assert pool2.restarts == restarts + 1
    assert victim not in pool2.pids


def test_a_stuck_rank_is_reported_within_the_timeout(pool2):
    t0 = time.monotonic()
    with pytest.raises(RankFailure) as info:
        pool2.run(sleep_then_allreduce, {"seconds": 60, "sleeper": 0}, timeout=3)
    assert "did not answer within 3 s" in str(info.value)
    assert time.monotonic() - t0 < 30
    assert pool2.run(allreduce_rank_sum) == [1.0, 1.0]


def test_pool_rejects_a_bad_size():
    with pytest.raises(ValueError, match="nproc=0"):
        RankPool(0)


def test_two_pools_side_by_side_do_not_collide(pool2):
    other = RankPool(2, num_threads=1, timeout=120)
    try:
        assert other.run(allreduce_rank_sum) == [1.0, 1.0]
        assert pool2.run(allreduce_rank_sum) == [1.0, 1.0]
    finally:
        other.close()


def communicators_on_rank() -> dict:
    """comm_groups asked for 3, then 2, then 1 communicators: how many were made, and whether the smaller asks got
    the first of the same ones."""
    from suite.runtime import groups

    groups.reset()
    three, two, one = groups.comm_groups(3), groups.comm_groups(2), groups.comm_groups(1)
    made = {id(g) for g in three + two + one}
    labels = [groups.label_of(g) for g in three]
    import torch
    import torch.distributed as dist

    t = torch.ones(4)
    dist.all_reduce(t, group=two[1])  # a shared communicator still reduces over every rank
    groups.reset()
    return {"made": len(made), "same": two == three[:2] and one == three[:1], "labels": labels, "sum": float(t[0])}


def test_engines_of_fewer_communicators_reuse_the_first_ones(pool2):
    """At world 8 each rank held 10 to 19 communicators, one set per nccl_comm_num asked (issue 43.8): now 1, 2 and 3
    communicators are the first 1, 2 and 3 of one list, 3 groups in all, labelled comm0..comm2."""
    for r in pool2.run(communicators_on_rank):
        assert r == {"made": 3, "same": True, "labels": ["comm0", "comm1", "comm2"], "sum": 2.0}, r
