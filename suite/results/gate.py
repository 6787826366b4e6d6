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

The question is `ab`'s, at this comparison's threshold t: is HEAD slower by t or more?  A verdict
must rest on more than the test:

- **not slower** (by t or more): the whole interval of HEAD/BASE below 1 + t (the speedup's low end
  above 1 / (1 + t));
- **slower**: the test says so **and** the whole interval beyond the threshold (HEAD/BASE above
  1 + t: separate runs differ by a few percent without any code change, which no interval from one
  pair of runs can see, so `compare` asks for the threshold where `ab`, interleaved, asks for 1);
- **faster**: the test says so and the whole interval above a speedup of 1;

anything else, or too few samples, is **undecided** (exit 3), with what would decide it.  "same" is
never said (it needs an equivalence margin, which only `ab` has), and neither is "not slower" for a
significant slowdown smaller than the threshold without the interval below it.  Every row records the
smallest slowdown its samples could have caught at 95% (``detectable_slowdown``, the same power
statement as `ab`'s), or, past 100%, how many windows a side would catch less (``needed_windows``); the table
states it beside an undecided row, and beside a decided one what its interval caught or rules out
(``suite.results.compare.could_catch``).
"""
from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["GateOptions", "gate_samples", "MIN_SAMPLES", "min_p_value", "UNDECIDED", "VERDICTS", "detectable_shift",
           "ratio_interval_text"]

UNDECIDED = ("undecided", "too few samples")  # changes that decide nothing (exit 3)
VERDICTS = ("slower", "not slower", "faster") + UNDECIDED

MIN_SAMPLES = 3


@dataclass(frozen=True)
class GateOptions:
    threshold: float = 0.25  # relative slowdown that counts (0.25: 25% slower; docs/figures/gate.md section 1)
    alpha: float = 0.01  # significance level of the test
    method: str = "mwu"  # mwu | bootstrap
    n_boot: int = 1000
    seed: int = 0

    def __post_init__(self) -> None:
        # a fraction: 5 is refused, not taken as 500%; at t >= 1 the line 1/(1 + t) is at or below 0.5, so a 2x
        # slowdown (speedup 0.5) would no longer lie beyond the threshold
        if not (isinstance(self.threshold, (int, float)) and 0 <= self.threshold < 1):
            shown = format(self.threshold, "g") if isinstance(self.threshold, (int, float)) else repr(self.threshold)
            raise ValueError(f"--threshold {shown}: a fraction, e.g. 0.05 for 5%; allowed 0 <= t < 1")
        if not (isinstance(self.alpha, (int, float)) and 0 < self.alpha <= 0.5):
            raise ValueError(f"--alpha {self.alpha!r}: must be in (0, 0.5]")
        if self.method not in ("mwu", "bootstrap"):
            raise ValueError(f"--method {self.method!r}: allowed values are 'mwu' and 'bootstrap'")


def _finite(xs: Iterable[float]) -> np.ndarray:
    a = np.asarray(list(xs), dtype=float)
    return a[np.isfinite(a) & (a > 0)]


def gate_samples(base: Sequence[float], head: Sequence[float], opts: GateOptions = GateOptions()) -> dict:
    """Compare two sets of per-step seconds; returns speedup, interval, p-values and a change verdict.

    ``change`` is "slower", "not slower", "faster", "undecided" (see the module docstring; ``to_decide`` says
    what would decide it) or "too few samples" (fewer than MIN_SAMPLES finite positive samples on a side, or,
    with ``mwu``, too few for any p-value below alpha: 5 windows a side at alpha 0.01; nan/inf samples are
    dropped and counted).  ``detectable_slowdown``: the smallest slowdown (a fraction) these samples would have
    called slower at 95% (inf: none); ``needed_windows``: where that is 100% or more, the windows a side with
    which this spread would catch less (None: no spread to go by).
    """
    b, h = _finite(base), _finite(head)
    out: dict[str, Any] = {"n_base": int(b.size), "n_head": int(h.size), "dropped": int(len(list(base)) - b.size
                                                                          + len(list(head)) - h.size),
           "base_median_s": float(np.median(b)) if b.size else math.nan,
           "head_median_s": float(np.median(h)) if h.size else math.nan,
           "speedup": math.nan, "ci_low": math.nan, "ci_high": math.nan, "p_slower": math.nan,
           "p_faster": math.nan, "detectable_slowdown": math.inf, "needed_windows": None, "to_decide": ""}
    if b.size < MIN_SAMPLES or h.size < MIN_SAMPLES:
        out["change"] = "too few samples"
        out["to_decide"] = f"at least {_fewest(opts)} windows a side"
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
    # sides' n_base + n_head - 2 degrees of freedom, at its 95% upper bound (detectable_shift)
    se = math.nan
    if lo > 0 and math.isfinite(hi) and hi > 0:
        se = (math.log(hi) - math.log(lo)) / (2 * Z95)
        out["detectable_slowdown"] = _detectable(se, b.size, h.size, opts)
    if slow_test:  # significant: slower only if the whole interval is beyond the threshold
        out["change"] = "slower" if hi < slow_line else "undecided"
    elif lo > slow_line:  # HEAD/BASE's upper end below 1 + threshold
        out["change"] = "faster" if fast_test and lo > 1 else "not slower"
    else:
        out["change"] = "undecided"
    if opts.method == "mwu" and min_p_value(b.size, h.size) >= opts.alpha:
        # no arrangement of so few samples reaches alpha: the test cannot say "slower" at all
        out["change"] = "too few samples"
        out["detectable_slowdown"] = math.inf  # so it could have caught nothing
        out["to_decide"] = f"at least {_fewest(opts)} windows a side"
    if not out["detectable_slowdown"] < 1 and math.isfinite(se):
        out["needed_windows"] = _needed(se, b.size, h.size, opts)
    if out["change"] == "undecided":
        out["to_decide"] = _to_decide(lo, hi, b.size, h.size, opts)
    return out


Z95 = 1.959964  # the normal quantile 0.975 (the speedup's 95% interval)


def _detectable(se: float, nb: int, nh: int, opts: GateOptions) -> float:
    """The power statement: the bootstrap interval's width as the standard error of the log speedup, on the two
    sides' nb + nh - 2 degrees of freedom, at its 95% upper bound (detectable_shift), beyond
    the threshold."""
    return math.expm1(math.log1p(opts.threshold) + detectable_shift(se, nb + nh - 2, Z95))


def _fewest(opts: GateOptions) -> int:
    """The fewest windows a side that can decide at all: MIN_SAMPLES, and with mwu a p-value below alpha."""
    n = MIN_SAMPLES
    while opts.method == "mwu" and min_p_value(n, n) >= opts.alpha:
        n += 1
    return n


def _needed(se: float, nb: int, nh: int, opts: GateOptions, limit: int = 100_000) -> int | None:
    """The fewest windows a side with which this spread would state a slowdown below 100% (the standard error
    shrinking as sqrt(1/nb + 1/nh))."""
    n = _fewest(opts)
    while n <= limit:
        if _detectable(se * math.sqrt((2 / n) / (1 / nb + 1 / nh)), n, n, opts) < 1:
            return n
        n = n + 1 if n < 64 else int(n * 1.1)
    return None


def _to_decide(lo: float, hi: float, nb: int, nh: int, opts: GateOptions) -> str:
    """What an undecided row lacks: HEAD/BASE's interval below 1 + threshold (not slower) or above it with the test
    (slower), and about how many times the windows would give it at this spread and estimate."""
    line = math.log1p(opts.threshold)
    r_lo, r_hi = -math.log(hi), -math.log(lo)  # HEAD/BASE, log scale
    est, half = (r_lo + r_hi) / 2, (r_hi - r_lo) / 2
    times = [(half / gap) ** 2 for gap in (line - est, est - line) if gap > 0]
    more = min(times) if times else math.inf
    how = (f"about {more:.1f} times the windows ({math.ceil(more * max(nb, nh))} a side) would decide at this "
           f"spread" if more < 100 else "over 100 times the windows would be needed at this spread and estimate")
    return f"HEAD/BASE's interval must lie below {1 + opts.threshold:.3f} (not slower) or above it (slower); {how}"


def min_p_value(n_base: int, n_head: int) -> float:
    """The smallest one-sided Mann–Whitney p-value ``n_base`` and ``n_head`` samples can give: 1/C(n+m, n)."""
    from math import comb

    return 1.0 / comb(n_base + n_head, n_base) if n_base and n_head else 1.0


# ---- shared with `ab` (suite.ab.stats): the power statement and the interval shown -------------------------------
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
