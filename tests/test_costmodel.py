"""The cost formulas against hand calculations, and the bucket simulation on synthetic profiles
whose answers are known (no overlap possible, perfect overlap, one slow bucket, shared links)."""
from __future__ import annotations

import math

import pytest

from suite.cluster import costmodel as cm
from suite.cluster.simulate import (
    Bucket,
    ParamGrad,
    Profile,
    Setting,
    make_buckets,
    predict_step,
    predict_table,
    simulate_comm,
)
from suite.cluster.spec import parse_cluster

B = 1e8  # bytes/s: 100 MB/s node links makes the hand calculations easy
N_BYTES = 1e8


def close(a, b, tol=1e-9):
    return math.isfinite(a) and abs(a - b) <= tol * max(1.0, abs(b))


def test_ring_allreduce_hand_calculations():
    # 2x2, inter-node link the bottleneck: 2(p-1)/p · n / B = 2·3/4 · 1e8/1e8 = 1.5 s
    assert close(cm.ring_allreduce(N_BYTES, cm.Cluster(2, 2, B)), 1.5)
    # 2x4: 2·7/8 = 1.75 s
    assert close(cm.ring_allreduce(N_BYTES, cm.Cluster(2, 4, B)), 1.75)
    # latency: 2(p-1) = 6 steps of (1 ms + 0.25 s)
    assert close(cm.ring_allreduce(N_BYTES, cm.Cluster(2, 2, B, inter_lat=1e-3)), 6 * (1e-3 + 0.25))
    # one node of 4 at 1 GB/s per pair: 6 · 2.5e7/1e9 = 0.15 s; a shared 1 GB/s bus: 4 edges at once, 0.6 s
    assert close(cm.ring_allreduce(N_BYTES, cm.Cluster(1, 4, B, intra_bw=1e9)), 0.15)
    assert close(cm.ring_allreduce(N_BYTES, cm.Cluster(1, 4, B, intra_bw=1e9, intra_shared=True)), 0.6)
    # a slow intra link becomes the bottleneck of the flat ring: 6 · (2.5e7 / 5e7) = 3 s
    assert close(cm.ring_allreduce(N_BYTES, cm.Cluster(2, 2, B, intra_bw=5e7)), 3.0)
    assert cm.ring_allreduce(N_BYTES, cm.Cluster(1, 1, B)) == 0.0


def test_hierarchical_hand_calculations_and_bounds():
    # inter phase: 2(N-1) · (n/N)/B = 2 · 0.5 = 1.0 s whatever R is
    assert close(cm.hierarchical_allreduce(N_BYTES, cm.Cluster(2, 2, B))["total"], 1.0)
    assert close(cm.hierarchical_allreduce(N_BYTES, cm.Cluster(2, 4, B))["total"], 1.0)
    # with 1 GB/s intra pairs, R=2: reduce-scatter 1 step of n/2 = 0.05 s, allgather the same
    h = cm.hierarchical_allreduce(N_BYTES, cm.Cluster(2, 2, B, intra_bw=1e9))
    assert close(h["reduce_scatter"], 0.05) and close(h["allgather"], 0.05) and close(h["inter_allreduce"], 1.0)
    assert close(h["total"], 1.1)
    # Paddle's reduce/broadcast variant: reduce and broadcast each n/B_intra = 0.1 s
    rb = cm.hierarchical_allreduce_reduce_bcast(N_BYTES, cm.Cluster(2, 2, B, intra_bw=1e9))
    assert close(rb["reduce"], 0.1) and close(rb["broadcast"], 0.1) and close(rb["total"], 1.2)
    # 4 nodes: 2·3 · (n/4)/B = 1.5 s
    assert close(cm.hierarchical_allreduce(N_BYTES, cm.Cluster(4, 2, B))["total"], 1.5)
    # the bounds
    assert close(cm.hierarchical_speedup_bound(cm.Cluster(2, 2, B)), 1.5)
    assert close(cm.hierarchical_speedup_bound(cm.Cluster(2, 4, B)), 1.75)
    assert close(cm.ring_allreduce(N_BYTES, cm.Cluster(2, 4, B)) / cm.allreduce(N_BYTES, cm.Cluster(2, 4, B), True),
                 1.75)


def test_broadcast_allgather_and_tcp_efficiency():
    # broadcast: the chain crosses each node link once: n/B = 1 s, plus (p-1) latencies
    assert close(cm.broadcast(N_BYTES, cm.Cluster(2, 2, B)), 1.0)
    assert close(cm.broadcast(N_BYTES, cm.Cluster(2, 2, B, inter_lat=1e-3)), 1.0 + 3e-3)
    # allgather of an n-byte output over 4 ranks: 3 steps of n/4 = 0.75 s
    assert close(cm.allgather(N_BYTES, cm.Cluster(2, 2, B)), 0.75)
    assert close(cm.reduce_scatter(N_BYTES, cm.Cluster(2, 2, B)), 0.75)
    assert close(cm.tcp_payload_efficiency(1500), 1448 / 1514)
    c = cm.from_spec(parse_cluster("2x2:inter=200mbit"), inter_lat=0.0)
    assert close(c.inter_bw, 25e6 * 1448 / 1514)
    assert cm.from_spec(parse_cluster("2x2:inter=200mbit,intra=1gbit")).intra_shared


def test_cluster_rejects_bad_values():
    with pytest.raises(ValueError, match="nodes=0"):
        cm.Cluster(0, 2, B)
    with pytest.raises(ValueError, match="inter_bw=-1"):
        cm.Cluster(2, 2, -1)
    with pytest.raises(ValueError, match="variant='x'"):
        cm.allreduce(1.0, cm.Cluster(2, 2, B), hierarchical=True, variant="x")


# ---- bucket simulation -----------------------------------------------------------------
C22 = cm.Cluster(2, 2, B)  # an allreduce of n bytes costs 1.5 n / 1e8 s, no latency


def _profile(params, f=0.1, b=0.2, o=0.05):
    return Profile(f, b, o, tuple(ParamGrad(f"p{i}", int(n), t) for i, (n, t) in enumerate(params)),
                   per_rank_batch=8)


def test_make_buckets_in_ready_order_with_cap():
    ps = [ParamGrad("a", 3 * 2**20, 0.3), ParamGrad("b", 2**20, 0.1), ParamGrad("c", 2**20, 0.2),
          ParamGrad("d", 5 * 2**20, 0.4)]
    bs = make_buckets(ps, 2.0)
    assert [b.names for b in bs] == [("b", "c"), ("a",), ("d",)]
    assert [b.ready_s for b in bs] == [0.2, 0.3, 0.4]
    assert [b.nbytes for b in make_buckets(ps, None)] == [2**20, 2**20, 3 * 2**20, 5 * 2**20]


def test_no_overlap_possible():
    # every gradient is ready only when backward ends: overlap cannot hide anything
    prof = _profile([(1e8, 0.2), (1e8, 0.2)])
    for k in (1, 2):  # two communicators share the link: no gain without latency to hide
        r = predict_step(prof, C22, Setting("o", bucket_mb=None, overlap=True, comm_num=k))
        assert close(r["step_s"], 0.1 + 0.2 + 3.0 + 0.05), (k, r)
    r = predict_step(prof, C22, Setting("s", bucket_mb=None, overlap=False))
    assert close(r["step_s"], 3.35)
    assert close(r["scaling_efficiency"], 0.35 / 3.35)
    assert close(r["throughput"], 4 * 8 / 3.35)


def test_perfect_overlap():
    # small buckets ready early in a long backward: communication is hidden entirely
    prof = _profile([(1e6, 0.0), (1e6, 0.05), (1e6, 0.1)], b=0.5)
    r = predict_step(prof, C22, Setting("o", bucket_mb=None, overlap=True))
    assert close(r["step_s"], 0.1 + 0.5 + 0.05) and close(r["scaling_efficiency"], 1.0)
    assert close(r["comm_alone_s"], 3 * 0.015)
    r = predict_step(prof, C22, Setting("s", bucket_mb=None, overlap=False))
    assert close(r["step_s"], 0.65 + 0.045)


def test_one_slow_bucket():
    # the last bucket (1e8 bytes, ready at the end of backward) alone sets the step
    prof = _profile([(1e6, 0.05), (1e8, 0.2)])
    r = predict_step(prof, C22, Setting("o", bucket_mb=None, overlap=True))
    assert close(r["step_s"], 0.1 + 0.2 + 1.5 + 0.05), r
    # a slow bucket early in backward: hidden up to backward's end
    prof = _profile([(1e7, 0.0), (1e6, 0.2)], b=0.2)  # 0.15 s of comm from t=0, backward 0.2 s
    r = predict_step(prof, C22, Setting("o", bucket_mb=None, overlap=True))
    assert close(r["step_s"], 0.1 + 0.2 + 0.015 + 0.05), r


def test_communicators_hide_latency_and_share_bandwidth():
    cl = C22.with_(inter_lat=0.01)  # latency part of one allreduce: 6 · 0.01 = 0.06 s
    bs = [Bucket(int(1e8), 0.0), Bucket(int(1e8), 0.0)]
    one = simulate_comm(bs, cl, comm_num=1)
    two = simulate_comm(bs, cl, comm_num=2)
    assert close(one, 2 * (0.06 + 1.5))
    assert close(two, 0.06 + 3.0)  # latencies at once, then the link shared
    assert close(simulate_comm(bs, cl, serial=True, start_s=1.0), 1.0 + 3.12)
    # unequal buckets at once on two communicators: the small one (0.3 s alone) ends at 0.6 s at
    # half rate, the big one (1.5 s alone) has 1.2 s left and ends at 1.8 s: the link never idles
    uneven = [Bucket(int(1e8), 0.0), Bucket(int(2e7), 0.0)]
    assert close(simulate_comm(uneven, C22, comm_num=2), 1.8)
    assert close(simulate_comm(uneven, C22, comm_num=1), 1.8)


def test_hierarchical_and_local_sgd_settings():
    prof = _profile([(1e8, 0.2)])
    flat = predict_step(prof, C22, Setting("f", bucket_mb=None, overlap=True))
    hier = predict_step(prof, C22, Setting("h", bucket_mb=None, overlap=True, hierarchical=True))
    assert close(flat["step_s"], 0.3 + 1.5 + 0.05) and close(hier["step_s"], 0.3 + 1.0 + 0.05)
    lsgd = predict_step(prof, C22, Setting("l", bucket_mb=None, overlap=False, local_sgd_k=4))
    assert close(lsgd["step_s"], 0.35 + 1.5 / 4)
    table = predict_table(prof, C22)
    assert table.count("\n") == 2 + 5 and "Local SGD k=4" in table


def test_profile_round_trip_and_errors():
    prof = _profile([(10, 0.1)])
    assert Profile.from_dict(prof.to_dict()) == prof
    bad = prof.to_dict()
    del bad["backward_s"]
    with pytest.raises(ValueError, match="'backward_s' is missing"):
        Profile.from_dict(bad)


def test_predict_cli_from_profile(tmp_path, capsys):
    import json

    from suite.cli.main import main

    prof = _profile([(1e8, 0.2), (1e6, 0.1)])
    path = tmp_path / "p.json"
    path.write_text(json.dumps(prof.to_dict()))
    assert main(["predict", "--cluster", "2x2:inter=800mbit", "--profile", str(path), "--inter-lat", "0",
                 "--intra-lat", "0", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    plain = rows[0]
    # 800 Mbit/s = 1e8 B/s: per-parameter allreduces after backward: 1.5 s + 0.015 s
    assert plain["buckets"] == 2 and close(plain["step_s"], 0.35 + 1.515)
    assert main(["predict", "--cluster", "512x8:inter=400gbit,intra=2000gbit", "--profile", str(path)]) == 0
    assert "| setting |" in capsys.readouterr().out
    assert main(["predict", "--cluster", "2x2:inter=1kbit", "--profile", str(path)]) == 2
    assert "inter='1kbit'" in capsys.readouterr().err
