"""The regression gate's statistics: is HEAD slower than BASE, beyond noise and beyond a threshold?

For each case the time samples of the two sides are compared: one sample per timed *window*
(seconds per step of the window), not per step.  The steps of one window are autocorrelated
(ranks wait for each other, load comes in bursts), so a test on per-step samples treats
dozens of dependent numbers as independent and its p-values are overconfident; windows are
far closer to independent.  Most of the noise still lies *between* separate runs, which no
test on one pair of runs can see: that is what the threshold is for, and why the gate between
two revisions is `fleetbench ab` (trials interleaved in time), not this comparison.

- speedup = median(BASE) / median(HEAD) (> 1: HEAD is faster), with a bootstrap 95% interval
  (the two sides resampled independently);
- ``mwu`` (default): one-sided Mann–Whitney U tests.  HEAD is *slower* when HEAD's steps are
  stochastically larger (p < ``alpha``) **and** the speedup is below 1 / (1 + threshold);
  *faster* symmetrically;
- ``bootstrap``: the test is the interval itself (it excludes no change).

A verdict must rest on more than the test, as `ab`'s does on its margin: *slower* needs the whole
interval below 1 / (1 + threshold) (beyond the threshold with 95% confidence, not only its point
estimate), and *same* needs the whole interval above it (not slower beyond the threshold).  An
interval that reaches across the threshold, or too few samples, is **undecided** (exit 3), never
"same": every row states the smallest slowdown its samples could have caught at 95%
(``detectable_slowdown``, the same power statement as `ab`'s).  A significant change smaller than
the threshold is "same": on a shared machine a few percent move between runs without any code
change (see ``fleetbench figures gate``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..measure.stats import detectable_shift

__all__ = ["GateOptions", "gate_samples", "MIN_SAMPLES", "min_p_value", "UNDECIDED"]

UNDECIDED = ("undecided", "too few samples")  # changes that decide nothing (exit 3)

MIN_SAMPLES = 3


@dataclass(frozen=True)
class GateOptions:
    threshold: float = 0.25  # relative slowdown that counts (0.25: 25% slower; measured by `figures gate`)
    alpha: float = 0.01  # significance level of the test
    method: str = "mwu"  # mwu | bootstrap
    n_boot: int = 1000
    seed: int = 0

    def __post_init__(self):
        # a fraction: 5 is refused, not taken as 500%; at t >= 1 the line 1/(1 + t) is at or below 0.5, so a 2x
        # slowdown (speedup 0.5) would no longer lie beyond the threshold
        if not (isinstance(self.threshold, (int, float)) and 0 <= self.threshold < 1):
            shown = format(self.threshold, "g") if isinstance(self.threshold, (int, float)) else repr(self.threshold)
            raise ValueError(f"--threshold {shown}: a fraction, e.g. 0.05 for 5%; allowed 0 <= t < 1")
        if not (isinstance(self.alpha, (int, float)) and 0 < self.alpha <= 0.5):
            raise ValueError(f"--alpha {self.alpha!r}: must be in (0, 0.5]")
        if self.method not in ("mwu", "bootstrap"):
            raise ValueError(f"--method {self.method!r}: allowed values are 'mwu' and 'bootstrap'")


def _finite(xs) -> np.ndarray:
    a = np.asarray(list(xs), dtype=float)
    return a[np.isfinite(a) & (a > 0)]


def gate_samples(base, head, opts: GateOptions = GateOptions()) -> dict:
    """Compare two sets of per-step seconds; returns speedup, interval, p-values and a change verdict.

    ``change`` is "slower", "faster", "same", "undecided" (see the module docstring) or "too few samples"
    (fewer than MIN_SAMPLES finite positive samples on a side, or, with ``mwu``, too few for any p-value
    below alpha: 5 windows a side at alpha 0.01; nan/inf samples are dropped and counted).
    ``detectable_slowdown``: the smallest slowdown (a fraction) these samples would have called slower at
    95% (inf: none).
    """
    b, h = _finite(base), _finite(head)
    out: dict[str, Any] = {"n_base": int(b.size), "n_head": int(h.size), "dropped": int(len(list(base)) - b.size
                                                                          + len(list(head)) - h.size),
           "base_median_s": float(np.median(b)) if b.size else math.nan,
           "head_median_s": float(np.median(h)) if h.size else math.nan,
           "speedup": math.nan, "ci_low": math.nan, "ci_high": math.nan, "p_slower": math.nan,
           "p_faster": math.nan, "detectable_slowdown": math.inf}
    if b.size < MIN_SAMPLES or h.size < MIN_SAMPLES:
        out["change"] = "too few samples"
        return out
    speedup = out["base_median_s"] / out["head_median_s"]
    rng = np.random.default_rng(opts.seed)
    bb = np.median(rng.choice(b, size=(opts.n_boot, b.size)), axis=1)
    hb = np.median(rng.choice(h, size=(opts.n_boot, h.size)), axis=1)
    lo, hi = np.quantile(bb / hb, [0.025, 0.975])
    out.update(speedup=float(speedup), ci_low=float(lo), ci_high=float(hi))
    from scipy.stats import mannwhitneyu

    out["p_slower"] = float(mannwhitneyu(h, b, alternative="greater").pvalue)
    out["p_faster"] = float(mannwhitneyu(h, b, alternative="less").pvalue)
    slow_line, fast_line = 1 / (1 + opts.threshold), 1 + opts.threshold
    if opts.method == "mwu":
        slow_test = out["p_slower"] < opts.alpha and speedup < slow_line
        fast_test = out["p_faster"] < opts.alpha and speedup > fast_line
    else:
        slow_test, fast_test = hi < 1, lo > 1
    # the power statement: the bootstrap interval's width as the standard error of the log speedup, on the two
    # sides' n_base + n_head - 2 degrees of freedom, at its 95% upper bound (suite.measure.stats.detectable_shift)
    if lo > 0 and math.isfinite(hi) and hi > 0:
        z_c = 1.959964  # the normal quantile 0.975 (the 95% interval)
        se = (math.log(hi) - math.log(lo)) / (2 * z_c)
        out["detectable_slowdown"] = math.expm1(math.log1p(opts.threshold)
                                                + detectable_shift(se, b.size + h.size - 2, z_c))
    if slow_test:  # significant: slower only if the whole interval is beyond the threshold
        out["change"] = "slower" if hi < slow_line else "undecided"
    elif fast_test:
        out["change"] = "faster"
    else:  # "same" claims HEAD is not slower beyond the threshold: the whole interval must say so
        out["change"] = "same" if lo > slow_line else "undecided"
    if opts.method == "mwu" and min_p_value(b.size, h.size) >= opts.alpha:
        # no arrangement of so few samples reaches alpha: the test cannot say "slower" at all
        out["change"] = "too few samples"
        out["detectable_slowdown"] = math.inf  # so it could have caught nothing
    return out


def min_p_value(n_base: int, n_head: int) -> float:
    """The smallest one-sided Mann–Whitney p-value ``n_base`` and ``n_head`` samples can give: 1/C(n+m, n)."""
    from math import comb

    return 1.0 / comb(n_base + n_head, n_base) if n_base and n_head else 1.0
