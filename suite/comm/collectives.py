"""Every collective fleetbench issues goes through here, so it can be counted per group.

The counts are structural evidence that tests use (one allreduce per bucket per step,
spread over ``nccl_comm_num`` groups, no collective between Local SGD averagings …) and
that records carry (bytes communicated).  Optional span recording (start/end wall
times per collective) feeds the Perfetto trace.
"""
from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.distributed as dist

from ..runtime.groups import label_of

__all__ = ["STATS", "CommStats", "all_reduce", "broadcast", "reduce_scatter", "all_gather", "reduce"]


@dataclass
class CommStats:
    calls: Counter = field(default_factory=Counter)  # (group label, op) -> count
    bytes: Counter = field(default_factory=Counter)  # (group label, op) -> bytes
    spans: Optional[list] = None  # (op, group label, nbytes, t_launch) when recording

    def reset(self) -> None:
        self.calls.clear()
        self.bytes.clear()
        if self.spans is not None:
            self.spans.clear()

    def record_spans(self, on: bool = True) -> None:
        self.spans = [] if on else None

    def snapshot(self) -> dict:
        return {
            "calls": {f"{g}/{op}": n for (g, op), n in sorted(self.calls.items())},
            "bytes": {f"{g}/{op}": n for (g, op), n in sorted(self.bytes.items())},
        }

    def total(self, op: Optional[str] = None, group_prefix: str = "") -> int:
        return sum(n for (g, o), n in self.calls.items() if (op is None or o == op) and g.startswith(group_prefix))

    def total_bytes(self, op: Optional[str] = None) -> int:
        return sum(n for (g, o), n in self.bytes.items() if op is None or o == op)


STATS = CommStats()
_LOCK = threading.Lock()  # collectives may be issued from communicator worker threads


def _count(op: str, group, tensor: torch.Tensor) -> None:
    label = label_of(group)
    nbytes = tensor.numel() * tensor.element_size()
    with _LOCK:
        STATS.calls[(label, op)] += 1
        STATS.bytes[(label, op)] += nbytes
        if STATS.spans is not None:
            STATS.spans.append((op, label, nbytes, time.perf_counter()))


def all_reduce(tensor: torch.Tensor, group=None, op=dist.ReduceOp.SUM, async_op: bool = False):
    _count("all_reduce", group, tensor)
    return dist.all_reduce(tensor, op=op, group=group, async_op=async_op)


def broadcast(tensor: torch.Tensor, src: int, group=None, async_op: bool = False):
    """``src`` is a global rank, as in torch.distributed."""
    _count("broadcast", group, tensor)
    return dist.broadcast(tensor, src=src, group=group, async_op=async_op)


def reduce(tensor: torch.Tensor, dst: int, group=None, op=dist.ReduceOp.SUM, async_op: bool = False):
    _count("reduce", group, tensor)
    return dist.reduce(tensor, dst=dst, op=op, group=group, async_op=async_op)


def reduce_scatter(output: torch.Tensor, input: torch.Tensor, group=None, op=dist.ReduceOp.SUM, async_op: bool = False):
    _count("reduce_scatter", group, input)
    return _REDUCE_SCATTER(output, input, op=op, group=group, async_op=async_op)


def all_gather(output: torch.Tensor, input: torch.Tensor, group=None, async_op: bool = False):
    _count("all_gather", group, output)
    return _ALL_GATHER(output, input, group=group, async_op=async_op)


# torch 2.13 renamed the flat-tensor forms (the old names warn FutureWarning); same arguments.
_REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
