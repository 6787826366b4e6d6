"""Rank functions for benchmark harnesses that time steps themselves (pytest-benchmark, asv).

``prepare_case`` builds a case's engine and batches once and keeps them in a rank-side cache
keyed by the case; ``run_steps`` then runs K steps of the cached engine (barriers only at the
window's two ends) and returns the per-step times, so a harness's rounds time steps, not
construction.  ``drop_case`` frees a case.

    pool.run(prepare_case, {"key": "mlp/plain", "model": "mlp", "config": cfg})
    pool.run(run_steps, {"key": "mlp/plain", "steps": 5})
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist

from ..config import StrategyConfig
from ..data.synthetic import make_dataset, prepare, shard, step_indices
from ..engine import build_engine
from ..models import get_model
from ..runtime.context import current
from ..runtime.device import default_threads
from ..strategies.fetch import LossFetcher
from .timing import StepClock, _peak_memory, straggler_for_step

__all__ = ["prepare_case", "run_steps", "drop_case", "cached_cases"]

_CACHE: dict = {}


class _Prepared:
    def __init__(self, model: str, config: StrategyConfig, per_rank_batch: int, seed: int, scale: int,
                 dataset_size: int):
        ctx = current()
        device, world, rank = ctx.platform.device, ctx.world_size, ctx.rank
        spec = get_model(model)
        data = make_dataset(spec, dataset_size, seed)
        self.nbatches = max(1, min(16, dataset_size // (per_rank_batch * world)))
        self.batches = []
        for b in range(self.nbatches):
            x, y = data.get(shard(step_indices(len(data), b, per_rank_batch * world, seed), rank, world))
            self.batches.append((prepare(data, x, device), y.to(device)))
        self.config = config
        self.engine = build_engine(spec.make(seed, device), spec.loss_fn, config)
        self.threads = default_threads(ctx.local_world_size, config.num_threads)
        self.seed = seed
        self.step = 0


def prepare_case(key: str, model: str, config: dict, per_rank_batch: int = 16, warmup: int = 2, seed: int = 0,
                 scale: int = 1, dataset_size: int = 1024) -> dict:
    """Build (once) and warm up the engine of ``key``; returns what the engine set up."""
    if key not in _CACHE:
        _CACHE[key] = _Prepared(model, StrategyConfig.from_dict(config), per_rank_batch, seed, scale, dataset_size)
        if warmup:
            run_steps(key, warmup)
    return {"rank": current().rank, "describe": _CACHE[key].engine.describe()}


def run_steps(key: str, steps: int) -> dict:
    """``steps`` steps of the cached engine: window seconds, per-step seconds, peak memory of this rank."""
    if key not in _CACHE:
        raise KeyError(f"case {key!r} is not prepared on rank {current().rank}; call prepare_case first "
                       f"(prepared: {sorted(_CACHE)})")
    ctx = current()
    p = _CACHE[key]
    torch.set_num_threads(p.threads)
    fetcher = LossFetcher(p.config.fetch_frequency)
    clock = StepClock(ctx.platform)
    dist.barrier()
    t0 = time.perf_counter()
    clock.mark()
    for _ in range(steps):
        p.step += 1
        if p.config.straggler_ms and straggler_for_step(p.step, ctx.world_size, p.seed) == ctx.rank:
            time.sleep(p.config.straggler_ms / 1e3)
        x, y = p.batches[p.step % p.nbatches]
        fetcher.push(p.engine.train_step(x, y))
        clock.mark()
    fetcher.flush()
    ctx.platform.synchronize()
    dist.barrier()
    return {"rank": ctx.rank, "window_s": time.perf_counter() - t0, "step_times_s": clock.durations(),
            "peak_memory_bytes": _peak_memory(ctx.platform)}


def drop_case(key: str) -> bool:
    return _CACHE.pop(key, None) is not None


def cached_cases() -> list:
    return sorted(_CACHE)
