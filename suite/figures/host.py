"""Host-side figures: fetching the loss every step against every N steps (Paddle's
``fetch_frequency``), and each rank's intra-op threads (``num_threads``) swept."""
from __future__ import annotations

import os
import statistics
from dataclasses import dataclass

from ..measure.stats import bootstrap_median_ci, paired_speedup, window_seconds
from ..measure.timing import RankTiming, time_on_rank
from ..runtime.device import default_threads
from ..workload import WorkloadSpec
from . import PoolOptions

DESCRIPTION = "fetch_frequency 1 vs N (host syncs) and num_threads swept: samples/s"

MODEL = "resnet"
PER_RANK_BATCH = 16
FETCH_N = 10


@dataclass(frozen=True)
class Options(PoolOptions):
    """The pool's options (``PoolOptions``), nothing of its own."""


def _timed(pool, options: Options, variants: list[tuple[str, dict]], steps: int) -> dict:
    answers = pool.run(time_on_rank,
                       dict(workload_spec=WorkloadSpec(MODEL, per_rank_batch=PER_RANK_BATCH, dataset_size=1024),
                            variants=[{"name": n, "config": c} for n, c in variants], warmup=2,
                            steps=steps, rounds=options.rounds))
    return {"variants": [n for n, _ in variants], "steps": steps, "answers": [a.to_dict() for a in answers]}


def measure(options: Options, pool) -> dict:
    """Both sweeps' interleaved timings (JSON-able), with the cores and ranks they ran on."""
    cores = len(os.sched_getaffinity(0))
    counts = sorted({1, 2, max(1, cores // pool.nproc), cores, 2 * cores})
    fetch = [("fetch every step", {"fetch_frequency": 1}), (f"fetch every {FETCH_N}", {"fetch_frequency": FETCH_N})]
    return {"world": pool.nproc, "cores": cores, "default_threads": default_threads(pool.nproc),
            "fetch": _timed(pool, options, fetch, max(options.steps, 2 * FETCH_N)),
            "threads": _timed(pool, options, [(f"{n} threads", {"num_threads": n}) for n in counts], options.steps)}


def _table(world: int, title: str, timed: dict, extra) -> list[str]:
    answers = [RankTiming.from_dict(a) for a in timed["answers"]]
    variants, steps = timed["variants"], timed["steps"]
    gb = PER_RANK_BATCH * world
    base = window_seconds(answers, variants[0])
    lines = [title, "", f"| variant | samples/s [95% CI] | speedup vs {variants[0]} | {extra[0]} |",
             "|---|---|---|---|"]
    for name in variants:
        w = window_seconds(answers, name)
        xs = [gb * steps / t for t in w]
        lo, hi = bootstrap_median_ci(xs)
        sp = paired_speedup(base, w)
        lines.append(f"| {name} | {statistics.median(xs):,.0f} [{lo:,.0f}, {hi:,.0f}] | "
                     f"{sp['speedup']:.2f} [{sp['ci'][0]:.2f}, {sp['ci'][1]:.2f}] | "
                     f"{extra[1](answers[0].variants[name])} |")
    return lines


def render(raw: dict, options: Options) -> str:
    world, cores = raw["world"], raw["cores"]
    fetch = _table(
        world,
        f"**Loss fetch frequency** ({MODEL}, {world} ranks, batch {PER_RANK_BATCH} per rank, windows of "
        f"{raw['fetch']['steps']} steps, {options.rounds} interleaved rounds)",
        raw["fetch"],
        ("host syncs per window (rank 0)", lambda v: f"{v.host_syncs / max(1, len(v.windows)):.0f}"),
    )
    threads = _table(
        world,
        f"**num_threads per rank** ({MODEL}, {world} ranks on {cores} cores; default = cores / local ranks "
        f"= {raw['default_threads']})",
        raw["threads"], ("threads observed in the windows", lambda v: ", ".join(map(str, v.threads_observed))),
    )
    note = [
        "",
        "Speedup > 1 is faster. On CPU a loss fetch (`.item()`) waits for nothing: ops run synchronously, so "
        "fetching every step costs only the copy of one number and no difference is expected; on CUDA each fetch "
        "blocks the host until the device drains its queue, which is what `fetch_frequency` avoids. Threads beyond "
        "cores / ranks oversubscribe the cores.",
    ]
    return "\n".join(fetch + [""] + threads + note)
