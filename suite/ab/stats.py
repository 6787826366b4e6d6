"""The sequential ABBA statistics of `fleetbench ab`.

Trials of BASE (A) and HEAD (B) alternate in blocks of four, each block ``ABBA`` or ``BAAB``
(drawn at random, seeded): a linear drift of the machine within a block hits both sides
alike.  Each block gives one number, the log ratio of HEAD's to BASE's step time

    d = log( mean(HEAD's two trials) / mean(BASE's two trials) )       (> 0: HEAD slower)

Blocks, not steps, are the samples: steps of one window are autocorrelated, blocks far less
(``lag1`` reports the lag-1 autocorrelation of the block series, which the figure checks).
The estimate is the 20%-trimmed mean of the ``d`` (robust to a block hit by a burst of load),
with a bootstrap interval (``scipy.stats.bootstrap``, BCa) at ``confidence`` (default 99%).

Sequential rule, with the equivalence margin δ (default 2%, on the ratio: ±log(1+δ)):
after at least ``min_blocks`` blocks (default 10), after every block,

- the whole interval above +δ  -> **slower**;
- the whole interval below −δ  -> **faster**;
- the whole interval inside ±δ -> **same** (equivalent within the margin);

otherwise another block, until the time budget per case (or ``max_blocks``) is spent: then
**inconclusive**, with the interval so far.  Looking after every block is a sequential test:
its false-alarm rate is measured, not assumed (``fleetbench figures gate``).

Rotation (``rotate`` = N, `ab --rotate N`): two preparations of the same case (engine, model,
buffers, data) can differ in speed by a few percent for as long as they run, and two pairs of
processes by a few percent more (``fleetbench figures gate`` measures both spreads), a bias no
number of blocks from one preparation averages out.  With rotation, after every N blocks the case
is prepared afresh on both servers, and every ``restart``-th time on fresh servers (which draws
the processes' part again); each pair of preparations' trimmed mean is one sample, the estimate
is their mean and the interval a Student t interval over the pairs (:func:`pair_interval`),
decided after whole pairs from ``min_pairs`` on.

Power (:func:`detectable_slowdown`): every verdict states the smallest slowdown the comparison would have
called "slower" with probability ``POWER`` (95%), from its own spread (at its 95% upper confidence bound) and
number of samples; checked per comparison: at its own stated value, at least 95% of fresh comparisons say
"slower".
"""
from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ..measure.stats import detectable_shift

__all__ = ["SeqOptions", "Sequential", "block_log_ratio", "interval", "pair_interval", "decide", "lag1", "VERDICTS",
           "describe_verdict", "describe_power", "detectable_slowdown", "POWER"]

VERDICTS = ("slower", "faster", "same", "inconclusive")
POWER = 0.95  # of the power statement: the slowdown a comparison would have caught this often
SPREAD_BOUND = 0.95  # the power statement takes the samples' spread at its 95% upper confidence bound


@dataclass(frozen=True)
class SeqOptions:
    delta: float = 0.02  # equivalence margin on the step-time ratio (0.02: ±2%)
    confidence: float = 0.99  # of the bootstrap interval
    min_blocks: int = 10  # no decision before this many blocks
    max_blocks: int = 2000
    budget_s: float = 180.0  # timed blocks per case, seconds (prepare and check not counted)
    trim: float = 0.2  # trimmed mean of the block log ratios
    n_resamples: int = 2000
    seed: int = 0
    split: float | None = None  # bisection: a log ratio; above it "slower", below it "same" (two regions)
    rotate: int = 0  # blocks per pair of preparations (0: one for the whole comparison); see pair_interval
    min_pairs: int = 3  # with rotation: pairs of preparations before any verdict
    restart: int = 2  # with rotation: every K-th fresh preparation is on fresh servers (0: never, 1: always)

    def __post_init__(self):
        if not (isinstance(self.delta, (int, float)) and 0 < self.delta < 1):
            raise ValueError(f"--delta {self.delta!r}: must be a fraction in (0, 1) (0.02 = 2%)")
        if not (0.5 < self.confidence < 1):
            raise ValueError(f"--confidence {self.confidence!r}: must be in (0.5, 1)")
        if not (isinstance(self.min_blocks, int) and self.min_blocks >= 3):
            raise ValueError(f"--min-blocks {self.min_blocks!r}: must be a whole number >= 3")
        if self.max_blocks < self.min_blocks:
            raise ValueError(f"--max-blocks {self.max_blocks}: must be >= --min-blocks ({self.min_blocks})")
        if not (math.isfinite(self.budget_s) and self.budget_s > 0):
            raise ValueError(f"--budget {self.budget_s!r}: must be a finite number of seconds > 0")
        if not (0 <= self.trim < 0.5):
            raise ValueError(f"trim {self.trim!r}: must be in [0, 0.5)")
        if not (isinstance(self.rotate, int) and (self.rotate == 0 or self.rotate >= 2)):
            raise ValueError(f"--rotate {self.rotate!r}: must be 0 (one preparation) or a whole number "
                             f">= 2 (blocks per pair of preparations)")
        if not (isinstance(self.restart, int) and self.restart >= 0):
            raise ValueError(f"--restart {self.restart!r}: must be a whole number >= 0 (fresh servers every K-th "
                             f"rotation; 0: never)")
        if not (isinstance(self.min_pairs, int) and self.min_pairs >= 2):
            raise ValueError(f"min_pairs {self.min_pairs!r}: must be a whole number >= 2")


def block_log_ratio(base_trials: Sequence[float], head_trials: Sequence[float]) -> float:
    """log(mean(head) / mean(base)); a ValueError for a trial time that is not a finite positive number."""
    for t in list(base_trials) + list(head_trials):
        if not (isinstance(t, (int, float)) and math.isfinite(t) and t > 0):
            raise ValueError(f"trial time {t!r} is not a finite positive number of seconds")
    return math.log(float(np.mean(head_trials)) / float(np.mean(base_trials)))


def _trimmed(x, axis=-1, trim: float = 0.2):
    """scipy.stats.trim_mean's rule (int(trim * n) cut from each end of the sorted values), in numpy alone: the
    gate figure's simulation calls it hundreds of thousands of times, and scipy's wrapper costs 0.3 ms a call."""
    a = np.sort(np.asarray(x, dtype=float), axis=axis)
    n = a.shape[axis]
    cut = int(trim * n)
    return np.take(a, range(cut, n - cut), axis=axis).mean(axis=axis)


def interval(d: Sequence[float], opts: SeqOptions = SeqOptions(), rng: np.random.Generator | None = None
             ) -> tuple[float, float, float]:
    """(estimate, low, high) of the block log ratios: trimmed mean and its bootstrap interval."""
    from scipy.stats import bootstrap

    a = np.asarray(d, dtype=float)
    if a.size == 0 or not np.all(np.isfinite(a)):
        raise ValueError("block log ratios must be finite and non-empty")
    est = float(_trimmed(a, trim=opts.trim))
    if a.size < 3 or np.ptp(a) == 0:
        return est, (est if np.ptp(a) == 0 else -math.inf), (est if np.ptp(a) == 0 else math.inf)
    rng = rng if rng is not None else np.random.default_rng(opts.seed)

    def stat(x, axis=-1):
        return _trimmed(x, axis=axis, trim=opts.trim)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for method in ("BCa", "percentile"):
            res = bootstrap((a,), stat, confidence_level=opts.confidence, n_resamples=opts.n_resamples,
                            method=method, vectorized=True, random_state=rng)
            lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
            if math.isfinite(lo) and math.isfinite(hi):
                return est, lo, hi
    return est, -math.inf, math.inf


def pair_interval(groups: Sequence[Sequence[float]], opts: SeqOptions = SeqOptions()) -> tuple[float, float, float]:
    """(estimate, low, high) over pairs of preparations: each pair's trimmed mean of its block log ratios,
    their mean, and a Student t interval over the pairs (G - 1 degrees of freedom).

    Two preparations of the same code can differ in speed for as long as they run (memory layout of the
    engine's tensors, placement): a bias shared by all blocks of one pair, which more blocks from that pair
    cannot average out.  With rotation (``SeqOptions.rotate``) every pair is a fresh draw of that bias, and
    the pairs, not the blocks, are the independent samples."""
    from scipy.stats import t as student_t

    means = np.asarray([float(_trimmed(np.asarray(g, dtype=float), trim=opts.trim)) for g in groups if len(g)])
    if means.size == 0 or not np.all(np.isfinite(means)):
        raise ValueError("pair means must be finite and non-empty")
    est = float(means.mean())
    if means.size < 2:
        return est, -math.inf, math.inf
    half = float(student_t.ppf(0.5 + opts.confidence / 2, means.size - 1)) * float(means.std(ddof=1)) \
        / math.sqrt(means.size)
    return est, est - half, est + half


def detectable_slowdown(samples: Sequence[float], lo: float, hi: float, opts: SeqOptions = SeqOptions(),
                        t_samples: bool = True) -> float:
    """The smallest slowdown (a fraction: 0.05 = 5%) that a comparison like this one, with as many samples and
    their spread, would have called "slower" with probability ``POWER``; ``inf`` when it could catch none (fewer
    than two samples, fewer than three blocks without rotation, or an unbounded interval).

    "slower" needs the interval's low end above log(1+δ): the estimate more than ``crit`` estimated standard
    errors beyond it.  :func:`suite.measure.stats.detectable_shift` gives the distance, noncentral t on the
    standard error's degrees of freedom, with the standard error at its ``SPREAD_BOUND`` (95%) upper confidence
    bound from this comparison's own, so that the statement errs on the side of claiming less:

    - a t interval over G samples (rotation: the pairs' trimmed means, ``t_samples``): se = s/√G, G−1 degrees
      of freedom, crit the interval's t quantile;
    - the block bootstrap (no rotation): se = the interval's width / (2·z), z its normal quantile, and crit = z,
      on the trimmed mean's n − 2⌊trim·n⌋ − 1 degrees of freedom (Yuen's; blocks hit by a burst of load leave
      fewer effective samples than blocks).

    The slowdown is exp(log(1+δ) + shift) − 1.  Validated per comparison in tests/test_ab.py: each simulated
    comparison's own stated value, then a fresh comparison (same design, same true spread) at exactly that
    slowdown; at least 95% of those say "slower", for either branch, with the "same" verdicts of sequential
    stopping among them."""
    from scipy.stats import norm
    from scipy.stats import t as student_t

    margin = math.log1p(opts.delta)
    if t_samples:
        g = len(samples)
        if g < 2:
            return math.inf
        df = g - 1
        sd = float(np.std(np.asarray(samples, dtype=float), ddof=1))
        if not math.isfinite(sd):
            return math.inf
        t_c = float(student_t.ppf(0.5 + opts.confidence / 2, df))
        shift = detectable_shift(sd / math.sqrt(g), df, t_c, POWER, SPREAD_BOUND)
    else:
        n = len(samples)
        if n < 3 or not (math.isfinite(lo) and math.isfinite(hi)):  # one block's "interval" is the block itself
            return math.inf
        z_c = float(norm.ppf(0.5 + opts.confidence / 2))
        df = max(1, n - 2 * int(opts.trim * n) - 1)
        shift = detectable_shift((hi - lo) / (2 * z_c), df, z_c, POWER, SPREAD_BOUND)
    return math.expm1(margin + shift)


def decide(lo: float, hi: float, delta: float) -> str | None:
    """The verdict an interval (log scale) gives against the margin ±log(1+δ), or None (keep going)."""
    margin = math.log1p(delta)
    if lo > margin:
        return "slower"
    if hi < -margin:
        return "faster"
    if -margin < lo and hi < margin:
        return "same"
    return None


def lag1(d: Sequence[float]) -> float:
    """Lag-1 autocorrelation of a series (nan for fewer than 3 points or no variance)."""
    a = np.asarray(d, dtype=float)
    if a.size < 3:
        return math.nan
    a = a - a.mean()
    den = float(np.dot(a, a))
    return float(np.dot(a[:-1], a[1:]) / den) if den > 0 else math.nan


@dataclass
class Sequential:
    """Blocks in, a verdict out as soon as the interval decides (see the module docstring)."""

    opts: SeqOptions = field(default_factory=SeqOptions)
    d: list = field(default_factory=list)
    estimate: float = math.nan
    low: float = -math.inf
    high: float = math.inf
    verdict: str | None = None
    pairs: list = field(default_factory=list)  # with rotation: the blocks of each pair of preparations

    def __post_init__(self):
        self._rng = np.random.default_rng(self.opts.seed)

    @property
    def pair_done(self) -> bool:
        """With rotation: the current pair of preparations has run its blocks (time for fresh ones)."""
        return bool(self.opts.rotate) and bool(self.pairs) and len(self.pairs[-1]) >= self.opts.rotate

    @property
    def restart_due(self) -> bool:
        """With rotation and ``restart`` = K: the pair just done is the K-th since fresh servers (restart them)."""
        return self.pair_done and bool(self.opts.restart) and len(self.pairs) % self.opts.restart == 0

    def add(self, d: float) -> str | None:
        if not math.isfinite(d):
            raise ValueError(f"block log ratio {d!r} is not finite")
        self.d.append(float(d))
        if self.opts.rotate:
            if not self.pairs or len(self.pairs[-1]) >= self.opts.rotate:
                self.pairs.append([])
            self.pairs[-1].append(float(d))
            if not self.pair_done or len(self.pairs) < self.opts.min_pairs:
                return None  # decisions only over whole pairs
            self.estimate, self.low, self.high = pair_interval(self.pairs, self.opts)
        elif len(self.d) >= self.opts.min_blocks:
            self.estimate, self.low, self.high = interval(self.d, self.opts, self._rng)
        else:
            return None
        if self.opts.split is None:
            self.verdict = decide(self.low, self.high, self.opts.delta)
        else:
            self.verdict = "slower" if self.low > self.opts.split else "same" if self.high < self.opts.split \
                else None
        return self.verdict

    def finish(self) -> str:
        """The verdict when blocks stop coming: the decision, or inconclusive."""
        if self.verdict is None:
            if self.opts.rotate and self.pairs:
                groups = [g for g in self.pairs if len(g) >= self.opts.rotate]
                if len(groups) < 2:
                    groups = [g for g in self.pairs if g]
                if len(groups) >= 2:
                    self.estimate, self.low, self.high = pair_interval(groups, self.opts)
                else:  # one pair of preparations so far: its blocks' interval, for the report (no verdict rests on it)
                    self.estimate, self.low, self.high = interval(self.d, self.opts, self._rng)
            elif self.d and len(self.d) < self.opts.min_blocks:
                self.estimate, self.low, self.high = interval(self.d, self.opts, self._rng)
            self.verdict = "inconclusive"
        return self.verdict

    @property
    def ratio(self) -> float:
        return math.exp(self.estimate) if math.isfinite(self.estimate) else math.nan

    @property
    def detectable(self) -> float:
        """:func:`detectable_slowdown` of the samples so far (rotation: the whole pairs' trimmed means)."""
        if self.opts.rotate:
            groups = [g for g in self.pairs if len(g) >= self.opts.rotate]
            means = [float(_trimmed(np.asarray(g, dtype=float), trim=self.opts.trim)) for g in groups]
            return detectable_slowdown(means, self.low, self.high, self.opts)
        return detectable_slowdown(self.d, self.low, self.high, self.opts, t_samples=False)

    @property
    def ratio_ci(self) -> tuple[float, float]:
        return (math.exp(self.low) if math.isfinite(self.low) else 0.0,
                math.exp(self.high) if math.isfinite(self.high) else math.inf)


def describe_power(detectable: float) -> str:
    """The power statement every verdict carries: "could have caught ≥ 12%" (at 95%)."""
    if not math.isfinite(detectable):
        return "could have caught no slowdown yet (too few samples)"
    return f"could have caught ≥ {detectable:.1%} at {POWER:.0%}"


def describe_verdict(verdict: str, ratio: float, ci: tuple, delta: float, detectable: float = math.nan) -> str:
    lo, hi = ci
    span = f"HEAD/BASE step time {ratio:.3f} [{lo:.3f}, {hi:.3f}]"
    power = "" if math.isnan(detectable) else f"; {describe_power(detectable)}"
    if verdict == "slower":
        return f"slower: {span}, the whole interval above +{delta:.0%}{power}"
    if verdict == "faster":
        return f"faster: {span}, the whole interval below -{delta:.0%}{power}"
    if verdict == "same":
        return f"same: {span}, the whole interval inside ±{delta:.0%}{power}"
    return (f"inconclusive: {span} still straddles ±{delta:.0%}{power} (more blocks, or a larger --budget, "
            f"would decide)")
