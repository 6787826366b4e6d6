"""Starting a rank: from a local spawn (the rank pool) or from the environment torchrun sets."""
from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from ..config import ConfigError
from . import groups
from .context import RankContext, set_current
from .device import default_threads, select_platform

__all__ = ["TorchrunEnv", "torchrun_env", "init_rank", "init_from_env", "shutdown"]

TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class TorchrunEnv:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int


RANK_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")  # a rank of a launched world


def torchrun_env(environ: dict | None = None) -> TorchrunEnv | None:
    """The world torchrun describes in the environment, or None when not under torchrun.

    A rank's variables without torchrun's agent (``TORCHELASTIC_RUN_ID``, which torchrun always sets) are stale:
    left over in a shell, they would make a local run join a world nobody launched, listening for it on every
    interface; they are refused (a :class:`~suite.config.ConfigError` naming them), never followed."""
    env = os.environ if environ is None else environ
    stale = [v for v in RANK_VARS if v in env]
    if stale and "TORCHELASTIC_RUN_ID" not in env:
        shown = ", ".join(f"{v}={env[v][:20]!r}" for v in stale)
        raise ConfigError(f"{shown} set without torchrun's agent (TORCHELASTIC_RUN_ID is not set): stale variables "
                          f"of another launch? unset them for a local run, or start fleetbench with torchrun")
    if not all(v in env for v in TORCHRUN_VARS[:5]):
        return None
    try:
        return TorchrunEnv(
            rank=int(env["RANK"]),
            world_size=int(env["WORLD_SIZE"]),
            local_rank=int(env["LOCAL_RANK"]),
            local_world_size=int(env["LOCAL_WORLD_SIZE"]),
            master_addr=env["MASTER_ADDR"],
            master_port=int(env.get("MASTER_PORT", "29500")),
        )
    except ValueError as exc:
        raise ConfigError(f"torchrun environment is malformed ({exc}); expected integers in {TORCHRUN_VARS}") \
            from None


def init_rank(
    rank: int,
    world_size: int,
    local_rank: int,
    local_world_size: int,
    *,
    store: dist.Store | None = None,
    device: str | None = None,
    pg_timeout: float = 60.0,
    num_threads: int | None = None,
    torchrun: bool = False,
) -> RankContext:
    """Initialise the default process group (bounded by ``pg_timeout``) and this rank's context."""
    platform = select_platform(device, local_rank, local_world_size)
    threads = default_threads(local_world_size, num_threads)
    torch.set_num_threads(threads)
    platform.set_device()  # this thread's current GPU (other threads set theirs: Platform.set_device)
    timeout = datetime.timedelta(seconds=pg_timeout)
    kwargs: dict[str, Any] = dict(backend=platform.backend, rank=rank, world_size=world_size, timeout=timeout)
    if store is not None:
        kwargs["store"] = store
    else:
        kwargs["init_method"] = "env://"
    if platform.is_cuda:
        kwargs["device_id"] = platform.device
    dist.init_process_group(**kwargs)
    ctx = RankContext(
        rank=rank,
        world_size=world_size,
        local_rank=local_rank,
        local_world_size=local_world_size,
        platform=platform,
        torchrun=torchrun,
        pg_timeout=pg_timeout,
        threads=threads,
    )
    set_current(ctx)
    return ctx


def init_from_env(device: str | None = None, pg_timeout: float = 60.0, num_threads: int | None = None) -> RankContext:
    """Join the world torchrun set up (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR)."""
    env = torchrun_env()
    if env is None:
        raise RuntimeError(f"not under torchrun: the environment lacks some of {', '.join(TORCHRUN_VARS[:5])}")
    return init_rank(
        env.rank,
        env.world_size,
        env.local_rank,
        env.local_world_size,
        device=device,
        pg_timeout=pg_timeout,
        num_threads=num_threads,
        torchrun=True,
    )


def shutdown() -> None:
    groups.reset()
    if dist.is_initialized():
        dist.destroy_process_group()
    set_current(None)
