"""Statistics over the ranks' timings: medians with intervals, never a single run.

Speedups are always stated as speedup (> 1 is faster): baseline time / variant time, paired
round by round (the variants ran interleaved), summarised by the median ratio with a
bootstrap 95% interval.
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .reader_timing import ReaderTiming
    from .timing import RankTiming

__all__ = ["describe", "window_seconds", "paired_speedup", "bootstrap_median_ci", "RUN_ROUNDS_FOR_95"]

from ..results.records import Stat
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
    any round's window is not a finite time > 0 (such a round is a fault to see, not one to leave out)."""
    pairs = list(zip(baseline_windows, variant_windows))
    valid = [(b, v) for b, v in pairs if math.isfinite(b) and math.isfinite(v) and b > 0 and v > 0]
    ratios = [b / v for b, v in valid]
    if not ratios or len(valid) < len(pairs):
        return {"speedup": math.nan, "ci": [math.nan, math.nan], "rounds": len(ratios)}
    lo, hi = bootstrap_median_ci(ratios)
    return {"speedup": statistics.median(ratios), "ci": [lo, hi], "rounds": len(ratios)}
