"""Structure of the bucketed path, since parameters alone cannot tell implementations apart.

The MLP has 5 Linear layers (10 parameters: 768x1024, 3 x 1024x1024, 1024x10, each with a
bias), so the expected bucket counts below are known by hand, not computed by the code
under test: layer cap 1 -> 5 buckets; fusion off -> 10; 1 MiB cap -> 4 (the last two layers
plus the 4 MiB weight that crosses the cap, then one layer each).
"""
from __future__ import annotations

import pytest

from suite.config import StrategyConfig
from tests.fakes import captured_log

MLP_PARAMS = 10
MLP_GRAD_BYTES = 4 * (768 * 1024 + 1024 + 3 * (1024 * 1024 + 1024) + 1024 * 10 + 10)


def structure_on_rank(model: str, config: dict, steps: int = 2, record: bool = True,
                      drop_grads_after_begin: bool = False, set_to_none_between: bool = False) -> dict:
    """Train ``steps`` steps; return per-step collective counts, hook/launch/wait order, storage facts."""
    from suite.check.harness import _digest
    from suite.comm import collectives as C
    from suite.data.synthetic import make_dataset, prepare, shard, step_indices
    from suite.engine import build_engine
    from suite.models import get_model
    from suite.runtime.context import current

    ctx = current()
    rank, world = ctx.rank, ctx.world_size
    with captured_log("suite.comm.buckets") as records:
        spec = get_model(model)
        engine = build_engine(spec.make(rank), spec.loss_fn, StrategyConfig.from_dict(config))
    sync = engine.grad_sync
    if drop_grads_after_begin:  # autograd then creates fresh .grad tensors; the hooks must restore the views
        original = sync.begin_step

        def begin(communicate=True):
            original(communicate)
            for p in sync.params:
                p.grad = None

        sync.begin_step = begin
    data = make_dataset(spec, 256, 0)
    per_step, events = [], []
    for step in range(steps):
        x, y = data.get(shard(step_indices(len(data), step, 8 * world, 0), rank, world))
        C.STATS.reset()
        sync.events = [] if record else None
        engine.train_step(prepare(data, x, ctx.platform.device), y)
        per_step.append({"calls": C.STATS.snapshot()["calls"], "bytes": C.STATS.snapshot()["bytes"]})
        events.append([(k, b) for k, b, _ in (sync.events or [])])
        if set_to_none_between and step < steps - 1:
            engine.optimizer.zero_grad(set_to_none=True)
    shared = []
    for b in sync.buckets:
        lo, hi = b.flat.data_ptr(), b.flat.data_ptr() + b.flat.numel() * b.flat.element_size()
        for p in b.params:
            g = p.grad
            shared.append(g is not None and g.untyped_storage().data_ptr() == b.flat.untyped_storage().data_ptr()
                          and lo <= g.data_ptr() < hi)
    return {"rank": rank, "per_step": per_step, "events": events, "shared": shared, "describe": engine.describe(),
            "log": records, "digest": _digest(engine.module), "nparams": len(sync.params)}


def _run(pool, steps=2, **config):
    return pool.run(structure_on_rank,
                    dict(model="mlp", config=StrategyConfig(**config).to_dict(), steps=steps))


def _allreduces(step: dict) -> dict:
    return {k: n for k, n in step["calls"].items() if k.endswith("/all_reduce")}


def test_buckets_spread_over_communicators_with_overlap(pool2):
    answers = _run(pool2, fuse_all_reduce_ops=True, fuse_grad_size_in_layers=1, nccl_comm_num=3,
                   sync_nccl_allreduce=False)
    for a in answers:
        assert a["nparams"] == MLP_PARAMS
        for step in a["per_step"]:
            # 5 buckets, one allreduce each per step, round-robin over 3 communicators
            assert _allreduces(step) == {"comm0/all_reduce": 2, "comm1/all_reduce": 2, "comm2/all_reduce": 1}
            assert sum(n for k, n in step["bytes"].items() if k.endswith("/all_reduce")) == MLP_GRAD_BYTES
        assert a["shared"] and all(a["shared"]), "a p.grad is not a view into its bucket's flat buffer"
        for ev in a["events"]:
            hooks = [i for i, (k, _) in enumerate(ev) if k == "hook"]
            launches = [i for i, (k, _) in enumerate(ev) if k == "launch"]
            waits = [i for i, (k, _) in enumerate(ev) if k == "wait"]
            assert len(hooks) == MLP_PARAMS and len(launches) == 5 and len(waits) == 5
            assert launches[0] < hooks[-1], "overlap: the first bucket must launch before the last hook fires"
            assert min(waits) > hooks[-1], "overlap: nothing is waited on during backward"
            assert [b for k, b in ev if k == "launch"] == [0, 1, 2, 3, 4], "buckets launch in bucket order"
        d = a["describe"]
        assert (d["allreduce_ops_before_fusion"], d["allreduce_ops"]) == (10, 5)
        assert any("Find all_reduce operators: 10" in m and "the number of all_reduce ops is 5" in m for m in a["log"])


@pytest.mark.filterwarnings("ignore:nccl_comm_num=.*sync_nccl_allreduce=True")
def test_sync_mode_waits_each_at_launch_and_fusion_off(pool2):
    answers = _run(pool2, fuse_all_reduce_ops=False, sync_nccl_allreduce=True, nccl_comm_num=2)
    for a in answers:
        for step, ev in zip(a["per_step"], a["events"]):
            assert _allreduces(step) == {"comm0/all_reduce": 5, "comm1/all_reduce": 5}  # one per parameter
            kinds = [k for k, _ in ev]
            for i, k in enumerate(kinds):
                if k == "launch":
                    assert kinds[i + 1] == "wait", f"sync mode: launch not waited on at once: {kinds}"
        assert all(a["shared"])


def test_byte_cap_buckets(pool2):
    answers = _run(pool2, steps=1, fuse_all_reduce_ops=True, fuse_grad_size_in_MB=1.0)
    assert _allreduces(answers[0]["per_step"][0]) == {"comm0/all_reduce": 4}
    answers = _run(pool2, steps=1, fuse_all_reduce_ops=True, fuse_grad_size_in_MB=float("inf"),
                   fuse_grad_size_in_layers=2)
    assert _allreduces(answers[0]["per_step"][0]) == {"comm0/all_reduce": 3}


def test_hierarchical_groups(pool4):
    answers = _run(pool4, fuse_all_reduce_ops=True, fuse_grad_size_in_layers=1, nccl_comm_num=2,
                   sync_nccl_allreduce=False, use_hierarchical_allreduce=True, hierarchical_allreduce_inter_nranks=2)
    for a in answers:
        r = a["rank"]
        node, local = r // 2, r % 2
        for step in a["per_step"]:
            calls = step["calls"]
            # 5 buckets: communicator 0 gets buckets 0, 2, 4; communicator 1 gets 1, 3
            assert calls == {
                f"intra0.node{node}/reduce_scatter": 3, f"intra1.node{node}/reduce_scatter": 2,
                f"inter0.local{local}/all_reduce": 3, f"inter1.local{local}/all_reduce": 2,
                f"intra0.node{node}/all_gather": 3, f"intra1.node{node}/all_gather": 2,
            }, calls
            inter_bytes = sum(n for k, n in step["bytes"].items() if k.startswith("inter"))
            assert inter_bytes == MLP_GRAD_BYTES // 2, "the inter-node step carries one shard per local rank"
        for ev in a["events"]:
            first_launch = next(i for i, (k, _) in enumerate(ev) if k == "launch")
            last_hook = max(i for i, (k, _) in enumerate(ev) if k == "hook")
            assert first_launch < last_hook
        assert all(a["shared"])


@pytest.mark.parametrize("variant", ["drop_grads_after_begin", "set_to_none_between"])
def test_grads_stay_views_when_replaced(pool2, variant):
    """Autograd replacing a None .grad, or zero_grad(set_to_none=True): views are restored, results unchanged."""
    cfg = StrategyConfig(fuse_all_reduce_ops=True, fuse_grad_size_in_layers=1, sync_nccl_allreduce=False).to_dict()
    base = pool2.run(structure_on_rank, dict(model="mlp", config=cfg, steps=3))
    odd = pool2.run(structure_on_rank,
                    dict(model="mlp", config=cfg, steps=3, **{variant: True}))
    for a, b in zip(base, odd):
        assert all(b["shared"]) and len(b["shared"]) == MLP_PARAMS
        assert a["digest"] == b["digest"], "replacing .grad changed the training result"
    assert len({b["digest"] for b in odd}) == 1


def average_on_rank(config: dict) -> dict:
    """average_tensors over the config's path: rank r holds (r+1)*k; the mean is known exactly."""
    import torch

    from suite.comm import collectives as C
    from suite.comm.factory import build_grad_sync
    from suite.models import get_model
    from suite.runtime.context import current

    rank, world = current().rank, current().world_size
    sync = build_grad_sync(get_model("mlp").make(0), StrategyConfig.from_dict(config))
    tensors = [torch.full((n,), float(rank + 1)) * (k + 1) for k, n in enumerate([5, 300_000, 7, 1])]
    C.STATS.reset()
    sync.average_tensors(tensors)
    mean = (world + 1) / 2
    return {"exact": all(torch.equal(t, torch.full_like(t, mean * (k + 1))) for k, t in enumerate(tensors)),
            "calls": C.STATS.snapshot()["calls"]}


def test_average_tensors_uses_the_same_path(pool4):
    cfg = StrategyConfig(fuse_all_reduce_ops=True, fuse_grad_size_in_MB=1.0, nccl_comm_num=2, sync_nccl_allreduce=False,
                         use_hierarchical_allreduce=True, hierarchical_allreduce_inter_nranks=2).to_dict()
    for a in pool4.run(average_on_rank, dict(config=cfg)):
        assert a["exact"]
        # 1.2 MB of tensors: the 1 MiB cap makes two buckets, one per communicator, through the hierarchy
        assert sorted(k.split(".")[0] + "/" + k.split("/")[1] for k in a["calls"]) == [
            "inter0/all_reduce", "inter1/all_reduce", "intra0/all_gather", "intra0/reduce_scatter",
            "intra1/all_gather", "intra1/reduce_scatter"], a["calls"]


def broadcasts_per_step_on_rank(model: str, config: dict) -> float:
    """Broadcasts one training step issues (rank 0's BatchNorm buffers before the forward)."""
    from suite.comm import collectives as C
    from suite.data.synthetic import make_dataset, prepare, shard, step_indices
    from suite.engine import build_engine
    from suite.models import get_model
    from suite.runtime.context import current

    ctx = current()
    spec = get_model(model)
    engine = build_engine(spec.make(ctx.rank), spec.loss_fn, StrategyConfig.from_dict(config))
    data = make_dataset(spec, 64, 0)
    x, y = data.get(shard(step_indices(len(data), 0, 8 * ctx.world_size, 0), ctx.rank, ctx.world_size))
    C.STATS.reset()
    engine.train_step(prepare(data, x, ctx.platform.device), y)
    calls = C.STATS.snapshot()["calls"]
    if hasattr(engine.grad_sync, "close"):
        engine.grad_sync.close()
    return sum(v for k, v in calls.items() if k.endswith("/broadcast"))


def test_variants_compared_with_ddp_coalesce_buffer_broadcasts_and_plain_does_not(pool2):
    """Issue 27: the knob keeps Paddle's default (per tensor); fusion, overlap, multicomm and hierarchical
    broadcast the ResNet's 21 buffers as 2 flat buckets (fp32 statistics, int64 counters), as DDP coalesces
    its own; plain keeps 21 broadcasts."""
    from suite.cases import get_case

    assert StrategyConfig().fuse_broadcast_ops is False
    compared = ("fusion", "overlap", "multicomm", "hierarchical")
    assert all(get_case(f"{m}/{v}").config["fuse_broadcast_ops"] is True
               for m in ("resnet", "mlp", "resnet50", "gpt2") for v in compared)
    for variant, expected in (("plain", 21), ("overlap", 2)):  # what the setting does, on the ranks
        config = get_case(f"resnet/{variant}").config
        got = pool2.run(broadcasts_per_step_on_rank, {"model": "resnet", "config": config})
        assert got == [expected, expected], (variant, got)


def footprint_on_rank(config: dict) -> int:
    """The MLP engine's footprint after one step (gradients and optimizer state exist)."""
    from suite.data.synthetic import make_dataset, prepare, shard, step_indices
    from suite.engine import build_engine
    from suite.measure.timing import footprint_bytes
    from suite.models import get_model
    from suite.runtime.context import current

    ctx = current()
    spec = get_model("mlp")
    engine = build_engine(spec.make(ctx.rank), spec.loss_fn, StrategyConfig.from_dict(config))
    data = make_dataset(spec, 64, 0)
    x, y = data.get(shard(step_indices(len(data), 0, 8 * ctx.world_size, 0), ctx.rank, ctx.world_size))
    engine.train_step(prepare(data, x, ctx.platform.device), y)
    got = footprint_bytes(engine)
    if hasattr(engine.grad_sync, "close"):
        engine.grad_sync.close()
    return got


@pytest.mark.parametrize("config,copies", [
    ({}, 2),  # parameters + gradients (SGD keeps no state)
    ({"fuse_all_reduce_ops": True, "sync_nccl_allreduce": False}, 2),  # gradients are views into the buckets
    ({"optimizer": "momentum"}, 3),  # + one momentum buffer
    ({"optimizer": "adam"}, 4),  # + two moments (and torch.optim's `step`: a 4-byte tensor per parameter)
    ({"fuse_all_optimizer_ops": True, "optimizer": "momentum"}, 3),  # flat buffers; parameters are views
], ids=["plain-sgd", "buckets-sgd", "momentum", "adam", "fused-momentum"])
def test_footprint_counts_parameters_gradients_buckets_and_optimizer_state_once(pool2, config, copies):
    """``footprint_bytes``: what the engine holds between steps, in copies of the MLP's fp32 parameters
    (known by hand: MLP_GRAD_BYTES); shared storage (views into buckets or flat buffers) counted once."""
    got = pool2.run(footprint_on_rank, {"config": config})
    steps = 4 * MLP_PARAMS if config.get("optimizer") == "adam" else 0
    assert got == [copies * MLP_GRAD_BYTES + steps] * 2, (got, copies * MLP_GRAD_BYTES)


def collectives_alone_on_rank(config: dict) -> dict:
    """collectives_alone over the config's path: rank r's tensors (parameters on the plain path, bucket buffers on
    the bucketed one) hold r+1; after one call each holds the mean, (world+1)/2, exactly."""
    import torch

    from suite.comm import collectives as C
    from suite.comm.factory import build_grad_sync
    from suite.models import get_model
    from suite.runtime.context import current

    rank, world = current().rank, current().world_size
    sync = build_grad_sync(get_model("mlp").make(0), StrategyConfig.from_dict(config))
    tensors = [b.flat for b in sync.buckets] if hasattr(sync, "buckets") else [p.detach() for p in sync.params]
    for t in tensors:
        t.fill_(float(rank + 1))
    C.STATS.reset()
    sync.collectives_alone()
    if hasattr(sync, "close"):
        sync.close()
    return {"exact": all(torch.equal(t, torch.full_like(t, (world + 1) / 2)) for t in tensors),
            "calls": sum(C.STATS.snapshot()["calls"].values()), "tensors": len(tensors)}


@pytest.mark.parametrize("config", [{}, {"fuse_all_reduce_ops": True, "fuse_grad_size_in_MB": 0.01,
                                         "sync_nccl_allreduce": False, "nccl_comm_num": 2}])
def test_collectives_alone_averages_every_tensor_of_the_path_once(pool2, config):
    """What `figures comm` times: one collective per parameter (plain) or per bucket (bucketed), each averaged."""
    for a in pool2.run(collectives_alone_on_rank, dict(config=config)):
        assert a["exact"] and a["calls"] == a["tensors"] > 1, a
