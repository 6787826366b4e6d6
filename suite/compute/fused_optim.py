"""Fused optimizers (``fuse_all_optimizer_ops``): SGD, Momentum and Adam as one update over flat buffers.

Paddle's ``fuse_optimizer_op_pass`` ("Find momentum operators: 161 … those optimization are
fused during training") packs every parameter, gradient and optimizer state of one kind
into contiguous buffers and runs one optimizer op over them.  Here:

- **Parameters** are copied into one flat buffer per group, and every ``p.data`` becomes a
  view into it (the model keeps working; its storage moved).
- **Gradients**: when the gradient communication already keeps the gradients in flat buckets
  (``grad_sync.buckets``: objects with ``flat``, ``params``, ``offsets``, ``numel``, whose
  ``p.grad`` are views into ``flat``, as in ``suite.comm.buckets.Bucket``), one group per
  bucket and those very buffers are the gradients: nothing is copied.  Otherwise (plain,
  none, DDP, and buckets with ``gradient_as_bucket_view=False``, whose gradients are copied in
  and out: the fallback) the optimizer allocates its own flat gradient buffer per (dtype, device) and
  makes every ``p.grad`` a view into it, so autograd accumulates straight into it.
- **State** (momentum buffer; Adam's ``exp_avg``, ``exp_avg_sq``) lives in flat buffers laid
  out like the parameters; ``state[p]`` gives per-parameter views for inspection.
- **The update** is a handful of whole-buffer tensor ops per group, written here, with the
  operations of ``torch.optim``'s single-tensor path (SGD, SGD with momentum, Adam; weight decay
  as torch.optim defines it: added to the gradient, ``g + wd * p``).  It is never a call into
  torch's ``foreach`` or ``fused`` implementations.  Equal to torch.optim within a few ulp, not
  bit for bit: torch.optim picks its foreach kernels on CUDA (``_default_to_fused_or_foreach``),
  and kernels may contract ``a + b * c`` into one multiply-add differently.  Adam's bias
  correction divides by a 0-dim tensor on the parameters' device, a true division on CPU and
  CUDA alike (as the CPU single-tensor path and CUDA's ``_foreach_div_`` with a scalar list,
  ``std::divides`` in aten/src/ATen/native/cuda/ForeachBinaryOpScalarList.cu, compute it); a
  Python number as divisor would be ``a * (1/b)`` on CUDA (BinaryDivTrueKernel.cu).

A parameter without a gradient (``p.grad`` None: no rank has ever given it one, see
``suite.comm.grad_sync``) is skipped, as torch.optim skips it: the update runs over the whole
buffers, and that parameter's slices of the parameters and of the state are put back as they were.
Its gradient is bound to its view once it exists (never before: a view would be a zero gradient,
which weight decay and momentum act on).  One difference from torch.optim remains: Adam's bias
correction counts the optimizer's steps, not each parameter's own, so a parameter that first gets a
gradient after the first step is corrected as if it had had one from the start.
"""
from __future__ import annotations

import logging
import math

import torch

from ..comm.grad_sync import sparse_gradient_names, sparse_gradients_refused
from ..config import StrategyConfig

__all__ = ["FlatOptimizer", "build_fused_optimizer"]

log = logging.getLogger("suite.compute.fused_optim")

_STATE_NAMES = {"sgd": (), "momentum": ("momentum_buffer",), "adam": ("exp_avg", "exp_avg_sq")}
_PADDLE_NAMES = {"sgd": "sgd", "momentum": "momentum", "adam": "adam"}


class _Group:
    """Parameters that share flat buffers: one dtype, one device, in ``offsets`` order."""

    def __init__(self, params: list[torch.nn.Parameter], offsets: list[int], size: int, numel: int,
                 flat_grad: torch.Tensor | None, bucket=None):
        p0 = params[0]
        self.params = params
        self.offsets = offsets
        self.numel = numel  # elements used; buffers may be longer (a bucket's padding)
        self.bucket = bucket
        with torch.no_grad():
            self.flat_param = torch.zeros(size, dtype=p0.dtype, device=p0.device)
            for p, off in zip(params, offsets):
                self.flat_param[off:off + p.numel()].copy_(p.data.reshape(-1))
            for p, off in zip(params, offsets):
                p.data = self.flat_param[off:off + p.numel()].view_as(p)
        if flat_grad is None:  # our own gradient buffer
            flat_grad = torch.zeros(size, dtype=p0.dtype, device=p0.device)
            self.grad_views = [flat_grad[off:off + p.numel()].view_as(p) for p, off in zip(params, offsets)]
            with torch.no_grad():
                for p, v in zip(params, self.grad_views):
                    if p.grad is not None:  # a gradient that does not exist stays None (see the module docstring)
                        v.copy_(p.grad)
                        p.grad = v
        else:
            self.grad_views = [flat_grad[off:off + p.numel()].view_as(p) for p, off in zip(params, offsets)]
        self.flat_grad = flat_grad
        self.state: dict[str, torch.Tensor] = {}
        self._scratch: dict[str, torch.Tensor] = {}

    def scratch(self, name: str) -> torch.Tensor:
        """A work buffer the size of the flat parameters, allocated on first use and kept."""
        buf = self._scratch.get(name)
        if buf is None:
            buf = self._scratch[name] = torch.empty_like(self.flat_param)
        return buf

    def bind(self) -> None:
        """Make every ``p.grad`` that exists the view into the flat gradient buffer again, keeping its value; the
        slot of one that does not exist is zero (it stays None)."""
        if self.bucket is not None and hasattr(self.bucket, "bind_all"):
            self.bucket.bind_all()
            return
        for p, v in zip(self.params, self.grad_views):
            g = p.grad
            if g is not None and g.data_ptr() == v.data_ptr():
                continue
            with torch.no_grad():
                if g is None:
                    v.zero_()
                    continue
                v.copy_(g)
            p.grad = v

    def absent(self) -> list[tuple[int, int]]:
        """(offset, numel) of every parameter without a gradient (``p.grad`` None): the update leaves them alone."""
        return [(off, p.numel()) for p, off in zip(self.params, self.offsets) if p.grad is None]


class FlatOptimizer:
    """One fused update over flat buffers; see the module docstring.

    ``step()``, ``zero_grad(set_to_none=False)``, ``param_groups`` (``lr`` may be changed
    there), ``state[p]`` (per-parameter views of the flat state), ``flat_grads()``,
    ``flat_state()`` and ``describe()``.
    """

    def __init__(self, params: list[torch.nn.Parameter], kind: str, lr: float, momentum: float = 0.0,
                 weight_decay: float = 0.0, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 buckets: list | None = None):
        if kind not in _STATE_NAMES:
            raise ValueError(f"optimizer={kind!r}: the fused optimizer supports 'sgd', 'momentum', 'adam'")
        params = [p for p in params if p.requires_grad]
        if not params:
            raise ValueError("the fused optimizer got no trainable parameters")
        self.kind = kind
        self.param_groups = [{"params": params, "lr": lr, "momentum": momentum, "weight_decay": weight_decay,
                              "betas": betas, "eps": eps}]
        self.step_count = 0
        self.grads_from = "own flat buffers"
        self.groups = self._build_groups(params, buckets)
        for g in self.groups:
            for name in _STATE_NAMES[kind]:
                g.state[name] = torch.zeros_like(g.flat_param)
        self._state_views: dict | None = None

    # ---- construction --------------------------------------------------------------------
    def _build_groups(self, params: list[torch.nn.Parameter], buckets: list | None) -> list[_Group]:
        if buckets and _buckets_cover(buckets, params):
            self.grads_from = "gradient buckets"
            return [_Group(list(b.params), list(b.offsets), b.flat.numel(), b.numel, b.flat, bucket=b)
                    for b in buckets]
        by_kind: dict = {}
        for p in params:
            by_kind.setdefault((p.dtype, p.device), []).append(p)
        groups = []
        for ps in by_kind.values():
            offsets, off = [], 0
            for p in ps:
                offsets.append(off)
                off += p.numel()
            groups.append(_Group(ps, offsets, off, off, None))
        return groups

    # ---- the optimizer interface -----------------------------------------------------------
    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        hp = self.param_groups[0]
        lr, wd = hp["lr"], hp["weight_decay"]
        self.step_count += 1
        for g in self.groups:
            g.bind()
            absent = g.absent()  # torch.optim skips a parameter without a gradient: its slices are put back after
            kept = [(off, n, g.flat_param[off:off + n].clone(), {k: t[off:off + n].clone() for k, t in g.state.items()})
                    for off, n in absent]
            p = g.flat_param
            grad = g.flat_grad
            if wd != 0:  # into a scratch buffer allocated once: no per-step allocation of a full buffer
                grad = torch.add(grad, p, alpha=wd, out=g.scratch("decayed_grad"))
            if self.kind == "sgd":
                p.add_(grad, alpha=-lr)
            elif self.kind == "momentum":
                buf = g.state["momentum_buffer"]
                if self.step_count == 1:
                    buf.copy_(grad)  # torch.optim: the first buffer is the gradient itself
                else:
                    buf.mul_(hp["momentum"]).add_(grad)
                p.add_(buf, alpha=-lr)
            else:  # adam
                beta1, beta2 = hp["betas"]
                m, v = g.state["exp_avg"], g.state["exp_avg_sq"]
                m.lerp_(grad, 1 - beta1)
                v.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                bc1 = 1 - beta1 ** self.step_count
                bc2 = 1 - beta2 ** self.step_count
                bc2_sqrt = torch.full((), math.sqrt(bc2), dtype=p.dtype, device=p.device)  # see the docstring
                denom = torch.sqrt(v, out=g.scratch("denom")).div_(bc2_sqrt).add_(hp["eps"])
                p.addcdiv_(m, denom, value=-lr / bc1)
            for off, n, param, state in kept:
                g.flat_param[off:off + n].copy_(param)
                for k, t in state.items():
                    g.state[k][off:off + n].copy_(t)
        return loss

    @torch.no_grad()
    def zero_grad(self, set_to_none: bool = False) -> None:
        """Zero the flat gradient buffers (one op per group).  ``set_to_none=True`` also drops
        the ``.grad`` references; the next step treats a missing gradient as zero."""
        for g in self.groups:
            g.flat_grad.zero_()
            if set_to_none:
                for p in g.params:
                    p.grad = None

    # ---- inspection ------------------------------------------------------------------------
    def flat_grads(self) -> list[torch.Tensor]:
        """The flat gradient buffers (each ``p.grad`` is a view into one), bound and ready."""
        for g in self.groups:
            g.bind()
        return [g.flat_grad for g in self.groups]

    def flat_params(self) -> list[torch.Tensor]:
        return [g.flat_param for g in self.groups]

    def flat_state(self) -> dict[str, list[torch.Tensor]]:
        return {name: [g.state[name] for g in self.groups] for name in _STATE_NAMES[self.kind]}

    @property
    def state(self) -> dict:
        """``state[p]``: per-parameter views into the flat state, named as in torch.optim."""
        if self._state_views is None:
            views: dict = {}
            for g in self.groups:
                for p, off in zip(g.params, g.offsets):
                    views[p] = {name: g.state[name][off:off + p.numel()].view_as(p) for name in _STATE_NAMES[self.kind]}
            self._state_views = views
        step = torch.tensor(float(self.step_count))
        for s in self._state_views.values():
            s["step"] = step
        return self._state_views

    def describe(self) -> dict:
        numel = sum(g.numel for g in self.groups)
        params = sum(len(g.params) for g in self.groups)
        return {"optimizer": self.kind, "fused": True, "optimizer_ops_before_fusion": params,
                "optimizer_ops": len(self.groups), "numel": numel, "grads_from": self.grads_from}

    def log_line(self) -> str:
        d = self.describe()
        return (f"Find {_PADDLE_NAMES[self.kind]} operators : {d['optimizer_ops_before_fusion']}, and "
                f"{d['optimizer_ops_before_fusion']} for dense gradients. To make the speed faster, those "
                f"optimization are fused during training ({d['optimizer_ops']} flat update(s), gradients from "
                f"{d['grads_from']}).")


def _buckets_cover(buckets: list, params: list[torch.nn.Parameter]) -> bool:
    """The buckets hold every trainable parameter exactly once, with the attributes we use."""
    try:
        ids = [id(p) for b in buckets for p in b.params]
        ok = all(hasattr(b, a) for b in buckets for a in ("flat", "params", "offsets", "numel"))
    except (AttributeError, TypeError):
        return False
    return ok and len(ids) == len(set(ids)) and set(ids) == {id(p) for p in params}


def build_fused_optimizer(model: torch.nn.Module, config: StrategyConfig, grad_sync=None) -> FlatOptimizer:
    """The engine's plug point (``fuse_all_optimizer_ops``).  The gradient buckets are its gradient buffers only
    where the gradients are their views (``gradient_as_bucket_view``); with copies it keeps its own flat
    gradient buffers, which the buckets copy from and back into."""
    sparse = sparse_gradient_names(model)
    if sparse:
        raise ValueError(sparse_gradients_refused("the fused optimizer's flat gradient buffer", sparse))
    buckets = getattr(grad_sync, "buckets", None) if grad_sync is not None else None
    if buckets and not all(getattr(b, "as_views", True) for b in buckets):
        buckets = None
    seen: set[int] = set()
    params = []
    for p in model.parameters():
        if p.requires_grad and id(p) not in seen:
            seen.add(id(p))
            params.append(p)
    opt = FlatOptimizer(params, config.optimizer, lr=config.lr,
                        momentum=config.momentum if config.optimizer == "momentum" else 0.0,
                        weight_decay=config.weight_decay, buckets=buckets)
    log.info(opt.log_line())
    return opt
