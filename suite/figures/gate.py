"""The regression gate's sensitivity on this machine: false alarms and the smallest slowdown caught.

Separate runs of ``mlp/plain`` (each one ``time_on_rank`` call, as separate nightly runs
are), some unchanged, some slowed by a sleep in every step sized from a calibration run to
make the step 1.1x, 1.25x, 1.5x and 2x slower.  Every pair of unchanged runs is gated (a
"slower" is a false alarm); every slowed run is gated against every unchanged one.  Reported
per threshold: the false-alarm rate, the detection rate per slowdown, and the smallest
slowdown caught in >= 95% of pairs.

    fleetbench figures gate --nproc 2 --rounds 5 --steps 5
"""
from __future__ import annotations

import itertools
import os
import statistics

from ..results.gate import GateOptions, gate_samples
from ..measure.timing import time_on_rank
from ..workload import WorkloadSpec

DESCRIPTION = "regression gate: false-alarm rate over unchanged reruns, smallest slowdown caught at 95%"

SLOWDOWNS = (1.1, 1.25, 1.5, 2.0)
THRESHOLDS = (0.05, 0.10, 0.25, 0.5)


def _run(pool, args, straggler_ms: float = 0.0) -> list:
    answers = pool.run(time_on_rank, dict(
        workload_spec=WorkloadSpec("mlp", per_rank_batch=16), warmup=2, steps=args.steps, rounds=args.rounds,
        variants=[{"name": "plain", "config": {"straggler_ms": straggler_ms}}]), timeout=args.timeout)
    return [t for a in answers for t in a["variants"]["plain"]["step_times"]]


def run(pool, args) -> str:
    n_same = int(os.environ.get("FLEETBENCH_GATE_RUNS", "8"))
    n_slow = int(os.environ.get("FLEETBENCH_GATE_SLOW_RUNS", "4"))
    calib = statistics.median(_run(pool, args))
    unchanged, slowed = [], {s: [] for s in SLOWDOWNS}
    for i in range(max(n_same, n_slow)):  # interleave the levels so drifts of the machine hit them alike
        if i < n_same:
            unchanged.append(_run(pool, args))
        if i < n_slow:
            for s in SLOWDOWNS:
                slowed[s].append(_run(pool, args, straggler_ms=(s - 1.0) * calib * 1e3))
    lines = [f"### Regression gate sensitivity (mlp/plain, {pool.nproc} ranks, {args.rounds} rounds x {args.steps} "
             f"steps per run; step {calib * 1e3:.1f} ms at calibration)", "",
             "| threshold | false alarms (unchanged pairs) | " + " | ".join(f"caught at {s}x" for s in SLOWDOWNS)
             + " | smallest slowdown caught >= 95% |", "|---" * (3 + len(SLOWDOWNS)) + "|"]
    pairs = list(itertools.combinations(unchanged, 2))
    for thr in THRESHOLDS:
        opts = GateOptions(threshold=thr)
        false = sum(gate_samples(a, b, opts)["change"] == "slower" for a, b in pairs) / max(1, len(pairs))
        caught = {}
        for s in SLOWDOWNS:
            res = [gate_samples(u, h, opts)["change"] == "slower" for h in slowed[s] for u in unchanged]
            caught[s] = sum(res) / max(1, len(res))
        smallest = next((f"{s}x" for s in SLOWDOWNS if caught[s] >= 0.95), "none of those tried")
        lines.append(f"| {thr:.0%} | {false:.1%} ({len(pairs)} pairs) | "
                     + " | ".join(f"{caught[s]:.0%}" for s in SLOWDOWNS) + f" | {smallest} |")
    lines += ["", "Mann-Whitney U (alpha 0.01) on per-step samples plus the threshold on the median ratio; "
              "the slowdown is a sleep in every step (the nominal factor, sized from the calibration run)."]
    return "\n".join(lines)
