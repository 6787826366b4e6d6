"""Fused ops: each a real ``torch.autograd.Function`` (one forward, one backward) that keeps
fewer bytes for backward than the unfused pair of ops it replaces.

=====================  =========================================  =====================================
fused op               unfused pair keeps for backward            the fused op keeps
=====================  =========================================  =====================================
BatchNorm → ReLU       BN: its input x (+ mean, invstd, weight);   x (+ mean, invstd, weight, bias); the
                       ReLU: its output y                          ReLU mask is recomputed from x
add → ReLU             ReLU: its output y (add keeps nothing)      the mask ``y > 0`` as bool (1 byte
                                                                   per element instead of 4 in fp32)
ReLU → depthwise conv  ReLU: its output r; conv: r again + weight  r once (+ weight); the ReLU mask is
                                                                   ``r > 0``
=====================  =========================================  =====================================

BN → ReLU keeps BN's *input* rather than its output: BN's backward needs the normalised
input at every position, including where the ReLU clipped to zero, and the output does not
hold it there (InPlace-ABN keeps the output only because it uses an invertible leaky ReLU).
The ReLU's mask is recomputed from x with the very same expression as in the forward, so it
is bit-identical.

The arithmetic lives in plain functions (``*_fwd`` / ``*_bwd``) that the autograd Functions
call through a kernel table: ``eager`` runs them as written; ``compile`` runs them through
``torch.compile`` so a compiler can fuse their pointwise chains into few kernels
(``fusion_backend='compile'``).  each fused model's :class:`Kernels` records what actually ran.

Mixed precision: the ops follow autocast as the unfused pair does (the depthwise conv runs
in the autocast dtype; BN and ReLU run in the dtype they are given, BN's statistics in fp32).
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn.modules.conv import _ConvNd

__all__ = ["BatchNormReLUFunction", "AddReLUFunction", "ReLUConvFunction", "BatchNormReLU", "AddReLU",
           "ReLUDepthwiseConv", "Kernels", "EAGER", "is_depthwise"]

log = logging.getLogger("suite.compute.fused_ops")


# ---------------------------------------------------------------------------------------
# The arithmetic (plain functions, so torch.compile can take them as they are)
# ---------------------------------------------------------------------------------------
def _acc(t: torch.Tensor) -> torch.Tensor:
    """``t`` in the accumulation dtype: at least float32 (half precision is upcast; float64 stays float64)."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


def _bcast(v: torch.Tensor, ndim: int) -> torch.Tensor:
    return v.view([1, -1] + [1] * (ndim - 2))


def bn_relu_train_fwd(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float):
    """Batch statistics; returns (y, mean, biased var, invstd).  Statistics in at least fp32."""
    dims = [0] + list(range(2, x.dim()))
    xf = _acc(x)
    var, mean = torch.var_mean(xf, dim=dims, correction=0)
    invstd = torch.rsqrt(var + eps)
    scale = invstd * weight
    shift = bias - mean * scale
    y = torch.relu(xf * _bcast(scale, x.dim()) + _bcast(shift, x.dim()))
    return y.to(x.dtype), mean, var, invstd


def bn_relu_train_bwd(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                      mean: torch.Tensor, invstd: torch.Tensor):
    """Gradients (dx, dweight, dbias) of relu(batch_norm(x)) with batch statistics."""
    nd = x.dim()
    dims = [0] + list(range(2, nd))
    n = x.numel() // x.shape[1]
    xf = _acc(x)
    scale = invstd * weight
    shift = bias - mean * scale
    mask = (xf * _bcast(scale, nd) + _bcast(shift, nd)) > 0  # the forward's expression: the same mask
    gy = torch.where(mask, _acc(dy), 0.0)
    xhat = (xf - _bcast(mean, nd)) * _bcast(invstd, nd)
    dbias = gy.sum(dims)
    dweight = (gy * xhat).sum(dims)
    dx = _bcast(scale, nd) * (gy - (_bcast(dbias, nd) + xhat * _bcast(dweight, nd)) * (1.0 / n))  # no / int
    return dx.to(x.dtype), dweight, dbias


def bn_relu_eval_fwd(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, running_mean: torch.Tensor,
                     running_var: torch.Tensor, eps: float):
    invstd = torch.rsqrt(_acc(running_var) + eps)
    scale = invstd * weight
    shift = bias - _acc(running_mean) * scale
    y = torch.relu(_acc(x) * _bcast(scale, x.dim()) + _bcast(shift, x.dim()))
    return y.to(x.dtype), invstd


def bn_relu_eval_bwd(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                     running_mean: torch.Tensor, invstd: torch.Tensor):
    nd = x.dim()
    dims = [0] + list(range(2, nd))
    xf = _acc(x)
    scale = invstd * weight
    shift = bias - _acc(running_mean) * scale
    mask = (xf * _bcast(scale, nd) + _bcast(shift, nd)) > 0
    gy = torch.where(mask, _acc(dy), 0.0)
    xhat = (xf - _bcast(_acc(running_mean), nd)) * _bcast(invstd, nd)
    return (gy * _bcast(scale, nd)).to(x.dtype), (gy * xhat).sum(dims), gy.sum(dims)


def add_relu_fwd(a: torch.Tensor, b: torch.Tensor):
    y = torch.relu(a + b)
    return y, y > 0


def add_relu_bwd(dy: torch.Tensor, mask: torch.Tensor):
    return torch.where(mask, dy, 0.0)


def relu_conv_fwd(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, stride, padding, dilation,
                  groups: int):
    r = torch.relu(x)
    z = torch.ops.aten.convolution(r, weight, bias, stride, padding, dilation, False, [0] * len(stride), groups)
    return z, r


def relu_conv_bwd(dz: torch.Tensor, r: torch.Tensor, weight: torch.Tensor, has_bias: bool, stride, padding,
                  dilation, groups: int, needs_x: bool, needs_w: bool):
    gi, gw, gb = torch.ops.aten.convolution_backward(
        dz, r, weight, [weight.shape[0]] if has_bias else None, stride, padding, dilation, False,
        [0] * len(stride), groups, [needs_x, needs_w, has_bias])
    dx = torch.where(r > 0, gi, 0.0) if needs_x else None
    return dx, gw, gb


_EAGER: dict[str, Callable[..., Any]] = {
    "bn_relu_train_fwd": bn_relu_train_fwd, "bn_relu_train_bwd": bn_relu_train_bwd,
    "bn_relu_eval_fwd": bn_relu_eval_fwd, "bn_relu_eval_bwd": bn_relu_eval_bwd,
    "add_relu_fwd": add_relu_fwd, "add_relu_bwd": add_relu_bwd,
    "relu_conv_fwd": relu_conv_fwd, "relu_conv_bwd": relu_conv_bwd,
}

_COMPILED: dict[str, Callable[..., Any]] = {}


class Kernels:
    """Which implementation of the arithmetic the fused ops of one model run, and what ran.

    ``requested`` is the config's ``fusion_backend``; ``ran`` is filled by the first fused call
    ("eager", "compile", or "eager (compile failed: ...)" when the compiler is unavailable).
    One per fused model, so an eager and a compiled model can run side by side in one process.
    """

    def __init__(self, requested: str = "eager"):
        if requested not in ("eager", "compile"):
            raise ValueError(f"fusion_backend={requested!r}: allowed values are 'eager', 'compile'")
        # one dict, updated in place: the fusion report holds this very dict
        self.info: dict = {"requested": requested, "ran": None, "error": None}

    def __call__(self, name: str, *args):
        info = self.info
        if info["requested"] != "compile" or info["error"] is not None:
            info["ran"] = info["ran"] or "eager"
            return _EAGER[name](*args)
        fn = _COMPILED.get(name)
        if fn is None:
            fn = _COMPILED[name] = torch.compile(_EAGER[name], dynamic=False)
        try:
            out = fn(*args)
            info["ran"] = "compile"
            return out
        except Exception as exc:  # noqa: BLE001 - the compiler's many failure types
            info["error"] = f"{type(exc).__name__}: {exc}"[:300]
            info["ran"] = f"eager (compile failed: {info['error']})"
            log.warning("fusion_backend='compile': torch.compile failed (%s); running the fused ops eagerly",
                        info["error"])
            return _EAGER[name](*args)


EAGER = Kernels("eager")


# ---------------------------------------------------------------------------------------
# Autograd functions
# ---------------------------------------------------------------------------------------
class BatchNormReLUFunction(torch.autograd.Function):
    """relu(batch_norm(x)); running statistics updated in place as BatchNorm does."""

    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, use_batch_stats: bool, momentum: float,
                eps: float, kernels: Kernels = EAGER):
        C = x.shape[1]
        w = weight if weight is not None else torch.ones(C, device=x.device)
        b = bias if bias is not None else torch.zeros(C, device=x.device)
        w, b = _acc(w.detach()), _acc(b.detach())
        if use_batch_stats:
            y, mean, var, invstd = kernels("bn_relu_train_fwd", x, w, b, eps)
            if running_mean is not None:
                n = x.numel() // C
                with torch.no_grad():
                    running_mean.mul_(1 - momentum).add_(mean.to(running_mean.dtype), alpha=momentum)
                    unbiased = var * (n / max(n - 1, 1))
                    running_var.mul_(1 - momentum).add_(unbiased.to(running_var.dtype), alpha=momentum)
            ctx.save_for_backward(x, w, b, mean, invstd)
        else:
            y, invstd = kernels("bn_relu_eval_fwd", x, w, b, running_mean, running_var, eps)
            ctx.save_for_backward(x, w, b, running_mean, invstd)
        ctx.kernels = kernels
        ctx.use_batch_stats = use_batch_stats
        ctx.affine = (weight is not None, bias is not None)
        ctx.param_dtypes = (None if weight is None else weight.dtype, None if bias is None else bias.dtype)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, w, b, mean, invstd = ctx.saved_tensors
        name = "bn_relu_train_bwd" if ctx.use_batch_stats else "bn_relu_eval_bwd"
        dx, dw, db = ctx.kernels(name, dy.contiguous(), x, w, b, mean, invstd)
        dw = dw.to(ctx.param_dtypes[0]) if ctx.affine[0] and ctx.needs_input_grad[1] else None
        db = db.to(ctx.param_dtypes[1]) if ctx.affine[1] and ctx.needs_input_grad[2] else None
        return (dx if ctx.needs_input_grad[0] else None), dw, db, None, None, None, None, None, None


class AddReLUFunction(torch.autograd.Function):
    """relu(a + b), keeping only the bool mask for backward."""

    @staticmethod
    def forward(ctx, a, b, kernels: Kernels = EAGER):
        y, mask = kernels("add_relu_fwd", a, b)
        ctx.save_for_backward(mask)
        ctx.kernels = kernels
        ctx.shapes = (a.shape, b.shape)
        ctx.dtypes = (a.dtype, b.dtype)
        return y

    @staticmethod
    def backward(ctx, dy):
        (mask,) = ctx.saved_tensors
        g = ctx.kernels("add_relu_bwd", dy, mask)
        out = []
        for i in range(2):
            if not ctx.needs_input_grad[i]:
                out.append(None)
                continue
            gi = g if g.shape == ctx.shapes[i] else g.sum_to_size(ctx.shapes[i])
            out.append(gi.to(ctx.dtypes[i]))
        return out[0], out[1], None


def _autocast_dtype(device_type: str) -> torch.dtype | None:
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return None


class ReLUConvFunction(torch.autograd.Function):
    """conv(relu(x), weight, bias); keeps relu(x) once (the conv needs it; the mask is ``> 0``)."""

    @staticmethod
    def forward(ctx, x, weight, bias, stride, padding, dilation, groups, kernels: Kernels = EAGER):
        cast = _autocast_dtype(x.device.type)
        wc = weight.to(cast) if cast is not None else weight
        bc = bias.to(cast) if (cast is not None and bias is not None) else bias
        xc = x.to(cast) if cast is not None else x
        with torch.autocast(x.device.type, enabled=False):
            z, r = kernels("relu_conv_fwd", xc, wc, bc, stride, padding, dilation, groups)
        ctx.save_for_backward(r, weight)
        ctx.kernels = kernels
        ctx.conf = (stride, padding, dilation, groups, cast, x.dtype, bias is not None)
        return z

    @staticmethod
    def backward(ctx, dz):
        r, weight = ctx.saved_tensors
        stride, padding, dilation, groups, cast, x_dtype, has_bias = ctx.conf
        wc = weight.to(cast) if cast is not None else weight
        dz = dz.to(r.dtype)
        dx, gw, gb = ctx.kernels("relu_conv_bwd", dz.contiguous(), r, wc, has_bias, stride, padding, dilation,
                                 groups, ctx.needs_input_grad[0], ctx.needs_input_grad[1])
        dx = dx.to(x_dtype) if dx is not None else None
        gw = gw.to(weight.dtype) if (gw is not None and ctx.needs_input_grad[1]) else None
        gb = gb.to(weight.dtype) if (gb is not None and has_bias and ctx.needs_input_grad[2]) else None
        return dx, gw, gb, None, None, None, None, None


# ---------------------------------------------------------------------------------------
# Modules the pass installs (same parameter and buffer names as the module they replace)
# ---------------------------------------------------------------------------------------
class BatchNormReLU(nn.Module):
    """A BatchNorm fused with the ReLU after it; shares the BatchNorm's parameters and buffers."""

    def __init__(self, bn: nn.modules.batchnorm._BatchNorm, kernels: Kernels = EAGER):
        super().__init__()
        self.num_features, self.eps, self.momentum = bn.num_features, bn.eps, bn.momentum
        self.affine, self.track_running_stats = bn.affine, bn.track_running_stats
        self.weight = bn.weight
        self.bias = bn.bias
        self.register_buffer("running_mean", bn.running_mean)
        self.register_buffer("running_var", bn.running_var)
        self.num_batches_tracked: torch.Tensor | None
        self.register_buffer("num_batches_tracked", bn.num_batches_tracked)
        self.train(bn.training)
        self.source = type(bn).__name__
        self.kernels = kernels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # BatchNorm's own rules (nn.modules.batchnorm._BatchNorm.forward).
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            factor = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
        use_batch_stats = self.training or (self.running_mean is None and self.running_var is None)
        tracked = not self.training or self.track_running_stats
        rm = self.running_mean if tracked else None
        rv = self.running_var if tracked else None
        return BatchNormReLUFunction.apply(x, self.weight, self.bias, rm, rv, use_batch_stats, factor, self.eps,
                                           self.kernels)

    def extra_repr(self) -> str:
        return f"{self.num_features}, eps={self.eps}, momentum={self.momentum} (fused {self.source} + ReLU)"


class AddReLU(nn.Module):
    """Fused ``relu(a + b)``; plain ops when an operand is not a floating-point tensor."""

    def __init__(self, kernels: Kernels = EAGER):
        super().__init__()
        self.kernels = kernels

    def forward(self, a, b):
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.is_floating_point() \
                and b.is_floating_point():
            return AddReLUFunction.apply(a, b, self.kernels)
        return torch.relu(a + b)


def is_depthwise(conv: nn.Module | None) -> bool:
    return (isinstance(conv, (nn.Conv1d, nn.Conv2d, nn.Conv3d)) and conv.groups > 1
            and conv.groups == conv.in_channels and conv.out_channels % conv.in_channels == 0)


class ReLUDepthwiseConv(nn.Module):
    """A ReLU fused into the depthwise conv after it; shares the conv's weight and bias."""

    def __init__(self, conv: _ConvNd, kernels: Kernels = EAGER):
        super().__init__()
        if conv.padding_mode != "zeros" or (isinstance(conv.padding, str) and conv.padding != "valid"):
            raise ValueError(f"padding={conv.padding!r}, padding_mode={conv.padding_mode!r} (fused: zeros, explicit)")
        nd = len(conv.kernel_size)
        self.weight = conv.weight
        self.bias = conv.bias
        self.stride = list(conv.stride)
        self.padding = [0] * nd if isinstance(conv.padding, str) else list(conv.padding)
        self.dilation = list(conv.dilation)
        self.groups = conv.groups
        self.source = repr(conv)
        self.kernels = kernels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ReLUConvFunction.apply(x, self.weight, self.bias, self.stride, self.padding, self.dilation,
                                      self.groups, self.kernels)

    def extra_repr(self) -> str:
        return f"ReLU + {self.source}"
