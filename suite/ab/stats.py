"""The sequential ABBA statistics of `fleetbench ab`.

Trials of BASE (A) and HEAD (B) alternate in blocks of four, each block ``ABBA`` or ``BAAB``
(drawn at random, seeded): a linear drift of the machine within a block hits both sides
alike.  Each block gives one number, the log ratio of HEAD's to BASE's step time

    d = log( mean(HEAD's two trials) / mean(BASE's two trials) )       (> 0: HEAD slower)

Blocks, not steps, are the samples: steps of one window are autocorrelated, blocks far less
(``lag1`` reports the lag-1 autocorrelation of the block series, which the figure checks).
The estimate is the 20%-trimmed mean of the ``d`` (robust to a block hit by a burst of load),
with Yuen's interval (:func:`interval`: the winsorized spread, Student's t on the trimmed
mean's h − 1 degrees of freedom, valid from 3 blocks on, where a bootstrap of 3 values is not).

The question (:func:`decide`) is the gate's: is HEAD slower by the threshold δ (``threshold``,
default 5%) or more?  On an interval [lo, hi] of the log ratio:

- the whole interval below −log(1+margin) (``delta``, default 2%)  -> **faster**;
- the whole interval inside ±log(1+margin)                          -> **same** (equivalent);
- hi below log(1+δ)                                                  -> **not slower** (by δ or more);
- lo above 0                                                         -> **slower**;

otherwise another block, until the time budget per case (or ``max_blocks``) is spent: then a
last look, and **inconclusive** with what would decide it (:func:`describe_verdict`).

Looking after every block would spend the interval's error rate again at every look.  So the
looks are few (at geometrically spaced sample counts, each at least ``LOOK_GROWTH`` times the
last) and each spends part of ``1 − confidence`` (α): by the budget's share used so far t, at
most α·t^``SPEND_RHO`` in all (a Lan–DeMets power family: little early, most at the end), the
look's interval at level 1 − (what it spends), and the last look (:meth:`Sequential.finish`)
spends what is left.  By the union bound, an A/A comparison's chance of any "slower" over all
looks is at most α/2, whatever the budget (``tests/test_ab.py`` simulates it at the smallest
settings `ab` allows).

Rotation (``rotate`` = N, `ab --rotate N`, N >= 2): two preparations of the same case (engine, model,
buffers, data) can differ in speed by a few percent for as long as they run, and two pairs of
processes by a few percent more (docs/figures/gate.md measured both spreads), a bias no number of
blocks from one preparation averages out.  So after every N blocks the case is prepared afresh on
both servers, and every ``restart``-th time on fresh servers (which draws the processes' part
again); each pair of preparations' trimmed mean is one sample, the estimate is their mean and the
interval a Student t interval over the pairs (:func:`pair_interval`), looked at over whole pairs
from ``min_pairs`` on.  Yuen's interval over the blocks (:func:`interval`) is only the report's, for
a comparison that ended before two whole pairs.

Power (:func:`detectable_slowdown`): every comparison records the smallest slowdown it would have called
"slower" with probability ``POWER`` (95%), from its own spread (at its 95% upper confidence bound) and number of
samples, or, past 100%, how many samples it would take (:func:`describe_power`).  The sentence beside a verdict
(:func:`power_sentence`) agrees with it: a decided verdict states what its interval caught or rules out (a
"slower, 1.114 [1.056, 1.175]" beside "could have caught ≥ 17.3%" read as a contradiction: the statement is of
what would be caught 95% of the time, and a smaller slowdown is caught less often, as this one was); an
inconclusive one states what it could have caught, which is more than its estimate (its interval reaches 1).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..results.gate import detectable_shift, ratio_interval_text
from ..run_spec import SeqOptions  # the settings' data (suite/run_spec.py); their rules are here

__all__ = ["SeqOptions", "Sequential", "block_log_ratio", "interval", "pair_interval", "decide", "lag1", "VERDICTS",
           "describe_verdict", "describe_power", "detectable_slowdown", "POWER", "LOOK_GROWTH", "SPEND_RHO",
           "fmt_ratio", "fmt_span", "needed_samples", "rate_interval", "power_sentence", "IDENTICAL"]

VERDICTS = ("slower", "not slower", "faster", "same", "inconclusive")
POWER = 0.95  # of the power statement: the slowdown a comparison would have caught this often
SPREAD_BOUND = 0.95  # the power statement takes the samples' spread at its 95% upper confidence bound
LOOK_GROWTH = 1.25  # a look after at least this many times the samples of the last one (and one more)
SPEND_RHO = 2.0  # alpha spent by the budget's share t: alpha * t**SPEND_RHO (Lan-DeMets' power family)


def block_log_ratio(base_trials: Sequence[float], head_trials: Sequence[float]) -> float:
    """log(mean(head) / mean(base)); a ValueError for a trial time that is not a finite positive number."""
    for t in list(base_trials) + list(head_trials):
        if not (isinstance(t, (int, float)) and math.isfinite(t) and t > 0):
            raise ValueError(f"trial time {t!r} is not a finite positive number of seconds")
    return math.log(float(np.mean(head_trials)) / float(np.mean(base_trials)))


def _trimmed(x: Any, axis: int = -1, trim: float = 0.2) -> Any:
    """scipy.stats.trim_mean's rule (int(trim * n) cut from each end of the sorted values), in numpy alone: the
    tests' simulations call it hundreds of thousands of times, and scipy's wrapper costs 0.3 ms a call."""
    a = np.sort(np.asarray(x, dtype=float), axis=axis)
    n = a.shape[axis]
    cut = int(trim * n)
    return np.take(a, range(cut, n - cut), axis=axis).mean(axis=axis)


def _yuen(a: np.ndarray, trim: float) -> tuple[float, float, int]:
    """(trimmed mean, its standard error, degrees of freedom) by Yuen's rule: g = int(trim * n) values
    winsorized at each end, se = sqrt((n - 1) s_w^2 / (h (h - 1))) with h = n - 2g kept values, h - 1 df."""
    s = np.sort(a)
    n = s.size
    g = int(trim * n)
    h = n - 2 * g
    w = s.copy()
    if g:
        w[:g], w[n - g:] = s[g], s[n - g - 1]
    sw2 = float(np.var(w, ddof=1))
    return float(s[g:n - g].mean()), math.sqrt((n - 1) * sw2 / (h * (h - 1))), h - 1


def _t(level: float, df: float) -> float:
    """Student's t quantile of a two-sided ``level`` (scipy.special's, 50 times quicker than scipy.stats.t.ppf:
    the simulations call it at every look)."""
    from scipy.special import stdtrit

    return float(stdtrit(df, 0.5 + level / 2))


def interval(d: Sequence[float], opts: SeqOptions = SeqOptions(), level: float | None = None
             ) -> tuple[float, float, float]:
    """(estimate, low, high) of the block log ratios: the trimmed mean and Yuen's interval at ``level`` (default
    ``opts.confidence``); unbounded from fewer than 3 blocks, a point where every block is the same."""
    a = np.asarray(d, dtype=float)
    if a.size == 0 or not np.all(np.isfinite(a)):
        raise ValueError("block log ratios must be finite and non-empty")
    est = float(_trimmed(a, trim=opts.trim))
    if np.ptp(a) == 0:
        return est, est, est
    if a.size < 3:
        return est, -math.inf, math.inf
    est, se, df = _yuen(a, opts.trim)
    half = _t(opts.confidence if level is None else level, df) * se
    return est, est - half, est + half


def pair_interval(groups: Sequence[Sequence[float]], opts: SeqOptions = SeqOptions(), level: float | None = None
                  ) -> tuple[float, float, float]:
    """(estimate, low, high) over pairs of preparations: each pair's trimmed mean of its block log ratios,
    their mean, and a Student t interval over the pairs (G - 1 degrees of freedom) at ``level`` (default
    ``opts.confidence``).

    Two preparations of the same code can differ in speed for as long as they run (memory layout of the
    engine's tensors, placement): a bias shared by all blocks of one pair, which more blocks from that pair
    cannot average out.  With rotation (``SeqOptions.rotate``) every pair is a fresh draw of that bias, and
    the pairs, not the blocks, are the independent samples."""
    means = [float(_trimmed(np.asarray(g, dtype=float), trim=opts.trim)) for g in groups if len(g)]
    return _mean_interval(means, opts.confidence if level is None else level)


def _mean_interval(means: Sequence[float], level: float) -> tuple[float, float, float]:
    """(mean, low, high): Student's t interval at ``level`` over samples (unbounded from one)."""
    a = np.asarray(means, dtype=float)
    if a.size == 0 or not np.all(np.isfinite(a)):
        raise ValueError("pair means must be finite and non-empty")
    est = float(a.mean())
    if a.size < 2:
        return est, -math.inf, math.inf
    half = _t(level, a.size - 1) * float(a.std(ddof=1)) / math.sqrt(a.size)
    return est, est - half, est + half


def _se_df(samples: Sequence[float]) -> tuple[float, int]:
    """(standard error, degrees of freedom) of the estimate over pairs: (s/sqrt(G), G - 1); (nan, 0) when there is
    no spread to speak of (fewer than 2 pairs)."""
    a = np.asarray(samples, dtype=float)
    return (float(a.std(ddof=1)) / math.sqrt(a.size), a.size - 1) if a.size >= 2 else (math.nan, 0)


def detectable_slowdown(samples: Sequence[float], opts: SeqOptions = SeqOptions(),
                        level: float | None = None) -> float:
    """The smallest slowdown (a fraction: 0.05 = 5%) that a comparison like this one, with as many pairs of
    preparations (``samples``: their trimmed means) and their spread, would have called "slower" with probability
    ``POWER``; ``inf`` when it could catch none (fewer than two pairs).

    "slower" needs the interval's low end above 0 (and its high end not below log(1+threshold), which a
    slowdown of the threshold or more gives): the estimate more than ``crit`` estimated standard errors above
    0, crit the t quantile of the interval's ``level`` (the last look's; default ``opts.confidence``).
    :func:`suite.results.gate.detectable_shift` gives the distance, noncentral t on the standard error's
    degrees of freedom, with the standard error at its ``SPREAD_BOUND`` (95%) upper confidence bound from this
    comparison's own, so that the statement errs on the side of claiming less: over G pairs, se = s/√G, G−1
    degrees of freedom.

    The slowdown is exp(shift) − 1, and never below the threshold (a smaller slowdown may be called "not
    slower").  Validated per comparison in tests/test_ab.py: each simulated comparison's own stated value,
    then a fresh comparison (same design, same true spread) at exactly that slowdown; at least 95% of those
    say "slower"."""
    se, df = _se_df(samples)
    if df < 1 or not math.isfinite(se):
        return math.inf
    crit = _t(opts.confidence if level is None else level, df)
    return max(math.expm1(detectable_shift(se, df, crit, POWER, SPREAD_BOUND)), opts.threshold)


def needed_samples(samples: Sequence[float], opts: SeqOptions = SeqOptions(),
                   level: float | None = None, limit: int = 100_000) -> int | None:
    """The fewest pairs of preparations with which a comparison of this spread would state a slowdown below 100%
    (the spread taken as this one's; None when it has none to go by, or needs more than ``limit``)."""
    se, df = _se_df(samples)
    n = len(samples)
    if df < 1 or not math.isfinite(se):
        return None
    crit_level = opts.confidence if level is None else level

    def caught(m: int) -> bool:  # the same spread, m samples: se shrinks as 1/sqrt(m)
        df_m = m - 1
        if df_m < 1:
            return False
        shift = detectable_shift(se * math.sqrt(n / m), df_m, _t(crit_level, df_m), POWER, SPREAD_BOUND)
        return math.expm1(shift) < 1.0

    if caught(n):
        return n
    lo, hi = n, n + 1
    while not caught(hi):
        lo, hi = hi, hi * 2
        if hi > limit:
            return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if caught(mid) else (mid, hi)
    return hi


def rate_interval(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Clopper-Pearson (exact binomial) interval of the rate ``k / n`` at ``level``: the tests bound the rates of
    simulated verdicts (false alarms, power) with it."""
    from scipy.stats import beta

    if not 0 <= k <= n or n == 0:
        raise ValueError(f"rate_interval: {k} of {n}: need 0 <= k <= n and n > 0")
    a = (1 - level) / 2
    return (0.0 if k == 0 else float(beta.ppf(a, k, n - k + 1)),
            1.0 if k == n else float(beta.ppf(1 - a, k + 1, n - k)))


def decide(lo: float, hi: float, delta: float, threshold: float = SeqOptions.threshold) -> str | None:
    """The verdict an interval (log scale) gives, or None (keep going): faster (below -log(1+delta)), same
    (inside ±log(1+delta)), not slower (below log(1+threshold)), slower (above 0), in that order."""
    margin = math.log1p(delta)
    if hi < -margin:
        return "faster"
    if -margin < lo and hi < margin:
        return "same"
    if hi < math.log1p(threshold):
        return "not slower"
    if lo > 0:
        return "slower"
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
    """Blocks in, a verdict out as soon as a look's interval decides (see the module docstring)."""

    opts: SeqOptions = field(default_factory=SeqOptions)
    d: list = field(default_factory=list)
    estimate: float = math.nan
    low: float = -math.inf
    high: float = math.inf
    verdict: str | None = None
    pairs: list = field(default_factory=list)  # the blocks of each pair of preparations
    looks: list = field(default_factory=list)  # (samples, the interval's level) of every look
    spent: float = 0.0  # of alpha = 1 - confidence, by the looks so far
    means: list = field(default_factory=list)  # each whole pair's trimmed mean, as it completes

    @property
    def pair_done(self) -> bool:
        """The current pair of preparations has run its blocks (time for fresh ones)."""
        return bool(self.pairs) and len(self.pairs[-1]) >= self.opts.rotate

    @property
    def restart_due(self) -> bool:
        """With ``restart`` = K: the pair just done is the K-th since fresh servers (restart them)."""
        return self.pair_done and bool(self.opts.restart) and len(self.pairs) % self.opts.restart == 0

    @property
    def samples(self) -> list[float]:
        """What the interval is over: the whole pairs' trimmed means."""
        return list(self.means)

    @property
    def unit(self) -> str:
        return "pairs of preparations"

    @property
    def level(self) -> float:
        """The level of the last look's interval (``opts.confidence`` before any look)."""
        return self.looks[-1][1] if self.looks else self.opts.confidence

    def _due(self, n: int) -> bool:
        if n < self.opts.min_pairs:
            return False
        return not self.looks or n >= max(self.looks[-1][0] + 1, math.ceil(self.looks[-1][0] * LOOK_GROWTH))

    def _look(self, progress: float) -> str | None:
        """Spend alpha up to alpha * progress**SPEND_RHO on an interval over the samples so far, and decide."""
        alpha = 1 - self.opts.confidence
        target = alpha * min(1.0, max(0.0, progress)) ** SPEND_RHO
        spend = target - self.spent
        if spend <= 0:
            return None
        self.spent = target
        level = 1 - spend
        self.looks.append((len(self.samples), level))
        self.estimate, self.low, self.high = _mean_interval(self.means, level)
        if self.opts.split is None:
            self.verdict = decide(self.low, self.high, self.opts.delta, self.opts.threshold)
        else:
            self.verdict = "slower" if self.low > self.opts.split else "same" if self.high < self.opts.split \
                else None
        return self.verdict

    def add(self, d: float, progress: float | None = None) -> str | None:
        """One block's log ratio; ``progress``: the share of the budget spent so far (elapsed / budget), which
        sets how much of alpha a look may spend (default: blocks / ``max_blocks``)."""
        if not math.isfinite(d):
            raise ValueError(f"block log ratio {d!r} is not finite")
        self.d.append(float(d))
        if not self.pairs or len(self.pairs[-1]) >= self.opts.rotate:
            self.pairs.append([])
        self.pairs[-1].append(float(d))
        if not self.pair_done:
            return None  # looks only over whole pairs
        self.means.append(float(_trimmed(np.asarray(self.pairs[-1]), trim=self.opts.trim)))
        if not self._due(len(self.means)):
            return None
        share = len(self.d) / self.opts.max_blocks
        return self._look(share if progress is None else max(progress, share))

    def finish(self) -> str:
        """The verdict when blocks stop coming: a last look spending what is left of alpha, or inconclusive."""
        if self.verdict is None:
            if len(self.samples) >= self.opts.min_pairs:
                self._look(1.0)
            if self.verdict is None and self.d and not self.looks:  # never looked: an interval for the report only
                if len([g for g in self.pairs if g]) >= 2:
                    self.estimate, self.low, self.high = pair_interval([g for g in self.pairs if g], self.opts)
                else:
                    self.estimate, self.low, self.high = interval(self.d, self.opts)
            self.verdict = self.verdict or "inconclusive"
        return self.verdict

    @property
    def ratio(self) -> float:
        return math.exp(self.estimate) if math.isfinite(self.estimate) else math.nan

    @property
    def detectable(self) -> float:
        """:func:`detectable_slowdown` of the samples so far at the last look's level."""
        return detectable_slowdown(self.samples, self.opts, self.level)

    @property
    def needed(self) -> int | None:
        """:func:`needed_samples` of the samples so far (None: no spread to go by)."""
        return needed_samples(self.samples, self.opts, self.level)

    def power_statement(self) -> str:
        """:func:`power_sentence` of this comparison's verdict (after :meth:`finish`): what its interval caught or
        rules out, or, inconclusive, what it could have caught."""
        if self.opts.split is not None:  # bisect's classification against a split: the power alone
            return describe_power(self.detectable, self.needed, self.unit, len(self.samples), 2)
        return power_sentence(self.verdict or "inconclusive", self.ratio_ci, self.detectable, self.needed,
                              self.unit, len(self.samples), 2, delta=self.opts.delta)[1]

    @property
    def ratio_ci(self) -> tuple[float, float]:
        return (math.exp(self.low) if math.isfinite(self.low) else 0.0,
                math.exp(self.high) if math.isfinite(self.high) else math.inf)


def fmt_ratio(x: float) -> str:
    """A step-time ratio for people: 3 decimals ("-" for none)."""
    return f"{x:.3f}" if isinstance(x, (int, float)) and math.isfinite(x) else "-"


def fmt_span(ratio: float, ci: tuple) -> str:
    """"1.020 [0.985, 1.061]": the ratio and its interval, an interval too wide to read said as such
    (:func:`suite.results.gate.ratio_interval_text`: "[< 0.1, > 10]" for [0.002, 692.970])."""
    return f"{fmt_ratio(ratio)} {ratio_interval_text(*ci)}"


def describe_power(detectable: float, needed: int | None = None, unit: str = "samples", have: int = 0,
                   fewest: int = 2) -> str:
    """The power statement every verdict carries: "could have caught ≥ 12.0% at 95%", or, where that would be
    100% or more, "could have caught nothing below 100%: fewer than N pairs of preparations" (N: the fewest
    with which this spread would catch less; without a spread to go by, the fewest that give one)."""
    if math.isfinite(detectable) and detectable < 1.0:
        return f"could have caught ≥ {detectable:.1%} at {POWER:.0%}"
    if needed is not None and needed > have:
        return f"could have caught nothing below 100%: fewer than {needed} {unit}"
    return f"could have caught nothing below 100%: fewer than {max(fewest, have + 1)} {unit}"


IDENTICAL = "identical"  # the same commit or tree: answered before any trial (suite/cli/ab.py)


def power_sentence(verdict: str, ci: tuple, detectable: float = math.nan, needed: int | None = None,
                   unit: str = "samples", have: int = 0, fewest: int = 2, delta: float = SeqOptions.delta
                   ) -> tuple[str, str]:
    """(the table's cell, the sentence) that stands beside ``verdict``, in words that agree with it.

    A decided verdict rests on its interval ``ci`` (HEAD/BASE step time), so its sentence is the interval's:
    "slower" caught at least the lower end's slowdown; "not slower" rules out a slowdown of the upper end's or
    more (any slowdown, where the upper end is below 1); "faster" rules out any (faster by at least the upper end's
    distance from 1); "same" rules out a change beyond the farther end.  Only "inconclusive" states the power,
    what the comparison would have caught 95% of the time (:func:`describe_power`): the verdict said nothing was
    caught, and that slowdown is above the estimate (its interval reaches 1, the statement's distance from 1 is more
    than the interval's half-width).  "identical": nothing was timed, so nothing was to be caught.  An error: ""."""
    lo, hi = (float(ci[0]), float(ci[1])) if ci is not None and len(ci) == 2 else (math.nan, math.nan)
    if verdict == "slower":
        return f"caught ≥ {lo - 1:.1%}", f"caught a slowdown of at least {lo - 1:.1%} (the interval's lower end)"
    if verdict == "not slower":
        if hi <= 1:
            return "rules out any", f"rules out any slowdown (the interval's upper end {hi:.3f} is below 1)"
        return f"rules out ≥ {hi - 1:.1%}", f"rules out a slowdown of {hi - 1:.1%} or more (the interval's upper end)"
    if verdict == "faster":
        return "rules out any", f"rules out any slowdown: faster by at least {1 - hi:.1%} (the interval's upper end)"
    if verdict == "same":
        far = max(1 - lo, hi - 1, 0.0)
        return f"beyond ±{far:.1%} ruled out", f"rules out a change beyond ±{far:.1%} (the interval's farther end)"
    if verdict == IDENTICAL:
        return "-", "nothing to catch: the same code on both sides, nothing timed"
    if verdict == "inconclusive":
        said = describe_power(detectable, needed, unit, have, fewest)
        short = (f"could catch ≥ {detectable:.1%}" if math.isfinite(detectable) and detectable < 1.0
                 else "nothing < 100%")
        return short, said
    return "-", ""


def _to_decide(lo: float, hi: float, threshold: float) -> str:
    """What an undecided interval (log scale) lacks, and how many times the samples would give it at this
    spread and estimate: the upper end below log(1+threshold) ("not slower") or the lower end above 0
    ("slower")."""
    line = math.log1p(threshold)
    est, half = (lo + hi) / 2, (hi - lo) / 2
    if not (math.isfinite(half) and half > 0):
        return f"more samples would decide (not slower: the upper end below {1 + threshold:.3f}; slower: the " \
               f"lower end above 1)"
    times = [(half / gap) ** 2 for gap in (line - est, est) if gap > 0]
    more = min(times) if times else math.inf
    how = (f"about {more:.1f} times the samples would decide at this spread" if more < 100 else
           "over 100 times the samples would be needed at this spread and estimate")
    return (f"not slower needs the upper end below {1 + threshold:.3f}, slower the lower end above 1; {how} "
            f"(a larger --budget)")


def describe_verdict(verdict: str, ratio: float, ci: tuple, delta: float, detectable: float = math.nan,
                     threshold: float = SeqOptions.threshold, power: str | None = None) -> str:
    """One line: the verdict, the ratio and interval, why (and the sentence ``power`` beside it, or
    :func:`power_sentence` of the verdict and ``detectable``: words that agree with the verdict)."""
    lo, hi = ci
    span = f"HEAD/BASE step time {fmt_span(ratio, ci)}"
    if power is None and not math.isnan(detectable):
        power = power_sentence(verdict, ci, detectable, delta=delta)[1]
    power = f"; {power}" if power else ""
    if verdict == "slower":
        return f"slower: {span}, the whole interval above 1{power}"
    if verdict == "not slower":
        return (f"not slower by ≥ {threshold:.0%}: {span}, the whole interval below {1 + threshold:.3f}"
                + (" (HEAD slower than BASE, by less than that)" if lo > 1 else "") + power)
    if verdict == "faster":
        return f"faster: {span}, the whole interval below -{delta:.0%}{power}"
    if verdict == "same":
        return f"same: {span}, the whole interval inside ±{delta:.0%}{power}"
    log_lo = math.log(lo) if lo > 0 else -math.inf
    log_hi = math.log(hi) if math.isfinite(hi) and hi > 0 else math.inf
    return f"inconclusive: {span}{power}; {_to_decide(log_lo, log_hi, threshold)}"
