"""A few traced steps on every rank: a torch.profiler trace per rank, and the marks of one timeline of every rank.

:func:`trace_on_rank` builds the case's engine, warms it up, then runs ``steps`` steps under
``torch.profiler`` (CPU ops, and on CUDA kernels, NCCL and streams, under the engine's
``record_function`` ranges: forward, backward, bucket N ready / allreduce issue / wait, wait,
optimizer): Kineto's Chrome-trace JSON, exported into a private temporary directory and returned
gzipped (the parent writes it through the atomic writer: ``CaseRunner.trace``).

In the same steps it records marks (``platform.mark``: CUDA timing events on the current stream, host timestamps
on CPU): the step's start and end, forward start and end (hooks on the model), each
gradient's ready time (post-accumulate-grad hooks), each bucket's ready time (the gradient
synchronizer's own "ready" event, taken before it launches anything), the optimizer's start (its
``step`` called: what comes between backward and it is the wait for communication), and every
collective's launch and completion (``collectives.STATS.record_spans``).  These draw the one file
Kineto cannot: every rank on one clock with each communicator's collectives on its own track
(``suite.measure.timeline``); Kineto writes one file per rank.  On CUDA a
hook runs when its kernels are *queued*, so a host clock there would show every gradient ready
at once and every collective near-instant; device events show when the work ran.  After each
step's synchronize, every mark becomes wall-clock seconds (an anchor mark taken with the host
time at the step's start), so ranks line up.  The step boundaries synchronize the device, so
traced steps are slower than timed ones: the trace shows the structure of a step, the timings
live in the records.

Bucket-ready marks: a gradient synchronizer that records events (``BucketedGradSync.events``)
gets its "ready" events, marked on the device clock (``clock``).  The hooks of this module are
registered after the synchronizer's, so for a bucket's last gradient the synchronizer's hook has
already launched the allreduce when this module's hook runs: a ready time taken there came 1-2 ms
after the allreduce began.  Otherwise (plain data parallel: its allreduces start after backward)
every parameter is its own bucket, ready at its gradient's mark.
"""
from __future__ import annotations

import gzip
import os
import tempfile
import time

import torch
from torch.profiler import ProfilerActivity, profile, schedule, supported_activities

from ..comm import collectives as C
from ..comm.bucketed import BucketedGradSync
from ..config import StrategyConfig
from ..workload import WorkloadSpec, workload

__all__ = ["trace_on_rank", "quiet_kineto", "KINETO_QUIET"]

KINETO_QUIET = "6"  # KINETO_LOG_LEVEL: its levels end with its USDT lines (5); 6 prints none of them


def quiet_kineto(cuda: bool) -> None:
    """Kineto (torch 2.13) prints two lines, ``USDT: … profiler_start`` and ``profiler_stop``, to stderr at every
    profiler start and stop: two lines per rank per profiled section on the user's terminal, between the run's own
    lines.  On CPU, where Kineto has nothing else to say (no CUPTI), its log is silenced for this rank process
    (``KINETO_LOG_LEVEL``, read when a profiler starts) unless the user set the variable; on CUDA it is left as it
    is: CUPTI's warnings are worth reading there."""
    if not cuda:
        os.environ.setdefault("KINETO_LOG_LEVEL", KINETO_QUIET)


def _buckets(engine, names: list[str]) -> list[list[str]]:
    sync = engine.grad_sync
    fn = getattr(sync, "bucket_names", None)
    if callable(fn):
        return [list(b) for b in fn()]
    buckets = getattr(sync, "buckets", None)  # BucketedGradSync: Bucket.names, in launch order
    if buckets and all(hasattr(b, "names") for b in buckets):
        return [list(b.names) for b in buckets]
    if sync is not None and type(sync).__name__ == "NoGradSync":
        return []
    return [[n] for n in names]


def trace_on_rank(workload_spec: WorkloadSpec, config: dict, steps: int = 3, warmup: int = 1) -> dict:
    """The marks of ``steps`` steps after ``warmup`` (see the module docstring) and this rank's torch.profiler trace:
    ``kineto`` (Kineto's Chrome-trace JSON, gzipped) and ``kineto_bytes`` (its size unzipped)."""
    wl = workload(workload_spec)
    world, rank = wl.world, wl.rank
    engine = wl.engine(StrategyConfig.from_dict(config))
    names = [n for n, p in engine.module.named_parameters() if p.requires_grad]

    platform = wl.platform
    sync = engine.grad_sync if isinstance(engine.grad_sync, BucketedGradSync) else None
    if sync is not None:  # its own events ("ready" before any launch), on this trace's clock
        sync.clock, sync.events = platform.mark, []
    # wall = perf + offset: one clock per rank, comparable across ranks of one host (and roughly across hosts)
    offset = time.time() - time.perf_counter()
    marks: dict = {"fwd": [], "grads": [], "opt": []}

    def pre(_m, _inp):
        marks["fwd"].append(platform.mark())

    def post(_m, _inp, _out):
        marks["fwd"].append(platform.mark())

    def grad_hook(name):
        def hook(_p):
            marks["grads"].append((name, platform.mark()))
        return hook

    handles = [engine.model.register_forward_pre_hook(pre), engine.model.register_forward_hook(post)]
    for n, p in engine.module.named_parameters():
        if p.requires_grad:
            handles.append(p.register_post_accumulate_grad_hook(grad_hook(n)))
    optimizer = engine.optimizer
    real_step, own_step = optimizer.step, "step" in vars(optimizer)

    def step_marked(*a, **k):  # the optimizer's start; an instance attribute, removed below
        marks["opt"].append(platform.mark())
        return real_step(*a, **k)

    optimizer.step = step_marked

    batches = [wl.batch(b) for b in range(warmup + steps)]
    out_steps = []
    activities = [ProfilerActivity.CPU] + (
        [ProfilerActivity.CUDA] if platform.is_cuda and ProfilerActivity.CUDA in supported_activities() else [])
    quiet_kineto(platform.is_cuda)
    try:
        with tempfile.TemporaryDirectory(prefix="fleetbench-trace-") as private:  # mode 0700: this process's own
            path = os.path.join(private, f"rank{rank}.pt.trace.json")
            with profile(activities=activities, schedule=schedule(wait=0, warmup=warmup, active=steps, repeat=1),
                         on_trace_ready=lambda prof: prof.export_chrome_trace(path)) as prof:
                for i, (x, y) in enumerate(batches):
                    record = i >= warmup
                    for kind in marks.values():
                        kind.clear()
                    if sync is not None:
                        sync.events = []
                    C.STATS.record_spans(record)
                    torch.distributed.barrier()
                    platform.synchronize()
                    t0 = time.perf_counter()
                    anchor = platform.mark()
                    engine.train_step(x, y)
                    platform.synchronize()
                    t1 = time.perf_counter()
                    prof.step()
                    if record:
                        out_steps.append(_step_marks(platform, anchor, t0, t1, offset, marks,
                                                     sync.events if sync is not None else None))
            with open(path, "rb") as fh:
                kineto = fh.read()
    finally:
        C.STATS.record_spans(False)
        for h in handles:
            h.remove()
        if own_step:
            optimizer.step = real_step
        else:
            del optimizer.step  # the class's own again
        if sync is not None:
            sync.clock, sync.events = time.perf_counter, None
    return {"rank": rank, "world": world, "device": str(wl.device), "buckets": _buckets(engine, names),
            "describe": engine.describe(), "steps": out_steps, "kineto": gzip.compress(kineto, 6),
            "kineto_bytes": len(kineto)}


def _step_marks(platform, anchor, t0: float, t1: float, offset: float, marks: dict, events: list | None) -> dict:
    """One traced step's marks as wall-clock seconds (see the module docstring)."""
    C.STATS.resolve_spans(platform, anchor, t0)

    def at(m) -> float:
        return t0 + platform.elapsed(anchor, m) + offset

    spans = list(C.STATS.spans or [])
    return {
        "t0": t0 + offset, "t1": t1 + offset,
        "forward": [at(marks["fwd"][0]), at(marks["fwd"][-1])] if marks["fwd"] else None,
        "grads": [(n, at(m)) for n, m in marks["grads"]],
        "bucket_ready": None if events is None else [(b, at(m)) for kind, b, m in events if kind == "ready"],
        "optimizer": at(marks["opt"][0]) if marks["opt"] else None,  # None: AMP skipped the step
        "comm": [{"op": s.op, "group": s.group, "nbytes": s.nbytes, "start": s.start_means,
                  "t0": s.t_launch + offset, "t1": (s.t_end if s.t_end is not None else t1) + offset}
                 for s in spans],
    }
