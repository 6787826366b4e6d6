"""asv benchmarks: the step time of every case of the matrix (lower is better).

asv reads every increase as a regression, so the tracked figure is a time: seconds per
step (the slowest rank's window over its steps, median over rounds).  Parameters come from
the case registry (``suite.cases``): case name × world size, narrowed by the environment
variables FLEETBENCH_BENCH_CASES / _TAGS / _WORLDS (comma-separated; default: the smoke
tag at each case's world sizes).  A (case, world size) pair the case does not run at is
skipped (setup raises NotImplementedError, asv's way of saying "n/a").

Ranks are spawned processes (``RankPool``: spawn start method) started in ``setup`` and
closed in ``teardown``; the engine is built and warmed up there too, so the tracked rounds
time steps only.  The timeout is raised for multi-rank cases.
"""
from __future__ import annotations

import os
import statistics

from bench_cases._matrix import case_config, env_selection, selected_matrix
from suite.measure.steps import prepare_case, run_steps

ROUNDS = int(os.environ.get("FLEETBENCH_BENCH_ROUNDS", "5"))
STEPS = int(os.environ.get("FLEETBENCH_BENCH_STEPS", "5"))

_PAIRS = {(c.name, w): c for c, w in selected_matrix(*env_selection())}


class StepTime:
    """Seconds per training step of a case at a world size."""

    params = [sorted({n for n, _ in _PAIRS}), sorted({w for _, w in _PAIRS})]
    param_names = ["case", "world_size"]
    timeout = 1800.0  # multi-rank: rank start, engine build, warm-up and the rounds
    unit = "seconds"

    def setup(self, case, world_size):
        self.pool = None
        c = _PAIRS.get((case, world_size))
        if c is None:
            raise NotImplementedError(f"{case} is not run at world size {world_size}")
        cfg, why = case_config(c, world_size)
        if cfg is None:
            raise NotImplementedError(why)
        from suite.runtime import RankPool

        self.case = c
        self.pool = RankPool(world_size, timeout=self.timeout / 2, pg_timeout=120.0)
        self.pool.run(prepare_case,
                      dict(key=case, model=c.model, config=cfg.to_dict(), per_rank_batch=c.per_rank_batch))

    def teardown(self, case, world_size):
        if getattr(self, "pool", None) is not None:
            self.pool.close()

    def track_step_time(self, case, world_size):
        per_round = []
        for _ in range(ROUNDS):
            answers = self.pool.run(run_steps, dict(key=case, steps=STEPS))
            per_round.append(max(a["window_s"] for a in answers) / STEPS)
        return statistics.median(per_round)

    track_step_time.unit = "seconds"
