"""The regression gates' measured sensitivity on this machine: `fleetbench ab` and `fleetbench compare`.

For each case (default ``mlp/plain`` and ``resnet/plain``) at ``--nproc`` ranks, long A/B runs
are made exactly as `fleetbench ab` makes them: two trial servers (two interpreters, two rank
pools, the current tree), trials of ``--steps`` steps alternating in randomised ABBA blocks.
Each run is one *pair* of fresh servers: A/A pairs (nothing changed) and pairs whose HEAD has
busy work injected into every training step, costing 2%, 5% or 10% of the step
(``suite.ab.server.inject_on_rank``: CPU spent in the trial process, proportional to the step,
like a real regression; not a sleep).

**ab.**  A comparison's verdict depends only on the sequence of its block log ratios.  The
blocks of a run are close to independent (the lag-1 autocorrelation of each run is shown),
so sequential comparisons are simulated by drawing blocks at random from one run (with
replacement) and applying `ab`'s rule (``suite.ab.stats.Sequential``, the default margin,
interval and minimum) until it decides or the budget (in blocks: the budget over that run's
seconds per block) is spent.  Resampling *within* a pair keeps what is particular to that
pair of processes; rates are averaged over pairs.  Each run's own first blocks, read as `ab`
reads them, are shown too (one real comparison per pair).

**compare.**  Separate runs are groups of ``--rounds`` consecutive trials (windows) of one
server; two runs from *different* servers are two separate runs (different processes, at
different times), compared as `fleetbench compare` does: per-window samples, Mann–Whitney at
alpha 0.01 and a threshold on the median ratio.

    fleetbench figures gate --nproc 2 --steps 5 --rounds 5

Settings (environment): FLEETBENCH_GATE_CASES (comma-separated), FLEETBENCH_GATE_BLOCKS (blocks
per run, default 60), FLEETBENCH_GATE_PAIRS (A/A pairs per case, default 3),
FLEETBENCH_GATE_SLOW_PAIRS (pairs per slowdown, default 2), FLEETBENCH_GATE_SIMS (simulated
comparisons per pair, default 100), FLEETBENCH_GATE_BUDGET (ab's budget per comparison,
seconds, default 180), FLEETBENCH_GATE_SIZE (default tiny); FLEETBENCH_GATE_SAVE=PATH keeps every run
(block log ratios and trial times, JSON) as it is measured, FLEETBENCH_GATE_LOAD=PATH reads them
back instead of measuring (the rates and tables are recomputed from the saved runs).
"""
from __future__ import annotations

import itertools
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

    @property
    def block_s(self) -> float:
        return self.seconds / max(1, len(self.d))


def long_run(case: str, inject: float, blocks: int, args, seed: int, say) -> Run:
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
        keys = [s.request("prepare", case=case, size=size, warmup=2, check=False, inject=inj)["key"]
                for s, inj in zip(servers, (0.0, inject))]
        run.setup_s = time.monotonic() - t0
        rng = random.Random(seed)
        run.load.append(os.getloadavg()[0])
        t1 = time.monotonic()
        for _ in range(blocks):
            order = (0, 1, 1, 0) if rng.random() < 0.5 else (1, 0, 0, 1)
            got: dict[int, list[float]] = {0: [], 1: []}
            for i in order:
                got[i].append(servers[i].request("trial", key=keys[i], steps=args.steps, warmup=1)["step_s"])
            run.base_trials += got[0]
            run.head_trials += got[1]
            run.d.append(block_log_ratio(got[0], got[1]))
        run.seconds = time.monotonic() - t1
        run.load.append(os.getloadavg()[0])
    finally:
        for s in servers:
            s.close()
    say(f"  {case} +{inject:.0%}: {blocks} blocks in {run.seconds:.0f} s ({run.block_s:.2f} s a block; setup "
        f"{run.setup_s:.0f} s), mean log ratio {np.mean(run.d):+.4f}")
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
    budget = float(os.environ.get("FLEETBENCH_GATE_BUDGET", "180"))
    seq = SeqOptions()
    save, load = os.environ.get("FLEETBENCH_GATE_SAVE"), os.environ.get("FLEETBENCH_GATE_LOAD")
    loaded = _load(load) if load else []
    t_start = time.monotonic()
    out = [f"### `fleetbench ab`: false alarms and detection ({args.nproc} ranks, trials of {args.steps} steps, "
           f"margin ±{seq.delta:.0%}, {seq.confidence:.0%} bootstrap interval, decisions from {seq.min_blocks} "
           f"blocks, budget {budget:.0f} s per comparison)", "",
           "| case | change injected | pairs x blocks (s a block) | lag-1 autocorr. of blocks | simulated comparisons |"
           " slower | same | faster | inconclusive | median time to stop | each pair's own first blocks |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    all_runs: dict = {}
    summary = []
    for ci, case in enumerate(cases):
        runs = [r for r in loaded if r.case == case]
        if not runs:
            plan = [0.0] * pairs_aa + [f for f in SLOWDOWNS for _ in range(pairs_slow)]
            order = random.Random(ci).sample(plan, len(plan))  # levels interleaved in time
            for k, f in enumerate(order):
                runs.append(long_run(case, f, blocks, args, seed=1000 * ci + k, say=say))
                if save:
                    _save(save, [r for rs in all_runs.values() for r in rs] + runs)
        all_runs[case] = runs
        for f in (0.0,) + SLOWDOWNS:
            rs = [r for r in runs if r.inject == f]
            if not rs:
                continue
            counts = {"slower": 0, "faster": 0, "same": 0, "inconclusive": 0}
            used_s = []
            for j, r in enumerate(rs):
                sim = simulate(r, sims, budget, seed=17 * j + int(f * 1000))
                for k2, v in sim["counts"].items():
                    counts[k2] += v
                used_s += [n * r.block_s for n in sim["blocks"]]
            total = sum(counts.values())
            lags = [lag1(r.d) for r in rs]
            label = "none (A/A)" if f == 0 else f"+{f:.0%}"
            out.append(f"| {case} | {label} | {len(rs)} x {blocks} ({statistics.mean(r.block_s for r in rs):.2f}) | "
                       f"{', '.join(f'{x:+.2f}' for x in lags)} | {total} | {_rate(counts['slower'], total)} | "
                       f"{_rate(counts['same'], total)} | {_rate(counts['faster'], total)} | "
                       f"{_rate(counts['inconclusive'], total)} | {statistics.median(used_s):.0f} s | "
                       f"{', '.join(direct(r, budget) for r in rs)} |")
            summary.append((case, f, counts, total))
    out += ["", "Goal: a 5% slowdown caught in >= 95% of comparisons with <= 1% false alarms per case, within 3 "
            "minutes per case."]
    for case in cases:
        fa = next((c for k, f, c, t in summary if k == case and f == 0), None)
        five = next((c for k, f, c, t in summary if k == case and f == 0.05), None)
        if fa and five:
            fa_rate = fa["slower"] / max(1, sum(fa.values()))
            hit = five["slower"] / max(1, sum(five.values()))
            ok = fa_rate <= 0.01 and hit >= 0.95
            out.append(f"- {case}: false alarms {fa_rate:.1%}, 5% caught {hit:.0%}: goal "
                       f"{'met' if ok else 'missed'}.")
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
    if loads:
        out += [f"Machine load (1-minute load average on {os.cpu_count()} cores) during the runs: "
                f"{min(loads):.1f} to {max(loads):.1f}; figures measured under load are not the machine's "
                f"sensitivity, only the harness's."]
    out += [f"Runs: each pair is two fresh trial servers (their own interpreters and rank pools); levels interleaved "
            f"in time. Slowdowns are busy work in the HEAD server's training step (a fraction of the step's own "
            f"time). ab rates: sequential comparisons simulated by resampling a pair's blocks ({sims} per pair); "
            f"compare rates: every pair of separate runs from different servers (up to 2000). "
            f"The runs took {blocks_min:.0f} minutes of timed blocks and {setup_min:.0f} of server start-up "
            f"(summed over pairs); this table took {minutes:.0f} minutes"
            + (" (recomputed from saved runs)." if loaded else ".")]
    return "\n".join(out)
