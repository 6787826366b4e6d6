"""Bucketed gradient communication: allreduce fusion, overlap, several communicators, hierarchy.

One class covers the knobs that change *how* gradients travel (``build_grad_sync`` picks it
as soon as one of them is set):

- ``fuse_all_reduce_ops`` / ``fuse_grad_size_in_MB`` / ``fuse_grad_size_in_layers`` / ``first_bucket_MB``:
  buckets (``suite.comm.buckets``, where DDP's first-bucket rule is decided); fusion off = one parameter per
  bucket.  ``p.grad`` are views into one flat buffer per bucket (``gradient_as_bucket_view``; False: their
  own tensors, copied in by the hook and out once the bucket is reduced), one allreduce per bucket,
  averaging folded in: under the engine, into backward's seed (the loss gradient is 1/world, Paddle's
  ``gradient_scale_configs`` "avg"), so the buckets are summed as they are; driven by anyone else, each
  bucket is divided by the world size before its sum.
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
gradient arrived: a marker, before anything is launched for it), "bucket N allreduce issue" (the launch),
"bucket N wait" (its completion, in ``finish_step`` with overlap) and, with copies, "bucket N copy out"; per
bucket, never per parameter hook.

The hook is the only Python that runs per parameter in a step: one dictionary look-up, one identity test
(``p.grad`` is still its view), its bucket's count; everything else is per bucket.  With views the engine
zeroes the gradients bucket by bucket (:meth:`zero_grad`: one fill per bucket, not one per parameter).

Parameters with ``requires_grad=False`` are skipped.  Unused parameters (``find_unused_parameters=True``) follow
torch DDP's reducer (torch/csrc/distributed/c10d/reducer.cpp):

- before backward the engine finds which parameters the step's autograd graph reaches (``search_unused_parameters``
  in ``prepare_for_backward``; here ``suite.comm.agree.used_parameters``) and :meth:`mark_unused` marks the others
  ready at once, their slots holding their gradient as it is (zeros when they have none), as the reducer does at
  the first autograd hook (``autograd_hook``: "if (!has_marked_unused_parameters_) … mark_variable_ready(unused_index)",
  whose ``mark_variable_ready_dense`` zeroes the slot of an undefined gradient): so a bucket holding an unused
  parameter is launched during backward like any other, instead of holding back every bucket after it (buckets
  launch strictly in order);
- after backward one allreduce of flags says which parameters any rank has a gradient for (DDP's
  ``local_used_map``); one that no rank has keeps ``grad`` None ("If a parameter is globally unused, we keep its grad
  untouched", ``finalize_bucket_dense``), so the optimizer skips it as it would in one process; one that another
  rank used gets the average.  A gradient is never bound to its bucket view before it exists (the reducer's
  ``initialize_bucket_views``: "grads should be kept as being undefined for globally unused parameters").

A parameter whose hook did not fire otherwise is reduced as zeros with ``find_unused_parameters=True``; without
it ``finish_step`` raises an error naming it, after draining the collectives already in flight, so nothing hangs.
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
from .grad_sync import GradSync, sparse_gradients_refused, unused_parameters_error
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
        if self._sparse:  # refused here too, for a user's own build_engine (the selection skips such cases)
            raise ValueError(sparse_gradients_refused("flat gradient buckets", sorted(self._sparse)))
        ctx = _rank_context()
        # a user's own process group: the parameters' device and the group's backend (on NCCL the CUDA paths,
        # never collectives from worker threads)
        self.platform: Platform = ctx.platform if ctx is not None else platform_of(self.params, group)
        self.wait_timeout = (ctx.pg_timeout if ctx else 60.0) + 30.0
        self.fuse = config.fuse_all_reduce_ops
        self.as_views = config.gradient_as_bucket_view
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
                             config.fuse_grad_size_in_layers, config.first_bucket_MB if self.fuse else None)
        self.buckets: list[Bucket] = [
            Bucket.allocate(pl.index, [self.named_params[i] for i in pl.members], pl.layers,
                            pl.index % self.comm_num, pad_to, as_views=self.as_views)
            for pl in plans
        ]
        self._slot: dict[int, tuple[Bucket, int]] = {}  # id(parameter) -> its bucket and place in it
        for b in self.buckets:
            for k, p in enumerate(b.params):
                self._slot[id(p)] = (b, k)
        self._handles = [p.register_post_accumulate_grad_hook(self._on_grad) for p in self.params]
        self._executors: dict[int, cf.ThreadPoolExecutor] = {}  # CPU: one worker thread per communicator
        self._side_streams: dict = {}  # CUDA: one side stream per communicator
        self._inflight: list[tuple[Bucket, Callable[[], None]]] = []
        self._next = 0
        self._armed = False
        self._listening = False  # the hooks count gradients (between begin_step(True) and finish_step)
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
        self._listening = communicate

    def finish_step(self) -> None:
        armed, self._armed, self._listening = self._armed, False, False
        if not self.communicate:
            return
        if not armed:
            raise RuntimeError("finish_step() without begin_step(): call begin_step before backward")
        self._note_launched_in_backward()
        missing = [(b, k) for b in self.buckets if b.pending for k in range(len(b.params)) if not b.ready[k]]
        if missing:
            if not self.config.find_unused_parameters:
                self._drain()  # what was launched completes on every rank; nothing is left hanging
                raise unused_parameters_error([b.names[k] for b, k in missing])
            for b, k in missing:  # in the graph, yet no gradient arrived: as an unused one
                self._mark_ready_unused(b, k)
            self._launch_ready()
        if self._next != len(self.buckets):  # cannot happen: every bucket is complete here
            raise RuntimeError(f"internal error: {len(self.buckets) - self._next} bucket(s) never launched")
        read = self._defined_anywhere() if self.config.find_unused_parameters and self.params else None
        self._drain()
        if read is not None:
            lacking = [i for i, p in enumerate(self.params) if p.grad is None]
            anywhere = read() if lacking else None  # waited for and read on the host only where needed, as DDP
            self._settle()
            for i in lacking:  # a gradient another rank has: this rank's zeros were in the average; adopt it
                if anywhere is not None and anywhere[i]:
                    b, k = self._slot[id(self.params[i])]
                    b.adopt(k)

    def wants_used(self) -> bool:
        """With ``find_unused_parameters``, on a communicating step: the unused parameters are marked ready before
        backward (see the module docstring)."""
        return self.config.find_unused_parameters and self._listening

    def mark_unused(self, used: list[bool]) -> None:
        """Before backward: every parameter the step's graph does not reach is ready now (its slot holds its gradient
        as it is, zeros when it has none), and every bucket that completes is launched, in order."""
        if not self._listening:
            return
        for p, u in zip(self.params, used):
            if not u:
                b, k = self._slot[id(p)]
                if not b.ready[k]:
                    self._mark_ready_unused(b, k)
        self._launch_ready()

    def _mark_ready_unused(self, b: Bucket, k: int) -> None:
        """Parameter ``k`` of bucket ``b`` gets no gradient in this step: its slot holds the gradient it has (zeros
        when it has none, which stays None until the flags after backward say another rank has one)."""
        with torch.no_grad():
            if b.params[k].grad is None:
                b.views[k].zero_()
            elif b.as_views:
                b.bind(k)
            else:
                b.copy_in(k)
        b.ready[k] = True
        b.pending -= 1
        if b.pending == 0:
            self._ready(b.index)

    def fold_average_into_backward(self) -> bool:
        """Yes: the engine scales backward's seed by 1/world and the buckets are summed as they are (no division
        pass over the gradients; see :meth:`GradSync.fold_average_into_backward`)."""
        self.averaged_in_backward = True
        return True

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
            "gradient_as_bucket_view": self.as_views,
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

    def zero_grad(self) -> bool:
        """Zero every gradient bucket by bucket (one fill each) when the gradients are its views; False (nothing
        done) with copies, whose gradients the optimizer zeroes."""
        if not self.as_views:
            return False
        with torch.no_grad():
            for b in self.buckets:
                b.bind_all()  # a gradient replaced since the hooks ran (set to None, or a new tensor) is a view again
                b.flat.zero_()
        return True

    def time_hooks(self, reps: int = 20) -> float:
        """Microseconds per parameter of the gradient hook's own work (its bookkeeping, the per-bucket ranges, with
        copies its copy into the bucket), communication left out: every hook called in bucket order, ``reps``
        times, each between ``begin_step`` and ``finish_step`` with the launches stubbed (what
        `fleetbench figures engine_cost` reports beside the profile, where the profiler's own cost per event
        would weigh on a figure this small).  Leaves the gradients' values as they were (copies: as reduced)."""
        params = [p for b in self.buckets for p in b.params]
        if not params:
            return 0.0
        def nothing(flat: torch.Tensor, comm: int, asynchronous: bool, divide: bool = True) -> Callable[[], None]:
            return lambda: None

        self._start = nothing  # type: ignore[method-assign]
        seconds = 0.0
        try:
            for _ in range(reps):
                self.begin_step(True)
                t0 = time.perf_counter()
                for p in params:
                    self._on_grad(p)
                seconds += time.perf_counter() - t0
                self.finish_step()
        finally:
            del self._start  # the method again
        return seconds / reps / len(params) * 1e6

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
        """A parameter's gradient is accumulated: its bucket counts it down and launches when complete (the only
        Python per parameter in a step: keep it to look-ups and one identity test)."""
        if not self._listening:
            return
        b, k = self._slot[id(p)]
        if not b.as_views:
            b.copy_in(k)  # copies: into its slice of the bucket, as DDP's reducer does
        elif p.grad is not b.views[k]:
            b.bind(k)  # autograd replaced the view (it does when p.grad was None): restore it, keeping the value
        ready = b.ready
        if ready[k]:
            raise RuntimeError(
                f"parameter {b.names[k]!r} got a gradient twice in one step (two backward calls between "
                "begin_step and finish_step); accumulate with begin_step(communicate=False) steps instead"
            )
        ready[k] = True
        b.pending -= 1
        if self.events is not None:
            self.events.append(("hook", b.index, self.clock()))
        if b.pending == 0:
            self._ready(b.index)
            self._launch_ready()

    def _launch_ready(self) -> None:
        """Launch every complete bucket from the next one in order (never out of order)."""
        while self._next < len(self.buckets) and self.buckets[self._next].pending == 0:
            b = self.buckets[self._next]
            self._next += 1
            self._event("launch", b.index)
            with record_function(f"bucket {b.index} allreduce issue"):
                complete = self._start(b.flat, b.comm_index, asynchronous=self.overlap,
                                       divide=not self.averaged_in_backward)
            if self.overlap:
                self._inflight.append((b, complete))
            else:
                self._complete(b, complete)

    def _start(self, flat: torch.Tensor, comm: int, asynchronous: bool, divide: bool = True) -> Callable[[], None]:
        """Start averaging ``flat`` over the world on communicator ``comm`` (``divide=False``: it holds gradients
        divided already, by backward's seed); returns its completion."""
        if self.hier is None:
            done = self._allreduce_average(flat, self.groups[comm], async_op=asynchronous, divide=divide)
            return done if done is not None else (lambda: None)
        ng = self.hier[comm]

        def chain() -> None:
            wire = self._to_wire(flat, divide)  # the flat path's averaging and wire dtype
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

    def _complete(self, b: Bucket, complete: Callable[[], None]) -> None:
        """Wait for bucket ``b``'s allreduce (copies: then copy it out into the gradients)."""
        with record_function(f"bucket {b.index} wait"):
            complete()
        self._event("wait", b.index)
        if not b.as_views:
            with record_function(f"bucket {b.index} copy out"), torch.no_grad():
                b.copy_out()

    def _drain(self) -> None:
        inflight, self._inflight = self._inflight, []
        for b, complete in inflight:
            self._complete(b, complete)
