"""Gradients as views into the buckets (``gradient_as_bucket_view``, the default) against gradients copied into the
buckets and back (DDP's default), and DDP's first-bucket rule (``first_bucket_MB``).

Each row trains two engines side by side on one rank, on the same model and the same batches: one whose
gradients are views into the buckets, one whose gradients are their own tensors.  After each of 3 steps their
parameters must be equal bit for bit (compared as integers: -0.0 and 0.0 differ), and so must the gradients the
optimizer read; the views' storage must lie inside their bucket's flat buffer (``data_ptr`` within its range) and
the copies' outside every bucket.  The fallbacks: bf16 communication keeps the views (the bucket stays fp32, the
wire is a cast copy of it), and the fused optimizer takes the buckets as its gradient buffers only with views
(with copies it keeps its own, which the buckets copy from and back into).

The MLP's layout (5 Linear layers: 768x1024, three 1024x1024, 1024x10, each with a bias; 15 MiB of fp32
gradients) gives the bucket counts by hand: 25 MiB buckets hold it all in one; with a 1 MiB first bucket, the
first takes the last layer and the 4 MiB weight that crosses 1 MiB (with its bias), the second the rest: 2.
"""
from __future__ import annotations

import pytest

from suite.comm.buckets import plan
from suite.config import PRESETS, ConfigError, StrategyConfig

DDP_CONFIGURATION = dict(PRESETS["ddp_configuration"])
MiB = 2**20
# (bytes, layer, kind) of the MLP's parameters in registration order, by hand
MLP = [(4 * 768 * 1024, "net.1", "f32"), (4 * 1024, "net.1", "f32"), (4 * 1024 * 1024, "net.3", "f32"),
       (4 * 1024, "net.3", "f32"), (4 * 1024 * 1024, "net.5", "f32"), (4 * 1024, "net.5", "f32"),
       (4 * 1024 * 1024, "net.7", "f32"), (4 * 1024, "net.7", "f32"), (4 * 1024 * 10, "net.9", "f32"),
       (4 * 10, "net.9", "f32")]


def _bits(t):
    import torch

    t = t.detach().reshape(-1)
    return t.view(torch.int32) if t.element_size() == 4 else t.view(torch.int64)


def _inside(t, flat) -> bool:
    lo = flat.data_ptr()
    hi = lo + flat.numel() * flat.element_size()
    return lo <= t.data_ptr() and t.data_ptr() + t.numel() * t.element_size() <= hi


def views_and_copies_on_rank(config: dict, steps: int = 3) -> dict:
    """Two engines, views and copies, trained side by side (see the module docstring)."""
    import torch

    from suite.workload import WorkloadSpec, workload

    wl = workload(WorkloadSpec("mlp", "tiny"))
    engines, seen = {}, {}
    for mode in ("views", "copies"):
        engine = engines[mode] = wl.engine(StrategyConfig.from_dict(
            {**config, "gradient_as_bucket_view": mode == "views"}))
        step_fn = engine.optimizer.step

        def step(*a, _mode=mode, _engine=engine, _step=step_fn, **k):  # what the optimizer reads, as it reads it
            flats = [b.flat for b in _engine.grad_sync.buckets]
            seen[_mode] = [(p.grad.detach().clone(), any(_inside(p.grad, f) for f in flats))
                           for p in _engine.module.parameters()]
            return _step(*a, **k)

        engine.optimizer.step = step
    start = [p.detach().clone() for p in engines["views"].module.parameters()]
    out: dict = {"rank": wl.rank, "steps": [], "describe": {m: e.describe() for m, e in engines.items()}}
    for i in range(steps):
        x, y = wl.batch(i)
        for mode in ("views", "copies"):  # the same order on every rank: their collectives pair up
            engines[mode].train_step(x, y)
        pv, pc = (list(engines[m].module.parameters()) for m in ("views", "copies"))
        out["steps"].append({
            "params_bitwise": all(torch.equal(_bits(a), _bits(b)) for a, b in zip(pv, pc)),
            "moved": any(not torch.equal(a, b) for a, b in zip(pv, start)),
            "grads_bitwise": all(torch.equal(_bits(a), _bits(b))
                                 for (a, _), (b, _) in zip(seen["views"], seen["copies"])),
            "grads_nonzero": any(bool(g.abs().sum() > 0) for g, _ in seen["views"]),
            "views_inside": [inside for _, inside in seen["views"]],
            "copies_inside": [inside for _, inside in seen["copies"]],
        })
    for e in engines.values():
        e.grad_sync.close()
    return out


ROWS = {
    "ddp_configuration": DDP_CONFIGURATION,  # overlap, 2 buckets (1 MiB first bucket)
    "synchronous": {**DDP_CONFIGURATION, "sync_nccl_allreduce": True},  # each bucket waited on (and copied) at once
    "bf16_wire": {**DDP_CONFIGURATION, "grad_comm_dtype": "bf16"},
    "fused_optimizer": {**DDP_CONFIGURATION, "fuse_all_optimizer_ops": True, "optimizer": "momentum",
                        "weight_decay": 1e-3},
}


@pytest.mark.parametrize("row", sorted(ROWS))
def test_bucket_views_give_the_parameters_of_copies_bit_for_bit(pool2, row):
    answers = pool2.run(views_and_copies_on_rank, dict(config=ROWS[row]))
    for a in answers:
        assert a["describe"]["views"]["allreduce_ops"] == 2, a["describe"]["views"]  # by hand: see the docstring
        assert a["describe"]["views"]["gradient_as_bucket_view"] is True
        assert a["describe"]["copies"]["gradient_as_bucket_view"] is False
        for i, s in enumerate(a["steps"], 1):
            where = f"rank {a['rank']} step {i} ({row})"
            assert s["moved"] and s["grads_nonzero"], where  # the steps trained: equal is not trivially equal
            assert s["params_bitwise"], f"{where}: views and copies hold different parameters"
            assert s["grads_bitwise"], f"{where}: the optimizer read different gradients"
            assert all(s["views_inside"]) and len(s["views_inside"]) == 10, f"{where}: a gradient is not a view"
            assert not any(s["copies_inside"]), f"{where}: a copied gradient lies inside a bucket"


def test_the_fused_optimizer_takes_the_buckets_only_when_the_gradients_are_their_views(pool2):
    answers = pool2.run(views_and_copies_on_rank, dict(config=ROWS["fused_optimizer"], steps=1))
    d = answers[0]["describe"]
    assert d["views"]["optimizer"]["grads_from"] == "gradient buckets"
    assert d["copies"]["optimizer"]["grads_from"] == "own flat buffers"


def test_ddps_first_bucket_rule_only_when_asked():
    """Paddle's fuse_grad_size_in_MB sizes every bucket; first_bucket_MB (ours, DDP's 1 MiB) closes the first one
    (the last layers') early.  By hand from the MLP's layout (module docstring)."""
    assert [p.members for p in plan(MLP, True, 25.0)] == [[9, 8, 7, 6, 5, 4, 3, 2, 1, 0]]
    assert [p.members for p in plan(MLP, True, 25.0, first_cap_mb=1.0)] == [[9, 8, 7, 6], [5, 4, 3, 2, 1, 0]]
    # the first cap never exceeds the others; later buckets keep fuse_grad_size_in_MB
    assert [p.members for p in plan(MLP, True, 4.0, first_cap_mb=100.0)] == [[9, 8, 7, 6], [5, 4], [3, 2], [1, 0]]
    # the parameter that crosses the first cap stays in it (as DDP's): 40 B + 40 KiB, then 4.5 MiB buckets
    assert [p.members for p in plan(MLP, True, 4.5, first_cap_mb=0.001)] == [[9, 8], [7, 6, 5, 4], [3, 2, 1, 0]]


def test_the_selection_plans_the_first_bucket_as_the_engine_builds_it():
    from suite.cases import get_case
    from suite.selection import plan_case

    case = get_case("mlp/fusion")  # 25 MB buckets: one for the MLP
    cfg = StrategyConfig.from_dict(case.config)
    assert plan_case(case, cfg, "tiny", 2).buckets == 1
    assert plan_case(case, cfg.replace(first_bucket_MB=1.0), "tiny", 2).buckets == 2


def test_the_new_knobs_are_refused_where_they_mean_nothing():
    with pytest.raises(ConfigError, match=r"first_bucket_MB=1\.0 caps the first fused bucket, but "
                                          r"fuse_all_reduce_ops=False"):
        StrategyConfig(first_bucket_MB=1.0)
    with pytest.raises(ConfigError, match="gradient_as_bucket_view=False needs data_parallel='suite'"):
        StrategyConfig(data_parallel="ddp", gradient_as_bucket_view=False)
    with pytest.raises(ConfigError, match="first_bucket_MB"):
        StrategyConfig(fuse_all_reduce_ops=True, first_bucket_MB=0.0)
    assert StrategyConfig().gradient_as_bucket_view is True and StrategyConfig().first_bucket_MB is None
