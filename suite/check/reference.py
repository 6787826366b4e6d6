"""Single-process references that a strategy's training must match, step by step.

The interface (every reference fills it):

    ref = SomeReference(model, loss_fn, config, world)
    out = ref.step(shards)      # shards: one (inputs, targets) per rank, in rank order
    out.losses[r]               # the loss rank r should report
    out.params_for(r)           # the parameters rank r should hold after the step
    out.buffers[r]              # the buffers rank r should hold after the step

:class:`DataParallelReference` is synchronous data parallel: one process runs each rank's
shard through the model separately (so BatchNorm normalises over the shard each rank
sees), averages the shards' gradients and steps once.  Before rank r's shard of step t it sets
torch's generators as the engine on rank r did before its forward (``suite.runtime.rng``: from
(seed, r, t)), so dropout and any other draw from torch's default generators replay exactly.
Buffers follow DDP's rule: every shard starts from rank 0's buffers (broadcast before each
forward), so rank r ends the step with rank 0's buffers updated by shard r's statistics.

"No gradient" stays None where torch keeps it None.  The engine zeroes gradients in place between
steps (``zero_grad(set_to_none=False)``), so a parameter's gradient exists from the first step in
which any rank gave it one; before that it is None, and torch.optim skips it (no weight decay, no
momentum), as torch DDP leaves a globally unused parameter's gradient untouched
(``Reducer::finalize_bucket_dense``) and one process would.  A parameter that some shards used and
others did not gets the average over every shard, the missing ones counted as zeros (DDP's rule).

Strategies whose semantics differ have their own reference here, picked by
:func:`make_reference`: :class:`LocalSGDReference` (one model and optimizer per rank) and
:class:`AmpReference` (the same autocast and loss scaler).  The references import the
strategies' small pure helpers (the loss-scaling rule); the strategies never import the check.
"""
from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..compute.fusion import fuse_model
from ..config import StrategyConfig
from ..engine import call_model
from ..runtime.rng import seed_step
from ..strategies.amp import LossScaler, autocast_dtype, check_amp_supported, unscale_
from ..strategies.optim import torch_optimizer

__all__ = ["StepRef", "DataParallelReference", "AmpReference", "LocalSGDReference", "make_reference"]


def snapshot(tensors: dict) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in tensors.items()}


@dataclass
class StepRef:
    losses: list[float]
    params: list[dict[str, torch.Tensor]]  # one per rank (all the same in synchronous data parallel)
    buffers: list[dict[str, torch.Tensor]] = field(default_factory=list)

    def params_for(self, rank: int) -> dict[str, torch.Tensor]:
        return self.params[rank if len(self.params) > 1 else 0]


class Replay:
    """Rank r's random state at step t, as the engine set it before its forward (``rng_seed`` None: none set)."""

    def __init__(self, model: torch.nn.Module, rng_seed: int | None):
        self.rng_seed = rng_seed
        self.device = next(iter(model.parameters())).device
        self.t = 0  # the step being replayed (1-based, as the engine counts)

    def next_step(self) -> None:
        self.t += 1

    def state_of(self, rank: int) -> None:
        if self.rng_seed is not None:
            seed_step(self.rng_seed, rank, self.t, self.device)


class DataParallelReference:
    name = "data_parallel"

    def __init__(self, model: torch.nn.Module, loss_fn: Callable, config: StrategyConfig, world: int,
                 rng_seed: int | None = None):
        self.model = model
        self.loss_fn = loss_fn
        self.config = config
        self.world = world
        self.optimizer = torch_optimizer(model.parameters(), config)
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.defined = [False] * len(self.params)  # a gradient exists (the engine zeroes it in place from then on)
        self.replay = Replay(model, rng_seed)

    def forward_loss(self, inputs, targets) -> torch.Tensor:
        return self.loss_fn(call_model(self.model, inputs), targets)

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def apply_update(self, grads: list[torch.Tensor | None]) -> None:
        for p, g in zip(self.params, grads):
            p.grad = g
        self.optimizer.step()

    def step(self, shards) -> StepRef:
        start_buffers = snapshot(dict(self.model.named_buffers()))
        sums = [torch.zeros_like(p) for p in self.params]
        losses, buffers = [], []
        self.replay.next_step()
        for rank, (inputs, targets) in enumerate(shards):
            _load(self.model, start_buffers)
            for p in self.params:
                p.grad = None
            self.replay.state_of(rank)
            loss = self.forward_loss(inputs, targets)
            self.backward(loss)
            losses.append(loss.item())
            buffers.append(snapshot(dict(self.model.named_buffers())))
            for i, (s, p) in enumerate(zip(sums, self.params)):
                if p.grad is not None:
                    s.add_(p.grad)
                    self.defined[i] = True
        self.apply_update([s / self.world if defined else None for s, defined in zip(sums, self.defined)])
        if buffers:
            _load(self.model, buffers[0])  # rank 0's buffers are what the next step broadcasts
        return StepRef(losses, [snapshot(dict(self.model.named_parameters()))], buffers)


def _load(model: torch.nn.Module, buffers: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for name, buf in model.named_buffers():
            buf.copy_(buffers[name])


class AmpReference(DataParallelReference):
    """Synchronous data parallel in one process, under the engine's autocast and loss scaling.

    With compute fusion on, the reference runs the same fused ops (eagerly): in half precision
    two correct implementations of BN+ReLU differ by rounding, so comparing a fused engine with
    unfused half-precision kernels would measure bf16 noise, not the composition.  Fused ops
    equal the unfused pair in fp32 (tests/test_fusion.py); under autocast they are compared
    with a half-precision tolerance there too.
    """

    name = "amp"

    def __init__(self, model: torch.nn.Module, loss_fn, config: StrategyConfig, world: int,
                 rng_seed: int | None = None):
        if config.compute_fusion_enabled:
            model, _ = fuse_model(model, bn_act=config.fuse_bn_act_ops,
                                  elewise_add_act=config.fuse_elewise_add_act_ops,
                                  relu_depthwise_conv=config.fuse_relu_depthwise_conv)
        super().__init__(model, loss_fn, config, world, rng_seed)
        device = next(iter(model.parameters())).device
        self.device_type = device.type
        check_amp_supported(config.amp, self.device_type)
        self.dtype = autocast_dtype(config.amp)
        self.scaler = LossScaler(config)

    def forward_loss(self, inputs, targets) -> torch.Tensor:
        with torch.autocast(self.device_type, dtype=self.dtype):
            return self.loss_fn(call_model(self.model, inputs), targets)

    def backward(self, loss: torch.Tensor) -> None:
        if self.scaler.enabled:
            (loss.float() * self.scaler.scale).backward()
        else:
            loss.backward()

    def apply_update(self, grads: list[torch.Tensor | None]) -> None:
        if self.scaler.enabled:
            present = [g for g in grads if g is not None]
            found = unscale_(present, self.scaler.scale, present[0].device if present else "cpu")
            skip = bool(found.item() > 0)
            self.scaler.update(skip)
            if skip:
                return
        super().apply_update(grads)


# ---------------------------------------------------------------------------------------------
# The independent reference: every rank simulated in one process.
# ---------------------------------------------------------------------------------------------

class LocalSGDReference:
    """One model and one optimizer per rank, in one process.

    Synchronous steps (1..W): every rank starts from rank 0's buffers (DDP's broadcast), runs
    its shard, the gradients are averaged and every rank steps with the average.  Local steps:
    every rank runs its own shard through its own model with its own buffers and optimizer.
    Gradients that do not exist stay None as in :class:`DataParallelReference` (per rank on local
    steps: a rank's gradient exists once that rank had one, or a synchronous step averaged one).
    After each due step the parameters are averaged (buffers are not).  The adaptive interval
    is recomputed here from the rank-averaged losses, written out again on purpose.
    """

    name = "local_sgd"

    def __init__(self, model: torch.nn.Module, loss_fn: Callable, config: StrategyConfig, world: int,
                 rng_seed: int | None = None):
        self.loss_fn = loss_fn
        self.world = world
        self.replay = Replay(model, rng_seed)
        self.models = [copy.deepcopy(model) for _ in range(world)]
        self.optimizers = [torch_optimizer(m.parameters(), config) for m in self.models]
        self.params = [[p for p in m.parameters() if p.requires_grad] for m in self.models]
        self.defined = [[False] * len(ps) for ps in self.params]  # per rank: the engine's gradient exists
        self.warm = config.local_sgd_is_warm_steps
        self.adaptive = config.use_adaptive_local_sgd
        self.init_k = config.init_k_steps
        self.k = self.init_k if self.adaptive else config.local_sgd_steps
        self.lr = config.lr
        self.next_average = self.warm + self.k
        self.loss0: float | None = None
        self.t = 0
        self.ks: list[int] = []

    def step(self, shards):
        self.t += 1
        sync = self.t <= self.warm
        if sync:  # rank 0's buffers are broadcast before the forward of a synchronous step
            start = snapshot(dict(self.models[0].named_buffers()))
            for m in self.models:
                with torch.no_grad():
                    for name, b in m.named_buffers():
                        b.copy_(start[name])
        losses = []
        self.replay.next_step()
        for rank, (m, ps, (inputs, targets)) in enumerate(zip(self.models, self.params, shards)):
            for p in ps:
                p.grad = None
            self.replay.state_of(rank)
            loss = self.loss_fn(call_model(m, inputs), targets)
            loss.backward()
            losses.append(loss.item())
            for i, p in enumerate(ps):
                self.defined[rank][i] |= p.grad is not None
        if sync:
            for i in range(len(self.params[0])):
                if not any(d[i] for d in self.defined):
                    continue  # no rank has ever had a gradient for it: None everywhere, skipped by the optimizer
                grads = [ps[i].grad if ps[i].grad is not None else torch.zeros_like(ps[i]) for ps in self.params]
                mean = torch.stack(grads).sum(0) / self.world
                for r, ps in enumerate(self.params):
                    ps[i].grad = mean.clone()
                    self.defined[r][i] = True
        else:  # a local step: a gradient this rank has had before and did not get now is zeros (zeroed in place)
            for d, ps in zip(self.defined, self.params):
                for i, p in enumerate(ps):
                    if p.grad is None and d[i]:
                        p.grad = torch.zeros_like(p)
        for opt in self.optimizers:
            opt.step()
        mean_loss = sum(losses) / self.world
        if self.adaptive and self.t == 1:  # Paddle's loss_0: the rank-averaged loss of step 1
            self.loss0 = mean_loss
        averaged = self.t == self.next_average
        if averaged:
            with torch.no_grad():
                for i in range(len(self.params[0])):
                    mean = torch.stack([ps[i].detach() for ps in self.params]).sum(0) / self.world
                    for ps in self.params:
                        ps[i].copy_(mean)
            if self.adaptive:
                value = math.sqrt(self.lr * mean_loss / (self.lr * self.loss0) * self.init_k)
                self.k = max(1, min(16, math.ceil(value)))
            self.ks.append(self.k)
            self.next_average = self.t + self.k
        if sync or averaged:
            params = [snapshot(dict(self.models[0].named_parameters()))]
        else:
            params = [snapshot(dict(m.named_parameters())) for m in self.models]
        buffers = [snapshot(dict(m.named_buffers())) for m in self.models]
        return StepRef(losses, params, buffers)


def make_reference(model, loss_fn, config: StrategyConfig, world: int, rng_seed: int | None = None):
    """The reference that fits ``config``: each strategy with its own semantics has one; ``rng_seed`` is the
    engine's (each rank's random state replayed before its shard)."""
    if config.local_sgd_enabled:
        return LocalSGDReference(model, loss_fn, config, world, rng_seed)
    if config.amp != "off":
        return AmpReference(model, loss_fn, config, world, rng_seed)
    return DataParallelReference(model, loss_fn, config, world, rng_seed)
