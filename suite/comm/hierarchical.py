"""Hierarchical allreduce over nodes (``use_hierarchical_allreduce``).

Nodes are consecutive blocks of ``ranks_per_node`` ranks (``hierarchical_allreduce_inter_nranks``;
real machines under torchrun, *emulated nodes* on one machine).  Each rank belongs to two
groups (``suite.runtime.groups.node_groups``): ``intra`` (the ranks of its node) and
``inter`` (the ranks with its local index, one per node).

Two schedules, both summing over the whole world:

- ``"scatter"`` (Horovod's; the one the gradient path uses): intra-node reduce-scatter, so
  local rank i holds node-sum shard i; inter-node allreduce of that shard among the ranks
  with local index i; intra-node allgather of the shards.  Every link carries 1/ranks_per_node
  of the tensor in the inter step.  Needs ``numel % ranks_per_node == 0`` (buckets are padded).
  gloo supports reduce-scatter and allgather of flat tensors in torch 2.13 (checked), so we
  use it.
- ``"reduce"`` (Paddle's docs: reduce, allreduce, broadcast): intra-node reduce to the node's
  local rank 0, inter-node allreduce among local ranks 0, intra-node broadcast.  Kept for the
  micro-benchmark, where the two are compared.

Every step is waited on before the next.  The caller decides *where* the chain runs: inline,
on a communicator's worker thread for overlap on CPU (gloo's wait blocks the thread), or queued
from the backward hook on a communicator's side stream on CUDA (NCCL's wait blocks the current
stream, not the thread: see ``suite.comm.bucketed``).  The shard is allocated on the current
stream, so inside ``torch.cuda.stream(side)`` it belongs to the side stream that uses it.
"""
from __future__ import annotations

import torch

from ..runtime.groups import NodeGroups
from . import collectives as C

__all__ = ["hierarchical_all_reduce", "MODES"]

MODES = ("scatter", "reduce")


def hierarchical_all_reduce(tensor: torch.Tensor, ng: NodeGroups, mode: str = "scatter") -> None:
    """Sum ``tensor`` (flat, contiguous) over every rank of the world, in place."""
    if mode == "scatter":
        n = ng.ranks_per_node
        if tensor.numel() % n:
            raise ValueError(f"hierarchical reduce-scatter needs numel divisible by ranks_per_node={n}, "
                             f"got {tensor.numel()} (pad the buffer)")
        shard = torch.empty(tensor.numel() // n, dtype=tensor.dtype, device=tensor.device)
        if n > 1:
            C.reduce_scatter(shard, tensor, group=ng.intra)
        else:
            shard.copy_(tensor)
        if ng.nodes > 1:
            C.all_reduce(shard, group=ng.inter)
        if n > 1:
            C.all_gather(tensor, shard, group=ng.intra)
        else:
            tensor.copy_(shard)
        return
    if mode == "reduce":
        leader = ng.intra_ranks[0]
        if ng.ranks_per_node > 1:
            C.reduce(tensor, dst=leader, group=ng.intra)
        if ng.local_index == 0 and ng.nodes > 1:
            C.all_reduce(tensor, group=ng.inter)
        if ng.ranks_per_node > 1:
            C.broadcast(tensor, src=leader, group=ng.intra)
        return
    raise ValueError(f"hierarchical mode {mode!r}: allowed {', '.join(MODES)}")
