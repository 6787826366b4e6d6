"""Figures of the communication strategies (``fleetbench figures comm``).

1. Speedup over torch DDP, and exposed communication / overlap efficiency, per strategy
   (plain, fused sync, overlap on 1/2/3 communicators, hierarchical at 4 ranks), on the MLP
   and the ResNet.  Definitions (strategies.md): exposed = step time − step time of the same
   case with gradient communication off (``data_parallel='none'``); overlap efficiency =
   1 − exposed / (time of the same collectives run alone).
2. Fused allreduce of all gradients vs one allreduce of the same total bytes: busbw ratio.
3. Paddle's rules of thumb: bucket ≈ 1/10 of the gradient bytes (a sweep of bucket sizes),
   and 1 vs 2 communicators (rows of table 1).

Step times come from ``suite.measure.timing.time_on_rank`` (variants interleaved in one
process group, rotated order, medians with bootstrap intervals, paired speedups).  The
collectives-alone times come from :func:`comm_alone_on_rank`, which follows the same
discipline (``interleaved_rounds``: all variants in every round, rotated order; ``timed_block``:
barriers only at window ends).
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..comm import collectives as C
from ..comm.table import busbw_factor
from ..config import StrategyConfig
from ..measure.interleave import interleaved_rounds, timed_block
from ..measure.stats import bootstrap_median_ci, paired_speedup, window_seconds
from ..measure.timing import time_on_rank
from ..models import get_model
from ..runtime.groups import comm_groups
from ..workload import WorkloadSpec, workload
from . import PoolOptions

DESCRIPTION = ("communication: speedup over DDP, exposed comm and overlap efficiency (nccl_comm_num 1/2/3), "
               "fused vs single allreduce busbw, bucket-size and communicator rules of thumb")

MiB = 2**20


def _grad_mb(model: str) -> float:
    net = get_model(model).make(0)
    return sum(p.numel() * p.element_size() for p in net.parameters() if p.requires_grad) / MiB


def strategy_variants(model: str, nproc: int) -> list[dict]:
    tenth = _grad_mb(model) / 10
    over = dict(fuse_all_reduce_ops=True, fuse_grad_size_in_MB=tenth, sync_nccl_allreduce=False)
    out = [
        {"name": "ddp", "config": {"data_parallel": "ddp"}},
        {"name": "no comm", "config": {"data_parallel": "none"}},
        {"name": "plain", "config": {}},
        {"name": "fused sync (32 MB)", "config": {"fuse_all_reduce_ops": True}},
        {"name": "overlap 1/10, 1 comm", "config": over},
        {"name": "overlap 1/10, 2 comms", "config": dict(over, nccl_comm_num=2)},
        {"name": "overlap 1/10, 3 comms", "config": dict(over, nccl_comm_num=3)},
    ]
    if nproc >= 4 and nproc % 2 == 0:
        out.append({"name": "hierarchical, overlap 1/10, 2 comms",
                    "config": dict(over, nccl_comm_num=2, use_hierarchical_allreduce=True,
                                   hierarchical_allreduce_inter_nranks=2)})
    return out


def comm_alone_on_rank(workload_spec: WorkloadSpec, variants: list[dict], rounds: int = 5, reps: int = 5) -> dict:
    """Seconds per step of each variant's gradient collectives with no compute around them, and the gradient bytes.

    One model of the workload (the gradients' shapes) is shared by every variant's ``GradSync``;
    ``{"name": "single"}`` is one allreduce of every gradient byte on one communicator.  All variants in every
    round, rotated order, barriers only at window ends (``interleaved_rounds``, ``timed_block``)."""
    wl = workload(workload_spec)
    net = wl.module()
    numel = sum(p.numel() for p in net.parameters() if p.requires_grad)
    runners: list[tuple[str, Callable[[], Any]]] = []
    syncs: list[Any] = []
    for v in variants:
        if v["name"] == "single":
            flat, g = torch.zeros(numel, device=wl.device), comm_groups(1)[0]  # NCCL: tensors on the rank's GPU

            def single(flat: torch.Tensor = flat, g: Any = g) -> None:
                C.all_reduce(flat.div_(1.0), group=g)

            runners.append((v["name"], single))
            continue
        sync = wl.grad_sync(StrategyConfig.from_dict(v["config"]), net)
        if sync is None:
            raise ValueError(f"comm variant {v['name']!r}: DDP's collectives cannot be timed alone")
        if hasattr(sync, "close"):
            syncs.append(sync)
        runners.append((v["name"], sync.collectives_alone))
    try:
        times = interleaved_rounds(runners, rounds, lambda nr: timed_block(nr[1], reps, wl.platform),
                                   warmup=lambda nr: nr[1]())
    finally:
        for sync in syncs:
            sync.close()  # its hooks and worker threads; else the buckets outlive this call
    return {"times": {name: t for (name, _), t in zip(runners, times)}, "bytes": 4 * numel}


def _median_ci(xs):
    lo, hi = bootstrap_median_ci(xs)
    return statistics.median(xs), lo, hi


def _size(mb: float) -> str:
    return f"{mb:.2f} MiB" if mb >= 1 else f"{mb * 1024:.1f} KiB"


def _ms(x: float) -> str:
    return f"{x * 1e3:.1f}" if math.isfinite(x) else "n/a"


@dataclass(frozen=True)
class Options(PoolOptions):
    """The pool's options (``PoolOptions``), nothing of its own."""


def _alone(pool, model, variants, rounds) -> dict[str, list[float]]:
    answers = pool.run(comm_alone_on_rank,
                       dict(workload_spec=WorkloadSpec(model), variants=variants, rounds=rounds))
    names = list(answers[0]["times"])
    return {n: [max(ts) for ts in zip(*(a["times"][n] for a in answers))] for n in names}


def _measure(pool, model, variants, options: Options, per_rank_batch=16):
    answers = pool.run(time_on_rank,
                       dict(workload_spec=WorkloadSpec(model, per_rank_batch=per_rank_batch), variants=variants,
                            steps=options.steps, rounds=options.rounds))
    return {v["name"]: window_seconds(answers, v["name"]) for v in variants}


def fused_variants(grad_mb: float) -> list[dict[str, Any]]:
    return [{"name": "single"},
            {"name": "fused 1/10 (overlap, 1 comm)", "config": dict(fuse_all_reduce_ops=True,
                                                                     fuse_grad_size_in_MB=grad_mb / 10,
                                                                     sync_nccl_allreduce=False)},
            {"name": "fused 32 MB (sync)", "config": dict(fuse_all_reduce_ops=True)},
            {"name": "unfused (per parameter)", "config": {}}]


def sweep_variants(total: float) -> list[dict[str, Any]]:
    fracs = [("1/50", 1 / 50), ("1/10", 1 / 10), ("1/3", 1 / 3), ("all (1 bucket)", math.inf)]
    variants: list[dict[str, Any]] = [{"name": "ddp", "config": {"data_parallel": "ddp"}}]
    for label, f in fracs:
        mb = math.inf if f == math.inf else total * f
        variants.append({"name": f"bucket {label}", "config": dict(fuse_all_reduce_ops=True, fuse_grad_size_in_MB=mb,
                                                                   sync_nccl_allreduce=False)})
    return variants


def measure(options: Options, pool) -> dict:
    """Per model the strategies' windows and their collectives alone; the fused paths alone and the bucket sweep
    on the MLP (JSON-able)."""
    raw: dict = {"grad_mb": {m: _grad_mb(m) for m in ("mlp", "resnet")}, "strategies": {}}
    for model in ("mlp", "resnet"):
        variants = strategy_variants(model, options.nproc)
        windows = _measure(pool, model, variants, options)
        comm_vars = [v for v in variants if v["name"] not in ("ddp", "no comm")]
        raw["strategies"][model] = {"variants": [v["name"] for v in variants], "windows": windows,
                                    "alone": _alone(pool, model, comm_vars, options.rounds)}
    fused = fused_variants(raw["grad_mb"]["mlp"])
    raw["fused"] = {"variants": [v["name"] for v in fused], "alone": _alone(pool, "mlp", fused, options.rounds)}
    sweep = sweep_variants(raw["grad_mb"]["mlp"])
    raw["sweep"] = {"variants": [v["name"] for v in sweep], "windows": _measure(pool, "mlp", sweep, options)}
    return raw


def strategy_table(raw: dict, model: str, options: Options) -> str:
    grad_mb, names = raw["grad_mb"][model], raw["strategies"][model]["variants"]
    windows, alone = raw["strategies"][model]["windows"], raw["strategies"][model]["alone"]
    none_w = windows["no comm"]
    lines = [f"**{model}**, {options.nproc} ranks, gradients {_size(grad_mb)} "
             f"(bucket 1/10 = {_size(grad_mb / 10)}); {options.rounds} rounds x {options.steps} steps",
             "",
             "| strategy | step (ms) | speedup over DDP [95% CI] | exposed comm (ms) | comm alone (ms) "
             "| overlap eff. |",
             "|---|---:|---|---:|---:|---:|"]
    for name in names:
        w = windows[name]
        step, _, _ = _median_ci([x / options.steps for x in w])
        sp = paired_speedup(windows["ddp"], w)
        exposed = statistics.median([(a - b) / options.steps for a, b in zip(w, none_w)])
        if name in alone:
            al = statistics.median(alone[name])
            eff = 1 - exposed / al if al > 0 else math.nan
            al_s, eff_s = _ms(al), f"{eff:.2f}"
        else:
            al_s = eff_s = "n/a"
        exp_s = "0 (baseline)" if name == "no comm" else _ms(exposed)
        lines.append(f"| {name} | {_ms(step)} | {sp['speedup']:.3f} [{sp['ci'][0]:.3f}, {sp['ci'][1]:.3f}] | "
                     f"{exp_s} | {al_s} | {eff_s} |")
    return "\n".join(lines)


def fused_vs_single(raw: dict, model: str, options: Options) -> str:
    alone = raw["fused"]["alone"]
    nbytes = raw["grad_mb"][model] * MiB
    factor = busbw_factor("all_reduce", options.nproc)
    lines = [f"**{model}**: all gradients ({nbytes / MiB:.1f} MiB) reduced as buckets vs as one allreduce of the "
             "same bytes (collectives alone, no compute)", "",
             "| path | time (ms) | busbw (GB/s) | busbw ratio to one allreduce [95% CI] |", "|---|---:|---:|---|"]
    for name in raw["fused"]["variants"]:
        t = statistics.median(alone[name])
        ratios = [s / x for s, x in zip(alone["single"], alone[name])]
        r, lo, hi = _median_ci(ratios)
        lines.append(f"| {name} | {_ms(t)} | {nbytes / t / 1e9 * factor:.3f} | {r:.3f} [{lo:.3f}, {hi:.3f}] |")
    return "\n".join(lines)


def bucket_sweep(raw: dict, model: str, options: Options) -> str:
    total = raw["grad_mb"][model]
    windows = raw["sweep"]["windows"]
    base = windows["bucket all (1 bucket)"]
    lines = [f"**{model}**: bucket size as a fraction of the {total:.1f} MiB of gradients (overlap on, 1 comm)", "",
             "| bucket | step (ms) | speedup over one bucket [95% CI] | speedup over DDP [95% CI] |",
             "|---|---:|---|---|"]
    for name in raw["sweep"]["variants"][1:]:
        w = windows[name]
        a, b = paired_speedup(base, w), paired_speedup(windows["ddp"], w)
        lines.append(f"| {name[7:]} | {_ms(statistics.median(w) / options.steps)} | "
                     f"{a['speedup']:.3f} [{a['ci'][0]:.3f}, {a['ci'][1]:.3f}] | "
                     f"{b['speedup']:.3f} [{b['ci'][0]:.3f}, {b['ci'][1]:.3f}] |")
    return "\n".join(lines)


def render(raw: dict, options: Options) -> str:
    parts = ["## Communication strategies", "",
             "### Speedup over torch DDP, exposed communication, overlap efficiency (incl. nccl_comm_num 1/2/3)", ""]
    for model in ("mlp", "resnet"):
        parts += [strategy_table(raw, model, options), ""]
    parts += ["### Fused allreduce vs one allreduce of the same bytes", "", fused_vs_single(raw, "mlp", options), "",
              "### Rule of thumb: bucket = 1/10 of the gradient bytes", "", bucket_sweep(raw, "mlp", options), "",
              "Rule of thumb 1 vs 2 communicators: compare the rows 'overlap 1/10, 1 comm' and '2 comms' above.",
              "Speedup > 1 is faster; intervals are bootstrap 95% intervals of the paired per-round ratio; "
              "exposed communication and overlap efficiency are medians over rounds (the slowest rank per window)."]
    return "\n".join(parts)
