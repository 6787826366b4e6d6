"""Every case of the matrix under pytest-benchmark, timed as ``fleetbench run`` times it: each round is one
training step of one window of the model's **interleaved** measurement.

The first benchmark of a model (at a world size) that runs measures the whole group through the same runner as
``fleetbench run`` (``CaseRunner.run_model`` in ``suite/runner.py``): the session's cases of that model (what
``--fleetbench-*``/``--fleetbench-spec`` selected and ``-k`` kept) are checked, then timed together with the
model's baseline, ``plain`` (always, selected or not), in one call on the ranks: round by round, every variant's
window of K steps between two barriers, the order rotated each round (``time_on_rank``,
``suite.measure.interleave.interleaved_rounds``), so a slow drift of the machine hits every case alike.  Each
benchmark then reports its own case's windows to pytest-benchmark: ``benchmark.pedantic`` replays them, one
round a window, through the benchmark's timer, the ranks' own clock (:func:`rank_clock`, advanced by each
window's slowest rank over K; pytest-benchmark takes a timer callable in ``@pytest.mark.benchmark(timer=...)``).
So a round is **one step** (the slowest rank's window over K), without the round trip from pytest to the ranks,
and the rows of one table (``MODEL@WORLD``) come from the same rounds: the speedups they show agree with
``fleetbench run``'s, which ``extra_info`` carries too (``speedup``, its interval, ``baseline``).  Before, each case
was timed alone, one after the other, and a table could disagree with ``run`` on a speedup's direction (issue 33).
``extra_info`` is the record's, built by the function the nightly's export uses
(``suite.results.export.extra_info``: samples/s, per-step samples, the correctness verdict, the record's
structure ...), with what only this harness knows: each rank's windows (``rank_window_s``) and the variants
timed together (``interleaved_with``).  ``fleetbench compare`` reads the saved JSON.

Parameters: ``case`` (the case's name) and ``world`` (the world size), plain values, so nothing in
the saved JSON is ``UNSERIALIZABLE``; ``benchmark.group`` is the model and world size (``mlp@2``).
"""
from __future__ import annotations

import math

import pytest

from suite.results.export import extra_info  # one shape: the nightly's export writes the same

MEASURED_BY = ("pytest-benchmark (bench_cases: the session's cases of the model, interleaved with its baseline, as "
               "fleetbench run times them)")

_CLOCK = [0.0]  # seconds per step, summed over every window reported in this session


def rank_clock() -> float:
    """pytest-benchmark's timer for test_step: the ranks' own seconds per step, accumulated window by window.  A
    window that is not a finite time gives its round a nan once; the clock then starts again from 0."""
    now = _CLOCK[0]
    if not math.isfinite(now):
        _CLOCK[0] = 0.0
    return now


@pytest.mark.benchmark(timer=rank_clock)
def test_step(benchmark, selection, rank_pools, timed, case: str, world: int):
    rc = selection.find(case, world)
    c = rc.case
    if rc.skip:
        pytest.skip(f"{case} does not run at world size {world}: {rc.skip}")
    runner = rank_pools.runner(world)
    k = runner.opts.steps
    benchmark.group = f"{c.model}@{world}"
    got = rank_pools.measured(case, world)  # the model's one interleaved measurement (made by its first benchmark)
    rec = got.records[case]
    info = benchmark.extra_info
    info.update(extra_info(rec, MEASURED_BY, rank_window_s=got.rank_windows(c.variant),
                           interleaved_with=got.timed_with(c.variant)))
    if rec.status == "skipped":
        pytest.skip(f"{case}@{world}: {rec.error}")
    windows = list(rec.metrics.window_s or [])
    if not windows:
        pytest.fail(f"{case}@{world}: not timed: {str(rec.error or 'no windows').splitlines()[0][:500]}")
    replay = iter(windows)

    def one_window():  # the next window of the interleaved measurement, as one round of pytest-benchmark's
        w = next(replay, None)
        if w is not None:
            _CLOCK[0] += w / k

    benchmark.pedantic(one_window, rounds=len(windows), iterations=1, warmup_rounds=0)
    if benchmark.enabled:  # timed: a table will show it (not under --benchmark-disable)
        timed.add(benchmark.group, k)
    assert rec.verdict in ("pass", "n/a"), f"{case}@{world}: correctness verdict {rec.verdict}: " \
                                           f"{info.get('message')}"
