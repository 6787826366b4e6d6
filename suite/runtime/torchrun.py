"""The launcher used under torchrun: every rank runs the function itself; rank 0 gathers.

It offers the rank pool's ``run(fn, kwargs)`` so ``fleetbench run`` drives both the same
way.  A function that raises on a rank is reported by rank 0 with that rank's traceback.
"""
from __future__ import annotations

import traceback
from typing import Any, Optional

import torch.distributed as dist

from .pool import RankError, RankFn, check_rank_fn, fn_name

__all__ = ["TorchrunLauncher"]


class TorchrunLauncher:
    def __init__(self, ctx):
        self.ctx = ctx
        self.nproc = ctx.world_size
        self.is_reporter = ctx.rank == 0

    def run(self, fn: RankFn, kwargs: Optional[dict] = None, *, timeout: Optional[float] = None,
            per_rank: Optional[list[dict]] = None) -> Optional[list[Any]]:
        check_rank_fn(fn)
        ref = fn_name(fn)
        kw = dict(kwargs or {})
        if per_rank is not None:
            kw.update(per_rank[self.ctx.rank])
        try:
            out = (True, fn(**kw))
        except Exception:  # noqa: BLE001 - reported by rank 0
            out = (False, traceback.format_exc())
        gathered = [None] * self.nproc if self.is_reporter else None
        dist.gather_object(out, gathered, dst=0)
        errors = {r: payload for r, (ok, payload) in enumerate(gathered) if not ok} if self.is_reporter else {}
        # Every rank must take the same path afterwards: rank 0 tells them whether the call failed.
        box = [errors]
        dist.broadcast_object_list(box, src=0)
        errors = box[0]
        if errors:
            first = min(errors)
            raise RankError(f"{ref} raised on rank(s) {sorted(errors)}; rank {first}:\n{errors[first]}", errors)
        if not self.is_reporter:
            return None
        return [payload for _, payload in gathered]

    def close(self) -> None:
        pass
