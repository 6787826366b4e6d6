"""A few traced steps on every rank: the timestamps a Chrome/Perfetto trace is drawn from.

:func:`trace_on_rank` builds the case's engine, warms it up, then runs ``steps`` steps while
recording marks (``platform.mark``: CUDA timing events on the current stream, host timestamps
on CPU): the step's start and end, forward start and end (hooks on the model), each
gradient's ready time (post-accumulate-grad hooks: the marks a bucket becomes ready from),
and every collective's launch and completion (``collectives.STATS.record_spans``).  On CUDA a
hook runs when its kernels are *queued*, so a host clock there would show every gradient ready
at once and every collective near-instant; device events show when the work ran.  After each
step's synchronize, every mark becomes wall-clock seconds (an anchor mark taken with the host
time at the step's start), so ranks line up.  The step boundaries synchronize the device, so
traced steps are slower than timed ones: the trace shows the structure of a step, the timings
live in the records.

Bucket-ready marks: a gradient synchronizer that exposes ``bucket_names()`` (a list of lists
of parameter names, in launch order) or ``buckets`` with ``.names`` (``BucketedGradSync``) gets
one mark per bucket, at the ready time of its last gradient; otherwise (plain data parallel)
every parameter is its own bucket.
"""
from __future__ import annotations

import time

import torch

from ..comm import collectives as C
from ..config import StrategyConfig
from ..workload import WorkloadSpec, workload

__all__ = ["trace_on_rank"]


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
    wl = workload(workload_spec)
    world, rank = wl.world, wl.rank
    engine = wl.engine(StrategyConfig.from_dict(config))
    names = [n for n, p in engine.module.named_parameters() if p.requires_grad]

    platform = wl.platform
    # wall = perf + offset: one clock per rank, comparable across ranks of one host (and roughly across hosts)
    offset = time.time() - time.perf_counter()
    marks: dict = {"fwd": [], "grads": []}

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

    batches = [wl.batch(b) for b in range(warmup + steps)]
    out_steps = []
    try:
        for i, (x, y) in enumerate(batches):
            record = i >= warmup
            marks["fwd"].clear()
            marks["grads"].clear()
            C.STATS.record_spans(record)
            torch.distributed.barrier()
            platform.synchronize()
            t0 = time.perf_counter()
            anchor = platform.mark()
            engine.train_step(x, y)
            platform.synchronize()
            t1 = time.perf_counter()
            if record:
                C.STATS.resolve_spans(platform, anchor, t0)

                def at(m, t0=t0, anchor=anchor) -> float:
                    return t0 + platform.elapsed(anchor, m) + offset

                spans = list(C.STATS.spans or [])
                out_steps.append({
                    "t0": t0 + offset, "t1": t1 + offset,
                    "forward": [at(marks["fwd"][0]), at(marks["fwd"][-1])] if marks["fwd"] else None,
                    "grads": [(n, at(m)) for n, m in marks["grads"]],
                    "comm": [{"op": s.op, "group": s.group, "nbytes": s.nbytes, "start": s.start_means,
                              "t0": s.t_launch + offset,
                              "t1": (s.t_end if s.t_end is not None else t1) + offset} for s in spans],
                })
    finally:
        C.STATS.record_spans(False)
        for h in handles:
            h.remove()
    return {"rank": rank, "world": world, "device": str(wl.device), "buckets": _buckets(engine, names),
            "describe": engine.describe(), "steps": out_steps}
