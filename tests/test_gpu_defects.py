"""The smaller defects of the first GPU nightly (issue 22, item 6): platform without a rank context,
the per-call timeout, ab's slowdown on the device, collective marks, NVML on every node."""
from __future__ import annotations

import types

import torch

from suite.runtime.device import Platform, platform_of


def test_platform_of_a_users_process_group_is_the_parameters_device_and_the_groups_backend(monkeypatch):
    import suite.runtime.device as device

    monkeypatch.setattr(device, "dist", types.SimpleNamespace(get_backend=lambda group=None: "nccl"))
    on_gpu = [types.SimpleNamespace(device=torch.device("cuda", 3))]  # a parameter on GPU 3
    p = platform_of(on_gpu)
    assert (p.device_type, p.backend, p.local_rank, p.is_cuda) == ("cuda", "nccl", 3, True)
    assert platform_of([torch.zeros(1)]) == Platform("cpu", "nccl", 0)


def bucketed_platform_without_context_on_rank() -> dict:
    """A user's own process group: no fleetbench rank context while the engine is built."""
    import suite.runtime.device as device
    from suite.config import StrategyConfig
    from suite.engine import build_engine
    from suite.models import get_model
    from suite.runtime import context

    saved, real = context._CURRENT, device.dist
    context.set_current(None)
    device.dist = types.SimpleNamespace(get_backend=lambda group=None: "the-groups-backend")
    try:
        spec = get_model("mlp", "tiny")
        cfg = StrategyConfig(fuse_all_reduce_ops=True, sync_nccl_allreduce=False, use_hierarchical_allreduce=True,
                             hierarchical_allreduce_inter_nranks=2)
        engine = build_engine(spec.make(0), spec.loss_fn, cfg)
        p = engine.grad_sync.platform
        engine.grad_sync.close()
        return {"device_type": p.device_type, "backend": p.backend}
    finally:
        device.dist = real
        context.set_current(saved)


def test_bucketed_sync_without_a_rank_context_asks_the_process_group(pool2):
    """hierarchical+overlap picks worker threads (CPU) or side streams (CUDA) from its platform: with no rank
    context it used to assume CPU/gloo whatever the group; now the group's backend (here a stand-in) counts."""
    got = pool2.run(bucketed_platform_without_context_on_rank)
    assert got == [{"device_type": "cpu", "backend": "the-groups-backend"}] * 2, got
