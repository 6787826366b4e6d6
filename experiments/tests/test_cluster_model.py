"""The cost model on an emulated cluster (moved from tests/test_cluster.py with the cost model; needs root or
CAP_NET_ADMIN, skipped otherwise): the probes' flat allreduce against the ring formula, the two-level probe exact,
and the calibration's terms finite and giving back the flat allreduces they were fitted on."""
from __future__ import annotations

import math
import sys

import pytest

from experiments.costmodel import costmodel as cm
from experiments.costmodel.calibrate import calibrate_on_pool
from experiments.costmodel.probes import check_two_level, timed_allreduce
from suite.check.errors import finite_le
from suite.cluster.emulate import unavailable_reason
from suite.cluster.launch import cluster_pool
from suite.cluster.spec import parse_cluster

_REASON = unavailable_reason()


def test_probes_and_calibration_on_an_emulated_2x2():
    if _REASON:
        print(f"SKIP emulated cluster: {_REASON}", file=sys.stderr)
        pytest.skip(f"emulated cluster unavailable: {_REASON}")
    spec = parse_cluster("2x2:inter=100mbit")
    n = 1_000_000
    with cluster_pool(spec, timeout=120, pg_timeout=60, start_timeout=120, num_threads=1) as (_, pool):
        errs = pool.run(check_two_level, {"ranks_per_node": 2})
        assert all(finite_le(e, 0.0) for e in errs), errs
        res = pool.run(timed_allreduce,
                       {"sizes": [n], "variants": ["flat"], "rounds": 3, "warmup": 1, "ranks_per_node": 2})
        per_round = [max(r[f"flat/{n}"][i] for r in res) for i in range(3)]
        measured = sorted(per_round)[1]
        # hand calculation: 2·3/4 · 1e6 B / (12.5e6 B/s · 1448/1514) = 0.1255 s
        predicted = cm.ring_allreduce(n, cm.from_spec(spec, inter_lat=0.0))
        assert abs(predicted - 0.1255) < 0.001
        ratio = measured / predicted
        assert math.isfinite(ratio) and 0.5 <= ratio <= 2.0, (measured, predicted)
        # the calibration on the same ranks, a few small sizes: every term finite, and the model built from
        # them gives back the flat allreduces it was fitted on
        sizes = {"allreduce": [4096, 65536], "broadcast": [1024], "intra": [65536, 262144], "hier": [65536, 262144]}
        cal = calibrate_on_pool(pool, spec, sizes=sizes, iters=2, rounds=1)
        assert [r["kind"] for r in cal.rows] == ["allreduce"] * 2 + ["broadcast"] + ["intra"] * 2 + ["hier"] * 2
        for name in ("intra_lat", "intra_bw", "cpu_per_byte", "cpu_per_byte_hier"):
            assert math.isfinite(getattr(cal, name)) and getattr(cal, name) >= 0, (name, cal)
        assert cal.intra_bw > 0 and len(cal.alpha_table) == 2 and len(cal.bcast_table) == 1
        model = cal.cluster_model()
        for r in cal.rows[:2]:
            fitted = cm.ring_allreduce(r["bytes"], model)
            assert math.isfinite(fitted) and fitted >= r["seconds"] * (1 - 1e-9), (r, fitted)  # alpha floored at 0
