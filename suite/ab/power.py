"""The power of `fleetbench ab`'s rule against what differs between preparations and processes: the statistics
`fleetbench figures gate` reads from its long A/B runs (:class:`Run`), beside ab's own rule (:mod:`.stats`).

:func:`process_spread` (tau between pairs of servers, Cochran's Q), :func:`prep_spread` (tau_prep between
preparations, tau_process between processes), :func:`effect_scale` (the injected busy work's cost), and the
Monte Carlo of ab's rule with biases drawn from those spreads (:func:`simulate_level`, per :func:`modes`), with
the earlier within-pair resampling (:func:`simulate`) and ab's verdict on a run's own blocks (:func:`direct`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from .stats import VERDICTS, SeqOptions, Sequential

__all__ = ["Run", "simulate", "process_spread", "prep_spread", "effect_scale", "simulate_level", "direct", "modes"]


@dataclass
class Run:
    """One pair of fresh trial servers, ``blocks`` ABBA blocks, HEAD slowed by ``inject``."""

    case: str
    inject: float
    d: list = field(default_factory=list)  # block log ratios
    base_trials: list = field(default_factory=list)  # seconds per step, in time order
    head_trials: list = field(default_factory=list)
    seconds: float = 0.0  # wall time of the blocks
    setup_s: float = 0.0  # servers started, case prepared
    load: list = field(default_factory=list)  # the machine's 1-minute load average before and after the blocks
    group: list = field(default_factory=list)  # each block's preparation (0, 1, ...: the case prepared afresh)
    prep_s: list = field(default_factory=list)  # seconds each fresh preparation of both sides took
    base_steps: list = field(default_factory=list)  # each trial's step times (the slowest rank's), kept in the raw data
    head_steps: list = field(default_factory=list)

    def groups(self) -> list[list[float]]:
        """The blocks of each preparation, in order (one group when the run was not regrouped)."""
        if len(self.group) != len(self.d):
            return [list(self.d)]
        out: dict[int, list[float]] = {}
        for g, x in zip(self.group, self.d):
            out.setdefault(g, []).append(x)
        return list(out.values())

    @property
    def block_s(self) -> float:
        return self.seconds / max(1, len(self.d))


def rate_interval(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Clopper-Pearson (exact binomial) interval of the rate ``k / n`` at ``level``: the gate figure states every
    rate with it and its count."""
    from scipy.stats import beta

    if not 0 <= k <= n or n == 0:
        raise ValueError(f"rate_interval: {k} of {n}: need 0 <= k <= n and n > 0")
    a = (1 - level) / 2
    return (0.0 if k == 0 else float(beta.ppf(a, k, n - k + 1)),
            1.0 if k == n else float(beta.ppf(1 - a, k + 1, n - k)))


def simulate(run: Run, sims: int, budget_s: float, seed: int, opts: SeqOptions | None = None) -> dict:
    """Sequential comparisons drawn from one run's blocks: verdict counts and blocks to a verdict."""
    opts = opts or SeqOptions()
    rng = np.random.default_rng(seed)
    limit = max(opts.min_blocks, int(budget_s / run.block_s))
    counts = dict.fromkeys(VERDICTS, 0)
    used = []
    d = np.asarray(run.d)
    for _ in range(sims):
        s = Sequential(replace(opts, seed=int(rng.integers(1 << 30)), rotate=0, max_blocks=max(limit, opts.min_blocks)))
        draws = d[rng.integers(0, d.size, size=limit)]
        for i, x in enumerate(draws, 1):
            if s.add(float(x), progress=i / limit) is not None:
                break
        counts[s.finish()] += 1
        used.append(len(s.d))
    return {"counts": counts, "blocks": used, "limit": limit}


def process_spread(runs: list[Run]) -> dict:
    """How much the mean block log ratio of a pair of fresh servers varies beyond its blocks' own noise.

    One-way random effects over pairs: pair j's mean m_j = mu_level + b_j + noise, with var(noise) =
    s_j^2 / n_j (the blocks are close to independent) and b_j ~ (0, tau^2) the pair's own bias (what
    differs between two processes of the same code).  A/A pairs have mu = 0 by construction (A and B
    are the same code in a random ABBA order); a slowed level's mu is estimated from its pairs.
    Method of moments: tau^2 = max(0, sum(dev^2) / df - mean(s_j^2 / n_j)); Cochran's Q = sum(dev^2 /
    (s_j^2 / n_j)) tests tau = 0 (chi-square with df degrees of freedom)."""
    from scipy.stats import chi2

    devs, noise = [], []
    df = 0
    for inject in sorted({r.inject for r in runs}):
        rs = [r for r in runs if r.inject == inject and len(r.d) >= 3]
        if not rs or (inject != 0 and len(rs) < 2):
            continue
        means = [float(np.mean(r.d)) for r in rs]
        center = 0.0 if inject == 0 else float(np.mean(means))
        devs += [m - center for m in means]
        noise += [float(np.var(r.d, ddof=1)) / len(r.d) for r in rs]
        df += len(rs) if inject == 0 else len(rs) - 1
    if df == 0:
        return {"tau": math.nan, "q": math.nan, "df": 0, "p": math.nan, "pairs": 0}
    tau2 = max(0.0, sum(x * x for x in devs) / df - float(np.mean(noise)))
    q = sum(x * x / v for x, v in zip(devs, noise))
    return {"tau": math.sqrt(tau2), "q": q, "df": df, "p": float(chi2.sf(q, df)), "pairs": len(devs)}


def prep_spread(runs: list[Run]) -> dict:
    """The spread of one preparation's mean log ratio, split into what differs between preparations in the same
    processes (``tau_prep``) and what the processes add (``tau_process``).

    Each run is a pair of servers whose case was prepared afresh every few blocks (``Run.group``).  With g_jk the
    mean of preparation k of pair j (n_jk blocks, block variance s_jk^2), v_jk = s_jk^2 / n_jk, and the level's
    centre (A/A: 0; a slowed level: the mean of its groups):
    within pairs, E[sum_k (g_jk - mean_j)^2] = (K_j - 1) (tau_prep^2 + v), so tau_prep^2 = sum of squares within
    pairs / sum (K_j - 1) - mean(v); over all groups, tau_total^2 = mean((g - centre)^2) - mean(v) (A/A: every
    group a degree of freedom) and tau_process^2 = tau_total^2 - tau_prep^2 (method of moments, each floored at 0).
    Cochran's Q within pairs tests tau_prep = 0; the one-way ANOVA of the groups by pair tests tau_process = 0."""
    from scipy.stats import chi2, f_oneway

    within_ss, within_df, q, noise = 0.0, 0, 0.0, []
    total_ss, total_df = 0.0, 0
    by_pair = []
    for inject in sorted({r.inject for r in runs}):
        rs = [r for r in runs if r.inject == inject]
        gs_level = []
        for r in rs:
            gs = [g for g in r.groups() if len(g) >= 3]
            if len(gs) < 2:
                continue
            means = [float(np.mean(g)) for g in gs]
            vs = [float(np.var(g, ddof=1)) / len(g) for g in gs]
            m = float(np.mean(means))
            within_ss += sum((x - m) ** 2 for x in means)
            within_df += len(gs) - 1
            q += sum((x - m) ** 2 / v for x, v in zip(means, vs) if v > 0)
            noise += vs
            gs_level.append(means)
            if inject == 0:
                by_pair.append(means)
        flat = [x for ms in gs_level for x in ms]
        if flat:
            centre = 0.0 if inject == 0 else float(np.mean(flat))
            total_ss += sum((x - centre) ** 2 for x in flat)
            total_df += len(flat) if inject == 0 else len(flat) - 1
    if within_df == 0 or total_df == 0:
        return {"tau_prep": math.nan, "tau_process": math.nan, "q": math.nan, "df": 0, "p": math.nan,
                "anova_p": math.nan, "groups": 0, "pairs": 0}
    v = float(np.mean(noise))
    tau_prep2 = max(0.0, within_ss / within_df - v)
    tau_total2 = max(0.0, total_ss / total_df - v)
    anova_p = float(f_oneway(*by_pair).pvalue) if len(by_pair) >= 2 else math.nan
    return {"tau_prep": math.sqrt(tau_prep2), "tau_process": math.sqrt(max(0.0, tau_total2 - tau_prep2)),
            "tau_total": math.sqrt(tau_total2), "q": q, "df": within_df, "p": float(chi2.sf(q, within_df)),
            "anova_p": anova_p, "groups": len(noise), "pairs": sum(1 for r in runs if len(r.groups()) >= 2)}


def effect_scale(runs: list[Run]) -> float:
    """k in (measured mean log ratio) = k * log(1 + injected fraction), least squares over the slowed pairs."""
    slowed = [(math.log1p(r.inject), float(np.mean(r.d))) for r in runs if r.inject > 0 and r.d]
    den = sum(x * x for x, _ in slowed)
    return sum(x * y for x, y in slowed) / den if den > 0 else 1.0


def simulate_level(runs: list[Run], sims: int, budget_s: float, seed: int, tau: float, opts: SeqOptions | None = None,
                   rotate: int = 0, scale: float | None = None, tau_process: float = 0.0,
                   fresh: str = "servers", servers_every: int = 0) -> dict:
    """Sequential comparisons of one level, each with its own biases: a process part ~ N(0, tau_process^2) and
    a preparation part ~ N(0, tau^2), then blocks mu + biases + a residual drawn from the level's runs (each
    block's deviation from its own preparation's mean, widened by sqrt(n / (n - 1))); A/A: mu = 0 and the
    residuals symmetrised (A and B are exchangeable), a slowdown: mu = k * log(1 + f), with k fitted over all
    slowed pairs of the case (:func:`effect_scale`: busy work of f of the training step need not cost f of the
    whole step, and one level's two pairs alone would carry their biases into mu).  Unlike :func:`simulate`,
    a pair's own sampling error is not taken for a property of the pair.

    ``rotate`` = N is `ab --rotate N`, decided over pairs of preparations: every N blocks ``fresh="preparations"``
    draws the preparation part again at the runs' mean cost of a fresh preparation (the servers stay, so does
    their part), every ``servers_every``-th time (`--restart K`) both parts at the cost of a server start-up;
    ``fresh="servers"`` draws both every time (`--restart 1`).  The budget counts blocks, preparations and
    start-ups.  With ``tau_process`` = 0 and runs of one preparation each, ``tau`` is the pairs' spread."""
    opts = opts or SeqOptions()
    rng = np.random.default_rng(seed)
    inject = runs[0].inject
    if fresh not in ("servers", "preparations"):
        raise ValueError(f"fresh={fresh!r}: 'servers' or 'preparations'")
    res = np.concatenate([(np.asarray(g) - np.mean(g)) * math.sqrt(len(g) / (len(g) - 1))
                          for r in runs for g in r.groups() if len(g) >= 2])
    if inject == 0:
        res = np.concatenate([res, -res])
    mu = 0.0 if inject == 0 else (scale if scale is not None else effect_scale(runs)) * math.log1p(inject)
    block_s = float(np.mean([r.block_s for r in runs]))
    setup_s = float(np.mean([r.setup_s for r in runs]))
    preps = [x for r in runs for x in r.prep_s]
    cost = setup_s if fresh == "servers" or not preps else float(np.mean(preps))
    counts = dict.fromkeys(VERDICTS, 0)
    used = []
    for _ in range(sims):
        s = Sequential(replace(opts, seed=int(rng.integers(1 << 30)), rotate=rotate, budget_s=budget_s,
                               restart=1 if fresh == "servers" else servers_every))
        proc, bias, t = rng.normal(0.0, tau_process) if tau_process else 0.0, rng.normal(0.0, tau), 0.0
        while True:
            t += block_s
            if s.add(float(mu + proc + bias + res[rng.integers(0, res.size)]), progress=t / budget_s) is not None \
                    or t >= budget_s:
                break
            if s.pair_done:
                restart = s.restart_due  # `ab`'s own rule (fresh="servers" is --restart 1)
                bias, t = rng.normal(0.0, tau), t + (setup_s if restart else cost)
                if restart and tau_process:
                    proc = rng.normal(0.0, tau_process)
        counts[s.finish()] += 1
        used.append(t)
    return {"counts": counts, "seconds": used, "mu": mu}


def direct(run: Run, budget_s: float) -> str:
    """The verdict `ab` would have given on this run's own blocks, in order."""
    s = Sequential(SeqOptions())
    limit = max(s.opts.min_blocks, int(budget_s / run.block_s))
    for i, x in enumerate(run.d[:limit], 1):
        if s.add(x, progress=i / limit) is not None:
            break
    return s.finish() + ("" if s.verdict != "inconclusive" or len(s.d) >= limit else f" (run ended at {len(s.d)})")



def modes(spread: dict, nested: dict, rotate: int, restart: int = SeqOptions().restart
          ) -> tuple[tuple[float, float], list[tuple[int, str, int, str]]]:
    """The spreads a simulated comparison draws its biases with, (tau_prep, tau_process), and the `ab` modes to
    simulate, each (rotate, fresh, servers_every, name) for :func:`simulate_level`.  With preparations measured
    (``nested`` from :func:`prep_spread`): one preparation, ``--rotate N --restart K`` as built, fresh
    preparations only, fresh servers every time; with runs of one preparation each, the pairs' tau
    (:func:`process_spread`) is all there is: one pair, fresh servers every ``rotate`` blocks."""
    if math.isfinite(nested["tau_prep"]):  # preparations measured: bias = process part + preparation part
        return (nested["tau_prep"], nested["tau_process"]), [
            (0, "servers", 0, "one preparation (--rotate 0)"),
            (rotate, "preparations", restart, f"--rotate {rotate} --restart {restart} (default)"),
            (rotate, "preparations", 0, f"--rotate {rotate} --restart 0 (preparations only)"),
            (rotate, "servers", 0, f"--rotate {rotate} --restart 1 (fresh servers every time)")]
    return ((spread["tau"] if math.isfinite(spread["tau"]) else 0.0, 0.0),
            [(0, "servers", 0, "one pair"), (rotate, "servers", 0, f"fresh servers every {rotate}")])
