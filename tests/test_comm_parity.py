"""Parity of the bucketed / overlapped / multi-communicator / hierarchical gradient path.

Every row trains 3 steps and must match (a) the harness's single-process reference within
1e-5 with all ranks identical and (b) torch DDP on the same data, within 1e-5.  The rows
cover every pair of knob values (bucket cap x layer cap x nccl_comm_num x sync x hierarchy;
``test_rows_cover_every_pair`` checks that), spread over three models, one with BatchNorm.

ResNet (BatchNorm) runs at world size 2 only: at world 4 with 8 samples per rank this small
ResNet is ill-conditioned (channels with near-zero batch variance amplify a 1e-7 change of
the parameters to ~5e-3 after 3 steps), so *any* change in the order gloo sums the ranks,
torch DDP's included, exceeds 1e-5 against the reference.  At world 2 the sum of two terms
does not depend on order, so the comparison is exact.  Hierarchical rows (world 4, 2 ranks per
node) therefore use the MLP and the Transformer.
"""
from __future__ import annotations

import itertools
import math

import pytest

from suite.check.errors import finite_le, worst_error
from suite.check.harness import run_check
from suite.config import StrategyConfig
from suite.workload import WorkloadSpec

TINY = 1e-6  # MiB: every parameter fills its bucket -> one parameter per bucket

# (bucket MB, layer cap, nccl_comm_num, sync_nccl_allreduce, hierarchical), model
PAIRWISE = [
    (("tiny", 1, 1, True, False), "resnet"),
    (("tiny", 50, 2, False, True), "transformer"),
    ((1.0, 1, 3, True, True), "mlp"),
    ((25.0, 50, 3, False, False), "resnet"),
    (("inf", 1, 1, False, True), "transformer"),
    (("inf", 50, 2, True, False), "resnet"),
    ((1.0, 50, 1, False, False), "mlp"),
    ((25.0, 1, 2, True, True), "transformer"),
    (("tiny", 1, 3, True, False), "transformer"),
    ((1.0, 1, 2, True, False), "resnet"),
    ((25.0, 1, 1, True, False), "mlp"),
    (("inf", 1, 3, True, False), "transformer"),
]
LEVELS = [("tiny", 1.0, 25.0, "inf"), (1, 50), (1, 2, 3), (True, False), (False, True)]


def row_config(row) -> StrategyConfig:
    mb, layers, comm, sync, hier = row
    extra = {"use_hierarchical_allreduce": True, "hierarchical_allreduce_inter_nranks": 2} if hier else {}
    return StrategyConfig(
        fuse_all_reduce_ops=True, fuse_grad_size_in_MB={"tiny": TINY, "inf": math.inf}.get(mb, mb),
        fuse_grad_size_in_layers=layers, nccl_comm_num=comm, sync_nccl_allreduce=sync, **extra,
    )


def test_rows_cover_every_pair():
    covered = set()
    for row, _ in PAIRWISE:
        for (i, a), (j, b) in itertools.combinations(enumerate(row), 2):
            covered.add((i, a, j, b))
    missing = [(i, a, j, b) for (i, la), (j, lb) in itertools.combinations(enumerate(LEVELS), 2)
               for a in la for b in lb if (i, a, j, b) not in covered]
    assert not missing, f"knob pairs not covered: {missing}"
    assert {m for _, m in PAIRWISE} >= {"resnet", "mlp", "transformer"}


def ddp_parity_on_rank(model: str, config: dict, steps: int = 3, per_rank_batch: int = 8, seed: int = 0) -> dict:
    """Train this config and torch DDP side by side on the same shards; compare parameters each step."""
    import torch  # noqa: F401

    from suite.check.harness import _digest
    from suite.data.synthetic import make_dataset, prepare, shard, step_indices
    from suite.engine import build_engine
    from suite.models import get_model
    from suite.runtime.context import current

    ctx = current()
    rank, world, device = ctx.rank, ctx.world_size, ctx.platform.device
    cfg = StrategyConfig.from_dict(config)
    ddp_cfg = cfg.replace(data_parallel="ddp", fuse_all_reduce_ops=False, nccl_comm_num=1, sync_nccl_allreduce=True,
                          use_hierarchical_allreduce=False)
    spec = get_model(model)
    ours = build_engine(spec.make(seed + 7919 * rank, device), spec.loss_fn, cfg)
    ddp = build_engine(spec.make(seed + 7919 * rank, device), spec.loss_fn, ddp_cfg)
    data = make_dataset(spec, 512, seed)
    errors = []
    for step in range(steps):
        x, y = data.get(shard(step_indices(len(data), step, per_rank_batch * world, seed), rank, world))
        x = prepare(data, x, device)
        y = y.to(device)
        ours.train_step(x, y)
        ddp.train_step(x, y)
        err, at = worst_error(dict(ours.module.named_parameters()), dict(ddp.module.named_parameters()))
        errors.append((err, at))
    return {"errors": errors, "digest": _digest(ours.module)}


def _check_ddp(pool, model, cfg):
    answers = pool.run(ddp_parity_on_rank, dict(model=model, config=cfg.to_dict()))
    worst = max((e for a in answers for e, _ in a["errors"]), default=math.inf)
    assert finite_le(worst, 1e-5), f"{model} {cfg}: differs from torch DDP by {worst:.3g}: {answers[0]['errors']}"
    assert len({a["digest"] for a in answers}) == 1, f"{model} {cfg}: ranks hold different parameters"


@pytest.mark.filterwarnings("ignore:nccl_comm_num=.*sync_nccl_allreduce=True")
@pytest.mark.parametrize("row,model", PAIRWISE, ids=[f"{m}-{'-'.join(map(str, r))}" for r, m in PAIRWISE])
def test_parity_pairwise(row, model, pools):
    cfg = row_config(row)
    pool = pools(4 if cfg.use_hierarchical_allreduce else 2)
    res = run_check(pool, WorkloadSpec(model, per_rank_batch=8), cfg)
    assert res.verdict == "pass", f"{model} {cfg}: {res.message}"
    assert finite_le(res.param_error, 1e-5) and res.ranks_identical
    _check_ddp(pool, model, cfg)


EXTRA = [
    # fusion off: one allreduce per parameter, through the same hooks, overlapped on 2 communicators
    (dict(fuse_all_reduce_ops=False, nccl_comm_num=2, sync_nccl_allreduce=False), "resnet", 2),
    # fusion off with the hierarchy, overlapped on 3 communicators
    (dict(fuse_all_reduce_ops=False, nccl_comm_num=3, sync_nccl_allreduce=False, use_hierarchical_allreduce=True,
          hierarchical_allreduce_inter_nranks=2), "mlp", 4),
    # one emulated node of 2 (no inter-node step) on the BatchNorm model
    (dict(fuse_all_reduce_ops=True, sync_nccl_allreduce=False, use_hierarchical_allreduce=True,
          hierarchical_allreduce_inter_nranks=2), "resnet", 2),
]


@pytest.mark.parametrize("values,model,world", EXTRA, ids=["nofuse-2comm", "nofuse-hier-3comm", "hier-one-node"])
def test_parity_extra(values, model, world, pools):
    cfg = StrategyConfig(**values)
    pool = pools(world)
    res = run_check(pool, WorkloadSpec(model, per_rank_batch=8), cfg)
    assert res.verdict == "pass", f"{model} {cfg}: {res.message}"
    _check_ddp(pool, model, cfg)


def test_half_precision_wire_hierarchical(pool4):
    """grad_comm_dtype=fp16 through the hierarchical, overlapped path: within the half tolerance.

    (bf16 misses the table's 2e-3 at world 4 on this model by ~3x on *every* path, the plain
    one included: 8 mantissa bits.  That is the tolerance table's business, reported to the lead.)"""
    cfg = StrategyConfig(fuse_all_reduce_ops=True, sync_nccl_allreduce=False, use_hierarchical_allreduce=True,
                         hierarchical_allreduce_inter_nranks=2, grad_comm_dtype="fp16")
    res = run_check(pool4, WorkloadSpec("transformer", per_rank_batch=8), cfg)
    assert res.verdict == "pass", res.message
    assert res.tolerance_key == "fp16_grad_comm" and res.param_error > 0  # the fp16 wire did round something
