"""asv benchmarks: the step time of every case of the matrix (lower is better).

asv reads every increase as a regression, so the tracked figure is a time: seconds per
step (the slowest rank's window over its steps, median over rounds).  Parameters come from
the case registry (``suite.cases``): case name × world size, narrowed by the environment
variables FLEETBENCH_BENCH_CASES / _TAGS / _WORLDS (comma-separated; default: the smoke
tag at each case's world sizes).  A (case, world size) pair the case does not run at is
skipped (setup raises NotImplementedError, asv's way of saying "n/a").

Cases run through the same runner as ``fleetbench run`` (``suite.runner``): ranks are spawned
processes (``RankPool``) started in ``setup`` and closed in ``teardown``; the engine is built
and warmed up there too (``CaseRunner.prepare``), so the tracked rounds time steps only.
"""
from __future__ import annotations

import os
import statistics

from bench_cases._matrix import bench_device, env_selection, resolve, run_options, selected_matrix

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
        self.pool = self.prepared = None
        c = _PAIRS.get((case, world_size))
        if c is None:
            raise NotImplementedError(f"{case} is not run at world size {world_size}")
        rc = resolve(c, world_size)
        if rc.skip:
            raise NotImplementedError(rc.skip)
        from suite.runner import CaseRunner
        from suite.runtime import RankPool

        self.pool = RankPool(world_size, device=bench_device()[0], timeout=self.timeout / 2, pg_timeout=120.0)
        runner = CaseRunner(self.pool, world_size, run_options(STEPS, ROUNDS, check=False, timeout=self.timeout / 2))
        self.prepared = runner.prepare(rc)

    def teardown(self, case, world_size):
        if getattr(self, "pool", None) is not None:
            self.pool.close()

    def track_step_time(self, case, world_size):
        for _ in range(ROUNDS):
            self.prepared.window()
        windows = [max(a["window_s"] for a in answers) / STEPS for answers in self.prepared.windows]
        return statistics.median(windows)

    track_step_time.unit = "seconds"
