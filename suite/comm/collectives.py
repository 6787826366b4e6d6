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

__all__ = ["STATS", "CommStats", "Span", "all_reduce", "broadcast", "reduce_scatter", "all_gather", "reduce"]


@dataclass
class CommStats:
    calls: Counter = field(default_factory=Counter)  # (group label, op) -> count
    bytes: Counter = field(default_factory=Counter)  # (group label, op) -> bytes
    # When recording: one Span per collective (t_end is filled when it completes: on return for
    # synchronous calls, on Work.wait() for asynchronous ones).  None: not recording, no overhead.
    spans: Optional[list] = None

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


@dataclass
class Span:
    """One recorded collective: host times (``time.perf_counter``) of launch and completion."""

    op: str
    group: str
    nbytes: int
    t_launch: float
    t_end: Optional[float] = None


class _TimedWork:
    """An async collective's Work that stamps its span's end when waited on; all else delegated."""

    __slots__ = ("_work", "_span")

    def __init__(self, work, span: Span):
        self._work = work
        self._span = span

    def wait(self, *args, **kwargs):
        out = self._work.wait(*args, **kwargs)
        if self._span.t_end is None:
            self._span.t_end = time.perf_counter()
        return out

    def __getattr__(self, name):
        return getattr(self._work, name)


def _count(op: str, group, tensor: torch.Tensor) -> Optional[Span]:
    label = label_of(group)
    nbytes = tensor.numel() * tensor.element_size()
    with _LOCK:
        STATS.calls[(label, op)] += 1
        STATS.bytes[(label, op)] += nbytes
        if STATS.spans is not None:
            span = Span(op, label, nbytes, time.perf_counter())
            STATS.spans.append(span)
            return span
    return None


def _done(span: Optional[Span], work, async_op: bool):
    """Stamp a synchronous call's end now; wrap an asynchronous call's Work (only when recording)."""
    if span is None:
        return work
    if async_op and work is not None:
        return _TimedWork(work, span)
    span.t_end = time.perf_counter()
    return work


def all_reduce(tensor: torch.Tensor, group=None, op=dist.ReduceOp.SUM, async_op: bool = False):
    span = _count("all_reduce", group, tensor)
    return _done(span, dist.all_reduce(tensor, op=op, group=group, async_op=async_op), async_op)


def broadcast(tensor: torch.Tensor, src: int, group=None, async_op: bool = False):
    """``src`` is a global rank, as in torch.distributed."""
    span = _count("broadcast", group, tensor)
    return _done(span, dist.broadcast(tensor, src=src, group=group, async_op=async_op), async_op)


def reduce(tensor: torch.Tensor, dst: int, group=None, op=dist.ReduceOp.SUM, async_op: bool = False):
    span = _count("reduce", group, tensor)
    return _done(span, dist.reduce(tensor, dst=dst, op=op, group=group, async_op=async_op), async_op)


def reduce_scatter(output: torch.Tensor, input: torch.Tensor, group=None, op=dist.ReduceOp.SUM, async_op: bool = False):
    span = _count("reduce_scatter", group, input)
    return _done(span, _REDUCE_SCATTER(output, input, op=op, group=group, async_op=async_op), async_op)


def all_gather(output: torch.Tensor, input: torch.Tensor, group=None, async_op: bool = False):
    span = _count("all_gather", group, output)
    return _done(span, _ALL_GATHER(output, input, group=group, async_op=async_op), async_op)


# torch 2.13 renamed the flat-tensor forms (the old names warn FutureWarning); same arguments.
_REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
