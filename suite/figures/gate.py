"""The regression gates' measured sensitivity on this machine: `fleetbench ab` and `fleetbench compare`.

For each case (default ``mlp/plain`` and ``resnet/plain``) at ``--nproc`` ranks, long A/B runs
are made exactly as `fleetbench ab` makes them: two trial servers (two interpreters, two rank
pools, the current tree), trials of ``--steps`` steps alternating in randomised ABBA blocks.
Each run is one *pair* of fresh servers: A/A pairs (nothing changed) and pairs whose HEAD has
busy work injected into every training step, costing 2%, 5% or 10% of the step
(``suite.measure.timing.TimedCase.inject``: CPU spent in the trial process, proportional to the step,
like a real regression; not a sleep).  Within a run the case is prepared afresh on both servers
every ``--regroup`` blocks, as `ab --rotate` does.

**ab.**  A comparison's verdict depends only on the sequence of its block log ratios.  The
blocks of a run are close to independent (the lag-1 autocorrelation of each run is shown).
What is particular to a preparation and to a pair of processes is measured, not assumed:
:func:`suite.ab.power.process_spread` estimates tau, the spread of the pairs' mean log ratios beyond their
blocks' own noise (a random-effects estimate with Cochran's Q test), and :func:`~suite.ab.power.prep_spread`
splits one preparation's spread into a part between preparations in the same servers
(tau_prep) and a part the processes add (tau_process).  Each simulated comparison
(:func:`~suite.ab.power.simulate_level`) draws its biases with those spreads (the preparation part again at
every fresh preparation, both at fresh servers, each at its measured cost), then blocks from
the level's runs about their own preparation's mean, fed to `ab`'s rule
(``suite.ab.stats.Sequential``, default margin, interval and minimum) until it decides or the
budget (in seconds) is spent.  Rows: one preparation (``--rotate 0``); ``--rotate N --restart K``
as built (fresh preparations, every K-th time on fresh servers); fresh preparations only
(``--restart 0``); fresh servers every time (``--restart 1``, the rotation `ab` had first).  The
earlier method (:func:`~suite.ab.power.simulate`: all of a comparison's blocks from one measured pair) is shown
beside it: a pair's own bias and sampling error decide every comparison drawn from it, so with
few pairs it reports the pairs one happened to get.  Each run's own first blocks, read as `ab` reads them, are shown too
(one real comparison per pair).

**compare.**  Separate runs are groups of ``--rounds`` consecutive trials (windows) of one
server; two runs from *different* servers are two separate runs (different processes, at
different times), compared as `fleetbench compare` does: per-window samples, Mann–Whitney at
alpha 0.01 and a threshold on the median ratio.

    fleetbench figures gate --nproc 2 --steps 5 --rounds 5

Options: :class:`Options`, from `fleetbench figures gate`'s arguments (``fleetbench figures --help``);
``--save PATH`` keeps every run (block log ratios and trial times, JSON) as it is measured, ``--load PATH``
renders saved runs instead of measuring.  The statistics are :mod:`suite.ab.power`'s; this module measures
(:func:`measure`) and renders (:func:`render`).
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import random
import statistics
import sys
import time
from dataclasses import dataclass

import numpy as np

from ..ab import blocks as ab_blocks
from ..ab.client import TrialServer
from ..ab.power import (
    Run,
    direct,
    effect_scale,
    modes,
    prep_spread,
    process_spread,
    rate_interval,
    simulate,
    simulate_level,
)
from ..ab.stats import SeqOptions, block_log_ratio, lag1
from ..outputs import read_input, write_atomic
from ..results.gate import GateOptions, gate_samples
from ..run_spec import RunOptions, RunSpec, Selection

DESCRIPTION = "regression gates: false alarms and detection of 2/5/10% slowdowns, ab and compare"

USES_POOL = False  # the trial servers are the figure's processes; `figures` starts no pool for it
SLOWDOWNS = (0.02, 0.05, 0.10)
THRESHOLDS = (0.05, 0.10, 0.25)


@dataclass(frozen=True)
class Options:
    """What `fleetbench figures gate` measures and how it renders (see the module docstring)."""

    nproc: int = 2
    steps: int = 5
    rounds: int = 5  # windows a separate run, for compare
    timeout: float = 1800.0
    cases: tuple[str, ...] = ("mlp/plain", "resnet/plain")
    blocks: int = 60
    regroup: int = 10
    pairs: int = 3
    slow_pairs: int = 2
    sims: int = 100
    rotate: int = 5
    budget: float = 180.0
    size: str = "tiny"
    save: str | None = None
    load: str | None = None

    def __post_init__(self):
        for name in ("nproc", "steps", "rounds", "blocks", "pairs", "slow_pairs", "sims"):
            if not getattr(self, name) >= 1:
                raise ValueError(f"figures gate: {name} {getattr(self, name)!r}: must be >= 1")
        for name in ("regroup", "rotate"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"figures gate: {name} {getattr(self, name)!r}: must be >= 0")
        if not self.cases:
            raise ValueError("figures gate: cases is empty; name at least one case (e.g. mlp/plain)")
        if not (math.isfinite(self.budget) and self.budget > 0):
            raise ValueError(f"figures gate: budget {self.budget!r}: must be a finite number of seconds > 0")


def long_run(case: str, inject: float, blocks: int, options, seed: int, say, regroup: int = 0) -> Run:
    """One pair of fresh trial servers, placed as `ab` places them: ``blocks`` ABBA blocks (:mod:`suite.ab.blocks`,
    never short-circuited: both sides are the same tree on purpose), the case prepared afresh on both every
    ``regroup`` blocks.  ``options`` needs nproc, timeout, size and steps."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    run = Run(case, inject)
    t0 = time.monotonic()
    servers = [TrialServer(root, label, nproc=options.nproc, timeout=options.timeout, wait=False)
               for label in ("A", "B")]
    spec = RunSpec(Selection(cases=(case,), size=options.size, worlds=(options.nproc,)),
                   RunOptions(check=False)).to_dict()
    try:
        for s in servers:
            s.ready()
        for s, rid in [(s, s.send("start")) for s in servers]:
            s.receive(rid, "starting the rank pool")

        def prepare() -> list:
            return [s.request("prepare", case=case, spec=spec, inject=inj)["key"]
                    for s, inj in zip(servers, (0.0, inject))]

        keys = prepare()
        run.setup_s = time.monotonic() - t0
        run.load.append(os.getloadavg()[0])
        t1 = time.monotonic()
        prep_time = 0.0

        def trial(i: int) -> dict:
            return servers[i].request("trial", key=keys[i], steps=options.steps, warmup=1)

        def after(got: list[list[dict]]) -> bool:
            nonlocal keys, prep_time
            run.group.append(len(run.d) // regroup if regroup else 0)
            run.base_trials += [a["step_s"] for a in got[0]]
            run.head_trials += [a["step_s"] for a in got[1]]
            run.base_steps += [a.get("step_times_s") or [] for a in got[0]]
            run.head_steps += [a.get("step_times_s") or [] for a in got[1]]
            run.d.append(block_log_ratio([a["step_s"] for a in got[0]], [a["step_s"] for a in got[1]]))
            if len(run.d) >= blocks:
                return True
            if regroup and len(run.d) % regroup == 0:  # as `ab --rotate`: the case prepared afresh on both servers
                tp = time.monotonic()
                for srv, key in zip(servers, keys):
                    srv.request("close", key=key)
                keys = prepare()
                run.prep_s.append(time.monotonic() - tp)
                prep_time += run.prep_s[-1]
            return False

        ab_blocks.run_blocks((0, 1), trial, random.Random(seed), after)
        run.seconds = time.monotonic() - t1 - prep_time
        run.load.append(os.getloadavg()[0])
    finally:
        for s in servers:
            s.close()
    say(f"  {case} +{inject:.0%}: {blocks} blocks in {run.seconds:.0f} s ({run.block_s:.2f} s a block; setup "
        f"{run.setup_s:.0f} s" + (f", {len(run.prep_s)} fresh preparations of {np.mean(run.prep_s):.1f} s"
                                   if run.prep_s else "") + f"), mean log ratio {np.mean(run.d):+.4f}")
    return run


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
    unchanged, slowed = _compare_runs(runs, rounds)
    rng = random.Random(seed)
    aa = [(a, b) for a, b in itertools.combinations(unchanged, 2) if a[0] != b[0]]
    aa = rng.sample(aa, min(max_pairs, len(aa)))
    lines = []
    for thr in THRESHOLDS:
        opts = GateOptions(threshold=thr)
        fa = sum(gate_samples(a[1], b[1], opts)["change"] == "slower" for a, b in aa)
        cells = [_rate(fa, len(aa))]
        for f in SLOWDOWNS:
            pairs = [(u, h) for h in slowed.get(f, []) for u in unchanged if u[0] != h[0]]
            pairs = rng.sample(pairs, min(max_pairs, len(pairs)))
            hit = sum(gate_samples(u[1], h[1], opts)["change"] == "slower" for u, h in pairs)
            cells.append(_rate(hit, len(pairs), digits=0))
        lines.append(f"| {thr:.0%} | " + " | ".join(cells) + " |")
    return lines


def _save(path: str, runs: list) -> None:
    write_atomic(path, json.dumps([dataclasses.asdict(r) for r in runs]))


def _load(path: str) -> list:
    return [Run(**r) for r in json.loads(read_input(path, "figure's raw data (JSON)"))]


def _passes(counts: dict) -> int:
    """Comparisons whose verdict lets the gate pass (ab's exit 0): not slower, same, faster."""
    return counts["not slower"] + counts["same"] + counts["faster"]


def _rate(n: int, total: int, digits: int = 1) -> str:
    """``1.7% (2/120) [0.2, 5.9]``: the rate, its count and its 95% Clopper-Pearson interval."""
    if not total:
        return "-"
    lo, hi = rate_interval(n, total)
    return f"{n / total:.{digits}%} ({n}/{total}) [{100 * lo:.{digits}f}, {100 * hi:.{digits}f}]"


def measure(options: Options, pool=None) -> dict:
    """The runs of every case (JSON-able): measured (each case's levels interleaved in time, saved to
    ``options.save`` as they come), or read from ``options.load`` for the cases it holds."""
    say = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    t_start = time.monotonic()
    loaded = _load(options.load) if options.load else []
    all_runs: dict = {}
    for ci, case in enumerate(options.cases):
        runs = [r for r in loaded if r.case == case]
        if not runs:
            plan = [0.0] * options.pairs + [f for f in SLOWDOWNS for _ in range(options.slow_pairs)]
            order = random.Random(ci).sample(plan, len(plan))  # levels interleaved in time
            for k, f in enumerate(order):
                runs.append(long_run(case, f, options.blocks, options, seed=1000 * ci + k, say=say,
                                     regroup=options.regroup))
                if options.save:
                    _save(options.save, [r for rs in all_runs.values() for r in rs] + runs)
        all_runs[case] = runs
    return {"runs": [dataclasses.asdict(r) for rs in all_runs.values() for r in rs], "loaded": bool(loaded),
            "seconds": time.monotonic() - t_start}


def render(raw: dict, options: Options) -> str:
    """The figure's Markdown from :func:`measure`'s runs (the simulations are seeded: the same runs give the same
    tables; only the closing "this table took" counts wall time)."""
    t_start = time.monotonic()
    cases, sims, rotate, regroup, budget = options.cases, options.sims, options.rotate, options.regroup, options.budget
    seq = SeqOptions()
    runs_of = {case: [r for r in (Run(**x) for x in raw["runs"]) if r.case == case] for case in cases}
    out = [f"### `fleetbench ab`: false alarms and detection ({options.nproc} ranks, trials of {options.steps} steps, "
           f"threshold {seq.threshold:.0%} ('not slower': the interval below +{seq.threshold:.0%}; 'slower': above 1), "
           f"margin ±{seq.delta:.0%} ('same'), {seq.confidence:.0%} over all looks (alpha spent by the budget's "
           f"share), looks from {seq.min_blocks} blocks or with --rotate from {seq.min_pairs} whole pairs, budget "
           f"{budget:.0f} s per comparison)", "",
           "| case | change injected | ab | pairs x blocks measured (s a block) | lag-1 autocorr. of blocks "
           "| each pair's HEAD/BASE | simulated comparisons | slower | not slower | same | faster | inconclusive "
           "| median time to stop | slower, resampling within a pair | each pair's own first blocks |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    spreads: dict = {}
    exact: dict = {}  # (case, ab mode) -> verdict counts at exactly +5% of the measured step time
    summary = []
    for case in cases:
        runs = runs_of[case]
        spread = process_spread(runs)
        scale = effect_scale(runs)
        nested = prep_spread(runs)
        spreads[case] = (spread, scale, nested)
        taus, simulated = modes(spread, nested, rotate)
        for f in (0.0,) + SLOWDOWNS:
            rs = [r for r in runs if r.inject == f]
            if not rs:
                continue
            n_within = max(10, sims // 3)  # the earlier method, for contrast: fewer comparisons
            within = sum(simulate(r, n_within, budget, seed=17 * j + int(f * 1000))["counts"]["slower"]
                         for j, r in enumerate(rs))
            lags = [lag1(r.d) for r in rs]
            label = "none (A/A)" if f == 0 else f"+{f:.0%}"
            for rot, fresh, every, name in simulated:
                sim = simulate_level(rs, sims * len(rs), budget, seed=int(f * 1000) + 7, tau=taus[0], rotate=rot,
                                     scale=scale, tau_process=taus[1], fresh=fresh, servers_every=every)
                counts = sim["counts"]
                total = sum(counts.values())
                out.append(f"| {case} | {label} | {name} | {len(rs)} x "
                           f"{round(statistics.mean(len(r.d) for r in rs))} "
                           f"({statistics.mean(r.block_s for r in rs):.2f}) | "
                           f"{', '.join(f'{x:+.2f}' for x in lags)} | "
                           f"{', '.join(f'{math.expm1(float(np.mean(r.d))):+.1%}' for r in rs)} | {total} | "
                           f"{_rate(counts['slower'], total)} | {_rate(counts['not slower'], total)} | "
                           f"{_rate(counts['same'], total)} | "
                           f"{_rate(counts['faster'], total)} | {_rate(counts['inconclusive'], total)} | "
                           f"{statistics.median(sim['seconds']):.0f} s | "
                           + (f"{_rate(within, n_within * len(rs))} | {', '.join(direct(r, budget) for r in rs)} |"
                              if not rot else "- | - |"))
                summary.append((case, f, name, counts, total))
                if f == 0.05:  # the same spreads, the mean shifted by exactly +5% of the measured step time
                    exact[(case, name)] = simulate_level(rs, sims * len(rs), budget, seed=int(f * 1000) + 11,
                                                         tau=taus[0], rotate=rot, scale=1.0, tau_process=taus[1],
                                                         fresh=fresh, servers_every=every)["counts"]
    out += ["", "Every rate: its share, its count and its 95% Clopper-Pearson interval in percent, e.g. 1.7% (2/120) "
            "[0.2, 5.9]."]
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
            "minutes per case; and an unchanged commit answered \"not slower\" (the nightly advances its last good "
            "commit on it)."]
    for case in cases:
        for name in dict.fromkeys(n for k, _, n, _, _ in summary if k == case):
            fa = next((c for k, f, n, c, t in summary if k == case and f == 0 and n == name), None)
            five = next((c for k, f, n, c, t in summary if k == case and f == 0.05 and n == name), None)
            if fa and five:
                fa_rate = fa["slower"] / max(1, sum(fa.values()))
                hit = five["slower"] / max(1, sum(five.values()))
                ok = fa_rate <= 0.01 and hit >= 0.95
                ex = exact.get((case, name))
                out.append(f"- {case}, {name}: false alarms {_rate(fa['slower'], sum(fa.values()))}, A/A "
                           f"\"not slower\" (or same, faster) {_rate(_passes(fa), sum(fa.values()))}, 5% caught "
                           f"{_rate(five['slower'], sum(five.values()), digits=0)}: goal {'met' if ok else 'missed'}"
                           + (f" (a slowdown of exactly +5% of the measured step time, the busy work's measured "
                              f"cost aside: caught {_rate(ex['slower'], sum(ex.values()), digits=0)})" if ex else "")
                           + ".")
    out += ["", f"### `fleetbench compare` on separate runs ({options.rounds} windows a run, per-window samples, "
            f"Mann-Whitney alpha 0.01 plus the threshold)", ""]
    for case in cases:
        out += [f"{case}:", "", "| threshold | false alarms (unchanged pairs) | "
                + " | ".join(f"caught at +{f:.0%}" for f in SLOWDOWNS) + " |",
                "|---" * (2 + len(SLOWDOWNS)) + "|"]
        out += compare_rates(runs_of[case], options.rounds, seed=5) + [""]
    minutes = (raw.get("seconds", 0.0) + time.monotonic() - t_start) / 60
    loads = [x for rs in runs_of.values() for r in rs for x in r.load]
    blocks_min = sum(r.seconds for rs in runs_of.values() for r in rs) / 60
    setup_min = sum(r.setup_s for rs in runs_of.values() for r in rs) / 60
    preps = [x for rs in runs_of.values() for r in rs for x in r.prep_s]
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
            + (" (recomputed from saved runs)." if raw.get("loaded") else ".")]
    return "\n".join(out)
