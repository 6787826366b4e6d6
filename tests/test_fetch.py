"""Host-side knobs: ``fetch_frequency`` (every step's loss still reported), ``num_threads``
(applied and recorded per variant) and stragglers (a seeded rank sleeps each step)."""
from __future__ import annotations

import math

import pytest
import torch

from suite.config import ConfigError, StrategyConfig
from suite.data.synthetic import make_dataset, prepare, shard, step_indices
from suite.engine import build_engine
from suite.measure.timing import straggler_for_step, time_on_rank
from suite.models import get_model
from suite.runtime.context import current
from suite.runtime.probes import whoami
from suite.strategies.fetch import LossFetcher
from suite.workload import WorkloadSpec


def fetch_on_rank(fetch_frequency: int, steps: int, seed: int = 0) -> dict:
    """One engine; each step's loss is fetched at once (``.item()``) and also pushed into a
    LossFetcher that fetches every ``fetch_frequency`` steps."""
    ctx = current()
    spec = get_model("transformer")
    cfg = StrategyConfig(fetch_frequency=fetch_frequency, lr=0.05)
    engine = build_engine(spec.make(seed, ctx.platform.device), spec.loss_fn, cfg)
    data = make_dataset(spec, 64, seed)
    fetcher = LossFetcher(cfg.fetch_frequency)
    every_step, fetches_seen = [], []
    for s in range(steps):
        x, y = data.get(shard(step_indices(len(data), s, 4 * ctx.world_size, seed), ctx.rank, ctx.world_size))
        loss = engine.train_step(prepare(data, x, ctx.platform.device), y)
        every_step.append(loss.item())
        fetcher.push(loss)
        fetches_seen.append(fetcher.fetches)
    fetcher.flush()
    return {"every_step": every_step, "fetched": fetcher.values, "fetches": fetcher.fetches,
            "fetches_seen": fetches_seen}


@pytest.mark.parametrize("n", [1, 3])
def test_fetch_every_n_reports_every_steps_loss(pool2, n):
    steps = 7
    for a in pool2.run(fetch_on_rank, dict(fetch_frequency=n, steps=steps)):
        assert a["fetched"] == a["every_step"]  # bitwise, in order, none lost at the end
        assert len(set(a["every_step"])) > 1  # the losses do change step to step
        assert a["fetches"] == math.ceil(steps / n)
        # the host is synced only every n-th step
        assert a["fetches_seen"] == [(s + 1) // n for s in range(steps)]


def test_measure_applies_and_records_threads_fetches_and_stragglers(pool2):
    variants = [
        {"name": "t1", "config": {"num_threads": 1}},
        {"name": "t2_f4_strag", "config": {"num_threads": 2, "fetch_frequency": 4, "straggler_ms": 1.0}},
    ]
    steps, rounds = 4, 2
    answers = pool2.run(time_on_rank,
                        dict(workload_spec=WorkloadSpec("transformer", per_rank_batch=4, dataset_size=64),
                             variants=variants, warmup=1, steps=steps, rounds=rounds))
    for a in answers:
        t1, t2 = a.variants["t1"], a.variants["t2_f4_strag"]
        assert (t1.threads, t2.threads) == (1, 2)
        assert (t1.threads_observed, t2.threads_observed) == ([1], [2])
        assert (t1.host_syncs, t2.host_syncs) == (steps * rounds, rounds)
        assert len(t1.losses) == len(t2.losses) == steps * rounds
        assert all(math.isfinite(v) for v in t2.losses)
        assert t1.straggler_sleeps == 0
    # exactly one rank straggles in each recorded step
    assert sum(a.variants["t2_f4_strag"].straggler_sleeps for a in answers) == steps * rounds
    # the rank's own thread setting is restored afterwards
    assert {w["threads"] for w in pool2.run(whoami)} == {1}


def test_straggler_is_seeded_and_moves_between_ranks():
    picks = [straggler_for_step(s, 4, seed=1) for s in range(1, 201)]
    assert picks == [straggler_for_step(s, 4, seed=1) for s in range(1, 201)]  # the same on every rank
    assert set(picks) == {0, 1, 2, 3}
    assert sum(a != b for a, b in zip(picks, picks[1:])) > 100  # not the same rank for long runs
    assert picks != [straggler_for_step(s, 4, seed=2) for s in range(1, 201)]


def test_loss_fetcher_edges():
    f = LossFetcher(3)
    for v in (1.0, 2.0):
        f.push(torch.tensor(v))
    assert f.fetches == 0 and f.values == []
    assert f.flush() == [1.0, 2.0] and f.fetches == 1
    assert f.flush() == [1.0, 2.0] and f.fetches == 1  # nothing pending: no extra sync
    with pytest.raises(ValueError, match="fetch_frequency=0"):
        LossFetcher(0)
    with pytest.raises(ConfigError, match="fetch_frequency=0"):
        StrategyConfig(fetch_frequency=0)
    with pytest.raises(ConfigError, match="num_threads=0"):
        StrategyConfig(num_threads=0)
    with pytest.raises(ConfigError, match="straggler_ms=-1"):
        StrategyConfig(straggler_ms=-1.0)
