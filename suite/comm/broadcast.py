"""Broadcasting module state from rank 0: per tensor, or over flat buckets (``fuse_broadcast_ops``)."""
from __future__ import annotations

import math

import torch
import torch.distributed as dist

from . import collectives as C

__all__ = ["broadcast_tensors", "broadcast_module", "module_state"]


def module_state(module: torch.nn.Module, buffers_only: bool = False) -> list[torch.Tensor]:
    """Parameters (unless ``buffers_only``) and buffers, each once, in registration order."""
    seen: set[int] = set()
    out = []
    tensors = [] if buffers_only else [p.data for p in module.parameters()]
    tensors += list(module.buffers())
    for t in tensors:
        if id(t) not in seen:
            seen.add(id(t))
            out.append(t)
    return out


def broadcast_tensors(tensors: list[torch.Tensor], src: int = 0, group=None, fused: bool = False,
                      bucket_mb: float = math.inf) -> int:
    """Broadcast ``tensors`` in place from global rank ``src``; returns the number of broadcasts.

    Fused: tensors of one dtype and device are packed into flat buckets of at most ``bucket_mb``
    MiB, one broadcast per bucket (all issued, then each waited on and unpacked with one
    ``_foreach_copy_``, as DDP's coalesced broadcast does).  Unfused: one broadcast per tensor,
    each waited on before the next (Paddle's ``fuse_broadcast_ops=False``).
    """
    tensors = [t for t in tensors if t.numel() > 0]
    if not fused:
        for t in tensors:
            C.broadcast(t, src=src, group=group)
        return len(tensors)
    cap = bucket_mb * 2**20
    buckets: list[list[torch.Tensor]] = []
    by_kind: dict[tuple, tuple[list[torch.Tensor], int]] = {}
    for t in tensors:
        key = (t.dtype, t.device)
        cur = by_kind.get(key)
        nbytes = t.numel() * t.element_size()
        if cur is None or (cur[1] + nbytes > cap and cur[0]):
            cur = ([], 0)
            buckets.append(cur[0])
        cur[0].append(t)
        by_kind[key] = (cur[0], cur[1] + nbytes)
    pending = []
    for bucket in buckets:
        flat = torch.cat([t.reshape(-1) for t in bucket])
        pending.append((bucket, flat, C.broadcast(flat, src=src, group=group, async_op=True)))
    for bucket, flat, work in pending:
        work.wait()
        parts = flat.split([t.numel() for t in bucket])
        torch._foreach_copy_(bucket, [v.view_as(t) for v, t in zip(parts, bucket)])
    return len(buckets)


def broadcast_module(module: torch.nn.Module, group=None, fused: bool = False, buffers_only: bool = False,
                     bucket_mb: float = math.inf) -> int:
    src = 0 if group is None else dist.get_global_rank(group, 0)
    with torch.no_grad():
        return broadcast_tensors(module_state(module, buffers_only), src=src, group=group, fused=fused,
                                 bucket_mb=bucket_mb)
