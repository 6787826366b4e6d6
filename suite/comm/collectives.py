"""Every collective fleetbench issues goes through here, so it can be counted per group.

The counts are structural evidence that tests use (one allreduce per bucket per step,
spread over ``nccl_comm_num`` groups, no collective between Local SGD averagings …) and
that records carry (bytes communicated).  Optional span recording (launch/end times per
collective) feeds the Perfetto trace.

Span times.  On CPU (gloo) a collective runs while the call blocks, so host clocks are right.
On CUDA (NCCL) a call returns once the work is *queued* and ``Work.wait()`` only makes a stream
wait, so host clocks would show near-zero collectives.  There each span holds two timing events
(``Platform.mark``): one on the calling stream before the launch, one that completes when the
collective does — after a synchronous call, on the calling stream (which NCCL made wait for it);
after an asynchronous one, on a timing stream of the span's group that waits for the work (so the
caller's stream is not held back).

What the start means on CUDA.  A *synchronous* call (``async_op=False``) runs on the calling stream
itself: torch 2.13's ``ProcessGroupNCCL::collective`` takes the current stream as the NCCL stream when
``asyncOp`` is false (torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp, "in asyncOp=false [default] mode,
we use currentStream as ncclStream"), so its span is the collective, waiting for its peers included.  An
*asynchronous* call runs on the communicator's own internal stream, which torch does not expose to Python:
at launch that stream is made to wait for an event recorded on the calling stream (``syncStream``); its
own start event (``ncclStartEvent_``) exists only with TORCH_NCCL_ENABLE_TIMING and is not readable per
call.  So an async span's start is when the calling stream reached the collective (its inputs ready); the
kernel starts then, or when the communicator's earlier collectives end: queueing behind the same
communicator plus the collective.  Each span says which (``Span.start_means``, carried into the trace's
event arguments).

Times are resolved after the step's synchronize:

    p.synchronize(); t0 = time.perf_counter(); anchor = p.mark()
    ...the step...
    p.synchronize(); STATS.resolve_spans(p, anchor, t0)   # span.t_launch / t_end, host seconds
"""
from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

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
    spans: list | None = None

    def reset(self) -> None:
        self.calls.clear()
        self.bytes.clear()
        if self.spans is not None:
            self.spans.clear()

    def record_spans(self, on: bool = True) -> None:
        self.spans = [] if on else None

    def resolve_spans(self, platform, anchor, anchor_time: float) -> None:
        """Set every event-timed span's ``t_launch``/``t_end`` to ``anchor_time`` plus its events' device
        time since ``anchor`` (a mark taken when ``anchor_time`` was read).  Call after a synchronize."""
        for span in self.spans or []:
            if span.ev_launch is not None:
                span.t_launch = anchor_time + platform.elapsed(anchor, span.ev_launch)
            if span.ev_end is not None:
                span.t_end = anchor_time + platform.elapsed(anchor, span.ev_end)

    def snapshot(self) -> dict:
        return {
            "calls": {f"{g}/{op}": n for (g, op), n in sorted(self.calls.items())},
            "bytes": {f"{g}/{op}": n for (g, op), n in sorted(self.bytes.items())},
        }

    def total(self, op: str | None = None, group_prefix: str = "") -> int:
        return sum(n for (g, o), n in self.calls.items() if (op is None or o == op) and g.startswith(group_prefix))

    def total_bytes(self, op: str | None = None) -> int:
        return sum(n for (g, o), n in self.bytes.items() if op is None or o == op)


STATS = CommStats()
_LOCK = threading.Lock()  # collectives may be issued from communicator worker threads


@dataclass
class Span:
    """One recorded collective: times (``time.perf_counter`` seconds) of launch and completion.

    On CUDA ``ev_launch``/``ev_end`` are timing events and the times are host stand-ins until
    :meth:`CommStats.resolve_spans` sets them from the events."""

    op: str
    group: str
    nbytes: int
    t_launch: float
    t_end: float | None = None
    ev_launch: Any = None
    ev_end: Any = None
    platform: Any = field(default=None, repr=False)
    asynchronous: bool = False

    @property
    def start_means(self) -> str:
        if self.platform is not None and not self.asynchronous:  # CUDA: see the module docstring
            return ("the calling stream reached the collective, which runs on that stream (synchronous NCCL call): "
                    "the collective, waiting for peers included")
        if self.platform is not None:
            return ("the calling stream reached the collective (inputs ready); NCCL's stream starts it then or "
                    "after this communicator's earlier collectives: queueing + collective")
        return "the call entered (gloo runs the collective inside the call, or on its worker thread when async)"


_TIMING_STREAMS: dict = {}  # (CUDA API, group label) -> a stream that only waits for that group's async collectives


def _platform():
    from ..runtime.context import _CURRENT  # read at call time: set_current rebinds it

    return _CURRENT.platform if _CURRENT is not None else None


def _mark_end_of_async(span: Span, work) -> None:
    """CUDA: an event on the group's timing stream that completes when ``work`` does."""
    p = span.platform
    key = (id(p.cuda), span.group)
    ts = _TIMING_STREAMS.get(key)
    if ts is None:
        ts = _TIMING_STREAMS[key] = p.new_stream()
    with p.use_stream(ts):
        work.wait()  # NCCL: makes the timing stream (current in this block) wait for the collective
        span.ev_end = p.mark(ts)


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


def _count(op: str, group, tensor: torch.Tensor, async_op: bool) -> Span | None:
    label = label_of(group)
    nbytes = tensor.numel() * tensor.element_size()
    with _LOCK:
        STATS.calls[(label, op)] += 1
        STATS.bytes[(label, op)] += nbytes
        if STATS.spans is None:
            return None
    span = Span(op, label, nbytes, time.perf_counter(), asynchronous=async_op)
    p = _platform()
    if p is not None and p.is_cuda:
        span.platform = p
        span.ev_launch = p.mark()  # on the calling stream (a synchronous collective's own; an async one's waits for it)
    with _LOCK:
        STATS.spans.append(span)
    return span


def _done(span: Span | None, work, async_op: bool):
    """Stamp a synchronous call's end; time an asynchronous call's completion (only when recording)."""
    if span is None:
        return work
    cuda = span.platform is not None
    if async_op and work is not None:
        if cuda:
            _mark_end_of_async(span, work)
            return work
        return _TimedWork(work, span)
    span.t_end = time.perf_counter()
    if cuda:
        span.ev_end = span.platform.mark()  # after the collective, which ran on the calling stream
    return work


def all_reduce(tensor: torch.Tensor, group=None, op=dist.ReduceOp.SUM, async_op: bool = False):
    span = _count("all_reduce", group, tensor, async_op)
    return _done(span, dist.all_reduce(tensor, op=op, group=group, async_op=async_op), async_op)


def broadcast(tensor: torch.Tensor, src: int, group=None, async_op: bool = False):
    """``src`` is a global rank, as in torch.distributed."""
    span = _count("broadcast", group, tensor, async_op)
    return _done(span, dist.broadcast(tensor, src=src, group=group, async_op=async_op), async_op)


def reduce(tensor: torch.Tensor, dst: int, group=None, op=dist.ReduceOp.SUM, async_op: bool = False):
    span = _count("reduce", group, tensor, async_op)
    return _done(span, dist.reduce(tensor, dst=dst, op=op, group=group, async_op=async_op), async_op)


def reduce_scatter(output: torch.Tensor, input: torch.Tensor, group=None, op=dist.ReduceOp.SUM, async_op: bool = False):
    span = _count("reduce_scatter", group, input, async_op)
    return _done(span, _REDUCE_SCATTER(output, input, op=op, group=group, async_op=async_op), async_op)


def all_gather(output: torch.Tensor, input: torch.Tensor, group=None, async_op: bool = False):
    span = _count("all_gather", group, output, async_op)
    return _done(span, _ALL_GATHER(output, input, group=group, async_op=async_op), async_op)


# torch 2.13 renamed the flat-tensor forms (the old names warn FutureWarning); same arguments.
_REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
