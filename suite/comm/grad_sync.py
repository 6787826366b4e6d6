"""Gradient synchronisation: the interface every data-parallel communication strategy fills.

The engine drives a ``GradSync`` the same way whatever the strategy:

    sync.begin_step(communicate)   # before backward: arm hooks (overlap) or not
    loss.backward()
    sync.finish_step()             # after backward: every gradient is averaged over the group
    sync.zero_grad() or optimizer.zero_grad()   # gradients zeroed for the next step

``average_tensors`` averages arbitrary tensors (Local SGD's parameters) over the same
collective path (buckets, communicators, hierarchy) as the gradients.

This module holds the interface, the plain strategy (fleetbench's definition of plain data
parallel: after backward one allreduce per parameter gradient, each waited on at once,
averaged) and the no-communication one.  Bucketing, overlap, several communicators and the
hierarchical allreduce live in their own modules; ``suite.comm.factory.build_grad_sync`` picks one.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch.profiler import record_function

from ..config import StrategyConfig
from . import collectives as C
from .dtype_probe import check_reducible

__all__ = ["GradSync", "PlainGradSync", "NoGradSync", "COMM_DTYPES", "trainable_params", "unused_parameters_error"]

# The wire dtype of each grad_comm_dtype: half precision casts; "fp32" (full precision) sends tensors in
# their own dtype (float32 for ordinary models, float64 in the BatchNorm models' float64 check).
COMM_DTYPES: dict[str, torch.dtype | None] = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def unused_parameters_error(names: list[str]) -> RuntimeError:
    """The error for parameters without a gradient in a step; the fix first (a terminal may cut the rest)."""
    return RuntimeError(
        f"set find_unused_parameters=true (gradients that are missing are then reduced as zeros, as DDP does) "
        f"or freeze those parameters (requires_grad=False): {', '.join(map(repr, names))} received no gradient "
        f"in this step, and every rank must reduce the same gradients, so fleetbench stops here instead of hanging")


def trainable_params(model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    """Parameters that get gradients, in registration order (frozen ones are skipped), each once."""
    seen: set[int] = set()
    out = []
    for name, p in model.named_parameters():
        if p.requires_grad and id(p) not in seen:
            seen.add(id(p))
            out.append((name, p))
    return out


class GradSync:
    """Base class: holds the group and the averaging rule; subclasses decide how to communicate."""

    name = "base"

    def __init__(self, model: torch.nn.Module, config: StrategyConfig, group=None):
        self.model = model
        self.config = config
        self.group = group
        self.world = dist.get_world_size(group)
        self.named_params = trainable_params(model)
        self.params = [p for _, p in self.named_params]
        self.comm_dtype = COMM_DTYPES[config.grad_comm_dtype]
        if self.comm_dtype is not None and self.params:
            check_reducible(self.comm_dtype, group, "grad_comm_dtype", config.grad_comm_dtype, self.params[0].device)
        self.communicate = True
        # the gradients arrive already divided by the world size (the engine scaled backward's seed: see
        # fold_average_into_backward); False for anyone else driving begin_step / backward / finish_step
        self.averaged_in_backward = False

    def fold_average_into_backward(self) -> bool:
        """Whether the strategy takes its gradients already divided by the world size, the engine scaling the loss
        gradient that seeds backward by 1/world instead (Paddle's ``gradient_scale_configs`` "avg": the loss
        gradient is 1/nranks), so that no pass over the gradients divides them; the engine calls it once, and when
        it answers True scales every communicating step's seed.  Plain data parallel keeps its own division."""
        return False

    # -- the engine's calls --------------------------------------------------------
    def begin_step(self, communicate: bool = True) -> None:
        self.communicate = communicate

    def finish_step(self) -> None:
        raise NotImplementedError

    def average_tensors(self, tensors: list[torch.Tensor]) -> None:
        """Average ``tensors`` in place over the group (one allreduce each in the plain path)."""
        for t in tensors:
            self._allreduce_average(t, self.group)

    def collectives_alone(self) -> None:
        """One step's gradient collectives with no compute around them (what ``figures comm`` times): here one
        allreduce of each parameter's own tensor, averaged in place."""
        for p in self.params:
            self._allreduce_average(p.detach(), self.group)

    def zero_grad(self) -> bool:
        """Zero every gradient where the strategy holds them itself (buckets whose views they are) and say so;
        False: the optimizer zeroes them."""
        return False

    def describe(self) -> dict:
        """What the strategy did at set-up (allreduce ops before and after fusion, buckets …)."""
        n = len(self.params)
        return {"strategy": self.name, "allreduce_ops_before_fusion": n, "allreduce_ops": n}

    # -- shared helpers ------------------------------------------------------------
    def _allreduce_average(self, tensor: torch.Tensor, group, async_op: bool = False, divide: bool = True):
        """Allreduce ``tensor`` (in ``grad_comm_dtype``) and divide by the world size, in place (``divide=False``:
        ``tensor`` was divided already, so the sum is the average).

        Returns a callable that completes the operation (waits, copies back), so
        asynchronous callers can launch now and finish later.
        """
        wire = self._to_wire(tensor, divide)
        work = C.all_reduce(wire, group=group, async_op=async_op)

        def complete() -> None:
            if work is not None and async_op:
                work.wait()
            if wire is not tensor:
                tensor.copy_(wire)

        if not async_op:
            complete()
            return None
        return complete

    def _to_wire(self, tensor: torch.Tensor, divide: bool = True) -> torch.Tensor:
        """``tensor`` divided by the world size (averaging folded in before the sum; ``divide=False``: it was
        divided already), in ``grad_comm_dtype``.

        In place when no cast is needed; otherwise divided in full precision first, then cast, so large
        (loss-scaled) gradients stay in fp16's range.  The caller copies a cast result back.
        """
        if self.comm_dtype is not None and self.comm_dtype != tensor.dtype:
            return (tensor.div(self.world) if divide else tensor).to(self.comm_dtype)
        return tensor.div_(self.world) if divide else tensor

    def _missing_grad(self, name: str, p: torch.nn.Parameter) -> torch.Tensor:
        """A parameter without a gradient this step: zeros (find_unused_parameters) or a clear error."""
        if self.config.find_unused_parameters:
            p.grad = torch.zeros_like(p)
            return p.grad
        raise unused_parameters_error([name])


class PlainGradSync(GradSync):
    """After backward, one allreduce per parameter gradient, each waited on at once, averaged."""

    name = "plain"

    def finish_step(self) -> None:
        if not self.communicate:
            return
        # one range for the whole loop (a torch.profiler trace): never one per parameter
        with record_function("allreduce issue and wait, one per parameter"):
            for name, p in self.named_params:
                grad = p.grad if p.grad is not None else self._missing_grad(name, p)
                self._allreduce_average(grad, self.group)


class NoGradSync(GradSync):
    """No gradient communication (``data_parallel='none'``): for measuring compute alone."""

    name = "none"

    def finish_step(self) -> None:
        return None

    def average_tensors(self, tensors: list[torch.Tensor]) -> None:
        return None

    def describe(self) -> dict:
        return {"strategy": self.name, "allreduce_ops_before_fusion": 0, "allreduce_ops": 0}
