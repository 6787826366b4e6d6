"""The regression gates' measured sensitivity on this machine: `fleetbench ab` and `fleetbench compare`.

For each case (default ``mlp/plain`` and ``resnet/plain``) at ``--nproc`` ranks, long A/B runs
are made exactly as `fleetbench ab` makes them: two trial servers (two interpreters, two rank
pools, the current tree), trials of ``--steps`` steps alternating in randomised ABBA blocks.
Each run is one *pair* of fresh servers: A/A pairs (nothing changed) and pairs whose HEAD has
busy work injected into every training step, costing 2%, 5% or 10% of the step
(``suite.ab.server.inject_on_rank``: CPU spent in the trial process, proportional to the step,
like a real regression; not a sleep).  Within a run the case is prepared afresh on both servers
every ``FLEETBENCH_GATE_REGROUP`` blocks, as `ab --rotate` does.

**ab.**  A comparison's verdict depends only on the sequence of its block log ratios.  The
blocks of a run are close to independent (the lag-1 autocorrelation of each run is shown).
What is particular to a preparation and to a pair of processes is measured, not assumed:
:func:`process_spread` estimates tau, the spread of the pairs' mean log ratios beyond their
blocks' own noise (a random-effects estimate with Cochran's Q test), and :func:`prep_spread`
splits one preparation's spread into a part between preparations in the same servers
(tau_prep) and a part the processes add (tau_process).  Each simulated comparison
(:func:`simulate_level`) draws its biases with those spreads (the preparation part again at
every fresh preparation, both at fresh servers, each at its measured cost), then blocks from
the level's runs about their own preparation's mean, fed to `ab`'s rule
(``suite.ab.stats.Sequential``, default margin, interval and minimum) until it decides or the
budget (in seconds) is spent.  Rows: one preparation (``--rotate 0``); ``--rotate N --restart K``
as built (fresh preparations, every K-th time on fresh servers); fresh preparations only
(``--restart 0``); fresh servers every time (``--restart 1``, the rotation `ab` had first).  The
earlier method (:func:`simulate`: all of a comparison's blocks from one measured pair) is shown
beside it: a pair's own bias and sampling error decide every comparison drawn from it, so with
few pairs it reports the pairs one happened to get.  Each run's own first blocks, read as `ab` reads them, are shown too
(one real comparison per pair).

**compare.**  Separate runs are groups of ``--rounds`` consecutive trials (windows) of one
server; two runs from *different* servers are two separate runs (different processes, at
different times), compared as `fleetbench compare` does: per-window samples, Mann–Whitney at
alpha 0.01 and a threshold on the median ratio.

    fleetbench figures gate --nproc 2 --steps 5 --rounds 5

Settings (environment): FLEETBENCH_GATE_CASES (comma-separated), FLEETBENCH_GATE_BLOCKS (blocks
per run, default 60), FLEETBENCH_GATE_REGROUP (blocks per preparation, default 10; 0: one preparation
per run), FLEETBENCH_GATE_PAIRS (A/A pairs per case, default 3),
FLEETBENCH_GATE_SLOW_PAIRS (pairs per slowdown, default 2), FLEETBENCH_GATE_SIMS (simulated
comparisons per pair, default 100), FLEETBENCH_GATE_ROTATE (the `ab --rotate` value simulated beside
one preparation, default 5), FLEETBENCH_GATE_BUDGET (ab's budget per comparison,
seconds, default 180), FLEETBENCH_GATE_SIZE (default tiny); FLEETBENCH_GATE_SAVE=PATH keeps every run
(block log ratios and trial times, JSON) as it is measured, FLEETBENCH_GATE_LOAD=PATH reads them
back instead of measuring (the rates and tables are recomputed from the saved runs).
"""
from __future__ import annotations

import itertools
import math
import os
import random
import statistics
import sys
import time
from dataclasses import dataclass, field

import numpy as np

DESCRIPTION = "regression gates: false alarms and detection of 2/5/10% slowdowns, ab and compare"

USES_POOL = False  # the trial servers are the figure's processes; `figures` starts no pool for it
SLOWDOWNS = (0.02, 0.05, 0.10)
THRESHOLDS = (0.05, 0.10, 0.25)


def _env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, str(default)))


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


def long_run(case: str, inject: float, blocks: int, args, seed: int, say, regroup: int = 0) -> Run:
    from ..ab.client import TrialServer
    from ..ab.stats import block_log_ratio

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    size = os.environ.get("FLEETBENCH_GATE_SIZE", "tiny")
    run = Run(case, inject)
    t0 = time.monotonic()
    servers = [TrialServer(root, label, nproc=args.nproc, timeout=args.timeout, wait=False) for label in ("A", "B")]
    try:
        for s in servers:
            s.ready()
        for s, rid in [(s, s.send("start")) for s in servers]:
            s.receive(rid, "starting the rank pool")
        def prepare() -> list:
            return [s.request("prepare", case=case, size=size, warmup=2, check=False, inject=inj)["key"]
                    for s, inj in zip(servers, (0.0, inject))]

        keys = prepare()
        run.setup_s = time.monotonic() - t0
        rng = random.Random(seed)
        run.load.append(os.getloadavg()[0])
        t1 = time.monotonic()
        prep_time = 0.0
        for b in range(blocks):
            if regroup and b and b % regroup == 0:  # as `ab --rotate`: the case prepared afresh on both servers
                tp = time.monotonic()
                for srv, key in zip(servers, keys):
                    srv.request("close", key=key)
                keys = prepare()
                run.prep_s.append(time.monotonic() - tp)
                prep_time += run.prep_s[-1]
            run.group.append(b // regroup if regroup else 0)
            order = (0, 1, 1, 0) if rng.random() < 0.5 else (1, 0, 0, 1)
            got: dict[int, list[float]] = {0: [], 1: []}
            for i in order:
                got[i].append(servers[i].request("trial", key=keys[i], steps=args.steps, warmup=1)["step_s"])
            run.base_trials += got[0]
            run.head_trials += got[1]
            run.d.append(block_log_ratio(got[0], got[1]))
        run.seconds = time.monotonic() - t1 - prep_time
        run.load.append(os.getloadavg()[0])
    finally:
        for s in servers:
            s.close()
    say(f"  {case} +{inject:.0%}: {blocks} blocks in {run.seconds:.0f} s ({run.block_s:.2f} s a block; setup "
        f"{run.setup_s:.0f} s" + (f", {len(run.prep_s)} fresh preparations of {np.mean(run.prep_s):.1f} s"
                                   if run.prep_s else "") + f"), mean log ratio {np.mean(run.d):+.4f}")
    return run


def simulate(run: Run, sims: int, budget_s: float, seed: int, opts=None) -> dict:
    """Sequential comparisons drawn from one run's blocks: verdict counts and blocks to a verdict."""
    from ..ab.stats import SeqOptions, Sequential

    opts = opts or SeqOptions()
    rng = np.random.default_rng(seed)
    limit = max(opts.min_blocks, int(budget_s / run.block_s))
    counts = {"slower": 0, "faster": 0, "same": 0, "inconclusive": 0}
    used = []
    d = np.asarray(run.d)
    for _ in range(sims):
        s = Sequential(SeqOptions(delta=opts.delta, confidence=opts.confidence, min_blocks=opts.min_blocks,
                                  seed=int(rng.integers(1 << 30))))
        draws = d[rng.integers(0, d.size, size=limit)]
        for x in draws:
            if s.add(float(x)) is not None:
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


def simulate_level(runs: list[Run], sims: int, budget_s: float, seed: int, tau: float, opts=None,
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
    from ..ab.stats import SeqOptions, Sequential

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
    counts = {"slower": 0, "faster": 0, "same": 0, "inconclusive": 0}
    used = []
    for _ in range(sims):
        s = Sequential(SeqOptions(delta=opts.delta, confidence=opts.confidence, min_blocks=opts.min_blocks,
                                  seed=int(rng.integers(1 << 30)), rotate=rotate,
                                  restart=1 if fresh == "servers" else servers_every))
        proc, bias, t = rng.normal(0.0, tau_process) if tau_process else 0.0, rng.normal(0.0, tau), 0.0
        while True:
            t += block_s
            if s.add(float(mu + proc + bias + res[rng.integers(0, res.size)])) is not None or t >= budget_s:
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
    from ..ab.stats import SeqOptions, Sequential

    s = Sequential(SeqOptions())
    limit = max(s.opts.min_blocks, int(budget_s / run.block_s))
    for x in run.d[:limit]:
        if s.add(x) is not None:
            break
    return s.finish() + ("" if s.verdict != "inconclusive" or len(s.d) >= limit else f" (run ended at {len(s.d)})")


def _compare_runs(runs: list[Run], rounds: int) -> tuple[list, dict]:
    """Separate runs of ``rounds`` windows: (unchanged runs as (server id, samples), {inject: slowed runs})."""
    unchanged: list = []
    slowed: dict = {}
    for i, r in enumerate(runs):
        chunks = lambda xs: [xs[j:j + rounds] for j in range(0, len(xs) - rounds + 1, rounds)]  # noqa: E731
        unchanged += [((i, "A"), c) for c in chunks(r.base_trials)]
        if r.inject == 0:
            unchanged += [((i, "B"), c) for c in chunks(r.head_trials)]
        else:
            slowed.setdefault(r.inject, []).extend(((i, "B"), c) for c in chunks(r.head_trials))
    return unchanged, slowed


def compare_rates(runs: list[Run], rounds: int, seed: int, max_pairs: int = 2000) -> list[str]:
    from ..results.gate import GateOptions, gate_samples

    unchanged, slowed = _compare_runs(runs, rounds)
    rng = random.Random(seed)
    aa = [(a, b) for a, b in itertools.combinations(unchanged, 2) if a[0] != b[0]]
    aa = rng.sample(aa, min(max_pairs, len(aa)))
    lines = []
    for thr in THRESHOLDS:
        opts = GateOptions(threshold=thr)
        fa = sum(gate_samples(a[1], b[1], opts)["change"] == "slower" for a, b in aa)
        cells = [f"{fa / max(1, len(aa)):.1%} of {len(aa)}"]
        for f in SLOWDOWNS:
            pairs = [(u, h) for h in slowed.get(f, []) for u in unchanged if u[0] != h[0]]
            pairs = rng.sample(pairs, min(max_pairs, len(pairs)))
            hit = sum(gate_samples(u[1], h[1], opts)["change"] == "slower" for u, h in pairs)
            cells.append(f"{hit / max(1, len(pairs)):.0%} of {len(pairs)}" if pairs else "-")
        lines.append(f"| {thr:.0%} | " + " | ".join(cells) + " |")
    return lines


def _save(path: str, runs: list) -> None:
    import dataclasses
    import json

    with open(path + ".tmp", "w") as fh:
        json.dump([dataclasses.asdict(r) for r in runs], fh)
    os.replace(path + ".tmp", path)


def _load(path: str) -> list:
    import json

    with open(path) as fh:
        return [Run(**r) for r in json.load(fh)]


def _rate(n: int, total: int) -> str:
    return f"{n / total:.1%} ({n}/{total})" if total else "-"


def run(pool, args) -> str:
    from ..ab.stats import SeqOptions, lag1

    say = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    cases = [c for c in os.environ.get("FLEETBENCH_GATE_CASES", "mlp/plain,resnet/plain").split(",") if c]
    blocks = _env_int("FLEETBENCH_GATE_BLOCKS", 60)
    pairs_aa = _env_int("FLEETBENCH_GATE_PAIRS", 3)
    pairs_slow = _env_int("FLEETBENCH_GATE_SLOW_PAIRS", 2)
    sims = _env_int("FLEETBENCH_GATE_SIMS", 100)
    rotate = _env_int("FLEETBENCH_GATE_ROTATE", 5)
    regroup = _env_int("FLEETBENCH_GATE_REGROUP", 10)
    restart = SeqOptions().restart
    budget = float(os.environ.get("FLEETBENCH_GATE_BUDGET", "180"))
    seq = SeqOptions()
    save, load = os.environ.get("FLEETBENCH_GATE_SAVE"), os.environ.get("FLEETBENCH_GATE_LOAD")
    loaded = _load(load) if load else []
    t_start = time.monotonic()
    out = [f"### `fleetbench ab`: false alarms and detection ({args.nproc} ranks, trials of {args.steps} steps, "
           f"margin ±{seq.delta:.0%}, {seq.confidence:.0%} intervals, decisions from {seq.min_blocks} blocks or with "
           f"--rotate from {seq.min_pairs} whole pairs, budget {budget:.0f} s per comparison)", "",
           "| case | change injected | ab | pairs x blocks measured (s a block) | lag-1 autocorr. of blocks "
           "| each pair's HEAD/BASE | simulated comparisons | slower | same | faster | inconclusive "
           "| median time to stop | slower, resampling within a pair | each pair's own first blocks |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    all_runs: dict = {}
    spreads: dict = {}
    exact: dict = {}  # (case, ab mode) -> verdict counts at exactly +5% of the measured step time
    summary = []
    for ci, case in enumerate(cases):
        runs = [r for r in loaded if r.case == case]
        if not runs:
            plan = [0.0] * pairs_aa + [f for f in SLOWDOWNS for _ in range(pairs_slow)]
            order = random.Random(ci).sample(plan, len(plan))  # levels interleaved in time
            for k, f in enumerate(order):
                runs.append(long_run(case, f, blocks, args, seed=1000 * ci + k, say=say, regroup=regroup))
                if save:
                    _save(save, [r for rs in all_runs.values() for r in rs] + runs)
        all_runs[case] = runs
        spread = process_spread(runs)
        scale = effect_scale(runs)
        nested = prep_spread(runs)
        spreads[case] = (spread, scale, nested)
        if math.isfinite(nested["tau_prep"]):  # preparations measured: bias = process part + preparation part
            taus = (nested["tau_prep"], nested["tau_process"])
            modes = [(0, "servers", 0, "one preparation (--rotate 0)"),
                     (rotate, "preparations", restart, f"--rotate {rotate} --restart {restart} (default)"),
                     (rotate, "preparations", 0, f"--rotate {rotate} --restart 0 (preparations only)"),
                     (rotate, "servers", 0, f"--rotate {rotate} --restart 1 (fresh servers every time)")]
        else:  # runs of one preparation each: the pairs' spread is all there is
            taus = (spread["tau"] if math.isfinite(spread["tau"]) else 0.0, 0.0)
            modes = [(0, "servers", 0, "one pair"), (rotate, "servers", 0, f"fresh servers every {rotate}")]
        for f in (0.0,) + SLOWDOWNS:
            rs = [r for r in runs if r.inject == f]
            if not rs:
                continue
            n_within = max(10, sims // 3)  # the earlier method, for contrast: fewer comparisons
            within = sum(simulate(r, n_within, budget, seed=17 * j + int(f * 1000))["counts"]["slower"]
                         for j, r in enumerate(rs))
            lags = [lag1(r.d) for r in rs]
            label = "none (A/A)" if f == 0 else f"+{f:.0%}"
            for rot, fresh, every, name in modes:
                sim = simulate_level(rs, sims * len(rs), budget, seed=int(f * 1000) + 7, tau=taus[0], rotate=rot,
                                     scale=scale, tau_process=taus[1], fresh=fresh, servers_every=every)
                counts = sim["counts"]
                total = sum(counts.values())
                out.append(f"| {case} | {label} | {name} | {len(rs)} x "
                           f"{round(statistics.mean(len(r.d) for r in rs))} "
                           f"({statistics.mean(r.block_s for r in rs):.2f}) | "
                           f"{', '.join(f'{x:+.2f}' for x in lags)} | "
                           f"{', '.join(f'{math.expm1(float(np.mean(r.d))):+.1%}' for r in rs)} | {total} | "
                           f"{_rate(counts['slower'], total)} | {_rate(counts['same'], total)} | "
                           f"{_rate(counts['faster'], total)} | {_rate(counts['inconclusive'], total)} | "
                           f"{statistics.median(sim['seconds']):.0f} s | "
                           + (f"{_rate(within, n_within * len(rs))} | {', '.join(direct(r, budget) for r in rs)} |"
                              if not rot else "- | - |"))
                summary.append((case, f, name, counts, total))
                if f == 0.05:  # the same spreads, the mean shifted by exactly +5% of the measured step time
                    exact[(case, name)] = simulate_level(rs, sims * len(rs), budget, seed=int(f * 1000) + 11,
                                                         tau=taus[0], rotate=rot, scale=1.0, tau_process=taus[1],
                                                         fresh=fresh, servers_every=every)["counts"]
    for case, (sp, scale, nested) in spreads.items():
        out += ["", f"{case}: the pairs' mean log ratios vary by tau = {sp['tau']:.2%} beyond their blocks' own noise "
                    f"(random effects over {sp['pairs']} pairs; Cochran's Q = {sp['q']:.1f} on {sp['df']} degrees of "
                    f"freedom, p = {sp['p']:.2g})"
                + (f"; one preparation's mean varies by {nested['tau_total']:.2%} in all, of which "
                   f"tau_prep = {nested['tau_prep']:.2%} between preparations in the same servers (Cochran's Q = "
                   f"{nested['q']:.1f} on {nested['df']} degrees of freedom within pairs, p = {nested['p']:.2g}) and "
                   f"tau_process = {nested['tau_process']:.2%} added by the processes (A/A groups by pair: ANOVA "
                   f"p = {nested['anova_p']:.2g}; {nested['groups']} preparations in {nested['pairs']} pairs)"
                   if math.isfinite(nested["tau_prep"]) else "")
                + f"; the injected busy work costs {scale:.2f} x its nominal fraction "
                  "(fitted over the slowed pairs; the simulated slowdowns use it)."]
    out += ["", "Goal: a 5% slowdown caught in >= 95% of comparisons with <= 1% false alarms per case, within 3 "
            "minutes per case."]
    for case in cases:
        for name in dict.fromkeys(n for k, _, n, _, _ in summary if k == case):
            fa = next((c for k, f, n, c, t in summary if k == case and f == 0 and n == name), None)
            five = next((c for k, f, n, c, t in summary if k == case and f == 0.05 and n == name), None)
            if fa and five:
                fa_rate = fa["slower"] / max(1, sum(fa.values()))
                hit = five["slower"] / max(1, sum(five.values()))
                ok = fa_rate <= 0.01 and hit >= 0.95
                ex = exact.get((case, name))
                ex_hit = ex["slower"] / max(1, sum(ex.values())) if ex else math.nan
                out.append(f"- {case}, {name}: false alarms {fa_rate:.1%}, 5% caught {hit:.0%}: goal "
                           f"{'met' if ok else 'missed'}"
                           + (f" (a slowdown of exactly +5% of the measured step time, the busy work's measured "
                              f"cost aside: caught {ex_hit:.0%} of {sum(ex.values())})" if ex else "") + ".")
    out += ["", f"### `fleetbench compare` on separate runs ({args.rounds} windows a run, per-window samples, "
            f"Mann-Whitney alpha 0.01 plus the threshold)", ""]
    for case in cases:
        out += [f"{case}:", "", "| threshold | false alarms (unchanged pairs) | "
                + " | ".join(f"caught at +{f:.0%}" for f in SLOWDOWNS) + " |",
                "|---" * (2 + len(SLOWDOWNS)) + "|"]
        out += compare_rates(all_runs[case], args.rounds, seed=5) + [""]
    minutes = (time.monotonic() - t_start) / 60
    loads = [x for rs in all_runs.values() for r in rs for x in r.load]
    blocks_min = sum(r.seconds for rs in all_runs.values() for r in rs) / 60
    setup_min = sum(r.setup_s for rs in all_runs.values() for r in rs) / 60
    preps = [x for rs in all_runs.values() for r in rs for x in r.prep_s]
    if loads:
        out += [f"Machine load (1-minute load average on {os.cpu_count()} cores) during the runs: "
                f"{min(loads):.1f} to {max(loads):.1f}; figures measured under load are not the machine's "
                f"sensitivity, only the harness's."]
    out += ["Runs: each pair is two fresh trial servers (their own interpreters and rank pools)"
            + (f", the case prepared afresh on both every {regroup} blocks ({len(preps)} fresh preparations, "
               f"{np.mean(preps):.1f} s each on average)" if preps else "")
            + f"; levels interleaved "
            f"in time. Slowdowns are busy work in the HEAD server's training step (a fraction of the step's own "
            f"time). ab rates: sequential comparisons simulated ({sims} per pair measured), each with a bias drawn "
            f"with the measured spreads (a process part and a preparation part, or the pairs' tau when the runs have "
            f"one preparation each; the preparation part drawn again at each fresh preparation, both at fresh "
            f"servers, each at its measured cost), then blocks resampled from the level's runs about their own "
            f"preparation's mean (A/A: about 0). 'resampling within a pair' is the earlier method, which draws "
            f"all of a comparison's blocks from one measured pair, so that pair's own bias and sampling error decide "
            f"every comparison drawn from it (with few pairs, the rate is that of the pairs one happened to get); "
            f"compare rates: every pair of separate runs from different servers (up to 2000). "
            f"The runs took {blocks_min:.0f} minutes of timed blocks and {setup_min:.0f} of server start-up "
            f"(summed over pairs); this table took {minutes:.0f} minutes"
            + (" (recomputed from saved runs)." if loaded else ".")]
    return "\n".join(out)
