"""Every case of the matrix under pytest-benchmark: ``benchmark.pedantic`` times K steps on every rank.

The engine is built and warmed up once per case on the ranks (``suite.measure.steps``), so
the rounds time steps, not construction.  ``extra_info`` carries samples/s, per-step samples,
per-rank statistics and the correctness verdict; ``fleetbench compare`` reads the saved JSON.
"""
from __future__ import annotations

import statistics

import pytest

from bench_cases._matrix import case_config, verdict_of
from bench_cases.conftest import CALL_TIMEOUT
from suite.measure.steps import drop_case, prepare_case, run_steps


def test_step(benchmark, rank_pools, case_world, request):
    case, world = case_world
    cfg, why = case_config(case, world)
    if cfg is None:
        pytest.skip(f"{case.name} does not run at world size {world}: {why}")
    steps = request.config.getoption("fleetbench_steps")
    rounds = request.config.getoption("fleetbench_rounds")
    pool = rank_pools.get(world)
    info = benchmark.extra_info
    info.update(case=case.name, model=case.model, variant=case.variant, world_size=world, steps_per_round=steps,
                per_rank_batch=case.per_rank_batch, config=cfg.to_dict(), tags=list(case.tags))
    info.update({"verdict": "n/a"} if request.config.getoption("fleetbench_no_check")
                else verdict_of(pool, case, cfg, timeout=CALL_TIMEOUT))
    key = f"{case.name}@{world}"
    try:
        prep = pool.run(prepare_case,
                        dict(key=key, model=case.model, config=cfg.to_dict(), per_rank_batch=case.per_rank_batch))
    except Exception as exc:
        info.update(status="error", verdict="error")
        pytest.fail(f"{case.name}@{world}: the engine could not be built: {str(exc).splitlines()[0][:500]}")
    answers: list = []

    def k_steps():
        answers.append(pool.run(run_steps, dict(key=key, steps=steps)))

    try:
        benchmark.pedantic(k_steps, rounds=rounds, iterations=1, warmup_rounds=0)
    finally:
        pool.run(drop_case, dict(key=key))
    windows = [max(a["window_s"] for a in per_rank) for per_rank in answers]
    per_rank_steps = [[t for per_rank in answers for t in per_rank[r]["step_times_s"]] for r in range(world)]
    throughput = [case.per_rank_batch * world * steps / w for w in windows]
    info.update(
        status="ok",
        samples_per_s=statistics.median(throughput),
        throughput_per_round=throughput,
        step_times_s=[t for ts in per_rank_steps for t in ts],
        rank_median_step_s=[statistics.median(ts) for ts in per_rank_steps],
        rank_max_step_s=[max(ts) for ts in per_rank_steps],
        peak_memory_bytes=max(a["peak_memory_bytes"] for per_rank in answers for a in per_rank),
        describe=prep[0]["describe"],
    )
    assert info["verdict"] in ("pass", "n/a"), f"{case.name}@{world}: correctness verdict {info['verdict']}: " \
                                                 f"{info.get('message') or info.get('error')}"
