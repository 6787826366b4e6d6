"""Every case of the matrix under pytest-benchmark: each round is one window of K steps on every rank.

The case runs through the same runner as ``fleetbench run`` (``suite.runner``): its correctness
check, then its engine built and warmed up once on the ranks (``CaseRunner.prepare``), then
pytest-benchmark's rounds, each one window.  What a round measures: K training steps on every
rank between two barriers, plus the round trip from pytest to the ranks and back; the ranks'
own window times (without the round trip) are in ``extra_info``, with samples/s, per-step
samples, the correctness verdict and the record's structure.  ``fleetbench compare`` reads the
saved JSON.
"""
from __future__ import annotations

import pytest

from bench_cases._matrix import resolve


def test_step(benchmark, rank_pools, case_world, request):
    case, world = case_world
    rc = resolve(case, world)
    if rc.skip:
        pytest.skip(f"{case.name} does not run at world size {world}: {rc.skip}")
    runner = rank_pools.runner(world)
    info = benchmark.extra_info
    info.update(case=case.name, model=case.model, variant=case.variant, world_size=world,
                steps_per_round=runner.opts.steps, size=runner.opts.size, config=rc.config.to_dict(),
                tags=list(case.tags))
    check = runner.check(rc)
    try:
        prepared = runner.prepare(rc)
    except Exception as exc:  # noqa: BLE001 - reported as the benchmark's failure
        info.update(status="error", verdict="error")
        pytest.fail(f"{case.name}@{world}: the engine could not be built: {str(exc).splitlines()[0][:500]}")
    try:
        benchmark.pedantic(prepared.window, rounds=runner.opts.rounds, iterations=1, warmup_rounds=0)
        metrics = prepared.metrics()
    finally:
        prepared.close()
    rec = runner.record(rc, check, metrics)
    m = rec.metrics
    info.update(status=rec.status, verdict=rec.verdict, samples_per_s=m["samples_per_s"],
                throughput_per_round=m["throughput_per_round"], step_times_s=m["step_times_s"],
                rank_median_step_s=m["rank_median_step_s"], peak_memory_bytes=m["peak_memory_bytes"],
                describe=rec.describe, structure=rec.structure, backend=rec.backend, device=rec.device,
                message=(rec.check or {}).get("message") or rec.error)
    assert rec.verdict in ("pass", "n/a"), f"{case.name}@{world}: correctness verdict {rec.verdict}: " \
                                           f"{info.get('message')}"
