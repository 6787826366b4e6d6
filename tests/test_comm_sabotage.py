"""The harness must catch a broken communication path; and awkward parameters never hang.

Sabotage is patched inside the ranks (a rank function patches, runs the harness's
``check_on_rank``, restores), and the parent folds the answers with ``summarize``.
"""
from __future__ import annotations

import dataclasses

import torch
from torch import nn

from suite.check.harness import summarize
from suite.config import StrategyConfig
from suite.runtime.pool import RankError
from suite.workload import WorkloadSpec

FUSED = dict(fuse_all_reduce_ops=True, fuse_grad_size_in_layers=1, sync_nccl_allreduce=False)
HIER = dict(FUSED, nccl_comm_num=2, use_hierarchical_allreduce=True, hierarchical_allreduce_inter_nranks=2)


def sabotaged_check_on_rank(kind: str, **kwargs) -> dict:
    from suite.check.harness import check_on_rank
    from suite.comm import bucketed

    saved_start, saved_hier = bucketed.BucketedGradSync._start, bucketed.hierarchical_all_reduce
    saved_fold = bucketed.BucketedGradSync.fold_average_into_backward
    if kind == "skip_bucket":
        def start(self, flat, comm, asynchronous, divide=True):
            if len(self.buckets) > 1 and flat is self.buckets[1].flat:
                return lambda: None  # bucket 1 is never reduced
            return saved_start(self, flat, comm, asynchronous, divide)

        bucketed.BucketedGradSync._start = start
    elif kind == "sum_not_average":
        def fold(self):
            self.averaged_in_backward = True  # the buckets are summed as they are ...
            return False  # ... but the engine is told not to scale backward's seed: a sum, not an average

        bucketed.BucketedGradSync.fold_average_into_backward = fold
    elif kind == "wrong_group":
        def hier(tensor, ng, mode="scatter"):
            return saved_hier(tensor, dataclasses.replace(ng, inter=ng.intra), mode)  # inter step inside the node

        bucketed.hierarchical_all_reduce = hier
    elif kind != "none":
        raise ValueError(kind)
    try:
        return check_on_rank(**kwargs)
    finally:
        bucketed.BucketedGradSync._start = saved_start
        bucketed.hierarchical_all_reduce = saved_hier
        bucketed.BucketedGradSync.fold_average_into_backward = saved_fold


def _check(pool, kind, model, values):
    cfg = StrategyConfig(**values)
    answers = pool.run(sabotaged_check_on_rank,
                       dict(kind=kind, workload_spec=WorkloadSpec(model, per_rank_batch=8), config=cfg.to_dict(),
                            steps=3))
    return summarize(cfg, answers)


def test_bucket_left_out_is_caught(pool2):
    assert _check(pool2, "none", "mlp", FUSED).verdict == "pass"  # the same run unsabotaged passes
    res = _check(pool2, "skip_bucket", "mlp", FUSED)
    assert res.verdict == "fail" and "parameter error" in res.message, res.message


def test_an_average_left_out_of_backwards_seed_is_caught(pool2):
    """The bucketed path's averaging lives in backward's seed (the loss gradient is 1/world): without it the
    buckets are summed, and the check fails."""
    res = _check(pool2, "sum_not_average", "mlp", FUSED)
    assert res.verdict == "fail" and "parameter error" in res.message, res.message


def test_wrong_hierarchical_group_is_caught(pool4):
    assert _check(pool4, "none", "transformer", HIER).verdict == "pass"
    res = _check(pool4, "wrong_group", "transformer", HIER)
    assert res.verdict == "fail" and "parameter error" in res.message, res.message


# ---- awkward parameters -------------------------------------------------------------------

class Awkward(nn.Module):
    """A frozen layer and a layer the forward never uses."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.frozen = nn.Linear(16, 16)
        self.frozen.requires_grad_(False)
        self.unused = nn.Linear(16, 16)
        self.fc2 = nn.Linear(16, 2)

    def forward(self, x):
        return self.fc2(torch.relu(self.frozen(torch.relu(self.fc1(x)))))


def awkward_on_rank(config: dict, steps: int = 2) -> dict:
    from suite.check.harness import _digest
    from suite.engine import build_engine
    from suite.runtime.context import current

    rank = current().rank
    torch.manual_seed(rank)
    net = Awkward()
    engine = build_engine(net, nn.functional.cross_entropy, StrategyConfig.from_dict(config))
    unused0 = net.unused.weight.detach().clone()
    g = torch.Generator().manual_seed(100 + rank)
    try:
        for _ in range(steps):
            engine.train_step(torch.randn(4, 8, generator=g), torch.randint(0, 2, (4,), generator=g))
    except RuntimeError as exc:
        return {"error": str(exc)}
    return {"error": None, "digest": _digest(net), "frozen_grad_none": net.frozen.weight.grad is None,
            "unused_unchanged": torch.equal(net.unused.weight, unused0),
            "buckets_params": sum(len(b.params) for b in engine.grad_sync.buckets)}


def test_unused_parameter_is_a_clear_error_not_a_hang(pool2):
    cfg = StrategyConfig(**FUSED, nccl_comm_num=2).to_dict()
    try:
        answers = pool2.run(awkward_on_rank, dict(config=cfg), timeout=90)
    except RankError as exc:  # pragma: no cover - the message is what matters
        raise AssertionError(f"expected a returned error, got a raise: {exc}") from exc
    for a in answers:
        assert a["error"] and "'unused.weight'" in a["error"] and "find_unused_parameters" in a["error"], a


def test_unused_parameter_handled_with_find_unused(pool2):
    cfg = StrategyConfig(**FUSED, nccl_comm_num=2, find_unused_parameters=True).to_dict()
    answers = pool2.run(awkward_on_rank, dict(config=cfg, steps=3), timeout=90)
    for a in answers:
        assert a["error"] is None, a["error"]
        assert a["frozen_grad_none"], "a frozen parameter must be skipped"
        assert a["buckets_params"] == 6, "fc1, unused, fc2 (weight and bias each) are bucketed; frozen is not"
        assert a["unused_unchanged"], "an unused parameter is reduced as zeros: plain SGD leaves it as it was"
    assert len({a["digest"] for a in answers}) == 1, "ranks differ"
