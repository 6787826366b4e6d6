"""Timed collectives for checking the emulated cluster and the cost model (rank functions).

The two-level allreduce timed is the suite's own (``suite.comm.hierarchical``): ``hier`` is its
"scatter" schedule (intra reduce-scatter, inter allreduce, intra allgather), ``hier_reduce``
Paddle's (intra reduce, inter allreduce, intra broadcast).  Every collective goes through
``suite.comm.collectives``.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from ..comm import collectives as C
from ..runtime.context import current
from ..runtime.groups import comm_groups, node_groups

__all__ = ["two_level_allreduce", "timed_allreduce", "check_two_level"]


def two_level_allreduce(t: torch.Tensor, ranks_per_node: int, mode: str = "scatter") -> None:
    """Sum ``t`` (1-D, numel divisible by ranks_per_node) over the world in place, in two levels."""
    from ..comm.hierarchical import hierarchical_all_reduce

    hierarchical_all_reduce(t, node_groups(ranks_per_node), mode=mode)


def _one(variant: str, bufs: list, ranks_per_node: int, comms: list) -> None:
    if variant == "flat":
        for b in bufs:
            C.all_reduce(b)
    elif variant in ("hier", "hier_reduce"):
        for b in bufs:
            two_level_allreduce(b, ranks_per_node, "scatter" if variant == "hier" else "reduce")
    elif variant == "bcast":
        for b in bufs:
            C.broadcast(b, src=0)
    elif variant == "intra_only":  # the two-level allreduce's node phases alone (calibrates the model)
        g = node_groups(ranks_per_node)
        for b in bufs:
            if g.ranks_per_node > 1:
                shard = torch.empty(b.numel() // g.ranks_per_node, dtype=b.dtype, device=b.device)
                C.reduce_scatter(shard, b, group=g.intra)
                C.all_gather(b, shard, group=g.intra)
    elif variant.startswith("flat_comm"):
        # every buffer launched at once, buffer i on communicator i mod k, then all waited on
        works = [C.all_reduce(b, group=comms[i % len(comms)], async_op=True) for i, b in enumerate(bufs)]
        for w in works:
            w.wait()
    else:
        raise ValueError(f"variant={variant!r}: allowed: flat, hier, hier_reduce, bcast, intra_only, flat_commK")


def timed_allreduce(sizes: list, variants: list, rounds: int = 5, warmup: int = 1, ranks_per_node: int = 1,
                    buffers: int = 1, repeat: int = 1) -> dict:
    """Time each (variant, size): ``buffers`` float32 tensors of ``size`` bytes in all, reduced
    ``repeat`` times per timing; variants interleaved, their order rotated each round.

    Variants: ``flat`` (one ring allreduce per buffer), ``hier`` (two-level per buffer),
    ``flat_comm1`` / ``flat_comm2`` (buffers launched at once on 1 or 2 communicators).
    Returns ``{"variant/size": [seconds per round]}`` on every rank (the parent takes the
    slowest rank per round).
    """
    ranks_per_node = max(1, ranks_per_node)
    platform = current().platform
    device = platform.device  # NCCL carries only tensors on the rank's GPU
    kmax = max([int(v[len("flat_comm"):]) for v in variants if v.startswith("flat_comm")] or [1])
    comms = comm_groups(kmax) if kmax > 1 else [None]
    if any(v in ("hier", "hier_reduce", "intra_only") for v in variants):
        node_groups(ranks_per_node)
    data = {}
    for size in sizes:
        numel = max(ranks_per_node * buffers, int(size) // 4)
        numel -= numel % (ranks_per_node * buffers)
        per = numel // buffers
        data[size] = [torch.ones(per, device=device) for _ in range(buffers)]
    out: dict = {f"{v}/{s}": [] for v in variants for s in sizes}
    order = list(variants)
    for r in range(warmup + rounds):
        for size in sizes:
            for v in order:
                bufs = data[size]
                dist.barrier()
                t0 = platform.now()
                for _ in range(repeat):
                    _one(v, bufs, ranks_per_node, comms[:int(v[len("flat_comm"):])] if v.startswith("flat_comm")
                         else comms)
                t1 = platform.now()  # synchronizes: NCCL calls return once queued
                if r >= warmup:
                    out[f"{v}/{size}"].append((t1 - t0) / repeat)
                for b in bufs:
                    b.fill_(1.0)
        order = order[1:] + order[:1]
    return out


def check_two_level(ranks_per_node: int, mode: str = "scatter") -> float:
    """Largest |error| of the two-level allreduce against the exact sum (integers: exact in fp32)."""
    ctx = current()
    device = ctx.platform.device
    t = torch.arange(8 * ranks_per_node, dtype=torch.float32, device=device) + ctx.rank
    two_level_allreduce(t, ranks_per_node, mode)
    w = ctx.world_size
    expect = w * torch.arange(8 * ranks_per_node, dtype=torch.float32, device=device) + w * (w - 1) / 2
    return float((t - expect).abs().max())
