"""Mixed precision: autocast (bf16/fp16) and loss scaling (static, or dynamic with Paddle's rule).

The engine's calls, in step order:
    with amp.autocast(): forward
    amp.scale_loss(loss).backward()
    skip = amp.unscale_and_check(optimizer)   # found-inf reduced over the group: every rank agrees
    if not skip: optimizer.step()
    amp.update(skip)
"""
from __future__ import annotations

import contextlib

import torch

from ..config import StrategyConfig

__all__ = ["Amp"]


class Amp:
    def __init__(self, config: StrategyConfig, group=None, device_type: str = "cpu"):
        self.config = config
        self.group = group
        self.device_type = device_type
        self.enabled = config.amp != "off"
        self.scaling = config.loss_scaling_enabled
        self.scale = config.effective_init_loss_scaling if self.scaling else 1.0
        self.good_steps = 0
        self.bad_steps = 0
        self.skipped_steps = 0
        if self.enabled:
            raise NotImplementedError("amp is not implemented yet")

    def autocast(self):
        return contextlib.nullcontext()

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        return loss

    def unscale_and_check(self, optimizer) -> bool:
        return False

    def update(self, skipped: bool) -> None:
        return None

    def state(self) -> dict:
        return {"scale": self.scale, "good_steps": self.good_steps, "bad_steps": self.bad_steps,
                "skipped_steps": self.skipped_steps}
