"""Bucketed gradient communication: allreduce fusion, overlap, several communicators, hierarchy.

One class covers the knobs that change *how* gradients travel (``build_grad_sync`` picks it
as soon as one of them is set):

- ``fuse_all_reduce_ops`` / ``fuse_grad_size_in_MB`` / ``fuse_grad_size_in_layers``: buckets
  (``suite.comm.buckets``); fusion off = one parameter per bucket.  ``p.grad`` are views into
  one flat buffer per bucket, one allreduce per bucket, averaging folded in (divide, sum).
- ``sync_nccl_allreduce``: a post-accumulate-grad hook per parameter counts the bucket's
  gradients; when a bucket is complete it is launched.  Buckets are launched strictly in
  bucket order (a bucket whose predecessor is not complete waits for it), so every rank issues
  the same collectives in the same order whatever order its hooks fire in, as DDP's reducer
  does.  True (Paddle's default): each launch is waited on at once, inside backward (no
  overlap).  False: launched asynchronously, waited on in ``finish_step`` before the optimizer.
  ``describe()["launched_in_backward"]``: the fewest buckets launched before backward ended in any
  step so far (read in ``finish_step``, one integer a step): the observation an overlap case's
  record holds.
- ``nccl_comm_num``: that many communicators (``comm_groups``); bucket i goes to
  communicator ``i % nccl_comm_num``.  On gloo each group has its own worker threads.
- ``use_hierarchical_allreduce``: each bucket goes through ``suite.comm.hierarchical``
  (intra reduce-scatter, inter allreduce, intra allgather) on communicator c's node groups
  (``node_groups(ranks_per_node, c)``).  Without overlap the chain runs inline.  With overlap:

  - CPU (gloo): the chain of a bucket runs on communicator c's own worker thread (one thread per
    communicator, buckets in order), so it proceeds while backward computes (gloo blocks the
    calling thread for each step).
  - CUDA (NCCL): ``Work.wait()`` blocks the calling thread's *current stream*, not the CPU, so a
    worker thread (whose current stream is the default stream backward also uses) would make
    backward wait for every chain, and threads of several communicators could queue in different
    orders on different ranks through that shared stream: a cross-rank wait cycle, a hang.  So the
    chain is queued from the hook itself, in bucket order, on communicator c's side stream: the
    side stream first waits for the stream that produced the gradients, the three steps are issued
    inside ``torch.cuda.stream(side)``, an event is recorded there; completion makes the current
    stream wait for that event and records the bucket's buffer as used on the side stream.  No
    thread issues a collective but the hook's and the caller's, always in bucket order.

Each bucket's moments are ``record_function`` ranges for a torch.profiler trace: "bucket N ready" (its last
gradient arrived: a marker, before anything is launched for it), "bucket N allreduce issue" (the launch) and
"bucket N wait" (its completion, in ``finish_step`` with overlap); per bucket, never per parameter hook.

Parameters with ``requires_grad=False`` are skipped.  A parameter whose hook did not fire in
a step (unused) is reduced as zeros with ``find_unused_parameters=True`` (DDP's behaviour),
otherwise ``finish_step`` raises an error naming it, after draining the collectives already in
flight, so nothing hangs.
"""
from __future__ import annotations

import concurrent.futures as cf
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch.profiler import record_function

from ..config import StrategyConfig
from ..runtime.context import current
from ..runtime.device import Platform, platform_of
from ..runtime.groups import comm_groups, label_of, node_groups
from .buckets import Bucket, fusion_log_line, log, param_owners, plan_buckets
from .grad_sync import GradSync, unused_parameters_error
from .hierarchical import hierarchical_all_reduce

__all__ = ["BucketedGradSync"]

HIER_MODE = "scatter"  # reduce-scatter / allreduce / allgather (see suite.comm.hierarchical)


def _rank_context():
    try:
        return current()
    except RuntimeError:
        return None


class BucketedGradSync(GradSync):
    name = "bucketed"

    def __init__(self, model: torch.nn.Module, config: StrategyConfig, group=None):
        super().__init__(model, config, group)
        ctx = _rank_context()
        # a user's own process group: the parameters' device and the group's backend (on NCCL the CUDA paths,
        # never collectives from worker threads)
        self.platform: Platform = ctx.platform if ctx is not None else platform_of(self.params, group)
        self.wait_timeout = (ctx.pg_timeout if ctx else 60.0) + 30.0
        self.fuse = config.fuse_all_reduce_ops
        self.overlap = not config.sync_nccl_allreduce
        self.comm_num = config.nccl_comm_num
        self.hier = None
        self.groups: list = []
        pad_to = 1
        if config.use_hierarchical_allreduce:
            if group is not None and group is not dist.group.WORLD:
                raise ValueError(
                    "use_hierarchical_allreduce=True needs the default (world) process group: emulated nodes are "
                    f"blocks of consecutive global ranks, but the engine was given group {label_of(group)!r}"
                )
            local_ws = ctx.local_world_size if ctx is not None and ctx.torchrun else None
            rpn = config.resolve_inter_nranks(self.world, local_ws)
            config.check_world(self.world, local_ws, torchrun=local_ws is not None)
            self.ranks_per_node = rpn
            self.hier = [node_groups(rpn, c) for c in range(self.comm_num)]
            pad_to = rpn
        else:
            self.groups = comm_groups(self.comm_num, parent=group)
        self.pad_to = pad_to

        plans = plan_buckets(self.named_params, param_owners(model), self.fuse, config.fuse_grad_size_in_MB,
                             config.fuse_grad_size_in_layers)
        self.buckets: list[Bucket] = [
            Bucket.allocate(pl.index, [self.named_params[i] for i in pl.members], pl.layers,
                            pl.index % self.comm_num, pad_to)
            for pl in plans
        ]
        self._slot: dict[int, tuple[int, int]] = {}
        for b in self.buckets:
            for k, p in enumerate(b.params):
                self._slot[id(p)] = (b.index, k)
        self._handles = [p.register_post_accumulate_grad_hook(self._on_grad) for p in self.params]
        self._executors: dict[int, cf.ThreadPoolExecutor] = {}  # CPU: one worker thread per communicator
        self._side_streams: dict = {}  # CUDA: one side stream per communicator
        self._inflight: list[tuple[int, Callable[[], None]]] = []
        self._next = 0
        self._armed = False
        self.launched_in_backward: int | None = None  # fewest buckets launched before backward ended, any step
        self.events: list | None = None  # (kind, bucket, time) when recording: "hook", "ready", "launch", "wait"
        self.clock: Callable[[], object] = time.perf_counter  # the events' time (a trace sets a device mark)
        log.info(fusion_log_line(len(self.params), len(self.buckets)))

    # -- the engine's calls --------------------------------------------------------
    def begin_step(self, communicate: bool = True) -> None:
        if self._inflight:  # a previous step that never finished (an exception mid-step): settle it first
            self._drain()
        self.communicate = communicate
        for b in self.buckets:
            b.bind_all()  # p.grad may have been set to None or replaced since the last step
            b.pending = len(b.params)
            b.ready = [False] * len(b.params)
        self._next = 0
        self._armed = True

    def finish_step(self) -> None:
        armed, self._armed = self._armed, False
        if not self.communicate:
            return
        if not armed:
            raise RuntimeError("finish_step() without begin_step(): call begin_step before backward")
        self._note_launched_in_backward()
        missing = [(b, k) for b in self.buckets for k in range(len(b.params)) if not b.ready[k]]
        if missing:
            if not self.config.find_unused_parameters:
                self._drain()  # what was launched completes on every rank; nothing is left hanging
                raise unused_parameters_error([b.names[k] for b, k in missing])
            with torch.no_grad():
                for b, k in missing:
                    b.bind(k)
                    b.views[k].zero_()
                    b.ready[k] = True
                    b.pending -= 1
                    if b.pending == 0:
                        self._ready(b.index)
            self._launch_ready()
        if self._next != len(self.buckets):  # cannot happen: every bucket is complete here
            raise RuntimeError(f"internal error: {len(self.buckets) - self._next} bucket(s) never launched")
        self._drain()

    def average_tensors(self, tensors: list[torch.Tensor]) -> None:
        """Average ``tensors`` in place over the same path: buckets (byte cap), communicators, hierarchy."""
        tensors = [t for t in tensors if t.numel() > 0]
        cap = self.config.fuse_grad_size_in_MB * 2**20 if self.fuse else 0
        chunks: list[list[torch.Tensor]] = []
        open_by_kind: dict = {}
        for t in tensors:
            kind = (t.dtype, t.device)
            cur = open_by_kind.get(kind)
            if cur is None or not self.fuse:
                cur = [[], 0]
                chunks.append(cur[0])
                open_by_kind[kind] = cur
            cur[0].append(t)
            cur[1] += t.numel() * t.element_size()
            if cur[1] >= cap:
                open_by_kind.pop(kind)
        pending = []
        for i, chunk in enumerate(chunks):
            numel = sum(t.numel() for t in chunk)
            padded = -(-numel // self.pad_to) * self.pad_to
            flat = torch.zeros(padded, dtype=chunk[0].dtype, device=chunk[0].device)
            off = 0
            for t in chunk:
                flat[off:off + t.numel()].copy_(t.detach().reshape(-1))
                off += t.numel()
            pending.append((chunk, flat, self._start(flat, i % self.comm_num, asynchronous=True)))
        with torch.no_grad():
            for chunk, flat, complete in pending:
                complete()
                off = 0
                for t in chunk:
                    t.copy_(flat[off:off + t.numel()].view_as(t))
                    off += t.numel()

    def describe(self) -> dict:
        info = {
            "strategy": self.name,
            "allreduce_ops_before_fusion": len(self.params),
            "allreduce_ops": len(self.buckets),
            "fuse_all_reduce_ops": self.fuse,
            "overlap": self.overlap,
            "nccl_comm_num": self.comm_num,
            "buckets": [
                {"params": len(b.params), "layers": len(b.layers), "bytes": b.nbytes, "comm": b.comm_index}
                for b in self.buckets
            ],
        }
        if self.launched_in_backward is not None:
            info["launched_in_backward"] = self.launched_in_backward
        if self.hier is not None:
            info["hierarchical"] = {"ranks_per_node": self.ranks_per_node, "nodes": self.hier[0].nodes,
                                    "schedule": "intra reduce-scatter, inter allreduce, intra allgather"}
        return info

    def collectives_alone(self) -> None:
        """Every bucket's collective, started in order and then completed, with no compute around them."""
        pending = [self._start(b.flat, b.comm_index, asynchronous=self.overlap) for b in self.buckets]
        for complete in pending:
            complete()

    def close(self) -> None:
        """Remove the hooks and stop the worker threads (the engine need not call it)."""
        for h in self._handles:
            h.remove()
        self._handles = []
        for ex in self._executors.values():
            ex.shutdown(wait=False)
        self._executors.clear()

    # -- hooks and launches --------------------------------------------------------
    def _note_launched_in_backward(self) -> None:
        """Backward has returned: the buckets launched so far were launched inside it."""
        if self.launched_in_backward is None or self._next < self.launched_in_backward:
            self.launched_in_backward = self._next

    def _event(self, kind: str, bucket: int) -> None:
        if self.events is not None:
            self.events.append((kind, bucket, self.clock()))

    def _ready(self, bucket: int) -> None:
        """Bucket ``bucket``'s gradients are all in: a marker range, before any launch it allows."""
        with record_function(f"bucket {bucket} ready"):
            self._event("ready", bucket)

    def _on_grad(self, p: torch.nn.Parameter) -> None:
        if not self._armed or not self.communicate:
            return
        bi, k = self._slot[id(p)]
        b = self.buckets[bi]
        b.bind(k)  # if autograd replaced the view (it does when p.grad was None), restore it
        if b.ready[k]:
            raise RuntimeError(
                f"parameter {b.names[k]!r} got a gradient twice in one step (two backward calls between "
                "begin_step and finish_step); accumulate with begin_step(communicate=False) steps instead"
            )
        b.ready[k] = True
        b.pending -= 1
        self._event("hook", bi)
        if b.pending == 0:
            self._ready(bi)
            self._launch_ready()

    def _launch_ready(self) -> None:
        """Launch every complete bucket from the next one in order (never out of order)."""
        while self._next < len(self.buckets) and self.buckets[self._next].pending == 0:
            b = self.buckets[self._next]
            self._next += 1
            self._event("launch", b.index)
            with record_function(f"bucket {b.index} allreduce issue"):
                complete = self._start(b.flat, b.comm_index, asynchronous=self.overlap)
            if self.overlap:
                self._inflight.append((b.index, complete))
            else:
                with record_function(f"bucket {b.index} wait"):
                    complete()
                self._event("wait", b.index)

    def _start(self, flat: torch.Tensor, comm: int, asynchronous: bool) -> Callable[[], None]:
        """Start averaging ``flat`` over the world on communicator ``comm``; returns its completion."""
        if self.hier is None:
            done = self._allreduce_average(flat, self.groups[comm], async_op=asynchronous)
            return done if done is not None else (lambda: None)
        ng = self.hier[comm]

        def chain() -> None:
            wire = self._to_wire(flat)  # the flat path's averaging and wire dtype
            hierarchical_all_reduce(wire, ng, HIER_MODE)
            if wire is not flat:
                flat.copy_(wire)

        if not asynchronous:
            chain()
            return lambda: None
        if self.platform.is_cuda:
            return self._queue_on_side_stream(flat, comm, chain)
        ex = self._executors.get(comm)
        if ex is None:
            ex = self._executors[comm] = cf.ThreadPoolExecutor(1, thread_name_prefix=f"fleetbench-comm{comm}")
        fut = ex.submit(chain)

        def complete() -> None:
            try:
                fut.result(timeout=self.wait_timeout)
            except cf.TimeoutError:
                raise RuntimeError(
                    f"hierarchical allreduce on communicator {comm} did not finish within {self.wait_timeout:.0f} s"
                ) from None

        return complete

    def _queue_on_side_stream(self, flat: torch.Tensor, comm: int, chain: Callable[[], None]) -> Callable[[], None]:
        """CUDA: queue ``chain`` now, from this thread, on communicator ``comm``'s side stream (see the
        module docstring); returns its completion (the current stream waits for it: no CPU wait)."""
        p = self.platform
        side = self._side_streams.get(comm)
        if side is None:
            side = self._side_streams[comm] = p.new_stream()
        side.wait_stream(p.current_stream())  # the bucket's gradients were produced on the current stream
        with p.use_stream(side):
            chain()
            done = p.record_event(side)

        def complete() -> None:
            p.current_stream().wait_event(done)
            p.record_stream(flat, side)  # the buffer was used on the side stream

        return complete

    def _drain(self) -> None:
        inflight, self._inflight = self._inflight, []
        for bi, complete in inflight:
            with record_function(f"bucket {bi} wait"):
                complete()
            self._event("wait", bi)
