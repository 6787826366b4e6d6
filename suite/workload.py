"""The rank-side workload: one model at one size, its data, sharded batches and engines.

Every rank-side job (interleaved timing, the correctness check, traces, profiles, figures)
starts from the same :class:`Workload`, built once per rank and kept for the next job:

    wl = workload(WorkloadSpec("resnet50", size="cpu"))
    engine = wl.engine(config)            # the model (seeded), wrapped by every strategy the config enables
    sync = wl.grad_sync(config, module)   # only the gradient communication of config, on a model of wl.module()
    x, y = wl.batch(i)                    # this rank's shard of timing batch i (cached on the device)
    shards = wl.shards(step)              # every rank's shard of the check's global batch ``step``

The parent sends a :class:`WorkloadSpec` (small, picklable); ranks resolve it to a
:class:`suite.models.ModelSpec` themselves, so a user's ``module:function`` model is imported
on every rank.  Global batches are drawn from a fresh permutation per step and split into
contiguous per-rank shards, so every rank trains on the same number of samples.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch

from .comm.factory import build_grad_sync
from .comm.grad_sync import GradSync
from .config import StrategyConfig
from .data.synthetic import move, prepare, shard, step_indices
from .engine import Engine, build_engine
from .models import ModelSpec, count_parameters, finds_batchnorm, get_model
from .runtime.context import current

__all__ = ["WorkloadSpec", "Workload", "workload", "drop_workloads"]

# Timing cycles over this many pre-built batches (on the device), so a window never waits for data.
TIMING_BATCHES = 16


@dataclass(frozen=True)
class WorkloadSpec:
    """What the parent sends to the ranks: the model reference, its size and the batch."""

    model: str
    size: str = "cpu"
    per_rank_batch: int | None = None  # None: the model's own at this size
    seed: int = 0
    dataset_size: int | None = None  # None: the model's own, at least two global batches
    options: tuple = ()  # (key, value) pairs for the model's factory, e.g. (("signal", 0.2),)

    def model_spec(self) -> ModelSpec:
        return get_model(self.model, self.size, **dict(self.options))

    def describe(self) -> dict:
        return {"model": self.model, "size": self.size, "per_rank_batch": self.per_rank_batch, "seed": self.seed}


class Workload:
    def __init__(self, ws: WorkloadSpec):
        ctx = current()
        self.ws = ws
        self.spec = ws.model_spec()
        self.platform = ctx.platform
        self.device = ctx.platform.device
        self.world, self.rank = ctx.world_size, ctx.rank
        self.per_rank_batch = ws.per_rank_batch or self.spec.per_rank_batch
        self.global_batch = self.per_rank_batch * self.world
        n = ws.dataset_size or max(self.spec.dataset_size, 2 * self.global_batch)
        if n < self.global_batch:
            raise ValueError(f"dataset of {n} samples is smaller than the global batch {self.global_batch} "
                             f"({self.per_rank_batch} per rank x {self.world} ranks)")
        self.data = self.spec.dataset(n, ws.seed)
        self._timing: dict[int, tuple] = {}
        self._has_batchnorm: bool | None = None
        self.repeatable: dict = {}  # the check's probe of the model, per dtype: None, or why it cannot be judged

    # -- data ------------------------------------------------------------------------------
    def shard_of(self, step: int, rank: int, dtype: torch.dtype | None = None) -> tuple[Any, Any]:
        """Rank ``rank``'s shard of the global batch of ``step`` (0-based), on this rank's device;
        floating-point inputs in ``dtype`` when given (the float64 check)."""
        idx = shard(step_indices(len(self.data), step, self.global_batch, self.ws.seed), rank, self.world)
        x, y = self.data.get(idx)
        return prepare(self.data, x, self.device, dtype), move(y, self.device)

    def shards(self, step: int, dtype: torch.dtype | None = None) -> list[tuple[Any, Any]]:
        """Every rank's shard of ``step`` (the check's reference runs them all)."""
        return [self.shard_of(step, r, dtype) for r in range(self.world)]

    def batch(self, i: int) -> tuple[Any, Any]:
        """This rank's shard of timing batch ``i`` (cycling over :data:`TIMING_BATCHES`, kept on the device)."""
        key = i % self.timing_batches
        if key not in self._timing:
            self._timing[key] = self.shard_of(key, self.rank)
        return self._timing[key]

    @property
    def timing_batches(self) -> int:
        """How many batches :meth:`batch` cycles over."""
        return max(1, min(TIMING_BATCHES, len(self.data) // self.global_batch))

    def prepare_batches(self) -> None:
        """Every timing batch built now, so no timed window builds one (an index gather and a host-to-device
        copy, which synchronizes on CUDA)."""
        for key in range(self.timing_batches):
            self.batch(key)

    # -- model and engine --------------------------------------------------------------------
    def module(self, seed: int | None = None, dtype: torch.dtype | None = None, rank: int | None = None
               ) -> torch.nn.Module:
        """A fresh model for ``rank`` (default: this rank; a factory's ``build(rank)`` is told it), initialised from
        ``seed`` (default: the workload's), on this rank's device (in ``dtype`` when given: the float64 check)."""
        module = self.spec.make(self.ws.seed if seed is None else seed, self.device,
                                self.rank if rank is None else rank)
        return module.to(dtype) if dtype is not None else module

    @property
    def has_batchnorm(self) -> bool:
        """Whether the model has BatchNorm: as its spec declares, or found in the module (built on the meta device)."""
        if self._has_batchnorm is None:
            with torch.device("meta"):
                found = finds_batchnorm(self.spec.module(self.rank))
            self._has_batchnorm = self.spec.has_batchnorm or found
        return self._has_batchnorm

    def engine(self, config: StrategyConfig, seed: int | None = None, dtype: torch.dtype | None = None,
               verify_gradients: bool = False) -> Engine:
        """An engine on a fresh model (initialised from ``seed``); its per-rank randomness (dropout) follows the
        workload's seed, this rank and the step, whatever ``seed`` the model was initialised from
        (``verify_gradients``: the check's engine, see :class:`suite.engine.Engine`)."""
        return build_engine(self.module(seed, dtype), self.spec.loss_fn, config, rng_seed=self.ws.seed,
                            verify_gradients=verify_gradients)

    def grad_sync(self, config: StrategyConfig, module: torch.nn.Module) -> GradSync | None:
        """The gradient communication ``config`` asks for on ``module`` (one of :meth:`module`'s), without an engine
        around it: the figures time its collectives alone (None for DDP)."""
        return build_grad_sync(module, config)

    def describe(self) -> dict:
        tensors, elements = count_parameters(self.spec)
        return {"model": self.ws.model, "name": self.spec.name, "size": self.spec.size, "data": self.spec.data,
                "per_rank_batch": self.per_rank_batch, "global_batch": self.global_batch,
                "parameter_tensors": tensors, "parameters": elements}


_WORKLOADS: OrderedDict[WorkloadSpec, Workload] = OrderedDict()
_KEEP = 2  # workloads kept per rank (their datasets and device batches); the oldest is dropped


def workload(ws: WorkloadSpec) -> Workload:
    """This rank's workload for ``ws``, built on first use and kept for the next job."""
    if ws in _WORKLOADS:
        _WORKLOADS.move_to_end(ws)
        return _WORKLOADS[ws]
    wl = _WORKLOADS[ws] = Workload(ws)
    while len(_WORKLOADS) > _KEEP:
        _WORKLOADS.popitem(last=False)
    return wl


def drop_workloads() -> None:
    _WORKLOADS.clear()
