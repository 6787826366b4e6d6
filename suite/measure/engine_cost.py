"""Where a step's time goes, the engine's and DDP's side by side: torch.profiler steps cut into the same rows.

:func:`profile_on_rank` builds each variant's engine on one workload (DDP, and fleetbench's engine in DDP's
configuration), warms them up, then profiles ``steps`` steps of each, interleaved step by step (the order rotated,
:func:`suite.measure.interleave.interleaved_rounds`), one ``torch.profiler`` session per step (CPU activity).  The
engine's own ``record_function`` ranges ("broadcast buffers", "forward", "backward", "bucket N allreduce issue",
"wait", "optimizer"; one per phase and per bucket, never per parameter) and the ops under them, and DDP's reducer's
ops ("torch::distributed::reducer::mul_out", "c10d::allreduce_", "...copy_bucket_to_grad"), are cut by
:func:`step_rows` into rows that add up to the step:

===================  =======================================================================================
``before_forward``    the engine's "broadcast buffers" and anything in "forward" before the model's own forward
                      (DDP: its buffer broadcast and reducer preparation); the model's start is a marker of this
                      module's forward pre-hook (one per step)
``forward``           the rest of "forward": the model and the loss
``backward``          autograd's work in "backward", less the rows below that run inside it
``hooks``             per parameter, what runs after the gradient is accumulated and is not one of the rows
                      below: the engine's hook (bookkeeping), DDP's reducer hook less its copy; autograd's own
                      overhead per accumulation node is in it on both sides, alike
``copy_in``           gradients copied into the buckets (DDP's ``mul_out``: its copy with the division; the
                      engine with ``gradient_as_bucket_view=False``); with views, nothing
``average``           the division by the world size on its own (the engine: one ``div_`` per bucket)
``launch``            starting the buckets' allreduces (the engine's "allreduce issue" less its division;
                      DDP's ``c10d::allreduce_`` calls)
``wait``              after the last gradient, waiting for the allreduces still running (the engine's "wait";
                      DDP: the end of "backward" after its last accumulation, less its copies out)
``copy_out``          reduced buckets copied back into the gradients (DDP's ``copy_bucket_to_grad``; the
                      engine's "bucket N copy out" with copies)
``optimizer``         the update (``optimizer.step``)
``zero_grad``         zeroing the gradients (the engine with views: one fill per bucket)
``other``             the step less all of the above (the engine's precision switches, seeding, Python between)
===================  =======================================================================================

and, not parts of the sum: ``first_launch`` (ms from the start of "backward" to the first allreduce's launch: DDP
starts with a small first bucket), ``last_grad`` (ms from the start of "backward" to the end of the last
accumulation), ``allreduce`` (ms the allreduces themselves ran, on gloo's threads), ``host_syncs`` (``.item()``
calls: a device sync on CUDA; none belongs to a step).

The profiler costs a few microseconds per event on both sides, so profiled steps are slower than timed ones; the
figure reports both and attributes the timed gap to these rows.  ``hook_us`` is the engine's hook timed alone
(:meth:`suite.comm.bucketed.BucketedGradSync.time_hooks`), without the profiler.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Iterable

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from ..check.harness import param_digest
from ..comm.broadcast import broadcast_tensors, module_state
from ..comm.bucketed import BucketedGradSync
from ..config import StrategyConfig
from ..runtime.context import current
from ..runtime.device import default_threads
from ..workload import workload
from .interleave import interleaved_rounds, timed_block
from .trace import quiet_kineto

__all__ = ["profile_on_rank", "side_costs_on_rank", "step_rows", "ROWS", "EXTRA", "MODEL_START"]

ROWS = ("before_forward", "forward", "backward", "hooks", "copy_in", "average", "launch", "wait", "copy_out",
        "optimizer", "zero_grad", "other")
EXTRA = ("step", "first_launch", "last_grad", "allreduce", "host_syncs")
MODEL_START = "fleetbench: model forward starts"  # the profile's own marker (a forward pre-hook), not the engine's

_ACCUMULATE = "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad"
_DDP_COPY_IN = "torch::distributed::reducer::mul_out"
_DDP_COPY_OUT = "torch.distributed.ddp.reducer::copy_bucket_to_grad"
_LAUNCH = "c10d::allreduce_"


def _dur(ev) -> float:
    return (ev.time_range.end - ev.time_range.start) / 1e3  # ms


def _walk(ev) -> Iterable:
    yield ev
    for c in ev.cpu_children:
        yield from _walk(c)


def _issue(ev) -> bool:
    return ev.name.startswith("bucket ") and ev.name.endswith(" allreduce issue")


def step_rows(events: list) -> dict:
    """One profiled step's rows (ms; see the module docstring) from its ``FunctionEvent`` list
    (``prof.profiler.function_events``): the tree of the thread that ran the step, and gloo's threads' allreduces."""
    top = [e for e in events if e.cpu_parent is None]
    step = next(e for e in top if e.name == "step")
    phases: dict[str, list] = {}
    for e in step.cpu_children:
        phases.setdefault(e.name, []).append(e)
    inside = list(_walk(step))

    def total(name: str) -> float:
        return sum(_dur(e) for e in phases.get(name, []))

    rows = dict.fromkeys(ROWS, 0.0)
    forward = phases["forward"][0]
    marker = next((e for e in inside if e.name == MODEL_START), None)
    pre = (marker.time_range.start - forward.time_range.start) / 1e3 if marker is not None else 0.0
    rows["before_forward"] = total("broadcast buffers") + pre
    rows["forward"] = _dur(forward) - pre

    backward = phases["backward"][0]
    b0 = backward.time_range.start
    accs = [e for e in _walk(backward) if e.name == _ACCUMULATE]
    issues = [e for e in _walk(backward) if _issue(e)]
    launches = [e for e in _walk(backward) if e.name == _LAUNCH]
    for acc in accs:
        own = _dur(acc)
        for e in list(_walk(acc))[1:]:
            if e.name == "torch::autograd::AccumulateGrad":
                # the accumulation itself (its first op) stays autograd's; a copy after it is the copies' hook
                ops = [c for c in e.cpu_children if c.name.startswith("aten::")]
                own -= sum(_dur(c) for c in ops[:1])
                rows["copy_in"] += sum(_dur(c) for c in ops[1:] if c.name == "aten::copy_")
                own -= sum(_dur(c) for c in ops[1:] if c.name == "aten::copy_")
            elif e.name == _DDP_COPY_IN:
                rows["copy_in"] += _dur(e)
                own -= _dur(e)
            elif e.name == _LAUNCH and not any(_issue(a) for a in _ancestors(e, acc)):
                rows["launch"] += _dur(e)
                own -= _dur(e)
            elif _issue(e):
                div = sum(_dur(c) for c in _walk(e) if c.name in ("aten::div_", "aten::div"))
                rows["average"] += div
                rows["launch"] += _dur(e) - div
                own -= _dur(e)
        rows["hooks"] += own
    ddp_out = [e for e in _walk(backward) if e.name == _DDP_COPY_OUT]  # DDP: copies out, in its finalize
    last = max((e.time_range.end for e in accs), default=backward.time_range.end)
    tail = (backward.time_range.end - last) / 1e3  # backward after its last accumulation (DDP's finalize)
    rows["wait"] = max(0.0, tail - sum(_dur(e) for e in ddp_out if e.time_range.start >= last))
    rows["copy_out"] = sum(_dur(e) for e in ddp_out)
    rows["backward"] = _dur(backward) - sum(rows[k] for k in ("hooks", "copy_in", "average", "launch", "wait",
                                                                "copy_out"))
    for w in phases.get("wait", []):  # the engine: its wait after backward, copies out (with copies) apart
        outs = sum(_dur(e) for e in _walk(w) if e.name.endswith(" copy out"))
        rows["copy_out"] += outs
        rows["wait"] += _dur(w) - outs

    for opt in phases.get("optimizer", []):
        zeros = [e for e in opt.cpu_children if e.name.startswith("Optimizer.zero_grad") or e.name == "aten::zero_"]
        rows["zero_grad"] += sum(_dur(e) for e in zeros)
        rows["optimizer"] += _dur(opt) - sum(_dur(e) for e in zeros)
    rows["other"] = _dur(step) - sum(rows[k] for k in ROWS if k != "other")

    first = min([e.time_range.start for e in issues + launches], default=None)
    reduces = [e for e in events if e.name == "gloo:all_reduce" and e.time_range.start >= step.time_range.start]
    return rows | {
        "step": _dur(step),
        "first_launch": (first - b0) / 1e3 if first is not None else None,
        "last_grad": (last - b0) / 1e3,
        "allreduce": sum(_dur(e) for e in reduces),
        "host_syncs": sum(1 for e in inside if e.name == "aten::_local_scalar_dense"),
    }


def _ancestors(ev, stop) -> list:
    out, cur = [], ev.cpu_parent
    while cur is not None and cur is not stop:
        out.append(cur)
        cur = cur.cpu_parent
    return out


def profile_on_rank(workload_spec, variants: list[dict], steps: int = 3, warmup: int = 2) -> dict:
    """Profile ``steps`` steps of every variant (``{"name": …, "config": {…}}``) on this rank, interleaved step by
    step; per variant its rows per step (:func:`step_rows`), the median of each, ``hook_us`` (the engine's hook
    timed alone, None for DDP) and what its engine set up."""
    wl = workload(workload_spec)
    quiet_kineto(current().platform.is_cuda)
    threads_before = torch.get_num_threads()
    torch.set_num_threads(default_threads(current().local_world_size))
    try:
        engines = {v["name"]: wl.engine(StrategyConfig.from_dict(v["config"])) for v in variants}
        wl.prepare_batches()
        step_no = 0

        def mark(_module, _inputs) -> None:
            with record_function(MODEL_START):
                pass

        hooks = [e.module.register_forward_pre_hook(mark) for e in engines.values()]
        rows: dict[str, list[dict]] = {name: [] for name in engines}

        def one(name: str, record: bool = True) -> None:
            nonlocal step_no
            step_no += 1
            x, y = wl.batch(step_no)
            engine = engines[name]
            if not record:
                engine.train_step(x, y)
                return
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                with record_function("step"):
                    engine.train_step(x, y)
            rows[name].append(step_rows(list(prof.profiler.function_events)))

        for name in engines:
            for _ in range(warmup):
                one(name, record=False)
        interleaved_rounds(list(engines), steps, one)
        for h in hooks:
            h.remove()
        out = {}
        for name, engine in engines.items():
            sync = engine.grad_sync
            hook_us = sync.time_hooks() if isinstance(sync, BucketedGradSync) else None
            params = sum(1 for p in engine.module.parameters() if p.requires_grad)
            median = {k: statistics.median(r[k] for r in rows[name]) if rows[name][0][k] is not None else None
                      for k in (*ROWS, *EXTRA)}
            out[name] = {"steps": rows[name], "median": median, "hook_us": hook_us, "params": params,
                         "describe": engine.describe()}
            if isinstance(sync, BucketedGradSync):
                sync.close()
        return {"rank": wl.rank, "variants": out, "seconds": time.perf_counter()}
    finally:
        torch.set_num_threads(threads_before)


def side_costs_on_rank(workload_spec, reps: int = 10) -> dict:
    """Two costs outside the engine's hot path, in ms on this rank: rank 0's buffers broadcast one tensor at a time
    (``plain``, Paddle's default ``fuse_broadcast_ops=False``) against one flat broadcast, interleaved ``reps``
    times (each a block between barriers); and the check's digest of the parameters (:func:`param_digest`, once
    per check step), ``reps`` times."""
    wl = workload(workload_spec)
    module = wl.module()
    threads_before = torch.get_num_threads()
    torch.set_num_threads(default_threads(current().local_world_size))
    try:
        buffers = [b for b in module_state(module, buffers_only=True) if b.numel()]
        out: dict = {"rank": wl.rank, "buffers": len(buffers), "buffer_bytes": sum(b.numel() * b.element_size()
                                                                                 for b in buffers)}
        if buffers:
            with torch.no_grad():
                per_tensor, fused = interleaved_rounds(
                    [False, True], reps,
                    lambda f: timed_block(lambda: broadcast_tensors(buffers, 0, None, fused=f), 1, wl.platform),
                    warmup=lambda f: broadcast_tensors(buffers, 0, None, fused=f))
            out["broadcast_ms"] = {"per_tensor": statistics.median(per_tensor) * 1e3,
                                   "fused": statistics.median(fused) * 1e3}
        param_digest(module)
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            param_digest(module)
            times.append(time.perf_counter() - t0)
        out["digest_ms"] = statistics.median(times) * 1e3
        out["parameter_bytes"] = sum(p.numel() * p.element_size() for p in module.parameters())
        return out
    finally:
        torch.set_num_threads(threads_before)
