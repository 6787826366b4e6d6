"""Single-process references that a strategy's training must match, step by step.

The interface (every reference fills it):

    ref = SomeReference(model, loss_fn, config, world)
    out = ref.step(shards)      # shards: one (inputs, targets) per rank, in rank order
    out.losses[r]               # the loss rank r should report
    out.params_for(r)           # the parameters rank r should hold after the step
    out.buffers[r]              # the buffers rank r should hold after the step

:class:`DataParallelReference` is synchronous data parallel: one process runs each rank's
shard through the model separately (so BatchNorm normalises over the shard each rank
sees), averages the shards' gradients and steps once.  Buffers follow DDP's rule: every
shard starts from rank 0's buffers (broadcast before each forward), so rank r ends the
step with rank 0's buffers updated by shard r's statistics.

Strategies whose semantics differ bring their own reference (Local SGD: one model per
rank; AMP: the same autocast and scaler) through :func:`make_reference`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from ..config import StrategyConfig
from ..strategies.optim import torch_optimizer

__all__ = ["StepRef", "DataParallelReference", "make_reference"]


def snapshot(tensors: dict) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in tensors.items()}


@dataclass
class StepRef:
    losses: list[float]
    params: list[dict[str, torch.Tensor]]  # one per rank (all the same in synchronous data parallel)
    buffers: list[dict[str, torch.Tensor]] = field(default_factory=list)

    def params_for(self, rank: int) -> dict[str, torch.Tensor]:
        return self.params[rank if len(self.params) > 1 else 0]


class DataParallelReference:
    name = "data_parallel"

    def __init__(self, model: torch.nn.Module, loss_fn: Callable, config: StrategyConfig, world: int):
        self.model = model
        self.loss_fn = loss_fn
        self.config = config
        self.world = world
        self.optimizer = torch_optimizer(model.parameters(), config)
        self.params = [p for p in model.parameters() if p.requires_grad]

    def forward_loss(self, inputs, targets) -> torch.Tensor:
        return self.loss_fn(self.model(inputs), targets)

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def apply_update(self, grads: list[torch.Tensor]) -> None:
        for p, g in zip(self.params, grads):
            p.grad = g
        self.optimizer.step()

    def step(self, shards) -> StepRef:
        start_buffers = snapshot(dict(self.model.named_buffers()))
        sums = [torch.zeros_like(p) for p in self.params]
        losses, buffers = [], []
        for inputs, targets in shards:
            _load(self.model, start_buffers)
            for p in self.params:
                p.grad = None
            loss = self.forward_loss(inputs, targets)
            self.backward(loss)
            losses.append(loss.item())
            buffers.append(snapshot(dict(self.model.named_buffers())))
            for s, p in zip(sums, self.params):
                if p.grad is not None:
                    s.add_(p.grad)
        self.apply_update([s / self.world for s in sums])
        if buffers:
            _load(self.model, buffers[0])  # rank 0's buffers are what the next step broadcasts
        return StepRef(losses, [snapshot(dict(self.model.named_parameters()))], buffers)


def _load(model: torch.nn.Module, buffers: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for name, buf in model.named_buffers():
            buf.copy_(buffers[name])


def make_reference(model, loss_fn, config: StrategyConfig, world: int):
    """The reference that fits ``config``: each strategy with its own semantics brings one."""
    if config.local_sgd_enabled:
        from ..strategies.local_sgd import LocalSGDReference

        return LocalSGDReference(model, loss_fn, config, world)
    if config.amp != "off":
        from ..strategies.amp import AmpReference

        return AmpReference(model, loss_fn, config, world)
    return DataParallelReference(model, loss_fn, config, world)
