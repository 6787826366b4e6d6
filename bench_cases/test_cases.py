"""Every case of the matrix under pytest-benchmark: each round is one training step.

The case runs through the same runner as ``fleetbench run`` (``suite.runner``): its correctness
check, then its engine built and warmed up once on the ranks (``CaseRunner.prepare``), then
pytest-benchmark's rounds.  Each round runs one window of K steps on every rank between two
barriers, and what pytest-benchmark records for it is **one step**: the slowest rank's window over
K.  The benchmark's timer is the ranks' own clock (:func:`rank_clock`, advanced by each window's
seconds per step; pytest-benchmark takes a timer callable in ``@pytest.mark.benchmark(timer=...)``),
so the round trip from pytest to the ranks and back is not in the tables, as it is not in asv's
samples (``asv_cases.py``) nor in ``fleetbench run``'s windows.  ``extra_info`` holds each rank's
windows, samples/s, per-step samples, the correctness verdict and the record's structure.
``fleetbench compare`` reads the saved JSON.

Parameters: ``case`` (the case's name) and ``world`` (the world size), plain values, so nothing in
the saved JSON is ``UNSERIALIZABLE``; ``benchmark.group`` is the model and world size (``mlp@2``).
"""
from __future__ import annotations

import pytest

from suite.results.export import UNIT, UNITS  # one shape: the nightly's export writes the same
from suite.results.records import jsonable

_CLOCK = [0.0]  # seconds per step, summed over every window timed in this session


def rank_clock() -> float:
    """pytest-benchmark's timer for test_step: the ranks' own seconds per step, accumulated window by window."""
    return _CLOCK[0]


@pytest.mark.benchmark(timer=rank_clock)
def test_step(benchmark, selection, rank_pools, timed, case: str, world: int):
    rc = selection.find(case, world)
    c = rc.case
    if rc.skip:
        pytest.skip(f"{case} does not run at world size {world}: {rc.skip}")
    runner = rank_pools.runner(world)
    k = runner.opts.steps
    benchmark.group = f"{c.model}@{world}"
    info = benchmark.extra_info
    info.update(case=case, model=c.model, variant=c.variant, world_size=world, unit=UNIT, steps_per_window=k,
                round=timed.round(k), units=UNITS, size=runner.opts.size, config=jsonable(rc.config.to_dict()),
                tags=list(c.tags))
    check = runner.check(rc)
    try:
        prepared = runner.prepare(rc)
    except Exception as exc:  # noqa: BLE001 - reported as the benchmark's failure
        info.update(status="error", verdict="error")
        pytest.fail(f"{case}@{world}: the engine could not be built: {str(exc).splitlines()[0][:500]}")

    def one_window():
        answers = prepared.window()
        _CLOCK[0] += max(a.window_s for a in answers) / k
        return answers

    try:
        benchmark.pedantic(one_window, rounds=runner.opts.rounds, iterations=1, warmup_rounds=0)
        metrics = prepared.metrics()
    finally:
        prepared.close()
    if benchmark.enabled:  # timed: a table will show it (not under --benchmark-disable)
        timed.add(benchmark.group, k)
    rec = runner.record(rc, check, metrics)
    m = rec.metrics
    rank_windows = [[a.window_s for a in sorted(answers, key=lambda a: a.rank)] for answers in prepared.windows]
    info.update(status=rec.status, verdict=rec.verdict, samples_per_s=m.samples_per_s,
                throughput_per_round=m.throughput_per_round, step_times_s=m.step_times_s,
                rank_median_step_s=m.rank_median_step_s, peak_memory_bytes=m.peak_memory_bytes,
                rank_window_s=rank_windows, window_s=[max(w) for w in rank_windows],
                threads_per_rank=m.threads, describe=jsonable(rec.describe), structure=jsonable(rec.structure),
                backend=rec.backend,
                device=rec.device, message=(rec.check.message if rec.check else None) or rec.error)
    assert rec.verdict in ("pass", "n/a"), f"{case}@{world}: correctness verdict {rec.verdict}: " \
                                           f"{info.get('message')}"
