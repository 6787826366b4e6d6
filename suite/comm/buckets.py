"""Gradient buckets: which parameters share one fused allreduce, and the flat buffer they live in.

Assignment (:func:`plan`, torch-free; :func:`plan_buckets` for a
model's parameters) walks the trainable parameters in *reverse registration order* (roughly the
order backward produces their gradients) and closes a bucket when

- its bytes reach ``fuse_grad_size_in_MB`` MiB (the parameter that crosses the cap stays in,
  as in DDP; ``inf`` = no byte cap; the first bucket at ``first_bucket_MB`` when that is set: DDP's
  first-bucket rule, see below), or
- the next parameter belongs to a new layer and the bucket already holds
  ``fuse_grad_size_in_layers`` layers (a *layer* is the module that owns the parameter, so
  an fc's weight and bias always share a bucket under the layer cap, as in Paddle's docs), or
- the next parameter has another dtype or device (one flat buffer has one of each).

Fusion off (``fuse_all_reduce_ops=False``): one parameter per bucket, the same machinery.

DDP's first-bucket rule (decided here, once).  DDP closes its first bucket (the first launched: the last layers'
gradients) at 1 MiB (``torch.distributed._DEFAULT_FIRST_BUCKET_BYTES``, applied when ``bucket_cap_mb`` is left at
its default; an explicit ``bucket_cap_mb`` makes every bucket that size in torch 2.13), so communication starts
early in backward.  Paddle's knobs do not have it: ``fuse_grad_size_in_MB`` is the size of every fused allreduce
(the op-fusion docs: "each AllReduce call transfers 16 MB"; the static graph's fuse pass has no smaller group),
and Paddle's dygraph ``DataParallel`` makes the *last* group small (``last_comm_group_size_MB``, 1 MB: the
gradients of the first layers, communicated last; ``AssignGroupBySize`` applies the small limit to the first group
in registration order and the reducer reverses the groups), the opposite end of DDP's.  So under Paddle's knobs no
bucket is smaller than the cap: the rule is ours, off by default (``first_bucket_MB``, None), and DDP's
configuration (the ``ddp_configuration`` preset, which `fleetbench figures engine_cost` times against DDP) sets it
to DDP's 1 MiB.  Paddle's small last group is not implemented (``last_comm_group_size_MB`` is refused by name).

Sized buckets (:func:`sized_bucket_mb`, the registry's ``*/overlap`` and ``*/multicomm``): the byte cap
follows the model's gradient bytes, so that every model at every size gets between 2 and 16 buckets
(:data:`SIZED_BUCKETS`) and its first bucket is launched while backward still runs.  The rule: a tenth of the
gradient bytes (:data:`SIZED_SHARE`: about ten buckets); where the tensors' sizes give a count outside 2-16 at
that cap (one tensor holding most of the bytes, or many tiny ones), the share nearest a tenth that does
(a ninth, an eleventh, an eighth, …, down to the whole and up to a 64th), else a tenth.  Rounded to 3
significant digits of MiB, the value the case's config records.

The parent plans a case before any rank starts (:func:`comm_plan`, from :func:`gradient_layout` of the model
built on the meta device), so a case whose name its plan cannot honour is skipped with the reason
(``suite.cases``), and what the engine then built (``describe()``) is compared with the plan.

Storage (:class:`Bucket`): one flat buffer per bucket, and by default every parameter's ``p.grad``
is a view into it once the gradient exists (DDP's ``gradient_as_bucket_view``;
``gradient_as_bucket_view=True``; a gradient that does not exist yet stays None, as DDP keeps it, and its
first arrival is copied in once and bound): autograd then accumulates straight into the buffer and the
allreduce runs on it, no copies on the hot path.  It is
exact: the same additions into the same values as a gradient of its own, the same division and sum of the
same buffer (``tests/test_bucket_views.py`` shows the parameters bitwise equal to the copies' over 3 steps).
Copies (``gradient_as_bucket_view=False``, DDP's default): each gradient is its own tensor, copied into
its slice of the bucket by its hook and back once the bucket is reduced.  The buffer may be padded
(zeros nobody views) to a multiple of the intra-node group size for the reduce-scatter of
the hierarchical allreduce.
"""
from __future__ import annotations

import logging
import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field

import torch

from .grad_sync import trainable_params

__all__ = ["BucketPlan", "Bucket", "plan", "plan_buckets", "param_owners", "fusion_log_line", "gradient_layout",
           "sized_bucket_mb", "CommPlan", "comm_plan", "SIZED_BUCKETS", "SIZED_SHARE"]

log = logging.getLogger("suite.comm.buckets")

MiB = 2**20


def param_owners(model: torch.nn.Module) -> dict[int, str]:
    """id(parameter) -> name of the module that registers it directly (its *layer*)."""
    owners: dict[int, str] = {}
    for mod_name, mod in model.named_modules():
        for p in mod._parameters.values():
            if p is not None and id(p) not in owners:
                owners[id(p)] = mod_name
    return owners


@dataclass
class BucketPlan:
    """One bucket's parameters (indices into the trainable list, in bucket order) and layers."""

    index: int
    members: list[int]
    layers: list[str]
    nbytes: int


def plan(grads: Sequence[tuple[int, str, Hashable]], fuse: bool, cap_mb: float = math.inf,
         cap_layers: int = 50, first_cap_mb: float | None = None) -> list[BucketPlan]:
    """Group gradients into buckets (see the module docstring): ``grads`` holds (bytes, layer, kind) of each
    trainable parameter in registration order, a kind being what one flat buffer must share (dtype and
    device); ``first_cap_mb``: the first bucket's byte cap (DDP's first-bucket rule; None: ``cap_mb``).
    Torch-free: the engine plans through :func:`plan_buckets`; a consumer may plan from a profile of sizes
    alone (experiments/costmodel does)."""
    cap_bytes = cap_mb * MiB
    first_bytes = cap_bytes if first_cap_mb is None else min(first_cap_mb * MiB, cap_bytes)
    plans: list[BucketPlan] = []
    cur: BucketPlan | None = None
    cur_kind = None
    for i in reversed(range(len(grads))):
        nbytes, layer, kind = grads[i]
        new_layer = cur is not None and layer not in cur.layers
        if cur is None or not fuse or kind != cur_kind or (new_layer and len(cur.layers) >= cap_layers):
            cur = BucketPlan(len(plans), [], [], 0)
            cur_kind = kind
            plans.append(cur)
        cur.members.append(i)
        if layer not in cur.layers:
            cur.layers.append(layer)
        cur.nbytes += nbytes
        if cur.nbytes >= (first_bytes if cur.index == 0 else cap_bytes):
            cur = None  # closed: the byte cap is reached
    return plans


def plan_buckets(named_params: list[tuple[str, torch.nn.Parameter]], owners: dict[int, str], fuse: bool,
                 cap_mb: float = math.inf, cap_layers: int = 50, first_cap_mb: float | None = None
                 ) -> list[BucketPlan]:
    """:func:`plan` of the engine's parameters (a layer: the module that owns it, see :func:`param_owners`)."""
    return plan([(p.numel() * p.element_size(), owners.get(id(p), name), (p.dtype, p.device))
                 for name, p in named_params], fuse, cap_mb, cap_layers, first_cap_mb)


def gradient_layout(model: torch.nn.Module) -> tuple[tuple[int, str, str], ...]:
    """(bytes, layer, dtype) of each trainable parameter in registration order, each tensor once: what
    :func:`plan` takes, read without a rank (the parent plans a case's buckets from a model built on the meta
    device, as the engine will from the real one)."""
    owners = param_owners(model)
    return tuple((p.numel() * p.element_size(), owners.get(id(p), name), str(p.dtype))
                 for name, p in trainable_params(model))


SIZED_BUCKETS = (2, 16)  # the bucket counts sized buckets give, at every model and size
SIZED_SHARE = 10  # the cap: about a tenth of the gradient bytes


def sized_bucket_mb(grads: Sequence[tuple[int, str, Hashable]], cap_layers: int = 50) -> float:
    """The byte cap (MiB) of sized buckets for gradients ``grads`` (as :func:`plan` takes them); the rule is the
    module docstring's."""
    total = sum(g[0] for g in grads)
    if total <= 0:
        return 25.0  # nothing to size (no trainable parameter): DDP's default
    lo, hi = SIZED_BUCKETS

    def cap(share: int) -> float:
        return float(f"{total / share / MiB:.3g}")

    for share in sorted(range(1, 65), key=lambda k: (abs(k - SIZED_SHARE), k)):  # 10, 9, 11, 8, 12, …
        if lo <= len(plan(grads, True, cap(share), cap_layers)) <= hi:
            return cap(share)
    return cap(SIZED_SHARE)


@dataclass(frozen=True)
class CommPlan:
    """What a bucketed gradient sync will do at one model, size and world: planned in the parent, before any rank."""

    gradients: int  # gradient tensors (what plain data parallel allreduces one by one)
    gradient_bytes: int
    fuse: bool  # fuse_all_reduce_ops (False: one tensor per bucket)
    cap_mb: float  # fuse_grad_size_in_MB (inf: no byte cap)
    buckets: int  # collectives per step on the gradient path (one per bucket)
    communicators: int  # distinct communicators the buckets go to
    overlap: bool  # launched asynchronously, waited on after backward (sync_nccl_allreduce=False)
    nodes: int = 1  # the hierarchy's nodes (1 without it)
    ranks_per_node: int = 0  # 0: no hierarchy

    def mismatch(self, describe: Mapping) -> str | None:
        """How what the engine built (its ``describe()``) differs from the plan, or None."""
        built = describe.get("allreduce_ops")
        if built != self.buckets:
            return f"the plan has {self.buckets} bucket(s), the engine built {built}"
        comms = {b.get("comm") for b in describe.get("buckets") or [] if isinstance(b, Mapping)}
        if len(comms) != self.communicators:
            return f"the plan puts the buckets on {self.communicators} communicator(s), the engine on {len(comms)}"
        if self.ranks_per_node:
            hier = describe.get("hierarchical") or {}
            got = (hier.get("nodes"), hier.get("ranks_per_node"))
            if got != (self.nodes, self.ranks_per_node):
                return (f"the plan has {self.nodes} node(s) of {self.ranks_per_node} ranks, the engine "
                        f"{got[0]} of {got[1]}")
        return None


def comm_plan(grads: Sequence[tuple[int, str, Hashable]], fuse: bool, cap_mb: float, cap_layers: int,
              comm_num: int, overlap: bool, world: int, ranks_per_node: int | None = None,
              first_cap_mb: float | None = None) -> CommPlan:
    """The :class:`CommPlan` of gradients ``grads`` (see :func:`gradient_layout`) under these knobs at ``world``
    ranks (``ranks_per_node``: the hierarchy's, None without one; ``first_cap_mb``: ``first_bucket_MB``)."""
    plans = plan(grads, fuse, cap_mb, cap_layers, first_cap_mb)
    rpn = ranks_per_node or 0
    return CommPlan(len(grads), sum(g[0] for g in grads), fuse, cap_mb, len(plans),
                    len({p.index % comm_num for p in plans}), overlap, world // rpn if rpn else 1, rpn)


def fusion_log_line(before: int, after: int) -> str:
    """Paddle's fuse_all_reduce_op_pass message, with our numbers."""
    return (f"Find all_reduce operators: {before}. To make the speed faster, some all_reduce ops are fused "
            f"during training, after fusion, the number of all_reduce ops is {after}.")


@dataclass
class Bucket:
    """A flat gradient buffer and its parameters; their ``.grad`` are views into it (``as_views``), or their own
    tensors copied in and out (:meth:`copy_in`, :meth:`copy_out`)."""

    index: int
    names: list[str]
    params: list[torch.nn.Parameter]
    layers: list[str]
    comm_index: int  # which communicator (round-robin over nccl_comm_num)
    flat: torch.Tensor = field(repr=False, default=None)  # type: ignore[assignment]  # set by allocate()
    views: list[torch.Tensor] = field(repr=False, default_factory=list)
    offsets: list[int] = field(default_factory=list)
    numel: int = 0  # elements the parameters use (the buffer may be longer: padding)
    as_views: bool = True  # p.grad is views[k] (False: p.grad is its own tensor, copied in and out)
    # per-step state
    pending: int = 0
    ready: list[bool] = field(default_factory=list)

    @classmethod
    def allocate(cls, index: int, named: list[tuple[str, torch.nn.Parameter]], layers: list[str], comm_index: int,
                 pad_to: int = 1, as_views: bool = True) -> Bucket:
        params = [p for _, p in named]
        numel = sum(p.numel() for p in params)
        padded = -(-numel // pad_to) * pad_to if pad_to > 1 else numel
        flat = torch.zeros(max(padded, 1), dtype=params[0].dtype, device=params[0].device)
        b = cls(index, [n for n, _ in named], params, layers, comm_index, flat=flat, numel=numel, as_views=as_views)
        off = 0
        with torch.no_grad():
            for p in params:
                b.offsets.append(off)
                view = flat[off:off + p.numel()].view_as(p)
                if p.grad is not None:
                    view.copy_(p.grad)
                b.views.append(view)
                off += p.numel()
        b.bind_all()
        return b

    @property
    def nbytes(self) -> int:
        return self.numel * self.flat.element_size()

    def bind_all(self) -> None:
        """Make every ``p.grad`` that exists its view again (after a replacement); copies: nothing to bind.  A
        gradient that does not exist (None: the parameter never had one, or ``zero_grad(set_to_none=True)``) stays
        None, as torch DDP's reducer leaves it (``initialize_bucket_views``: "grads should be kept as being
        undefined for globally unused parameters"): its hook binds it when autograd makes it."""
        if not self.as_views:
            return
        for p, view in zip(self.params, self.views):
            if p.grad is not view and p.grad is not None:  # one identity test while it stays the view
                self._rebind(p, view)

    def bind(self, k: int) -> None:
        """Make ``p.grad`` of parameter ``k`` its view again, keeping its value (copies: nothing to bind)."""
        if self.as_views and self.params[k].grad is not self.views[k]:
            self._rebind(self.params[k], self.views[k])

    @staticmethod
    def _rebind(p: torch.nn.Parameter, view: torch.Tensor) -> None:
        g = p.grad
        if g is not None and g.data_ptr() == view.data_ptr() and g.shape == view.shape:
            p.grad = view  # another tensor object over the same memory (e.g. a detached alias): the view itself
            return
        with torch.no_grad():
            if g is None:
                view.zero_()  # None means zero
            else:
                view.copy_(g)  # autograd or someone else replaced the view: keep the value, restore the view
        p.grad = view

    def copy_in(self, k: int) -> None:
        """Copies: parameter ``k``'s gradient into its slice of the bucket (its hook, as DDP's reducer does)."""
        g = self.params[k].grad
        if g is None:  # cannot be in a post-accumulate-grad hook; None means zero
            self.views[k].zero_()
        else:
            self.views[k].copy_(g)

    def copy_out(self) -> None:
        """Copies: the reduced bucket back into every parameter's own gradient (one without a gradient is left to
        :meth:`adopt`: whether it gets one depends on the other ranks)."""
        for p, view in zip(self.params, self.views):
            if p.grad is not None:
                p.grad.copy_(view)

    def adopt(self, k: int) -> None:
        """Parameter ``k`` had no gradient on this rank and another rank had one: its gradient is the reduced slot
        (its view; copies: a copy of it)."""
        self.params[k].grad = self.views[k] if self.as_views else self.views[k].clone()
