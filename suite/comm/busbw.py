"""nccl-tests' bus bandwidth (``doc/PERFORMANCE.md``), torch-free: the one table of its factors.

busbw = algbw x factor, algbw = bytes / time: allreduce 2(n-1)/n, allgather and reduce-scatter (n-1)/n,
broadcast and reduce 1.  The collective table (:mod:`suite.comm.table`, each row's ``busbw_factor``), ``fleetbench
comm``, the figures and the case summary (:mod:`suite.measure.summary`, which imports no torch) all take the factor
from here.
"""
from __future__ import annotations

import math

__all__ = ["busbw_factor", "busbw"]


def busbw_factor(op: str, n: int) -> float:
    """nccl-tests' bus bandwidth factor of ``op`` over ``n`` ranks: busbw = algbw x factor (0 alone)."""
    if n < 2:
        return 0.0
    return {"all_reduce": 2 * (n - 1) / n, "reduce_scatter": (n - 1) / n, "all_gather": (n - 1) / n,
            "broadcast": 1.0, "reduce": 1.0}[op]


def busbw(nbytes_per_step: float, seconds: float, world: int, op: str = "all_reduce") -> float:
    """The bus bandwidth (bytes/s) of ``nbytes_per_step`` moved in ``seconds`` over ``world`` ranks.

    fleetbench states it over the *exposed* communication time of a step (step time minus the same step without
    communication), so it is an effective figure, comparable across world sizes; nan when there is no exposed
    time to divide by."""
    if not (seconds > 0) or world < 2 or not nbytes_per_step:
        return math.nan
    return nbytes_per_step / seconds * busbw_factor(op, world)
