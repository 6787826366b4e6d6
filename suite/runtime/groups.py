"""Communicators and node groups, created once per process and reused.

``dist.new_group`` is collective: every rank must create the same groups in the same
order.  Engines ask for groups through this cache, and every rank builds the same
engines in the same order, so the order always agrees.  Each group gets a label
(``comm0``, ``intra1.node0``, ``inter0.local1`` …) under which its collectives are counted.
"""
from __future__ import annotations

import datetime
from dataclasses import dataclass

import torch.distributed as dist

__all__ = ["comm_groups", "node_groups", "NodeGroups", "label_of", "reset"]

_CACHE: dict = {}
_LABELS: dict[int, str] = {}


def _timeout() -> datetime.timedelta:
    from .context import _CURRENT  # read at call time: set_current rebinds it

    return datetime.timedelta(seconds=_CURRENT.pg_timeout if _CURRENT else 60.0)


def label_of(group: dist.ProcessGroup | None) -> str:
    if group is None or group is dist.group.WORLD:
        return "world"
    return _LABELS.get(id(group), "group")


def _new_group(ranks: list[int], label: str):
    group = dist.new_group(ranks=ranks, timeout=_timeout())
    if group is not None and group is not dist.GroupMember.NON_GROUP_MEMBER:
        _LABELS[id(group)] = label
    return group


def comm_groups(n: int, parent: dist.ProcessGroup | None = None) -> list:
    """``n`` communicators over the same ranks (Paddle's ``nccl_comm_num``): the first ``n`` of one list per set of
    ranks, made as they are first asked for, so engines of 1, 2 and 3 communicators share ``comm0`` (3 in all, not
    6: each NCCL communicator holds its own buffers, NVLS's several hundred MB on a GPU of an NVLink switch).

    On CUDA each NCCL communicator runs its collectives on its own stream; on gloo each
    group has its own worker threads, so collectives on different groups can proceed at once.
    Every rank asks in the same order (the engines are built in the same order), so the made groups agree.
    """
    ranks = list(range(dist.get_world_size())) if parent is None else dist.get_process_group_ranks(parent)
    made = _CACHE.setdefault(("comm", tuple(ranks)), [])
    while len(made) < n:
        made.append(_new_group(ranks, f"comm{len(made)}"))
    return made[:n]


@dataclass(frozen=True)
class NodeGroups:
    """This rank's groups for the hierarchical allreduce over nodes of ``ranks_per_node`` ranks."""

    intra: dist.ProcessGroup  # the ranks of this rank's node
    inter: dist.ProcessGroup  # the ranks with this rank's local index, one per node
    node: int
    local_index: int
    ranks_per_node: int
    nodes: int
    intra_ranks: tuple
    inter_ranks: tuple


def node_groups(ranks_per_node: int, comm_index: int = 0) -> NodeGroups:
    """Nodes are consecutive blocks of ``ranks_per_node`` ranks (real machines under torchrun,
    emulated nodes on one machine)."""
    world = dist.get_world_size()
    rank = dist.get_rank()
    if world % ranks_per_node:
        raise ValueError(f"ranks_per_node={ranks_per_node} does not divide world size {world}")
    key = ("nodes", ranks_per_node, comm_index, world)
    if key not in _CACHE:
        nodes = world // ranks_per_node
        mine_intra: tuple | None = None
        mine_inter: tuple | None = None
        for n in range(nodes):
            ranks = list(range(n * ranks_per_node, (n + 1) * ranks_per_node))
            g = _new_group(ranks, f"intra{comm_index}.node{n}")
            if rank in ranks:
                mine_intra = (g, tuple(ranks))
        for i in range(ranks_per_node):
            ranks = [n * ranks_per_node + i for n in range(nodes)]
            g = _new_group(ranks, f"inter{comm_index}.local{i}")
            if rank in ranks:
                mine_inter = (g, tuple(ranks))
        assert mine_intra is not None and mine_inter is not None  # every rank is in one node and one column
        _CACHE[key] = NodeGroups(
            intra=mine_intra[0], inter=mine_inter[0], node=rank // ranks_per_node,
            local_index=rank % ranks_per_node, ranks_per_node=ranks_per_node, nodes=nodes,
            intra_ranks=mine_intra[1], inter_ranks=mine_inter[1],
        )
    return _CACHE[key]


def reset() -> None:
    _CACHE.clear()
    _LABELS.clear()
