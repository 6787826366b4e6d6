"""Mixed precision: autocast (bf16/fp16) and loss scaling (static, or dynamic with Paddle's rule).

The engine's calls, in step order:
    with amp.autocast(): forward
    amp.scale_loss(loss).backward()
    skip = amp.unscale_and_check(optimizer)   # found-inf reduced over the group: every rank agrees
    if not skip: optimizer.step()
    amp.update(skip)

- ``amp='bf16'``: autocast to bfloat16 (CPU and CUDA).  Loss scaling is off unless asked for
  (``use_dynamic_loss_scaling`` or ``init_loss_scaling``): bf16 has fp32's exponent range.
- ``amp='fp16'``: autocast to float16 (CUDA; CPU where this torch supports it, checked at
  construction).  Dynamic loss scaling by default, as in Paddle.
- Master weights stay fp32 (autocast casts per op; parameters are never converted).

Loss scaling (Paddle's ``update_loss_scaling`` op, defaults ``init_loss_scaling`` 32768,
``incr_every_n_steps`` 1000, ``decr_every_n_nan_or_inf`` 2, ``incr_ratio`` 2.0, ``decr_ratio`` 0.8):

- a good step resets the bad count and advances the good count; when the good count reaches
  ``incr_every_n_steps`` the scale grows by ``incr_ratio`` (if still finite) and the count resets;
- a bad step (inf/nan in any gradient on any rank) resets the good count and advances the bad
  count; when the consecutive bad count reaches ``decr_every_n_nan_or_inf`` the scale shrinks by
  ``decr_ratio``, not below 1, and the count resets.

With loss scaling on (static or dynamic), gradients are unscaled after communication and
checked; the found-inf flag is MAX-allreduced over the group (through
``suite.comm.collectives``) so every rank skips the same steps.  Skipped steps are counted
(:meth:`Amp.state`).  Static scaling never changes the scale but still skips bad steps.

The harness's reference for AMP (``suite.check.reference.AmpReference``) runs synchronous data
parallel under the same autocast and the same loss-scaling rule (:class:`LossScaler`).
"""
from __future__ import annotations

import contextlib
import math
import warnings

import torch

from ..comm import collectives as C
from ..config import StrategyConfig

__all__ = ["Amp", "LossScaler", "autocast_dtype", "check_amp_supported", "unscale_"]

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
_SUPPORT: dict = {}


def autocast_dtype(amp: str) -> torch.dtype | None:
    return _DTYPES.get(amp)


def check_amp_supported(amp: str, device_type: str) -> None:
    """Clear error when this torch cannot autocast ``device_type`` to ``amp``'s dtype (probed once)."""
    if amp == "off":
        return
    key = (amp, device_type)
    if key not in _SUPPORT:
        dtype = _DTYPES[amp]
        reason = None
        if device_type not in ("cpu", "cuda"):
            reason = f"autocast on device type {device_type!r} is not supported by fleetbench (cpu, cuda)"
        elif device_type == "cuda" and amp == "bf16" and not torch.cuda.is_bf16_supported():
            reason = "this GPU does not support bfloat16"
        else:
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("error")  # torch warns and disables autocast for unsupported dtypes
                    with torch.autocast(device_type, dtype=dtype):
                        a = torch.ones(2, 2, device=device_type)
                        out = a @ a
                if out.dtype != dtype:
                    reason = f"a matmul under autocast came out {out.dtype}, not {dtype}"
            except Exception as exc:  # noqa: BLE001 - any failure means unsupported
                reason = f"{type(exc).__name__}: {exc}"
        _SUPPORT[key] = reason
    reason = _SUPPORT[key]
    if reason is not None:
        allowed = "'off', 'bf16'" if device_type == "cpu" else "'off', 'fp16'"
        raise ValueError(f"amp={amp!r} on device {device_type!r}: torch {torch.__version__} cannot autocast to "
                         f"{_DTYPES[amp]} here ({reason}); allowed here: {allowed}")


class LossScaler:
    """Paddle's loss-scaling rule (see the module docstring); pure host-side bookkeeping."""

    def __init__(self, config: StrategyConfig):
        self.enabled = config.loss_scaling_enabled
        self.dynamic = config.dynamic_loss_scaling
        self.scale = config.effective_init_loss_scaling if self.enabled else 1.0
        self.incr_every = config.incr_every_n_steps
        self.decr_every = config.decr_every_n_nan_or_inf
        self.incr_ratio = config.incr_ratio
        self.decr_ratio = config.decr_ratio
        self.good_steps = 0
        self.bad_steps = 0
        self.skipped_steps = 0

    def update(self, found_inf: bool) -> None:
        if found_inf:
            self.skipped_steps += 1
        if not self.dynamic:
            return
        if found_inf:
            self.good_steps = 0
            self.bad_steps += 1
            if self.bad_steps == self.decr_every:
                self.scale = max(self.scale * self.decr_ratio, 1.0)
                self.bad_steps = 0
        else:
            self.bad_steps = 0
            self.good_steps += 1
            if self.good_steps == self.incr_every:
                grown = self.scale * self.incr_ratio
                if math.isfinite(grown):
                    self.scale = grown
                self.good_steps = 0

    def state(self) -> dict:
        return {"scale": self.scale, "good_steps": self.good_steps, "bad_steps": self.bad_steps,
                "skipped_steps": self.skipped_steps, "dynamic": self.dynamic, "enabled": self.enabled}


def _grads_of(optimizer) -> list[torch.Tensor]:
    if hasattr(optimizer, "flat_grads"):  # the fused optimizer: one buffer per group
        return optimizer.flat_grads()
    return [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]


def unscale_(grads: list[torch.Tensor], scale: float, device) -> torch.Tensor:
    """Multiply ``grads`` by 1/scale in place; a 1-element float tensor, 1.0 if any is inf/nan."""
    found = torch.zeros(1, dtype=torch.float32, device=device)
    if grads:
        inv = torch.full((), 1.0 / scale, dtype=torch.float32, device=device)
        torch._amp_foreach_non_finite_check_and_unscale_(grads, found, inv)
    return found


class Amp:
    def __init__(self, config: StrategyConfig, group=None, device_type: str = "cpu"):
        self.config = config
        self.group = group
        self.device_type = device_type
        self.enabled = config.amp != "off"
        check_amp_supported(config.amp, device_type)
        self.dtype = autocast_dtype(config.amp)
        self.scaler = LossScaler(config)
        self.scaling = self.scaler.enabled

    # counters, readable as attributes
    @property
    def scale(self) -> float:
        return self.scaler.scale

    @property
    def good_steps(self) -> int:
        return self.scaler.good_steps

    @property
    def bad_steps(self) -> int:
        return self.scaler.bad_steps

    @property
    def skipped_steps(self) -> int:
        return self.scaler.skipped_steps

    def autocast(self):
        if not self.enabled:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        if not self.scaling:
            return loss
        return loss.float() * self.scaler.scale

    def unscale_and_check(self, optimizer, agree: bool = True) -> bool:
        """Unscale the gradients; True when inf/nan was found: skip the step.

        ``agree`` (a step whose gradients were communicated): the found-inf flag is reduced over
        the group, so every rank skips together.  On a Local SGD local step nothing was
        communicated and no collective may run: each rank decides on its own gradients.
        """
        if not self.scaling:
            return False
        grads = _grads_of(optimizer)
        device = grads[0].device if grads else torch.device(self.device_type)
        found = unscale_(grads, self.scaler.scale, device)
        import torch.distributed as dist

        if agree and dist.is_initialized() and dist.get_world_size(self.group) > 1:
            C.all_reduce(found, group=self.group, op=dist.ReduceOp.MAX)
        return bool(found.item() > 0)  # the one host decision AMP must make

    def update(self, skipped: bool) -> None:
        if self.scaling:
            self.scaler.update(skipped)

    def state(self) -> dict:
        return self.scaler.state()
