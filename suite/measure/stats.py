"""Statistics over the ranks' timings: medians with intervals, never a single run.

Speedups are always stated as speedup (> 1 is faster): baseline time / variant time, paired
round by round (the variants ran interleaved), summarised by the median ratio with a
bootstrap 95% interval.
"""
from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .reader_timing import ReaderTiming
    from .timing import RankTiming

__all__ = ["describe", "window_seconds", "paired_speedup", "bootstrap_median_ci", "busbw", "detectable_shift",
           "RUN_ROUNDS_FOR_95", "ratio_interval_text"]

# The fewest rounds whose range can cover the median with 95% probability (1 - 2**(1 - n) >= 0.95).
RUN_ROUNDS_FOR_95 = 6


def _quantile(xs: Sequence[float], q: float) -> float:
    s = sorted(xs)
    if not s:
        return math.nan
    pos = (len(s) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def describe(xs: Sequence[float]) -> dict:
    """median, IQR (q25..q75), min, max, mean, n."""
    if not xs:
        return {"n": 0, "median": math.nan, "q25": math.nan, "q75": math.nan, "iqr": math.nan, "min": math.nan,
                "max": math.nan, "mean": math.nan}
    q25, q75 = _quantile(xs, 0.25), _quantile(xs, 0.75)
    return {"n": len(xs), "median": statistics.median(xs), "q25": q25, "q75": q75, "iqr": q75 - q25,
            "min": min(xs), "max": max(xs), "mean": statistics.fmean(xs)}


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


@functools.lru_cache(maxsize=256)
def _noncentrality(df: float, crit: float, power: float) -> float:
    """ν with P(noncentral t(df, ν) > crit) = power."""
    from scipy.optimize import brentq
    from scipy.stats import nct

    return float(brentq(lambda x: float(nct.sf(crit, df, x)) - power, 0.0, 1e4))


def detectable_shift(se: float, df: float, crit: float, power: float = 0.95, bound: float = 0.95) -> float:
    """How far beyond its decision line a true effect must lie for a comparison like this one to cross the line
    with probability ``power``: the power statement of `ab` and `compare` (``detectable_slowdown``), in the units
    of ``se`` (log ratios).

    The comparison says "beyond" when (estimate - line) / se_hat > ``crit``, with se_hat its estimated standard
    error on ``df`` degrees of freedom (a t interval: s / sqrt(G) and G - 1; a bootstrap interval: its
    half-width over its quantile).  That ratio is noncentral t with df degrees of freedom and noncentrality
    (effect - line) / se, so the effect is line + ν·se, with ν the noncentrality at which it crosses ``crit``
    with probability ``power`` (this counts the next comparison's own uncertainty about its spread).  The true
    se is unknown: it is taken at its ``bound`` upper confidence bound from this comparison's se_hat,
    se_hat·sqrt(df / χ²_{1-bound}(df)).  The bound is 95% because the statement is checked per comparison (its
    own stated value, then a fresh comparison at exactly that effect; tests/test_ab.py, tests/test_compare.py),
    and a comparison that stopped early because its interval happened to be narrow underestimates its spread:
    at a 60% bound 10-15% of such comparisons stated less than they could catch, at 95% the fresh comparisons
    cross the line 96-99% of the time.  inf for a standard error that is not finite or df < 1."""
    from scipy.stats import chi2

    if not (math.isfinite(se) and se >= 0 and df >= 1):
        return math.inf
    upper = se * math.sqrt(df / float(chi2.ppf(1 - bound, df)))
    return _noncentrality(float(df), float(crit), float(power)) * upper


WIDE = 100.0  # an interval of a ratio whose ends are further apart than this factor is shown clipped
CLIP = (0.1, 10.0)  # ... at these ends


def ratio_interval_text(lo: float, hi: float) -> str:
    """An interval of a ratio for people: "[0.975, 1.043]" (3 decimals); one whose ends are more than a factor
    ``WIDE`` apart (or not finite) says so instead of printing digits no one can read: "[< 0.1, > 10]" (an
    interval from 3 samples reached [0.002, 692.970])."""
    def end(x: float) -> str:
        if not math.isfinite(x) or x > CLIP[1]:
            return f"> {CLIP[1]:g}"
        return f"< {CLIP[0]:g}" if x < CLIP[0] else f"{x:.3f}"

    if math.isnan(lo) or math.isnan(hi):
        return "[-, -]"
    if lo > 0 and math.isfinite(hi) and hi / lo <= WIDE:
        return f"[{lo:.3f}, {hi:.3f}]"
    return f"[{end(lo)}, {end(hi)}]"


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


def busbw(nbytes_per_step: float, seconds: float, world: int, op: str = "all_reduce") -> float:
    """nccl-tests' bus bandwidth (bytes/s): algbw = bytes / time, times 2(n-1)/n for allreduce.

    fleetbench states it over the *exposed* communication time of a step (step time minus
    the same step without communication), so it is an effective figure, comparable across
    world sizes; nan when there is no exposed time to divide by.
    """
    if not (seconds > 0) or world < 2 or not nbytes_per_step:
        return math.nan
    factor = {"all_reduce": 2 * (world - 1) / world, "reduce_scatter": (world - 1) / world,
              "all_gather": (world - 1) / world}.get(op, 1.0)
    return nbytes_per_step / seconds * factor
