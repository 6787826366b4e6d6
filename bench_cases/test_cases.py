"""Every case of the matrix under pytest-benchmark: each round is one window of K steps on every rank.

The case runs through the same runner as ``fleetbench run`` (``suite.runner``): its correctness
check, then its engine built and warmed up once on the ranks (``CaseRunner.prepare``), then
pytest-benchmark's rounds, each one window.  What a round measures: K training steps on every
rank between two barriers, plus the round trip from pytest to the ranks and back; the ranks'
own window times (without the round trip) are in ``extra_info``, with samples/s, per-step
samples, the correctness verdict and the record's structure.  ``fleetbench compare`` reads the
saved JSON.

Parameters: ``case`` (the case's name) and ``world`` (the world size), plain values, so nothing in
the saved JSON is ``UNSERIALIZABLE``; ``benchmark.group`` is the model and world size.
"""
from __future__ import annotations

import time

import pytest

from suite.results.records import jsonable

UNITS = {
    "round": "s: the time pytest-benchmark reports per round",
    "rank_window_s": "s: per round, each rank's window between its two barriers",
    "window_s": "s: per round, the slowest rank's window",
    "round_trip_s": "s: per round, the round as timed here minus the slowest rank's window",
    "step_times_s": "s: every step of every rank, round after round",
    "rank_median_step_s": "s: each rank's median step",
    "samples_per_s": "samples/s: global batch x steps per round / the slowest rank's window, median over rounds",
    "throughput_per_round": "samples/s, per round",
    "peak_memory_bytes": "bytes",
}


def test_step(benchmark, selection, rank_pools, timed, case: str, world: int):
    rc = selection.find(case, world)
    c = rc.case
    if rc.skip:
        pytest.skip(f"{case} does not run at world size {world}: {rc.skip}")
    runner = rank_pools.runner(world)
    k = runner.opts.steps
    benchmark.group = f"{c.model} at world size {world}: a round = {k} steps on every rank + the round trip"
    info = benchmark.extra_info
    info.update(case=case, model=c.model, variant=c.variant, world_size=world, steps_per_round=k,
                round=timed.round(k), units=UNITS, size=runner.opts.size, config=jsonable(rc.config.to_dict()),
                tags=list(c.tags))
    check = runner.check(rc)
    try:
        prepared = runner.prepare(rc)
    except Exception as exc:  # noqa: BLE001 - reported as the benchmark's failure
        info.update(status="error", verdict="error")
        pytest.fail(f"{case}@{world}: the engine could not be built: {str(exc).splitlines()[0][:500]}")
    rounds_s: list[float] = []

    def one_round():
        t0 = time.perf_counter()
        answers = prepared.window()
        rounds_s.append(time.perf_counter() - t0)
        return answers

    try:
        benchmark.pedantic(one_round, rounds=runner.opts.rounds, iterations=1, warmup_rounds=0)
        metrics = prepared.metrics()
    finally:
        prepared.close()
    timed.add(benchmark.group, k)
    rec = runner.record(rc, check, metrics)
    m = rec.metrics
    rank_windows = [[a["window_s"] for a in sorted(answers, key=lambda a: a["rank"])] for answers in prepared.windows]
    info.update(status=rec.status, verdict=rec.verdict, samples_per_s=m["samples_per_s"],
                throughput_per_round=m["throughput_per_round"], step_times_s=m["step_times_s"],
                rank_median_step_s=m["rank_median_step_s"], peak_memory_bytes=m["peak_memory_bytes"],
                rank_window_s=rank_windows, window_s=[max(w) for w in rank_windows],
                round_trip_s=[r - max(w) for r, w in zip(rounds_s, rank_windows)],
                describe=jsonable(rec.describe), structure=jsonable(rec.structure), backend=rec.backend,
                device=rec.device, message=(rec.check or {}).get("message") or rec.error)
    assert rec.verdict in ("pass", "n/a"), f"{case}@{world}: correctness verdict {rec.verdict}: " \
                                           f"{info.get('message')}"
