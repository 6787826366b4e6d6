"""The cost model's profile: gradient-ready times and forward marks from device events (moved from
tests/test_gpu_paths.py with the cost model; its fixtures are that file's)."""
from __future__ import annotations

import pytest

from tests.test_gpu_paths import _device_time_passes_between_marks, one_rank_world  # noqa: F401 - a fixture


def test_profile_gradient_ready_times_come_from_device_events(one_rank_world, monkeypatch):  # noqa: F811
    from experiments.costmodel.profile import record_profile
    from suite.workload import WorkloadSpec, drop_workloads

    _device_time_passes_between_marks(monkeypatch, one_rank_world)
    drop_workloads()
    try:
        prof = record_profile(WorkloadSpec("mlp", "tiny", per_rank_batch=4, dataset_size=16), steps=1, warmup=0)
    finally:
        drop_workloads()
    ready = [p["ready_s"] for p in prof["params"]]
    # marks: forward start, forward end, one per gradient (10 in the MLP), backward end, optimizer end
    assert prof["forward_s"] == pytest.approx(1.0)
    assert sorted(ready) == pytest.approx([float(k) for k in range(1, 11)]), ready
    assert prof["backward_s"] == pytest.approx(11.0) and prof["optimizer_s"] == pytest.approx(1.0)
