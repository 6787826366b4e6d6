"""Tiny rank functions for smoke tests and for diagnosing a pool: who am I, a collective, a sleep."""
from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist

from .context import current


def whoami() -> dict:
    ctx = current()
    return {"rank": ctx.rank, "world_size": ctx.world_size, "pid": os.getpid(), "backend": ctx.platform.backend,
            "threads": torch.get_num_threads()}


def allreduce_rank_sum() -> float:
    ctx = current()
    t = torch.tensor([float(ctx.rank)], device=ctx.platform.device)
    dist.all_reduce(t)
    return t.item()


def sleep_then_allreduce(seconds: float = 0.0, sleeper: int = -1) -> float:
    """Rank ``sleeper`` sleeps before joining the allreduce: the others wait inside the collective."""
    if current().rank == sleeper:
        time.sleep(seconds)
    return allreduce_rank_sum()


def crash(rank: int = 0) -> None:
    if current().rank == rank:
        os._exit(17)
    return None
