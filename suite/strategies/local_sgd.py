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

with lr0 the initial learning rate, lr the current one, loss0 the rank-averaged loss of
step 1 (Paddle's ``layers.cond(step == 1, initialize)`` in ``localsgd_optimizer.py``, whatever
``begin_step`` is) and loss the rank-averaged loss of this
averaging step.  Both losses travel inside the averaging collective (a 2-element tensor
averaged with the parameters: the current loss and this rank's loss of step 1),
so adaptive Local SGD runs no collective of its own.

The correctness harness compares against an independent single-process simulation with one
model and one optimizer per rank (``suite.check.reference.LocalSGDReference``).
"""
from __future__ import annotations

import math
from collections.abc import Callable

import torch

from ..config import StrategyConfig

__all__ = ["LocalSGD", "adaptive_k", "MIN_K", "MAX_K", "averaging_steps"]

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
                 lr_fn: Callable[[], float] | None = None):
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
        self.loss0: float | None = None  # rank-averaged loss of step 1 (adaptive)
        self._loss0_local: torch.Tensor | None = None
        # One row per averaging: step, the loss and loss0 averaged over ranks (adaptive), the next k.
        self.history: list[dict] = []

    def communicate_grads(self, step: int) -> bool:
        return step <= self.warm

    def after_step(self, step: int, loss: torch.Tensor) -> bool:
        if self.adaptive and step == 1:
            self._loss0_local = loss.detach().float().reshape(1).clone()
        if step != self.next_average:
            return False
        tensors = [p.data for p in self.params]
        extra = None
        if self.adaptive:
            assert self._loss0_local is not None  # recorded at step 1, before any averaging
            extra = torch.cat([loss.detach().float().reshape(1), self._loss0_local.to(loss.device)])
            tensors.append(extra)
        with torch.no_grad():
            self.grad_sync.average_tensors(tensors)
        row: dict[str, float] = {"step": step}
        if extra is not None:
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
