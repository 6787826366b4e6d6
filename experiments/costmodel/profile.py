"""Measuring a case's profile for ``python -m experiments.costmodel predict`` (a rank function, and its summary).

On every rank of a pool, the case's model trains with no gradient communication
(``data_parallel='none'``: the plain engine minus its allreduces), all ranks stepping at once
so they compete for the cores as they do in a real run.  Each step is timed in three parts
(forward, backward, optimizer), and a post-accumulate-grad hook on every parameter records
when its gradient became ready, measured from the start of backward.  Every point is a
``platform.mark`` (a CUDA timing event on the current stream, a host timestamp on CPU), read after
the step's one synchronize: on CUDA a hook runs when its kernels are queued, so a host clock
would see every gradient ready at the start of backward.  Buffers (BatchNorm
statistics) are listed too: the suite's engine broadcasts them from rank 0 before each forward.

The parent takes, per part, the median over steps on each rank and then the slowest rank
(a synchronous step waits for it), and the ready times of that rank.
"""
from __future__ import annotations

import statistics

import torch.distributed as dist

from suite.comm.grad_sync import trainable_params
from suite.config import StrategyConfig
from suite.workload import WorkloadSpec, workload

from .simulate import Profile

__all__ = ["record_profile", "summarize_profile"]


def record_profile(workload_spec: WorkloadSpec, steps: int = 6, warmup: int = 2, config: dict | None = None) -> dict:
    wl = workload(workload_spec)
    platform = wl.platform
    cfg = StrategyConfig.from_dict({**(config or {}), "data_parallel": "none"})
    engine = wl.engine(cfg)
    loss_fn = wl.spec.loss_fn
    module, opt = engine.module, engine.optimizer
    named = trainable_params(module)
    ready: dict[str, list] = {n: [] for n, _ in named}
    seen: dict[str, object] = {}  # name -> the mark taken when its gradient was accumulated

    def hook_for(name):
        def hook(_p):
            seen[name] = platform.mark()
        return hook

    handles = [p.register_post_accumulate_grad_hook(hook_for(n)) for n, p in named]
    parts: dict[str, list[float]] = {"forward_s": [], "backward_s": [], "optimizer_s": []}
    try:
        for s in range(warmup + steps):
            x, y = wl.batch(s)
            seen.clear()
            dist.barrier()
            platform.synchronize()
            m0 = platform.mark()
            loss = loss_fn(module(x), y)
            m1 = platform.mark()
            loss.backward()
            m2 = platform.mark()
            opt.step()
            opt.zero_grad(set_to_none=False)
            m3 = platform.mark()
            platform.synchronize()
            if s >= warmup:
                backward = platform.elapsed(m1, m2)
                parts["forward_s"].append(platform.elapsed(m0, m1))
                parts["backward_s"].append(backward)
                parts["optimizer_s"].append(platform.elapsed(m2, m3))
                for n, _ in named:
                    ready[n].append(platform.elapsed(m1, seen[n]) if n in seen else backward)
    finally:
        for h in handles:
            h.remove()
    return {
        **{k: statistics.median(v) for k, v in parts.items()},
        "params": [{"name": n, "nbytes": p.numel() * p.element_size(), "ready_s": statistics.median(ready[n])}
                   for n, p in named],
        "buffers": [b.numel() * b.element_size() for b in module.buffers() if b.numel()],
        "per_rank_batch": wl.per_rank_batch,
        "model": wl.ws.model,
    }


def summarize_profile(answers: list[dict]) -> dict:
    """One profile from every rank's: the slowest rank's parts and ready times (a dict for JSON)."""
    slow = max(answers, key=lambda a: a["forward_s"] + a["backward_s"] + a["optimizer_s"])
    out = dict(slow)
    for k in ("forward_s", "backward_s", "optimizer_s"):
        out[k] = max(a[k] for a in answers)
    out["ranks"] = len(answers)
    Profile.from_dict(out)  # validates
    return out
