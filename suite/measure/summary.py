"""From the ranks' answers to a case's metrics: the one summary that ``run``, pytest-benchmark and asv use.

The ranks answer :func:`suite.measure.timing.time_on_rank` (or, per window, the prepared-case
calls) with, per variant, their window times, per-step times, losses and communication
counts.  :func:`summarize` folds every rank's answer into one metrics dict per variant, every name
written through :class:`suite.results.records.Metrics` (the one list of metric names), plus the
engine's ``describe``:

- throughput per round (global batch × steps / the slowest rank's window), its median with a
  bootstrap interval, per-step time statistics over every rank's steps;
- speedup over the baseline, paired round by round (the variants ran interleaved);
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

from ..results.records import Metrics, allreduce_total
from .stats import bootstrap_median_ci, busbw, describe, paired_speedup, window_seconds
from .utilization import others_cpu

__all__ = ["variant_summary", "summarize", "first_nonfinite", "COMPUTE_ONLY"]

COMPUTE_ONLY = "none"  # the variant without gradient communication: compute alone


def first_nonfinite(losses: list) -> int | None:
    """The 1-based index of the first loss that is nan or ±inf (or not a number at all), else None."""
    for i, v in enumerate(losses, 1):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            return i
    return None


def variant_summary(answers: list[dict], variant: str, global_batch: int, steps: int) -> dict:
    windows = window_seconds(answers, variant)
    throughput = [global_batch * steps / w for w in windows if w > 0]
    per_rank_steps = [a["variants"][variant]["step_times"] for a in answers]
    all_steps = [t for ts in per_rank_steps for t in ts]
    rank_medians = [statistics.median(ts) if ts else math.nan for ts in per_rank_steps]
    slowest = max(range(len(rank_medians)), key=lambda r: rank_medians[r]) if rank_medians else 0
    lo, hi = bootstrap_median_ci(throughput)
    first = answers[0]["variants"][variant]
    precision = {a["rank"]: a["variants"][variant].get("describe", {}).get("precision") for a in answers}
    if any(p != precision[answers[0]["rank"]] for p in precision.values()):  # one process-wide state per rank
        raise ValueError(f"{variant}: the ranks report different precision settings (torch.backends): {precision}")
    bad = [(a["rank"], i) for a in answers
           for i in [first_nonfinite(a["variants"][variant]["losses"])] if i is not None]
    machine = [a["variants"][variant]["machine"] for a in answers if "machine" in a["variants"][variant]]
    others_s, others_share = others_cpu(machine) if len(machine) == len(answers) else (math.nan, math.nan)
    metrics = Metrics(
        samples_per_s=statistics.median(throughput) if throughput else math.nan,
        samples_per_s_ci=[lo, hi],
        throughput_per_round=throughput,
        window_s=windows,
        step_time_s=describe(all_steps),
        step_times_s=all_steps,
        rank_median_step_s=rank_medians,
        slowest_rank=slowest,
        losses=first["losses"],
        nonfinite_loss={"rank": bad[0][0], "step": bad[0][1]} if bad else None,
        comm_calls_per_step=first["comm_calls_per_step"],
        comm_bytes_per_step=first["comm_bytes_per_step"],
        host_syncs=first["host_syncs"],
        threads=first["threads"],
        peak_memory_bytes=max(a["variants"][variant].get("peak_memory_bytes", 0) for a in answers),
        peak_memory_kind=first.get("peak_memory_kind", ""),
        footprint_bytes=max(a["variants"][variant].get("footprint_bytes", 0) for a in answers),
        global_batch=global_batch,
        steps_per_window=steps,
        others_cpu_s=others_s if math.isfinite(others_s) else None,
        others_cpu_share=others_share if math.isfinite(others_share) else None,
    )
    return metrics.to_dict() | {"describe": first["describe"]}


def summarize(answers: list[dict], names: list[str], global_batch: int, steps: int, world: int,
              baseline: str | None = None) -> dict[str, dict]:
    """Metrics per variant of one interleaved timing call (see the module docstring)."""
    out = {n: variant_summary(answers, n, global_batch, steps) for n in names}
    if baseline is not None and baseline in out:
        base = window_seconds(answers, baseline)
        for n, s in out.items():
            sp = paired_speedup(base, window_seconds(answers, n))
            s.update(Metrics(speedup=sp["speedup"], speedup_ci=list(sp["ci"]), baseline=baseline).to_dict())
    if COMPUTE_ONLY in out:
        compute = out[COMPUTE_ONLY]["step_time_s"]["median"]
        for s in out.values():
            exposed = s["step_time_s"]["median"] - compute
            ar = allreduce_total(s["comm_bytes_per_step"])  # a two-level allreduce's gradients counted once
            s.update(Metrics(exposed_comm_s=exposed, compute_s=compute,
                             busbw_GBps=busbw(ar, exposed, world) / 1e9).to_dict())
    return out
