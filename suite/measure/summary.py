"""From the ranks' answers to a case's metrics: the one summary that ``run``, pytest-benchmark and asv use.

The ranks answer :func:`suite.measure.timing.time_on_rank` (or, per window, the prepared-case
calls) with, per variant, their window times, per-step times, losses and communication
counts (:class:`suite.measure.timing.RankTiming`).  :func:`summarize` folds every rank's answer into
one :class:`Timed` per variant: its :class:`suite.results.records.Metrics` (the one list of metric
names; the record takes the object as it is) and the engine's ``describe`` (typed, ``Describe``):

- throughput per round (global batch × steps / the slowest rank's window), its median with a
  bootstrap interval, per-step time statistics over every rank's steps;
- speedup over the baseline, paired round by round (the variants ran interleaved), and whether its rounds agree
  with each other (``speedup_consistent``: :func:`suite.measure.stats.round_consistency`);
- exposed communication (step time − the ``none`` variant's, when it ran) and the bus
  bandwidth over that exposed time (nccl-tests' busbw formula);
- the first non-finite loss, if any (a non-finite loss is a failed case, named by its step);
- the CPU time processes other than the ranks took during the windows, and its share of the machine's
  (``others_cpu_s``, ``others_cpu_share``: :func:`suite.measure.utilization.others_cpu`).
- memory, two figures: ``peak_memory_bytes`` is the *transient* peak (the largest rise above what was in
  use when a window opened: activations, temporaries; the name is kept from earlier records) and
  ``footprint_bytes`` what the engine holds between steps (parameters, gradients, buckets, optimizer
  state); both the largest over ranks.

Everything here is plain arithmetic on numbers; nothing imports torch.
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from ..comm.busbw import busbw
from ..results.records import Describe, Metrics, NonfiniteLoss, allreduce_total
from .stats import bootstrap_median_ci, describe, paired_speedup, window_seconds
from .utilization import others_cpu

if TYPE_CHECKING:
    from .timing import RankTiming

__all__ = ["Timed", "variant_summary", "summarize", "first_nonfinite", "COMPUTE_ONLY"]

COMPUTE_ONLY = "none"  # the variant without gradient communication: compute alone


def first_nonfinite(losses: list) -> int | None:
    """The 1-based index of the first loss that is nan or ±inf (or not a number at all), else None."""
    for i, v in enumerate(losses, 1):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            return i
    return None


@dataclass(frozen=True)
class Timed:
    """One variant's timing as a record takes it: its metrics and what its engine set up."""

    metrics: Metrics
    describe: Describe = field(default_factory=Describe)


def variant_summary(answers: Sequence[RankTiming], variant: str, global_batch: int, steps: int) -> Metrics:
    windows = window_seconds(answers, variant)
    throughput = [global_batch * steps / w for w in windows if w > 0]
    per_rank = [a.variants[variant] for a in answers]
    per_rank_steps = [v.step_times for v in per_rank]
    all_steps = [t for ts in per_rank_steps for t in ts]
    rank_medians = [statistics.median(ts) if ts else math.nan for ts in per_rank_steps]
    slowest = max(range(len(rank_medians)), key=lambda r: rank_medians[r]) if rank_medians else 0
    lo, hi = bootstrap_median_ci(throughput)
    first = per_rank[0]
    precision = {a.rank: a.variants[variant].describe.get("precision") for a in answers}
    if any(p != precision[answers[0].rank] for p in precision.values()):  # one process-wide state per rank
        raise ValueError(f"{variant}: the ranks report different precision settings (torch.backends): {precision}")
    bad = [(a.rank, i) for a in answers for i in [first_nonfinite(a.variants[variant].losses)] if i is not None]
    machine = [v.machine for v in per_rank if v.machine is not None]
    others_s, others_share = others_cpu(machine) if len(machine) == len(answers) else (math.nan, math.nan)
    return Metrics(
        samples_per_s=statistics.median(throughput) if throughput else math.nan,
        samples_per_s_ci=[lo, hi],
        throughput_per_round=throughput,
        window_s=windows,
        step_time_s=describe(all_steps),
        step_times_s=all_steps,
        rank_median_step_s=rank_medians,
        slowest_rank=slowest,
        losses=first.losses,
        nonfinite_loss=NonfiniteLoss(rank=bad[0][0], step=bad[0][1]) if bad else None,
        comm_calls_per_step=first.comm_calls_per_step,
        comm_bytes_per_step=first.comm_bytes_per_step,
        host_syncs=first.host_syncs,
        threads=first.threads,
        peak_memory_bytes=max(v.peak_memory_bytes for v in per_rank),
        peak_memory_kind=first.peak_memory_kind,
        footprint_bytes=max(v.footprint_bytes for v in per_rank),
        global_batch=global_batch,
        steps_per_window=steps,
        others_cpu_s=others_s if math.isfinite(others_s) else None,
        others_cpu_share=others_share if math.isfinite(others_share) else None,
    )


def _median_step(m: Metrics) -> float:
    """The median step of a variant's summary (nan where it has none)."""
    median = m.step_time_s.median if m.step_time_s is not None else None
    return median if median is not None else math.nan


def summarize(answers: Sequence[RankTiming], names: list[str], global_batch: int, steps: int, world: int,
              baseline: str | None = None) -> dict[str, Timed]:
    """Each variant's metrics and describe from one interleaved timing call (see the module docstring)."""
    metrics = {n: variant_summary(answers, n, global_batch, steps) for n in names}
    if baseline is not None and baseline in metrics:
        base = window_seconds(answers, baseline)
        for n, m in metrics.items():
            sp = paired_speedup(base, window_seconds(answers, n))
            metrics[n] = replace(m, speedup=sp["speedup"], speedup_ci=list(sp["ci"]), baseline=baseline,
                                 speedup_consistent=sp["consistent"] if n != baseline else None,
                                 speedup_disagreement=sp["disagreement"] if n != baseline else None)
    if COMPUTE_ONLY in metrics:
        compute = _median_step(metrics[COMPUTE_ONLY])
        for n, m in metrics.items():
            exposed = _median_step(m) - compute
            ar = allreduce_total(m.comm_bytes_per_step)  # a two-level allreduce's gradients counted once
            metrics[n] = replace(m, exposed_comm_s=exposed, compute_s=compute,
                                 busbw_GBps=busbw(ar, exposed, world) / 1e9)
    return {n: Timed(m, Describe.from_dict(answers[0].variants[n].describe, f"variant {n}", "describe."))
            for n, m in metrics.items()}
