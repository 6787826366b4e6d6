"""Where a preparation's and a process's few percent come from: the gate's variance components, one factor at a time.

The gate figure's A/A design (:func:`suite.figures.gate.long_run`: two fresh trial servers of the same tree, ABBA
blocks of ``--steps``-step trials, the case prepared afresh on both every ``--regroup`` blocks), repeated for
``--pairs`` pairs under each placement or layout of :data:`suite.ab.isolation.FACTORS` (both servers alike), the
pairs of all factors in one random order (the machine's drift is shared, not given to one factor).  For each
factor: tau_prep (what differs between preparations in the same processes), tau_process (what a pair of processes
adds) and the blocks' own noise (:func:`suite.ab.power.prep_spread`, :func:`~suite.ab.power.block_noise`), each
with a 90% interval from resampling whole pairs (:func:`~suite.ab.power.spread_interval`).

    fleetbench figures gate_sources --pairs 5 --regroup 6 --blocks 18 --save docs/figures/gate-sources-raw.json
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import random
import sys
import time
from dataclasses import dataclass

import numpy as np

from ..ab.isolation import FACTORS, Isolation
from ..ab.power import Run, block_noise, block_statistics, prep_spread, spread_interval
from ..ab.stats import POWER, SeqOptions
from ..outputs import read_input, write_atomic
from ..run_spec import RunOptions, RunSpec, Selection
from .gate import long_run

DESCRIPTION = "the gate's sources of bias: tau_prep, tau_process and block noise under each placement/layout factor"

USES_POOL = False  # trial servers are the figure's processes


@dataclass(frozen=True)
class Options:
    nproc: int = 2
    steps: int = 5
    timeout: float = 1800.0
    cases: tuple[str, ...] = ("mlp/plain", "resnet/plain")
    factors: tuple[str, ...] = tuple(f.name for f in FACTORS)
    pairs: int = 5
    blocks: int = 18
    regroup: int = 6
    size: str = "tiny"
    calibration: tuple[float, ...] = ()  # injected fractions to check (the same preparation before and after)
    trials: int = 60  # trials without and with the injection, for the calibration
    save: str | None = None
    load: str | None = None

    def __post_init__(self):
        for name in ("nproc", "steps", "pairs", "blocks", "regroup"):
            if not getattr(self, name) >= 1:
                raise ValueError(f"figures gate_sources: {name} {getattr(self, name)!r}: must be >= 1")
        if self.blocks < 2 * self.regroup:
            raise ValueError(f"figures gate_sources: blocks {self.blocks} with regroup {self.regroup}: at least two "
                             f"preparations a pair are needed (blocks >= 2 x regroup)")
        if not all(isinstance(f, float) and 0 < f < 1 for f in self.calibration):
            raise ValueError(f"figures gate_sources: calibration {self.calibration!r}: fractions between 0 and 1")
        if self.trials < 2:
            raise ValueError(f"figures gate_sources: trials {self.trials!r}: must be >= 2")
        known = {f.name: f for f in FACTORS}
        unknown = [f for f in self.factors if f not in known]
        if unknown:
            raise ValueError(f"figures gate_sources: factor {unknown[0]!r} is unknown; allowed: {', '.join(known)}")


def _factor(name: str) -> Isolation:
    return next(f for f in FACTORS if f.name == name)


def _save(path: str, data) -> None:
    """``data`` as JSON at ``path``, whole or not at all (written beside it, then renamed)."""
    write_atomic(path, json.dumps(data))


def measure(options: Options, pool=None) -> dict:
    """Every (case, factor, pair) run, in one seeded random order; with ``load``, the saved runs (nothing measured).
    Runs of several invocations (say, more pairs of one factor) are rendered together when their rows are
    concatenated into one file."""
    say = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    t0 = time.monotonic()
    if options.load:
        kept = json.loads(read_input(options.load, "figure's raw data (JSON)"))
        if isinstance(kept, dict):  # a calibration's raw data
            return {"rows": [], "calibration": kept.get("calibration") or [], "seconds": 0.0, "loaded": True}
        return {"rows": kept, "seconds": 0.0, "loaded": True}
    rows: list = []
    if options.calibration:  # only the calibration: the factors' runs are another invocation
        cal = [_calibrate(c, f, options, say) for c in options.cases for f in options.calibration]
        if options.save:
            _save(options.save, {"calibration": cal})
        return {"rows": [], "calibration": cal, "seconds": time.monotonic() - t0, "loaded": False}
    plan = [(c, f, k) for c in options.cases for f in options.factors for k in range(options.pairs)]
    random.Random(2013).shuffle(plan)
    for i, (case, factor, k) in enumerate(plan):
        say(f"[{i + 1}/{len(plan)}] {case} {factor} pair {k + 1} (load {os.getloadavg()[0]:.1f})")
        run = long_run(case, 0.0, options.blocks, options, seed=31 * i + k, say=say, regroup=options.regroup,
                       isolation=_factor(factor))
        rows.append({"factor": factor, "run": dataclasses.asdict(run)})
        if options.save:
            _save(options.save, rows)
    return {"rows": rows, "seconds": time.monotonic() - t0, "loaded": False}


def _calibrate(case: str, fraction: float, options: Options, say) -> dict:
    """One fresh trial server and one preparation: the injection calibrated once, then switched on and off between
    trials in ABBA blocks (``trials`` trials each way), so the machine's drift hits both alike and neither a
    preparation's nor a process's own speed enters the ratio."""
    from ..ab.client import TrialServer  # at call time: tests replace it

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    rng = random.Random(int(fraction * 1000))
    before: list[float] = []
    after: list[float] = []
    with TrialServer(root, "A", nproc=options.nproc, timeout=options.timeout) as srv:
        srv.request("start")
        spec = RunSpec(Selection(cases=(case,), size=options.size, worlds=(options.nproc,)), RunOptions(check=False))
        key = srv.request("prepare", case=case, spec=spec.to_dict())["key"]
        ranks = srv.request("inject", key=key, fraction=fraction)["ranks"]  # calibrates once
        for _ in range(max(1, options.trials // 2)):
            for on in ((False, True, True, False) if rng.random() < 0.5 else (True, False, False, True)):
                srv.request("inject", key=key, fraction=fraction if on else 0.0)
                t = srv.request("trial", key=key, steps=options.steps, warmup=1)["step_s"]
                (after if on else before).append(t)
    ratio = float(np.mean(after) / np.mean(before))
    say(f"  {case} +{fraction:.0%}: measured x{ratio:.3f} ({len(before)} trials without, {len(after)} with)")
    return {"case": case, "fraction": fraction, "before": before, "after": after,
            "step_s": [r["step_s"] for r in ranks], "load": os.getloadavg()[0]}


def _calibration(raw: dict) -> list[str]:
    rows = raw.get("calibration") or []
    if not rows:
        return []
    from scipy.stats import bootstrap

    out = ["", "#### The injected slowdown against what the trials measure (one preparation, the injection switched "
           "on and off between trials in ABBA blocks)", "",
           "| case | injected | trials without, with | measured slowdown (ratio of mean trial times) [90%] "
           "| measured / injected | load |", "|---|---|---|---|---|---|"]
    for r in rows:
        b, a = np.asarray(r["before"]), np.asarray(r["after"])
        ci = bootstrap((b, a), lambda x, y, axis=-1: np.mean(y, axis=axis) / np.mean(x, axis=axis), vectorized=True,
                       confidence_level=0.90, n_resamples=2000, random_state=1, method="percentile").confidence_interval
        got = float(np.mean(a) / np.mean(b)) - 1
        out.append(f"| {r['case']} | +{r['fraction']:.0%} | {b.size}, {a.size} | {got:+.1%} [{ci.low - 1:+.1%}, "
                   f"{ci.high - 1:+.1%}] | {got / r['fraction']:.2f} | {r['load']:.1f} |")
    return out


def _pct(x: float) -> str:
    return f"{x:.2%}" if math.isfinite(x) else "-"


def render(raw: dict, options: Options) -> str:
    rows = raw["rows"]
    if not rows:  # a calibration alone
        return "\n".join(_calibration(raw)[1:]) or "(no runs)"
    out = [f"### Sources of the gate's bias: A/A pairs under each factor ({options.nproc} ranks, trials of "
           f"{options.steps} steps, {options.regroup} blocks a preparation)", "",
           "| case | factor | pairs x preparations x blocks | tau_prep [90%] | tau_process [90%] "
           "| block noise (SD of a block's log ratio) [90%] | tau_prep = 0: Cochran p | tau_process = 0: ANOVA p "
           "| s a block | load |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    loads: list[float] = []
    for case in options.cases:
        for factor in options.factors:
            runs = [Run(**r["run"]) for r in rows if r["factor"] == factor and r["run"]["case"] == case]
            if not runs:
                continue
            sp = prep_spread(runs)
            ci = spread_interval(runs, seed=len(runs))
            noise = block_noise(runs)
            preps = round(float(np.mean([len(r.groups()) for r in runs])))
            blocks = round(float(np.mean([len(g) for r in runs for g in r.groups()])))
            load = [x for r in runs for x in r.load]
            loads += load
            load_txt = f"{min(load):.1f}-{max(load):.1f}" if load else "-"
            out.append(f"| {case} | {factor} | {len(runs)} x {preps} x {blocks} | {_pct(sp['tau_prep'])} "
                       f"[{_pct(ci['tau_prep'][0])}, {_pct(ci['tau_prep'][1])}] | {_pct(sp['tau_process'])} "
                       f"[{_pct(ci['tau_process'][0])}, {_pct(ci['tau_process'][1])}] | {_pct(noise)} "
                       f"[{_pct(ci['noise'][0])}, {_pct(ci['noise'][1])}] | {sp['p']:.2g} | {sp['anova_p']:.2g} | "
                       f"{float(np.mean([r.block_s for r in runs])):.2f} | {load_txt} |")
    out += _statistics(rows, options)
    out += _calibration(raw)
    out += _blocks_needed(rows, options)
    all_runs = [Run(**r["run"]) for r in rows]
    minutes = (raw.get("seconds") or sum(r.seconds + r.setup_s + sum(r.prep_s) for r in all_runs)) / 60
    out += ["", "Factors (both servers of a pair alike; `suite/ab/isolation.py`): default = none of them (as "
            "`fleetbench ab` ran before this table; `--isolation none`); "
            "pin = rank r on core r; threads=2 = two intra-op threads a rank (the default is one on 2 cores with 2 "
            "ranks); malloc_fixed = MALLOC_ARENA_MAX=1, MALLOC_MMAP_THRESHOLD_=131072, no trimming; thp = torch's "
            "large CPU tensors on transparent huge pages (THP_MEM_ALLOC_ENABLE=1; the kernel's mode is madvise); "
            "aslr_off = no address-space randomization (personality ADDR_NO_RANDOMIZE, as `setarch -R`); gc_frozen "
            "= after each preparation gc.collect, gc.freeze, gc off while timed; layout_pad = random padding "
            "allocations before each preparation (each preparation at other addresses); the last row switches off "
            "everything that can be switched off at once.",
            "tau_prep: the spread of a preparation's mean log ratio between preparations in the same servers beyond "
            "its blocks' noise; tau_process: what a pair of processes adds (method of moments, floored at 0; "
            "intervals from 1000 resamples of whole pairs, so with few pairs they are wide and a 0 floor is common).",
            f"Machine load (1-minute average, {os.cpu_count()} cores) during the runs: "
            + (f"{min(loads):.1f} to {max(loads):.1f}." if loads else "not recorded.")
            + f" Measured in {minutes:.0f} minutes (blocks, start-ups and preparations summed over the runs)"
            + (" (rendered from saved runs)." if raw.get("loaded") else ".")]
    return "\n".join(out)


def _statistics(rows: list, options: Options) -> list[str]:
    """The blocks' own noise under each trial statistic, from the runs whose step times were kept."""
    out: list[str] = []
    for case in options.cases:
        runs = [Run(**r["run"]) for r in rows if r["run"]["case"] == case]
        kept = [(r, block_statistics(r)) for r in runs]
        kept = [(r, st) for r, st in kept if st]
        if not kept:
            continue
        if not out:
            out += ["", "#### A trial's time: the window's mean step (as `ab` takes it) against robust statistics "
                    "of its steps (A/A runs with step times kept)", "",
                    "| case | trial statistic | runs x blocks | block noise (SD of a block's log ratio) [90%] "
                    "| blocks for the same precision, relative to the window mean |", "|---|---|---|---|---|"]
        names = list(kept[0][1])
        base = None
        for name in names:
            alt = [dataclasses.replace(r, d=st[name]) for r, st in kept]
            noise = block_noise(alt)
            ci = spread_interval(alt, n=300, seed=7)["noise"]
            base = noise if base is None else base
            out.append(f"| {case} | {name} | {len(alt)} x {round(float(np.mean([len(r.d) for r in alt])))} | "
                       f"{_pct(noise)} [{_pct(ci[0])}, {_pct(ci[1])}] | {(noise / base) ** 2:.2f} |")
    return out


def _blocks_needed(rows: list, options: Options) -> list[str]:
    """What the blocks' own noise alone costs `ab` at +5%: the blocks a fixed-size 99% interval needs to clear the
    +2% margin with 95% power at a true +5% (no preparation or process spread, no sequential looks)."""
    from scipy.stats import norm

    seq = SeqOptions()
    gap = math.log(1.05) - math.log1p(seq.delta)
    z = norm.ppf(1 - (1 - seq.confidence) / 2) + norm.ppf(POWER)
    out = []
    for case in options.cases:
        runs = [Run(**r["run"]) for r in rows if r["run"]["case"] == case and r["factor"] == "default"]
        noise = block_noise(runs) if runs else math.nan
        if not math.isfinite(noise):
            continue
        n = (noise * z / gap) ** 2
        block_s = float(np.mean([r.block_s for r in runs]))
        out.append(f"- {case}: with the default's block noise {noise:.2%} alone, a {seq.confidence:.0%} interval "
                   f"clears "
                   f"+{seq.delta:.0%} at a true +5% with {POWER:.0%} power after {n:.0f} blocks ({n * block_s:.0f} s "
                   f"at {block_s:.2f} s a block), before any preparation or process spread.")
    return ["", "The blocks' noise is the floor (a fixed-size interval; `ab` looks after every block, which costs "
            "more):", ""] + out if out else []
