"""A user's own strategies, outside suite/: what `fleetbench run --strategy my_strategies:mean_hook` imports.

Two kinds (suite/strategies/user.py, docs/strategies.md):

- ``mean_hook``: a DDP communication hook, torch's ``register_comm_hook`` signature (``hook(state, bucket)`` returns a
  Future of the bucket's averaged tensor), run on torch's DDP: each bucket allreduced, then divided by the world
  size.  Exact: the default check holds it to the single-process reference at every step.
- ``per_tensor_sync``: a gradient synchronizer on fleetbench's engine (``suite.comm.grad_sync.GradSync``): after
  backward every gradient allreduced asynchronously, then all waited on and scaled by 1/world.  Exact too.
- ``fp16_hook``: torch's own fp16 compression hook, declared lossy with a bound (``BoundedError``).

The rest are the tests' deliberately broken strategies (tests/test_strategies.py): a hook that drops a bucket, one
that averages wrongly (sums), a lossy hook that claims to be exact, one that raises on rank 1, one whose future never
completes, and functions that return the wrong thing.
"""
from __future__ import annotations

import threading

import torch
import torch.distributed as dist

from suite.comm.grad_sync import GradSync
from suite.strategies.user import BoundedError, DDPHook, Synchronizer


# ---- a DDP communication hook ------------------------------------------------------------------------------------
def _mean(state, bucket):
    group = state if state is not None else dist.group.WORLD
    scale = 1.0 / dist.get_world_size(group)
    fut = dist.all_reduce(bucket.buffer(), group=group, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0].mul_(scale))


def mean_hook() -> DDPHook:
    return DDPHook(_mean, description="each bucket allreduced, then scaled by 1/world")


def nccl_mean_hook() -> DDPHook:
    """The same hook, declared for NCCL only: its cases are skipped on gloo with that reason."""
    return DDPHook(_mean, name="nccl_mean", backends=("nccl",))


# ---- a gradient synchronizer -----------------------------------------------------------------------------------
class PerTensorSync(GradSync):
    """Every gradient allreduced on its own after backward (asynchronously, all waited on), scaled by 1/world."""

    def __init__(self, module: torch.nn.Module, group=None):
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.group = group
        self.world = dist.get_world_size(group)
        self.communicate = True

    def begin_step(self, communicate: bool = True) -> None:
        self.communicate = communicate

    def finish_step(self) -> None:
        if not self.communicate:
            return
        grads = [p.grad for p in self.params if p.grad is not None]
        works = [dist.all_reduce(g, group=self.group, async_op=True) for g in grads]
        for w in works:
            w.wait()
        scale = 1.0 / self.world
        for g in grads:
            g.mul_(scale)

    def average_tensors(self, tensors) -> None:
        works = [dist.all_reduce(t, group=self.group, async_op=True) for t in tensors]
        for w in works:
            w.wait()
        for t in tensors:
            t.mul_(1.0 / self.world)

    def describe(self) -> dict:
        return {"allreduce_ops": len(self.params), "allreduce_ops_before_fusion": len(self.params)}


def per_tensor_sync() -> Synchronizer:
    return Synchronizer(lambda module, group, config: PerTensorSync(module, group),
                        description="every gradient allreduced on its own after backward")


# ---- torch's fp16 compression, declared lossy -------------------------------------------------------------------
def fp16_hook() -> DDPHook:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    return DDPHook(default_hooks.fp16_compress_hook, name="my_fp16", check=BoundedError(rel=5e-3))


# ---- broken on purpose (the tests') ------------------------------------------------------------------------------
def _drops_bucket_0(state, bucket):
    if bucket.index() == 0:  # the first bucket's gradients never averaged: each rank keeps its own
        fut: torch.futures.Future = torch.futures.Future()
        fut.set_result(bucket.buffer())
        return fut
    return _mean(state, bucket)


def drops_a_bucket() -> DDPHook:
    return DDPHook(_drops_bucket_0, ddp_kwargs={"bucket_cap_mb": 0.001})  # several buckets, the first dropped


def _sums(state, bucket):
    return dist.all_reduce(bucket.buffer(), async_op=True).get_future().then(lambda f: f.value()[0])


def sums_instead_of_averaging() -> DDPHook:
    return DDPHook(_sums)


def fp16_claimed_exact() -> DDPHook:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    return DDPHook(default_hooks.fp16_compress_hook)  # lossy, and the default check is exact


def _raises_on_rank_1(state, bucket):
    if dist.get_rank() == 1:
        raise RuntimeError("my hook: deliberate failure on rank 1")
    return _mean(state, bucket)


def raises_on_rank_1() -> DDPHook:
    return DDPHook(_raises_on_rank_1)


_NEVER: list = []


def _never_completes(state, bucket):
    fut: torch.futures.Future = torch.futures.Future()
    _NEVER.append(fut)  # kept, never set: DDP waits on it at the end of backward
    return fut


def never_completes() -> DDPHook:
    return DDPHook(_never_completes)


def returns_a_string() -> str:
    return "not a strategy"


def hook_not_callable() -> DDPHook:
    return DDPHook("not callable")  # type: ignore[arg-type]


def sleeps_forever() -> DDPHook:
    threading.Event().wait()
    raise AssertionError("unreachable")


not_a_function = 42
