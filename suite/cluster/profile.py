"""Measuring a case's profile for ``fleetbench predict`` (a rank function, and its summary).

On every rank of a pool, the case's model trains with no gradient communication
(``data_parallel='none'``: the plain engine minus its allreduces), all ranks stepping at once
so they compete for the cores as they do in a real run.  Each step is timed in three parts
(forward, backward, optimizer), and a post-accumulate-grad hook on every parameter records
when its gradient became ready, measured from the start of backward.  Buffers (BatchNorm
statistics) are listed too: the suite's engine broadcasts them from rank 0 before each forward.

The parent takes, per part, the median over steps on each rank and then the slowest rank
(a synchronous step waits for it), and the ready times of that rank.
"""
from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist

from ..comm.grad_sync import trainable_params
from ..config import StrategyConfig
from ..data.synthetic import make_dataset, prepare, shard, step_indices
from ..engine import build_engine
from ..models import get_model
from ..runtime.context import current
from .simulate import Profile

__all__ = ["record_profile", "summarize_profile"]


def record_profile(model: str = "mlp", per_rank_batch: int = 16, steps: int = 6, warmup: int = 2, seed: int = 0,
                   scale: int = 1, config: dict | None = None, dataset_size: int = 512) -> dict:
    ctx = current()
    device, world, rank = ctx.platform.device, ctx.world_size, ctx.rank
    spec = get_model(model)
    data = make_dataset(spec, dataset_size, seed)
    cfg = StrategyConfig.from_dict({**(config or {}), "data_parallel": "none"})
    engine = build_engine(spec.make(seed, device), spec.loss_fn, cfg)
    module, opt = engine.module, engine.optimizer
    named = trainable_params(module)
    clock = {"bw0": 0.0}
    ready: dict[str, list] = {n: [] for n, _ in named}
    seen: dict[str, float] = {}

    def hook_for(name):
        def hook(_p):
            seen[name] = time.perf_counter() - clock["bw0"]
        return hook

    handles = [p.register_post_accumulate_grad_hook(hook_for(n)) for n, p in named]
    parts = {"forward_s": [], "backward_s": [], "optimizer_s": []}
    nb = max(1, min(8, dataset_size // (per_rank_batch * world)))
    batches = []
    for b in range(nb):
        x, y = data.get(shard(step_indices(len(data), b, per_rank_batch * world, seed), rank, world))
        batches.append((prepare(data, x, device), y.to(device)))
    try:
        for s in range(warmup + steps):
            x, y = batches[s % nb]
            seen.clear()
            dist.barrier()
            t0 = time.perf_counter()
            loss = spec.loss_fn(module(x), y)
            ctx.platform.synchronize()
            t1 = time.perf_counter()
            clock["bw0"] = t1
            loss.backward()
            ctx.platform.synchronize()
            t2 = time.perf_counter()
            opt.step()
            opt.zero_grad(set_to_none=False)
            ctx.platform.synchronize()
            t3 = time.perf_counter()
            if s >= warmup:
                parts["forward_s"].append(t1 - t0)
                parts["backward_s"].append(t2 - t1)
                parts["optimizer_s"].append(t3 - t2)
                for n, _ in named:
                    ready[n].append(seen.get(n, t2 - t1))
    finally:
        for h in handles:
            h.remove()
    return {
        **{k: statistics.median(v) for k, v in parts.items()},
        "params": [{"name": n, "nbytes": p.numel() * p.element_size(), "ready_s": statistics.median(ready[n])}
                   for n, p in named],
        "buffers": [b.numel() * b.element_size() for b in module.buffers() if b.numel()],
        "per_rank_batch": per_rank_batch,
        "model": model,
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
