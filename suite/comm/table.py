"""The collectives the suite times and checks, in one table (in the manner of nccl-tests).

One row per collective (:data:`COLLECTIVES`): how it runs (in place on a flat tensor, on the groups
of a :class:`Layout`), the bytes it moves, its bus-bandwidth factor (nccl-tests'
``doc/PERFORMANCE.md``: allreduce 2(n-1)/n, allgather and reduce-scatter (n-1)/n, broadcast and
reduce 1), inputs whose result is exact in floating point, and that result.  ``fleetbench comm``
(``suite/measure/collectives.py``) and ``fleetbench doctor`` take their collectives from here.

Exact inputs (nccl-tests' method): rank r holds (r+1)·((i mod 7)+1), small integers whose sums are
exact in fp32 and fp64; in half precision (fp16, bf16) (i mod 3)+1 + (r mod 2), so every partial sum
stays an integer the type holds.  A collective's expected result is the sum of these over the ranks
whose inputs it combines (:meth:`Collective.contributors`).

Rows:
- ``allreduce``: one allreduce on ``layout.group`` (the world when None);
- ``allreduce_comms``: the message cut into ``layout.pieces`` (default: one per communicator) equal
  pieces, piece i allreduced asynchronously on communicator i mod ``layout.comms``, then all waited on
  (what ``nccl_comm_num=N`` does with buckets in flight);
- ``hier`` / ``hier_reduce``: the two-level allreduce over nodes of ``layout.ranks_per_node`` ranks
  (``suite.comm.hierarchical``; Horovod's scatter schedule, Paddle's reduce schedule);
- ``intra``: the two-level allreduce's node phases alone (reduce-scatter, then allgather in every node);
- ``broadcast``: from rank 0 over the world.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from ..runtime.groups import comm_groups, node_groups
from . import collectives as C
from . import hierarchical
from .busbw import busbw_factor

__all__ = ["Layout", "Collective", "COLLECTIVES", "exact_inputs", "exact_sum", "busbw_factor"]

HALF = (torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class Layout:
    """The groups a collective runs on."""

    group: Any = None  # allreduce: its process group (None: the world)
    comms: int = 1  # allreduce_comms: communicators (``comm_groups(comms)``)
    pieces: int = 0  # allreduce_comms: pieces of the message (0: one per communicator)
    ranks_per_node: int = 1  # hier, hier_reduce, intra: consecutive ranks per (emulated) node


def exact_inputs(count: int, rank: int, dtype: torch.dtype, device: Any = "cpu") -> torch.Tensor:
    """Rank ``rank``'s exact inputs (module docstring)."""
    i = torch.arange(count, device=device)
    return (i % 3 + 1 + rank % 2 if dtype in HALF else (i % 7 + 1) * (rank + 1)).to(dtype)


def exact_sum(count: int, ranks, dtype: torch.dtype, device: Any = "cpu") -> torch.Tensor:
    """The exact sum of the inputs of ``ranks``."""
    i, ranks = torch.arange(count, device=device), list(ranks)
    if dtype in HALF:
        return ((i % 3 + 1) * len(ranks) + sum(r % 2 for r in ranks)).to(dtype)
    return ((i % 7 + 1) * sum(r + 1 for r in ranks)).to(dtype)


Run = Callable[[torch.Tensor], Any]


@dataclass(frozen=True)
class Collective:
    """One row of the table: ``build(layout)`` gives ``run(t)``, which computes ``op`` in place on ``t``;
    ``combines`` says whose inputs the result holds: ``"world"`` (the sum over every rank), ``"node"`` (over
    this rank's node), ``"root"`` (rank 0's)."""

    name: str
    op: str  # the nccl-tests operation it computes, for the busbw factor
    build: Callable[[Layout], Run]
    combines: str = "world"

    def nbytes(self, t: torch.Tensor) -> int:
        """Bytes of the message (nccl-tests' size: algbw = bytes / time)."""
        return t.numel() * t.element_size()

    def busbw_factor(self, world: int, layout: Layout = Layout()) -> float:
        return busbw_factor(self.op, layout.ranks_per_node if self.combines == "node" else world)

    def contributors(self, rank: int, world: int, layout: Layout = Layout()) -> range:
        if self.combines == "root":
            return range(1)
        if self.combines == "node":
            first = rank - rank % layout.ranks_per_node
            return range(first, first + layout.ranks_per_node)
        return range(world)

    def expected(self, count: int, dtype: torch.dtype, device: Any = "cpu", layout: Layout = Layout()) -> torch.Tensor:
        return exact_sum(count, self.contributors(dist.get_rank(), dist.get_world_size(), layout), dtype, device)

    def wrong(self, run: Run, count: int, dtype: torch.dtype, device: Any = "cpu", layout: Layout = Layout()) -> int:
        """Elements of ``run`` on this rank's exact inputs that differ from the expected result (0: exact)."""
        x = exact_inputs(count, dist.get_rank(), dtype, device)
        run(x)
        return int((x != self.expected(count, dtype, device, layout)).sum().item())


def _allreduce(lay: Layout) -> Run:
    return lambda t: C.all_reduce(t, group=lay.group)


def _allreduce_comms(lay: Layout) -> Run:
    groups = comm_groups(lay.comms)
    pieces = lay.pieces or len(groups)

    def run(t: torch.Tensor) -> None:
        works = [C.all_reduce(p, group=groups[i % len(groups)], async_op=True)
                 for i, p in enumerate(t.tensor_split(pieces))]
        for w in works:
            w.wait()

    return run


def _hier(mode: str) -> Callable[[Layout], Run]:
    def build(lay: Layout) -> Run:
        ng = node_groups(lay.ranks_per_node, 0)
        return lambda t: hierarchical.hierarchical_all_reduce(t, ng, mode)

    return build


def _intra(lay: Layout) -> Run:
    ng = node_groups(lay.ranks_per_node)
    shards: dict = {}

    def run(t: torch.Tensor) -> None:
        if ng.ranks_per_node > 1:
            key = (t.numel(), t.dtype, t.device)
            if key not in shards:
                shards[key] = torch.empty(t.numel() // ng.ranks_per_node, dtype=t.dtype, device=t.device)
            C.reduce_scatter(shards[key], t, group=ng.intra)
            C.all_gather(t, shards[key], group=ng.intra)

    return run


def _broadcast(lay: Layout) -> Run:
    return lambda t: C.broadcast(t, src=0)


COLLECTIVES: dict[str, Collective] = {c.name: c for c in (
    Collective("allreduce", "all_reduce", _allreduce),
    Collective("allreduce_comms", "all_reduce", _allreduce_comms),
    Collective("hier", "all_reduce", _hier("scatter")),
    Collective("hier_reduce", "all_reduce", _hier("reduce")),
    Collective("intra", "all_reduce", _intra, combines="node"),
    Collective("broadcast", "broadcast", _broadcast, combines="root"),
)}
