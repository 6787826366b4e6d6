"""Statistics over the ranks' timings: medians with intervals, never a single run.

Speedups are always stated as speedup (> 1 is faster): baseline time / variant time, paired
round by round (the variants ran interleaved), summarised by the median ratio with a
bootstrap 95% interval.

A speedup is *resolved* (:func:`speedup_unresolved`, the one rule `run`, the report and its charts state) when
its interval excludes 1, it rests on at least ``RUN_ROUNDS_FOR_95`` rounds, and its rounds agree with each other
(:func:`round_consistency`: every leave-one-round-out interval is on the same side of 1).
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .reader_timing import ReaderTiming
    from .timing import RankTiming

__all__ = ["describe", "window_seconds", "paired_speedup", "bootstrap_median_ci", "RUN_ROUNDS_FOR_95",
           "round_consistency", "speedup_unresolved", "NOT_RESOLVED", "ROUNDS_DISAGREE"]

from ..results.records import Metrics, Stat
from ..run_spec import RUN_ROUNDS_FOR_95  # the fewest rounds whose range can cover the median 95% of the time


def _quantile(xs: Sequence[float], q: float) -> float:
    s = sorted(xs)
    if not s:
        return math.nan
    pos = (len(s) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def describe(xs: Sequence[float]) -> Stat:
    """median, IQR (q25..q75), min, max, mean, n (no values: n 0, the rest nan)."""
    if not xs:
        return Stat(n=0, median=math.nan, q25=math.nan, q75=math.nan, iqr=math.nan, min=math.nan, max=math.nan,
                    mean=math.nan)
    q25, q75 = _quantile(xs, 0.25), _quantile(xs, 0.75)
    return Stat(n=len(xs), median=statistics.median(xs), q25=q25, q75=q75, iqr=q75 - q25, min=min(xs), max=max(xs),
                mean=statistics.fmean(xs))


def bootstrap_median_ci(xs: Sequence[float], level: float = 0.95, n_boot: int = 2000, seed: int = 0) -> tuple:
    """Percentile bootstrap interval of the median (scipy.stats.bootstrap, the project's one bootstrap); (nan, nan)
    from fewer than two values: one value is no interval, not a certain one.

    At small n the interval is about the range of the values, which covers the median with probability
    1 - 2**(1 - n) at best (75% at 3, 94% at 5): ``RUN_ROUNDS_FOR_95`` rounds are the fewest that can reach 95%."""
    if len(xs) < 2:
        return (math.nan, math.nan)
    import numpy as np
    from scipy.stats import bootstrap

    a = np.asarray(xs, dtype=float)
    if np.ptp(a) == 0:  # every resample's median is the value itself
        return (float(a[0]), float(a[0]))
    res = bootstrap((a,), np.median, confidence_level=level, n_resamples=n_boot, method="percentile",
                    vectorized=True, random_state=np.random.default_rng(seed))
    return (float(res.confidence_interval.low), float(res.confidence_interval.high))


def window_seconds(answers: Sequence[RankTiming] | Sequence[ReaderTiming], variant: str) -> list[float]:
    """Per round, the slowest rank's window time (windows end on a barrier, so ranks agree closely); nan for a
    round in which any rank's window is not finite (``max`` would keep or drop a nan by its position)."""
    per_rank = [a.variants[variant].windows for a in answers]
    return [max(ws) if all(math.isfinite(w) for w in ws) else math.nan for ws in zip(*per_rank)]


def paired_speedup(baseline_windows: Sequence[float], variant_windows: Sequence[float]) -> dict:
    """Speedup of the variant over the baseline (> 1 faster), paired by round, with a 95% interval; nan when
    any round's window is not a finite time > 0 (such a round is a fault to see, not one to leave out).
    ``consistent`` and ``disagreement``: :func:`round_consistency` of the rounds' ratios."""
    pairs = list(zip(baseline_windows, variant_windows))
    valid = [(b, v) for b, v in pairs if math.isfinite(b) and math.isfinite(v) and b > 0 and v > 0]
    ratios = [b / v for b, v in valid]
    if not ratios or len(valid) < len(pairs):
        return {"speedup": math.nan, "ci": [math.nan, math.nan], "rounds": len(ratios), "consistent": None,
                "disagreement": None}
    lo, hi = bootstrap_median_ci(ratios)
    consistent, why = round_consistency(ratios, (lo, hi))
    return {"speedup": statistics.median(ratios), "ci": [lo, hi], "rounds": len(ratios), "consistent": consistent,
            "disagreement": why}


def round_consistency(ratios: Sequence[float], ci: tuple[float, float] | None = None
                      ) -> tuple[bool | None, str | None]:
    """Whether the rounds' speedups agree with each other on the side of 1 their interval ``ci`` is on (default:
    :func:`bootstrap_median_ci` of ``ratios``): (True, None) when, leaving out any one round, the other rounds'
    interval still excludes 1 on that side; (False, why) naming the round without which it does not, and the
    rounds on the other side of 1; (None, None) where there is nothing to check (an interval that already spans 1,
    none, or fewer than 3 rounds: one left out leaves no interval).

    Why this check, and this one.  The interval treats the rounds as exchangeable draws from one machine state.
    A round that a burst of load hit (one variant's window slowed, not the other's) is no such draw: the median
    moves little, but the interval can sit off 1 only because of that round, and the next run does not repeat
    it (issue 46: resnet/ddp 2.03 [1.50, 3.47], 0.93 [0.51, 1.58], 1.87 [1.66, 1.92] on one commit).  Leaving
    each round out in turn asks whether the verdict rests on any single round (the jackknife's question), on
    the same interval and the same rounds, with no model of the noise within a round: a test of the spread
    between rounds against the step times' spread within them (Cochran's Q) would call a GPU's 0.5% wiggle
    between rounds "inconsistent" beside steps 0.1% apart, and its within-round variance from a handful of
    autocorrelated steps is itself unreliable.  It also restores the interval's error rate: with 6 rounds the
    percentile bootstrap of the median sits off 1 for 6.8% of unchanged cases (27 of 400 seeded cases of
    log-normal rounds, tests/test_stats.py), leaving one round out brings that to 2.8% (11), about the exact
    sign test's 3.1% (all 6 rounds on one side of 1); with more rounds it tolerates a round or two across 1
    (9 rounds: 4.5% to 3.2%).  What it costs: with rounds 10% apart (their log ratios' spread), a true speedup
    of 1.105 is resolved in 40% of runs instead of 59%, 1.22 in 87% instead of 98%, 1.35 in 99% instead of
    100% (300 seeded runs each)."""
    xs = [float(x) for x in ratios]
    lo, hi = ci if ci is not None else bootstrap_median_ci(xs)
    if len(xs) < 3 or not (math.isfinite(lo) and math.isfinite(hi)) or lo <= 1 <= hi:
        return None, None
    faster = lo > 1
    worst: tuple | None = None  # (how far across 1 its interval's near end is, round, interval)
    for j in range(len(xs)):
        l2, h2 = bootstrap_median_ci(xs[:j] + xs[j + 1:])
        near = l2 if faster else h2
        across = (1 - near) if faster else (near - 1)  # >= 0: the interval without round j reaches 1
        if across >= 0 and (worst is None or across > worst[0]):
            worst = (across, j, (l2, h2))
    if worst is None:
        return True, None
    _, j, (l2, h2) = worst
    other = [(i, x) for i, x in enumerate(xs) if (x <= 1 if faster else x >= 1)]
    said = ", ".join(f"round {i + 1} ({x:.2f})" for i, x in other[:4]) + (" …" if len(other) > 4 else "")
    return False, (f"{ROUNDS_DISAGREE}: " + (f"{said} on the other side of 1; " if said else "")
                   + f"without round {j + 1} ({xs[j]:.2f}) the other rounds' interval [{l2:.2f}, {h2:.2f}] "
                     f"contains 1")


NOT_RESOLVED = "not resolved"
ROUNDS_DISAGREE = "rounds disagree"


def speedup_unresolved(metrics: Metrics) -> str | None:
    """Why a case's speedup is not resolved, in the words of ``fleetbench run``'s table and the report (the one
    rule both state), or None where it is resolved (or there is no speedup): "not resolved" where its 95% interval
    spans 1 (neither faster nor slower), "not resolved (N rounds)" where it comes from fewer than
    RUN_ROUNDS_FOR_95 rounds (such an interval covers less than 95%: docs/report.md), "not resolved (rounds
    disagree)" where its rounds disagree with each other (:func:`round_consistency`, the record's
    ``speedup_consistent``; a record from before it was kept is not judged so), "no interval" where none was
    recorded (one round)."""
    sp = _num(metrics.speedup)
    if not math.isfinite(sp):
        return None
    ci = metrics.speedup_ci
    lo, hi = (_num(ci[0]), _num(ci[1])) if isinstance(ci, (list, tuple)) and len(ci) == 2 else (math.nan, math.nan)
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return "no interval"
    if lo <= 1 <= hi:
        return NOT_RESOLVED
    windows = metrics.window_s  # the rounds the speedup is paired over, as run counts them
    if isinstance(windows, list) and len(windows) < RUN_ROUNDS_FOR_95:
        return f"{NOT_RESOLVED} ({len(windows)} rounds)"
    if metrics.speedup_consistent is False:
        return f"{NOT_RESOLVED} ({ROUNDS_DISAGREE})"
    return None


def _num(x: object) -> float:
    """A recorded number as a float (nan where absent or not a number)."""
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else math.nan
