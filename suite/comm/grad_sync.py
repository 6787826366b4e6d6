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
averaged; a sparse gradient, ``nn.Embedding(sparse=True)``'s, reduced as it is) and the
no-communication one.  A parameter without a gradient: an error naming it before any collective,
or with ``find_unused_parameters`` torch DDP's rule (:meth:`GradSync._defined_anywhere`): None
where no rank has one, the average with zeros for the ranks that lack one otherwise.  Bucketing,
overlap, several communicators and the hierarchical allreduce live in their own modules;
``suite.comm.factory.build_grad_sync`` picks one.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch.profiler import record_function

from ..config import StrategyConfig
from . import collectives as C
from .dtype_probe import check_reducible

__all__ = ["GradSync", "PlainGradSync", "NoGradSync", "COMM_DTYPES", "trainable_params", "unused_parameters_error",
           "sparse_gradient_names", "sparse_gradients_refused"]

# The wire dtype of each grad_comm_dtype: half precision casts; "fp32" (full precision) sends tensors in
# their own dtype (float32 for ordinary models, float64 in the BatchNorm models' float64 check).
COMM_DTYPES: dict[str, torch.dtype | None] = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def unused_parameters_error(names: list[str], where: str = "") -> RuntimeError:
    """The error for parameters without a gradient in a step; the fix first (a terminal may cut the rest).
    ``where``: which ranks lacked them, when that is known (the check's agreement, ``suite.comm.agree``)."""
    shown = ", ".join(map(repr, names[:8])) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
    return RuntimeError(
        f"set find_unused_parameters=true (gradients that are missing are then reduced as zeros, as DDP does) "
        f"or freeze those parameters (requires_grad=False): {shown} received no gradient "
        f"in this step{where}, and every rank must reduce the same gradients, so fleetbench stops here instead of "
        f"hanging")


def trainable_params(model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    """Parameters that get gradients, in registration order (frozen ones are skipped), each once."""
    seen: set[int] = set()
    out = []
    for name, p in model.named_parameters():
        if p.requires_grad and id(p) not in seen:
            seen.add(id(p))
            out.append((name, p))
    return out


def sparse_gradient_names(module: torch.nn.Module) -> tuple[str, ...]:
    """The trainable parameters whose gradients autograd makes sparse: the weights of ``nn.Embedding`` and
    ``nn.EmbeddingBag`` built with ``sparse=True`` (the modules torch DDP looks for to keep a gradient sparse)."""
    names = []
    for mod_name, mod in module.named_modules():
        if isinstance(mod, (torch.nn.Embedding, torch.nn.EmbeddingBag)) and mod.sparse and mod.weight.requires_grad:
            names.append(f"{mod_name}.weight" if mod_name else "weight")
    return tuple(names)


def sparse_gradients_refused(what: str, names: tuple[str, ...] | list[str]) -> str:
    """Why ``what`` (a holder of dense gradients only: flat buckets, a flat gradient buffer) cannot train parameters
    ``names`` whose gradients are sparse (:func:`sparse_gradient_names`)."""
    return (f"sparse gradients: {what} hold(s) dense gradients only, and {', '.join(map(repr, names))} "
            f"(nn.Embedding/EmbeddingBag with sparse=True) has a sparse one, which torch DDP and plain data parallel "
            f"reduce as it is")


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
        self._sparse = set(sparse_gradient_names(model))
        self._flags_work = None  # find_unused_parameters: the flags' allreduce of this step, until settled
        # the gradients arrive already divided by the world size (the engine scaled backward's seed: see
        # fold_average_into_backward); False for anyone else driving begin_step / backward / finish_step
        self.averaged_in_backward = False

    def wants_used(self) -> bool:
        """Whether :meth:`mark_unused` wants this step's used parameters (the engine then finds them between forward
        and backward, as DDP's reducer does with ``find_unused_parameters``)."""
        return False

    def mark_unused(self, used: list[bool]) -> None:
        """Before backward: ``used[i]`` says whether ``self.params[i]`` is in the step's autograd graph."""

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
        """A parameter without a gradient on this rank that another rank has one for: zeros (find_unused_parameters;
        sparse zeros where its gradient is sparse) or a clear error."""
        if self.config.find_unused_parameters:
            if name in self._sparse:
                p.grad = torch.sparse_coo_tensor(torch.zeros((1, 0), dtype=torch.int64, device=p.device),
                                                 torch.zeros((0,) + tuple(p.shape[1:]), dtype=p.dtype,
                                                             device=p.device), tuple(p.shape))
            else:
                p.grad = torch.zeros_like(p)
            return p.grad
        raise unused_parameters_error([name])

    def _defined_anywhere(self) -> Callable[[], list[bool]]:
        """``find_unused_parameters``, after backward: starts one small allreduce of flags, for each parameter whether
        this rank holds a gradient for it (torch DDP allreduces its ``local_used_map`` the same way), and returns
        what reads the answer: for each parameter, whether any rank holds one.  A parameter no rank holds one for
        keeps ``grad`` None, as DDP leaves a globally unused parameter's gradient untouched
        (``Reducer::finalize_bucket_dense``, ``global_unused``), so the optimizer skips it as it would in one
        process; one that some rank holds gets zeros where it lacks one, and the average.  As DDP, the answer is
        waited for and read on the host only where this rank lacks a gradient; call it (or :meth:`_settle`)
        before the step ends."""
        flags = torch.tensor([p.grad is not None for p in self.params], dtype=torch.int32,
                             device=self.params[0].device)
        work = C.all_reduce(flags, group=self.group, op=dist.ReduceOp.MAX, async_op=True)
        self._flags_work = work

        def read() -> list[bool]:
            self._settle()
            return [bool(f) for f in flags.tolist()]

        return read

    def _settle(self) -> None:
        """The flags' allreduce of :meth:`_defined_anywhere` completed (no host read)."""
        work, self._flags_work = self._flags_work, None
        if work is not None:
            work.wait()


class PlainGradSync(GradSync):
    """After backward, one allreduce per parameter gradient, each waited on at once, averaged."""

    name = "plain"

    def finish_step(self) -> None:
        if not self.communicate:
            return
        if not self.config.find_unused_parameters:  # checked before any collective: nothing is left half-reduced
            missing = [name for name, p in self.named_params if p.grad is None]
            if missing:
                raise unused_parameters_error(missing)
        anywhere = None
        if self.config.find_unused_parameters and self.params:
            read = self._defined_anywhere()
            anywhere = read() if any(p.grad is None for p in self.params) else None  # read only where needed
        # one range for the whole loop (a torch.profiler trace): never one per parameter
        with record_function("allreduce issue and wait, one per parameter"):
            for i, (name, p) in enumerate(self.named_params):
                if p.grad is None:
                    if anywhere is not None and not anywhere[i]:
                        continue  # no rank has a gradient for it: it stays None, as in DDP and one process
                    grad = self._missing_grad(name, p)
                else:
                    grad = p.grad
                self._allreduce_average(grad, self.group)
        self._settle()


class NoGradSync(GradSync):
    """No gradient communication (``data_parallel='none'``): for measuring compute alone."""

    name = "none"

    def finish_step(self) -> None:
        return None

    def average_tensors(self, tensors: list[torch.Tensor]) -> None:
        return None

    def describe(self) -> dict:
        return {"strategy": self.name, "allreduce_ops_before_fusion": 0, "allreduce_ops": 0}
