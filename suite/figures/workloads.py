"""Figures of the published workloads (``fleetbench figures workloads``): ResNet-50 and GPT-2 small.

1. Speedup over torch DDP of the registry's cases on each model (``plain``, ``fusion``,
   ``overlap``, ``multicomm``, ``fused_optimizer``, ``grad_bf16``: the same configs ``fleetbench
   run --model M`` runs), with exposed communication (step time − the ``none`` case's, measured in
   the same group) and the allreduces each step issues (161 per step on ResNet-50 without fusion).
2. Fused allreduce vs one allreduce of the same bytes: each model's gradient collectives alone
   (no compute), as buckets and per parameter, against one allreduce of all gradient bytes (busbw).

Timing follows ``fleetbench run``: variants interleaved round by round in one process group
(``suite.measure.timing.time_on_rank``), in memory-bounded groups (a ``cpu``-size GPT-2 engine
holds ~2 GB per rank), each group carrying DDP (the baseline of the speedups) and ``none`` (the
compute-only step of the exposed communication), so every ratio is paired within one group.

Size: ``cpu`` (the models' full parameter layout, CPU-affordable activations; ``docs/models.md``).
``FLEETBENCH_FIGURE_SIZE=tiny`` runs the same figure on the ``tiny`` models (to validate the
code; its numbers say nothing about the real models).  ``FLEETBENCH_FIGURE_MEMORY_GB`` bounds the
memory the ranks' engines may hold at once (default: 60% of the machine's available memory),
which sets the groups.
"""
from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from ..cases import get_case
from ..config import StrategyConfig
from ..measure.stats import bootstrap_median_ci, window_seconds
from ..measure.summary import COMPUTE_ONLY, summarize
from ..measure.timing import time_on_rank
from ..workload import WorkloadSpec

DESCRIPTION = ("published workloads (resnet50, gpt2 at cpu size): speedup over DDP of plain, fused, overlap "
               "(1/2 comms), fused optimizer, bf16 gradients; exposed comm; fused vs single allreduce busbw")

MODELS = ("resnet50", "gpt2")
BASE = "ddp"
ROWS = ("plain", "fusion", "overlap", "multicomm", "fused_optimizer", "grad_bf16")
# The gradient collectives timed alone (table 2): one allreduce of every byte, then the cases' own paths.
ALONE = ("single", "fusion", "overlap", "multicomm", "plain")
LABELS = {
    "ddp": "DDP (baseline)", "none": "no communication", "plain": "plain (one allreduce per gradient)",
    "fusion": "fused, synchronous (25 MB buckets)", "overlap": "overlap, 1 communicator (25 MB buckets)",
    "multicomm": "overlap, 2 communicators (4 MB buckets)", "fused_optimizer": "fused optimizer (plain comm)",
    "grad_bf16": "bf16 gradient communication (plain comm)", "single": "one allreduce of all gradient bytes",
}
MiB = 2**20


def figure_size(args: Any = None) -> str:
    return getattr(args, "size", None) or os.environ.get("FLEETBENCH_FIGURE_SIZE") or "cpu"


def rows_for(model: str) -> tuple:
    """The rows of a model's table: the registry's cases (on a BatchNorm model, fusion, overlap and multicomm
    broadcast its buffers over flat buckets, as DDP coalesces its own; plain broadcasts per tensor)."""
    return ROWS


def variant_config(model: str, variant: str) -> dict:
    """The registry case's config: the figure measures what ``fleetbench run`` runs."""
    return dict(get_case(f"{model}/{variant}").config)


def groups(model: str, size: str, world: int, rows: tuple | None = None, budget: int | None = None
           ) -> list[list[str]]:
    """Variants timed together: each group is DDP, ``none`` and as many rows as the ranks' memory holds.

    The bound is the runner's (``suite.runner``): 16 bytes per parameter per engine per rank."""
    from ..runner import _engine_bytes
    from ..runtime.device import host_available_memory

    if budget is None:
        gb = os.environ.get("FLEETBENCH_FIGURE_MEMORY_GB")
        budget = int(float(gb) * 2**30) if gb else int(0.6 * host_available_memory())
    rows = rows_for(model) if rows is None else rows
    per_engine = _engine_bytes(model, size) * world
    per_group = max(1, budget // max(per_engine, 1) - 2)  # engines besides DDP and none
    return [[BASE, COMPUTE_ONLY, *rows[i:i + per_group]] for i in range(0, len(rows), per_group)]


def _allreduces(s: dict) -> tuple[float, float, float]:
    """Allreduces per step, their bytes, and broadcasts per step (rank 0, through suite.comm.collectives)."""
    calls = sum(v for k, v in s["comm_calls_per_step"].items() if k.endswith("/all_reduce"))
    nbytes = sum(v for k, v in s["comm_bytes_per_step"].items() if k.endswith("/all_reduce"))
    bcasts = sum(v for k, v in s["comm_calls_per_step"].items() if k.endswith("/broadcast"))
    return calls, nbytes, bcasts


def _ms(x: float) -> str:
    return f"{x * 1e3:.1f}" if math.isfinite(x) else "n/a"


def _ci(sp: dict) -> str:
    return f"{sp['speedup']:.3f} [{sp['ci'][0]:.3f}, {sp['ci'][1]:.3f}]"


def fresh_ranks(pool) -> None:
    """Stop the ranks; the pool starts fresh ones on its next call.

    Every group runs in new rank processes: nothing a previous group built (or its allocator's
    history) weighs on the next, and an engine with bucketed gradients, which stays alive after
    its job until ``BucketedGradSync.close()`` (its gradient hooks hold it; see the report of the
    workloads issue), cannot pile up: at ``cpu`` size each such GPT-2 engine holds ~1 GB per rank."""
    pool.close()


def measure_model(pool, model: str, size: str, args) -> dict:
    """Every group's interleaved timing; per variant its summary, group index, and the group's DDP windows."""
    from ..models import get_model

    spec = get_model(model, size)
    world = pool.nproc
    out: dict[str, dict] = {}
    plan = groups(model, size, world)
    for gi, names in enumerate(plan, 1):
        variants = [{"name": n, "config": variant_config(model, n)} for n in names]
        answers = pool.run(time_on_rank, dict(workload_spec=WorkloadSpec(model, size), variants=variants,
                                              warmup=2, steps=args.steps, rounds=args.rounds),
                           timeout=args.timeout)
        fresh_ranks(pool)
        summary = summarize(answers, names, spec.per_rank_batch * world, args.steps, world, baseline=BASE)
        for n in names:
            s = summary[n]
            s["group"] = gi
            s["window_s"] = window_seconds(answers, n)
            if n in (BASE, COMPUTE_ONLY):
                out.setdefault(n, {"groups": []})["groups"].append(s)
            else:
                out[n] = s
    return {"variants": out, "groups": plan, "spec": spec}


def strategy_table(model: str, measured: dict, args, world: int) -> tuple[str, dict | None]:
    from ..models import count_parameters

    spec = measured["spec"]
    tensors, elements = count_parameters(spec)
    v = measured["variants"]
    grad_mib = 4 * elements / MiB
    n_groups = len(measured["groups"])
    head = (f"**{model}** (`{spec.size}`: {spec.description or spec.name}; batch {spec.per_rank_batch} per rank), "
            f"{world} ranks; {tensors} gradient tensors, {grad_mib:.1f} MiB fp32; {args.rounds} rounds x "
            f"{args.steps} steps; {n_groups} group(s): "
            + "; ".join("{" + ", ".join(g) + "}" for g in measured["groups"]))
    lines = [head, "",
             "| case | what | group | step (ms) | speedup over DDP [95% CI] | exposed comm (ms) "
             "| allreduces/step | allreduce MiB/step | broadcasts/step |",
             "|---|---|---:|---:|---|---:|---:|---:|---:|"]
    for special in (BASE, COMPUTE_ONLY):
        for s in v[special]["groups"]:
            sp = s.get("speedup"), s.get("speedup_ci")
            calls, nbytes, bcasts = _allreduces(s)
            exposed = "0 (by definition)" if special == COMPUTE_ONLY else _ms(s["exposed_comm_s"])
            counts = "(DDP's own)" if special == BASE else f"{calls:.0f}"
            bc = "(DDP's own)" if special == BASE else f"{bcasts:.0f}"
            lines.append(f"| {model}/{special} | {LABELS[special]} | {s['group']} | "
                         f"{_ms(s['step_time_s']['median'])} | {sp[0]:.3f} [{sp[1][0]:.3f}, {sp[1][1]:.3f}] | "
                         f"{exposed} | {counts} | {'' if special == BASE else f'{nbytes / MiB:.1f}'} | {bc} |")
    for n in rows_for(model):
        s = v[n]
        calls, nbytes, bcasts = _allreduces(s)
        lines.append(f"| {model}/{n} | {LABELS[n]} | {s['group']} | {_ms(s['step_time_s']['median'])} | "
                     f"{s['speedup']:.3f} [{s['speedup_ci'][0]:.3f}, {s['speedup_ci'][1]:.3f}] | "
                     f"{_ms(s['exposed_comm_s'])} | {calls:.0f} | {nbytes / MiB:.1f} | {bcasts:.0f} |")
    ov = v.get("overlap")
    if ov is not None:
        d = ov.get("describe", {})
        lines += ["", f"- Allreduce ops {d.get('allreduce_ops_before_fusion')} before fusion, "
                      f"{d.get('allreduce_ops')} after (overlap's 25 MB buckets)."]
        met = "met" if ov["speedup"] >= 1 else "not met"
        lines.append(f"- Aim (overlap + bucketing at least as fast as DDP), overlap: speedup {ov['speedup']:.3f} "
                     f"[{ov['speedup_ci'][0]:.3f}, {ov['speedup_ci'][1]:.3f}]: **{met}** on this run.")
    return "\n".join(lines), ov


# ---------------------------------------------------------------------------------------
# the gradient collectives alone (no compute)
# ---------------------------------------------------------------------------------------
def alone_on_rank(model: str, size: str, variants: list[str], rounds: int = 5, reps: int = 3) -> dict:
    """Seconds per step of each variant's gradient collectives with no compute around them.

    One model (the gradients' shapes) is shared by every variant's ``GradSync``; ``single`` is
    one allreduce of every gradient byte on one communicator.  All variants in every round,
    rotated order, barriers only at window ends (as ``suite.figures.comm``)."""
    from ..comm import collectives as C
    from ..comm.factory import build_grad_sync
    from ..models import get_model
    from ..runtime.context import current
    from ..runtime.groups import comm_groups
    from .comm import _collectives_of

    platform = current().platform
    device = platform.device
    net = get_model(model, size).make(0, device)
    runners: list[tuple[str, Callable[[], Any]]] = []
    syncs: list[Any] = []
    for name in variants:
        if name == "single":
            flat = torch.zeros(sum(p.numel() for p in net.parameters() if p.requires_grad), device=device)
            g = comm_groups(1)[0]

            def single(flat: torch.Tensor = flat, g: Any = g) -> None:
                C.all_reduce(flat.div_(1.0), group=g)

            runners.append((name, single))
            continue
        sync = build_grad_sync(net, StrategyConfig.from_dict(variant_config(model, name)))
        if hasattr(sync, "close"):
            syncs.append(sync)
        runners.append((name, _collectives_of(sync)))
    nbytes = 4 * sum(p.numel() for p in net.parameters() if p.requires_grad)
    times: dict[str, list[float]] = {n: [] for n, _ in runners}
    try:
        for _, run in runners:  # warm-up
            run()
        for r in range(rounds):
            for name, run in runners[r % len(runners):] + runners[:r % len(runners)]:
                dist.barrier()
                t0 = time.perf_counter()
                for _ in range(reps):
                    run()
                platform.synchronize()
                dist.barrier()
                times[name].append((time.perf_counter() - t0) / reps)
    finally:
        for sync in syncs:
            sync.close()  # its hooks and worker threads; else the buckets outlive this call
    return {"times": times, "bytes": nbytes}


def alone_table(pool, model: str, size: str, args) -> str:
    answers = pool.run(alone_on_rank, dict(model=model, size=size, variants=list(ALONE), rounds=args.rounds,
                                           reps=args.steps), timeout=args.timeout)
    fresh_ranks(pool)
    per = {n: [max(ts) for ts in zip(*(a["times"][n] for a in answers))] for n in ALONE}  # slowest rank
    nbytes = answers[0]["bytes"]
    factor = 2 * (pool.nproc - 1) / pool.nproc
    lines = [f"**{model}**: all gradients ({nbytes / MiB:.1f} MiB) reduced by each case's path vs one allreduce of "
             f"the same bytes (collectives alone, no compute; {args.rounds} rounds x {args.steps} repetitions)", "",
             "| path | time (ms) | busbw (GB/s) | busbw ratio to one allreduce [95% CI] |", "|---|---:|---:|---|"]
    for n in ALONE:
        t = statistics.median(per[n])
        ratios = [s / x for s, x in zip(per["single"], per[n]) if x > 0]
        r = statistics.median(ratios)
        lo, hi = bootstrap_median_ci(ratios)
        label = LABELS[n] if n == "single" else f"{model}/{n}: {LABELS[n]}"
        lines.append(f"| {label} | {_ms(t)} | {nbytes / t / 1e9 * factor:.3f} | {r:.3f} [{lo:.3f}, {hi:.3f}] |")
    return "\n".join(lines)


def run(pool, args) -> str:
    size = figure_size(args)
    world = pool.nproc
    parts = [f"## Published workloads at size `{size}`: speedup over torch DDP ({world} ranks)", "",
             "How this was measured: `fleetbench figures workloads` "
             f"(`--nproc {world} --rounds {args.rounds} --steps {args.steps}`). Each model's cases are the "
             "registry's (`fleetbench run --model M` runs the same configs), timed interleaved round by round "
             "(rotated order, warm-up 2 steps) in groups bounded by the ranks' memory; every group also runs DDP "
             "and `none`, so each speedup is a per-round ratio to the DDP of its own group and each exposed "
             "communication is the step time minus the `none` step of its own group. Step times are medians over "
             "every rank's steps; intervals are bootstrap 95% intervals of the median of the paired ratios.", ""]
    for model in MODELS:
        measured = measure_model(pool, model, size, args)
        table, _ = strategy_table(model, measured, args, world)
        parts += [table, ""]
    parts += ["### Fused allreduce vs one allreduce of the same bytes", ""]
    for model in MODELS:
        parts += [alone_table(pool, model, size, args), ""]
    parts += ["`allreduces/step` and `MiB/step` count the collectives through `suite.comm.collectives` on rank 0 "
              "(DDP's own allreduces are not counted there). busbw is nccl-tests' formula, bytes / time x 2(n-1)/n."]
    return "\n".join(parts)
