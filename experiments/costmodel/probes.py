"""Timed collectives for checking the emulated cluster and the cost model (rank functions).

The collectives are ``suite.comm.table``'s rows: ``hier`` is the suite's two-level allreduce
(``suite.comm.hierarchical``) with its "scatter" schedule (intra reduce-scatter, inter allreduce,
intra allgather), ``hier_reduce`` Paddle's (intra reduce, inter allreduce, intra broadcast).
Every collective goes through ``suite.comm.collectives``.
"""
from __future__ import annotations

import torch

from suite.comm.table import COLLECTIVES, Layout, exact_inputs
from suite.measure.interleave import interleaved_rounds, timed_block
from suite.runtime.context import current

__all__ = ["timed_allreduce", "check_two_level", "VARIANTS"]

# a probe's variant -> the table's row (and ``flat_commK``: ``allreduce_comms`` on K communicators)
VARIANTS = {"flat": "allreduce", "hier": "hier", "hier_reduce": "hier_reduce", "bcast": "broadcast",
            "intra_only": "intra"}


def _runner(variant: str, ranks_per_node: int, buffers: int):
    """``run(t)``: ``variant`` on ``t`` cut into ``buffers`` consecutive buffers, each reduced in turn, except
    ``flat_commK``: every buffer launched at once, buffer i on communicator i mod K, then all waited on."""
    k = variant.removeprefix("flat_comm")
    if k != variant and k.isdigit() and int(k) >= 1:
        return COLLECTIVES["allreduce_comms"].build(Layout(comms=int(k), pieces=buffers))
    if variant not in VARIANTS:
        raise ValueError(f"variant={variant!r}: allowed: flat, hier, hier_reduce, bcast, intra_only, flat_commK")
    run = COLLECTIVES[VARIANTS[variant]].build(Layout(ranks_per_node=ranks_per_node))

    def each(t: torch.Tensor) -> None:
        for b in t.tensor_split(buffers):
            run(b)

    return each


def timed_allreduce(sizes: list, variants: list, rounds: int = 5, warmup: int = 1, ranks_per_node: int = 1,
                    buffers: int = 1, repeat: int = 1) -> dict:
    """Time each (variant, size): ``buffers`` float32 tensors of ``size`` bytes in all, reduced
    ``repeat`` times per timing; every round runs each size's variants in turn, their order rotated
    round by round (``interleaved_rounds``; ``warmup`` rounds first, dropped).

    Variants: ``flat`` (one ring allreduce per buffer), ``hier`` (two-level per buffer),
    ``flat_comm1`` / ``flat_comm2`` (buffers launched at once on 1 or 2 communicators).
    Returns ``{"variant/size": [seconds per round]}`` on every rank (the parent takes the
    slowest rank per round).
    """
    ranks_per_node = max(1, ranks_per_node)
    platform = current().platform
    device = platform.device  # NCCL carries only tensors on the rank's GPU
    runs = {v: _runner(v, ranks_per_node, buffers) for v in variants}
    data = {}
    for size in sizes:
        numel = max(ranks_per_node * buffers, int(size) // 4)
        data[size] = torch.ones(numel - numel % (ranks_per_node * buffers), device=device)

    def one(pair: tuple) -> float:
        size, v = pair
        seconds = timed_block(lambda: runs[v](data[size]), repeat, platform, barriers="start")
        data[size].fill_(1.0)
        return seconds

    pairs = [(size, v) for size in sizes for v in variants]
    got = dict(zip(pairs, interleaved_rounds(pairs, rounds, one, warmup_rounds=warmup, within=len(variants))))
    return {f"{v}/{size}": got[size, v] for v in variants for size in sizes}


def check_two_level(ranks_per_node: int, mode: str = "scatter") -> float:
    """Largest |error| of the two-level allreduce against the exact sum (the table's exact inputs)."""
    ctx = current()
    row = COLLECTIVES["hier" if mode == "scatter" else "hier_reduce"]
    t = exact_inputs(8 * ranks_per_node, ctx.rank, torch.float32, ctx.platform.device)
    row.build(Layout(ranks_per_node=ranks_per_node))(t)
    return float((t - row.expected(t.numel(), t.dtype, t.device)).abs().max())
