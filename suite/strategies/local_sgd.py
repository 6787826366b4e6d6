"""Local SGD (Paddle ``use_local_sgd`` / ``use_adaptive_local_sgd``): fewer, larger synchronisations.

Semantics (steps are 1-based, W = ``local_sgd_is_warm_steps``, k = ``local_sgd_steps``):

- steps 1..W are synchronous data parallel (gradients averaged, rank 0's buffers broadcast
  before each forward, exactly as without Local SGD);
- from step W+1 on, gradients are not communicated: each rank steps its own optimizer on
  its own shard (optimizer state stays local, BatchNorm buffers stay local);
- after steps W+k, W+2k, … the *parameters* are averaged over the ranks, through the
  gradient communication's ``average_tensors`` (so the bucketed / hierarchical path is used
  when it is enabled).  Between two averagings no collective runs at all.

In torch's terms this is ``post_localSGD_hook`` with ``start_localSGD_iter = W`` (and
``post_local_gradient_allreduce = False``) plus ``PeriodicModelAverager(period=k,
warmup_steps=W+k-1)`` called after every optimizer step.

Adaptive (``use_adaptive_local_sgd``, Paddle's AdaptiveLocalSGD): the first interval is
``init_k_steps``; after each averaging

    k = ceil(sqrt(lr0 * loss / (lr * loss0) * init_k))   clamped to [1, 16]

with lr0 the initial learning rate, lr the current one, loss0 the rank-averaged loss at the
end of warm-up (step W, or step 1 when W = 0) and loss the rank-averaged loss of this
averaging step.  Both losses travel inside the averaging collective (a 2-element tensor
averaged with the parameters: the current loss and this rank's loss at the end of warm-up),
so adaptive Local SGD runs no collective of its own.

:class:`LocalSGDReference` is the independent single-process simulation the correctness
harness compares against: one model and one optimizer per rank.
"""
from __future__ import annotations

import copy
import math
from typing import Callable, Optional

import torch

from ..config import StrategyConfig

__all__ = ["LocalSGD", "LocalSGDReference", "adaptive_k", "MIN_K", "MAX_K", "averaging_steps"]

MIN_K, MAX_K = 1, 16


def adaptive_k(lr0: float, lr: float, loss0: float, loss: float, init_k: int) -> int:
    """Paddle's adaptive interval: ceil(sqrt(lr0*loss / (lr*loss0) * init_k)), clamped to [1, 16].

    A ratio that is not a number (nan losses) gives 1 (average at once); an infinite one
    (loss0 = 0) gives 16.
    """
    try:
        ratio = (lr0 * loss) / (lr * loss0) * init_k
    except ZeroDivisionError:
        ratio = math.inf if loss * lr0 > 0 else math.nan
    if math.isnan(ratio) or ratio <= 0:
        return MIN_K
    if math.isinf(ratio):
        return MAX_K
    return int(min(MAX_K, max(MIN_K, math.ceil(math.sqrt(ratio)))))


def averaging_steps(warm: int, k: int, until: int) -> list[int]:
    """The 1-based steps after which fixed-k Local SGD averages: W+k, W+2k, … up to ``until``."""
    return list(range(warm + k, until + 1, k))


class LocalSGD:
    """The engine's Local SGD plug point.

    ``communicate_grads(step)`` (before backward) says whether this step is synchronous;
    ``after_step(step, loss)`` (after the optimizer step) averages the parameters when due and
    returns True then.  ``lr_fn`` gives the current learning rate (default: constant ``config.lr``).
    """

    def __init__(self, config: StrategyConfig, grad_sync, params: list[torch.nn.Parameter],
                 lr_fn: Optional[Callable[[], float]] = None):
        if grad_sync is None:
            raise ValueError("Local SGD averages parameters through the suite's gradient communication; "
                             "data_parallel must be 'suite'")
        self.config = config
        self.grad_sync = grad_sync
        self.params = list(params)
        self.warm = config.local_sgd_is_warm_steps
        self.adaptive = config.use_adaptive_local_sgd
        self.init_k = config.init_k_steps
        self.k = config.init_k_steps if self.adaptive else config.local_sgd_steps
        self.next_average = self.warm + self.k
        self.lr0 = config.lr
        self.lr_fn = lr_fn or (lambda: config.lr)
        self.loss0: Optional[float] = None  # rank-averaged loss at the end of warm-up (adaptive)
        self._loss0_local: Optional[torch.Tensor] = None
        # One row per averaging: step, the loss and loss0 averaged over ranks (adaptive), the next k.
        self.history: list[dict] = []

    def communicate_grads(self, step: int) -> bool:
        return step <= self.warm

    def after_step(self, step: int, loss: torch.Tensor) -> bool:
        if self.adaptive and step == max(self.warm, 1):
            self._loss0_local = loss.detach().float().reshape(1).clone()
        if step != self.next_average:
            return False
        tensors = [p.data for p in self.params]
        extra = None
        if self.adaptive:
            extra = torch.cat([loss.detach().float().reshape(1), self._loss0_local.to(loss.device)])
            tensors.append(extra)
        with torch.no_grad():
            self.grad_sync.average_tensors(tensors)
        row = {"step": step}
        if self.adaptive:
            mean_loss, mean_loss0 = extra.tolist()  # one host sync per averaging: the schedule lives on the host
            if self.loss0 is None:
                self.loss0 = mean_loss0
            self.k = adaptive_k(self.lr0, self.lr_fn(), self.loss0, mean_loss, self.init_k)
            row.update(loss=mean_loss, loss0=self.loss0)
        row["k"] = self.k
        self.history.append(row)
        self.next_average = step + self.k
        return True

    def describe(self) -> dict:
        return {"local_sgd_warm_steps": self.warm, "local_sgd_k": self.k, "adaptive": self.adaptive,
                "averagings": len(self.history)}


# ---------------------------------------------------------------------------------------------
# The independent reference: every rank simulated in one process.
# ---------------------------------------------------------------------------------------------

def _snapshot(named) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in named}


class LocalSGDReference:
    """One model and one optimizer per rank, in one process.

    Synchronous steps (1..W): every rank starts from rank 0's buffers (DDP's broadcast), runs
    its shard, the gradients are averaged and every rank steps with the average.  Local steps:
    every rank runs its own shard through its own model with its own buffers and optimizer.
    After each due step the parameters are averaged (buffers are not).  The adaptive interval
    is recomputed here from the rank-averaged losses, written out again on purpose.
    """

    name = "local_sgd"

    def __init__(self, model: torch.nn.Module, loss_fn: Callable, config: StrategyConfig, world: int):
        from .optim import torch_optimizer

        self.loss_fn = loss_fn
        self.world = world
        self.models = [copy.deepcopy(model) for _ in range(world)]
        self.optimizers = [torch_optimizer(m.parameters(), config) for m in self.models]
        self.params = [[p for p in m.parameters() if p.requires_grad] for m in self.models]
        self.warm = config.local_sgd_is_warm_steps
        self.adaptive = config.use_adaptive_local_sgd
        self.init_k = config.init_k_steps
        self.k = self.init_k if self.adaptive else config.local_sgd_steps
        self.lr = config.lr
        self.next_average = self.warm + self.k
        self.loss0: Optional[float] = None
        self.t = 0
        self.ks: list[int] = []

    def step(self, shards):
        from ..check.reference import StepRef

        self.t += 1
        sync = self.t <= self.warm
        if sync:  # rank 0's buffers are broadcast before the forward of a synchronous step
            start = _snapshot(self.models[0].named_buffers())
            for m in self.models:
                with torch.no_grad():
                    for name, b in m.named_buffers():
                        b.copy_(start[name])
        losses = []
        for m, ps, (inputs, targets) in zip(self.models, self.params, shards):
            for p in ps:
                p.grad = None
            loss = self.loss_fn(m(inputs), targets)
            loss.backward()
            losses.append(loss.item())
        if sync:
            for i in range(len(self.params[0])):
                grads = [ps[i].grad if ps[i].grad is not None else torch.zeros_like(ps[i]) for ps in self.params]
                mean = torch.stack(grads).sum(0) / self.world
                for ps in self.params:
                    ps[i].grad = mean.clone()
        for opt in self.optimizers:
            opt.step()
        mean_loss = sum(losses) / self.world
        if self.adaptive and self.t == max(self.warm, 1):
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
            params = [_snapshot(self.models[0].named_parameters())]
        else:
            params = [_snapshot(m.named_parameters()) for m in self.models]
        buffers = [_snapshot(m.named_buffers()) for m in self.models]
        return StepRef(losses, params, buffers)
