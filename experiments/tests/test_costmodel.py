"""The cost formulas against hand calculations, and the bucket simulation on synthetic profiles
whose answers are known (no overlap possible, perfect overlap, one slow bucket, shared links)."""
from __future__ import annotations

import json
import math

import pytest

from experiments.costmodel import costmodel as cm
from experiments.costmodel.simulate import Bucket, ParamGrad, Profile, make_buckets, predict_table, simulate_comm
from experiments.costmodel.simulate import predict_step as _predict_step
from suite.cluster.spec import parse_cluster
from suite.config import StrategyConfig

PLAIN = StrategyConfig()
OVERLAP = StrategyConfig(sync_nccl_allreduce=False)  # fusion off: one allreduce per parameter, overlapped
REGISTRY = ["plain", "fusion", "overlap", "multicomm", "hierarchical", "local_sgd"]

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


def predict_step(prof, cluster, config):  # the tests below list their gradients in ready order
    return _predict_step(prof, cluster, config, order="ready")


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
        r = predict_step(prof, C22, OVERLAP.replace(nccl_comm_num=k))
        assert close(r["step_s"], 0.1 + 0.2 + 3.0 + 0.05), (k, r)
    r = predict_step(prof, C22, PLAIN)
    assert close(r["step_s"], 3.35)
    assert close(r["scaling_efficiency"], 0.35 / 3.35)
    assert close(r["throughput"], 4 * 8 / 3.35)


def test_perfect_overlap():
    # small buckets ready early in a long backward: communication is hidden entirely
    prof = _profile([(1e6, 0.0), (1e6, 0.05), (1e6, 0.1)], b=0.5)
    r = predict_step(prof, C22, OVERLAP)
    assert close(r["step_s"], 0.1 + 0.5 + 0.05) and close(r["scaling_efficiency"], 1.0)
    assert close(r["comm_alone_s"], 3 * 0.015)
    r = predict_step(prof, C22, PLAIN)
    assert close(r["step_s"], 0.65 + 0.045)


def test_one_slow_bucket():
    # the last bucket (1e8 bytes, ready at the end of backward) alone sets the step
    prof = _profile([(1e6, 0.05), (1e8, 0.2)])
    r = predict_step(prof, C22, OVERLAP)
    assert close(r["step_s"], 0.1 + 0.2 + 1.5 + 0.05), r
    # a slow bucket early in backward: hidden up to backward's end
    prof = _profile([(1e7, 0.0), (1e6, 0.2)], b=0.2)  # 0.15 s of comm from t=0, backward 0.2 s
    r = predict_step(prof, C22, OVERLAP)
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
    flat = predict_step(prof, C22, OVERLAP)
    hier = predict_step(prof, C22, OVERLAP.replace(use_hierarchical_allreduce=True))
    assert close(flat["step_s"], 0.3 + 1.5 + 0.05) and close(hier["step_s"], 0.3 + 1.0 + 0.05)
    lsgd = predict_step(prof, C22, PLAIN.replace(use_local_sgd=True, local_sgd_steps=4))
    assert close(lsgd["step_s"], 0.35 + 1.5 / 4)
    table = predict_table(prof, C22)
    assert table.count("\n") == 2 + 5 and [line.split(" | ")[0][2:] for line in table.splitlines()[2:]] == REGISTRY


def test_profile_round_trip_and_errors():
    prof = _profile([(10, 0.1)])
    assert Profile.from_dict(prof.to_dict()) == prof
    bad = prof.to_dict()
    del bad["backward_s"]
    with pytest.raises(ValueError, match="'backward_s' is missing"):
        Profile.from_dict(bad)


def test_predict_cli_from_profile(tmp_path, capsys):
    import json

    from experiments.costmodel.cli import main

    prof = _profile([(1e8, 0.2), (1e6, 0.1)])
    path = tmp_path / "p.json"
    path.write_text(json.dumps(prof.to_dict()))
    assert main(["predict", "--cluster", "2x2:inter=800mbit", "--profile", str(path), "--inter-lat", "0",
                 "--intra-lat", "0", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["setting"] for r in rows] == REGISTRY  # the registry's variants, by name
    plain = rows[0]
    # 800 Mbit/s = 1e8 B/s: per-parameter allreduces after backward: 1.5 s + 0.015 s
    assert plain["buckets"] == 2 and close(plain["step_s"], 0.35 + 1.515)
    assert main(["predict", "--cluster", "512x8:inter=400gbit,intra=2000gbit", "--profile", str(path)]) == 0
    assert "| setting |" in capsys.readouterr().out
    assert main(["predict", "--cluster", "2x2:inter=1kbit", "--profile", str(path)]) == 2
    assert "inter='1kbit'" in capsys.readouterr().err


# ---- calibrated terms (experiments.costmodel.calibrate) ----------------------------------------------
def test_latency_table_interpolates_in_log_size_and_splits_latency_from_bytes():
    cl = cm.Cluster(2, 2, B, alpha_table=((1e3, 1e-3), (1e6, 0.0)))
    assert close(cm.step_alpha(cl, 1e3), 1e-3) and close(cm.step_alpha(cl, 1e6), 0.0)
    assert close(cm.step_alpha(cl, math.sqrt(1e9)), 0.5e-3)  # halfway in log size
    assert close(cm.step_alpha(cl, 10.0), 1e-3) and close(cm.step_alpha(cl, 1e9), 0.0)  # held beyond the ends
    # 4 kB over 4 ranks: 6 steps of 1 kB, each alpha(1 kB) + 1e3/B
    assert close(cm.ring_allreduce(4e3, cl), 6 * (1e-3 + 1e-5))
    lat, bw = cm.latency_bandwidth_split(4e3, cl)
    assert close(lat, 6e-3) and close(bw, 6e-5)
    # a large bucket carries no latency part: the old split (alpha at n -> 0) would have charged 6 ms
    lat, bw = cm.latency_bandwidth_split(4e9, cl)
    assert close(lat, 0.0) and close(bw, 1.5 * 4e9 / B)


def test_intra_node_terms_and_tree_broadcast():
    cl = cm.Cluster(2, 2, B, intra_bw=1e9, intra_lat=1e-3)
    h = cm.hierarchical_allreduce(N_BYTES, cl)
    # one intra step of n/2 = 5e7 bytes at 1e9 B/s plus its alpha, before and after the inter phase (1.0 s)
    assert close(h["reduce_scatter"], 1e-3 + 0.05) and close(h["total"], 2 * 0.051 + 1.0)
    tree = cl.with_(bcast_tree=True, bcast_table=((1e3, 2e-3),))
    assert close(cm.broadcast(1e3, tree), 2 * 2e-3 + 1e3 / B)  # ceil(log2 4) = 2 steps
    assert close(cm.broadcast(1e3, tree.with_(nodes=4)), 3 * 2e-3 + 1e3 / B)  # 8 ranks: 3 steps


def _synthetic_rows(spec, alpha, bcast_alpha, intra_lat, intra_bw, cpu):
    """Micro-benchmark rows that a cluster with these terms would give (what fit must recover)."""
    inter_bw = spec.inter_bps / 8 * cm.tcp_payload_efficiency()
    p, R = spec.world_size, spec.ranks_per_node
    rows = []
    for n in (1024, 65536, 1 << 20, 1 << 24):
        m = n / p
        rows.append({"kind": "allreduce", "bytes": n, "seconds": 2 * (p - 1) * (alpha(m) + m / inter_bw),
                     "cpu_seconds": 1e-4 + cpu * n})
    for n in (1024, 8192):
        rows.append({"kind": "broadcast", "bytes": n, "seconds": 2 * bcast_alpha + n / inter_bw, "cpu_seconds": 0.0})
    for n in (1 << 18, 1 << 20, 1 << 22):
        rows.append({"kind": "intra", "bytes": n, "seconds": 2 * (R - 1) * (intra_lat + n / R / intra_bw),
                     "cpu_seconds": 0.0})
        rows.append({"kind": "hier", "bytes": n, "seconds": 1.0, "cpu_seconds": 2e-4 + 2 * cpu * n})
    return rows


def test_fit_recovers_the_terms_that_made_the_rows():
    from experiments.costmodel.calibrate import Calibration, fit

    spec = parse_cluster("2x2:inter=800mbit")

    def alpha(m):
        return 1e-3 if m < 1e4 else 2e-4

    rows = _synthetic_rows(spec, alpha, 5e-4, 3e-4, 2e8, 2e-9)
    cal = fit(spec, rows, cores=2)
    assert close(cal.intra_lat, 3e-4, 1e-6) and close(cal.intra_bw, 2e8, 1e-6)
    assert [round(m) for m, _ in cal.alpha_table] == [256, 16384, 262144, 4194304]
    assert all(close(a, alpha(m), 1e-6) for m, a in cal.alpha_table)
    assert all(close(a, 5e-4, 1e-6) for _, a in cal.bcast_table)
    assert close(cal.cpu_per_byte, 2e-9, 1e-6) and close(cal.cpu_per_byte_hier, 4e-9, 1e-6)
    # the model built from the terms gives back the flat allreduces it was fitted on
    model = cal.cluster_model()
    for r in rows:
        if r["kind"] == "allreduce":
            assert close(cm.ring_allreduce(r["bytes"], model), r["seconds"], 1e-6), r
    # JSON round trip; a damaged file is refused with the field named
    back = Calibration.from_dict(json.loads(cal.to_json()))
    assert back.cluster_model() == model
    bad = json.loads(cal.to_json())
    bad["intra_bw"] = -1
    with pytest.raises(ValueError, match="intra_bw"):
        Calibration.from_dict(bad)
    del bad["alpha_table"]
    with pytest.raises(ValueError, match="alpha_table"):
        Calibration.from_dict(bad)
    with pytest.raises(ValueError, match="finite"):
        fit(spec, [{**rows[0], "seconds": math.nan}])


def test_one_bucket_planner_for_the_engine_and_the_cost_model(monkeypatch):
    """The engine (plan_buckets) and the cost model (a profile of the same parameters) plan through the one
    function suite.comm.buckets.plan and get the same buckets; the cost model's ready times are the running
    maximum (a bucket is launched after the one before)."""
    from experiments.costmodel.simulate import engine_buckets
    from suite.comm import buckets
    from suite.comm.grad_sync import trainable_params
    from suite.models import get_model

    calls: list = []
    real = buckets.plan

    def spy(grads, *args):
        calls.append([(n, layer) for n, layer, _ in grads])
        return real(grads, *args)

    monkeypatch.setattr(buckets, "plan", spy)
    for model, cap_mb, cap_layers in (("resnet", 0.01, 50), ("resnet", 16.0, 3), ("mlp", 4.0, 50)):
        module = get_model(model, "cpu").build()
        named = trainable_params(module)
        calls.clear()
        plans = buckets.plan_buckets(named, buckets.param_owners(module), True, cap_mb, cap_layers)
        params = [ParamGrad(n, p.numel() * 4, 0.001 * (len(named) - i)) for i, (n, p) in enumerate(named)]
        got = engine_buckets(params, cap_mb, cap_layers)
        assert len(calls) == 2 and calls[0] == calls[1], model  # both through plan, with the same gradients
        assert [b.names for b in got] == [tuple(named[i][0] for i in pl.members) for pl in plans], model
        assert [b.nbytes for b in got] == [pl.nbytes for pl in plans]
        assert len(plans) > 1 and [b.ready_s for b in got] == sorted(b.ready_s for b in got)
        prof = Profile(0.01, 0.03, 0.005, tuple(params))
        calls.clear()
        _predict_step(prof, C22, StrategyConfig(fuse_all_reduce_ops=True, fuse_grad_size_in_MB=cap_mb,
                                                fuse_grad_size_in_layers=cap_layers))
        assert len(calls) == 1  # predict_step plans through it too


def test_one_list_of_settings_the_registrys():
    """predict, its table and the extrapolation take the registry's variants (by name, with their configs) from
    one list; no module keeps a vocabulary of its own."""
    from experiments.costmodel import extrapolate, predict, simulate
    from suite.cases import VARIANTS

    registry = {v.name: StrategyConfig.from_dict(v.config) for v in VARIANTS}
    got = simulate.registry_settings()
    assert [n for n, _ in got] == REGISTRY and all(cfg == registry[n] for n, cfg in got)
    sized = dict(simulate.registry_settings(8.0, 6))
    assert sized["multicomm"] == registry["multicomm"].replace(fuse_grad_size_in_MB=8.0)
    assert sized["local_sgd"] == registry["local_sgd"].replace(local_sgd_steps=6)
    assert sized["plain"] == registry["plain"]
    assert [n.split(" ")[0] for n, _ in extrapolate.SETTINGS] == ["fusion", "multicomm", "hierarchical", "local_sgd"]
    assert extrapolate.SETTINGS[1][1] == registry["multicomm"].replace(fuse_grad_size_in_MB=32.0)
    for gone in ("Setting", "DEFAULT_SETTINGS"):
        assert not hasattr(simulate, gone), gone
    assert not hasattr(predict, "settings")
    with pytest.raises(ValueError, match="data_parallel='ddp'"):
        _predict_step(_profile([(10, 0.1)]), C22, registry["ddp"], "ddp")


def test_contention_stretches_overlapped_backward_only_on_shared_cores():
    prof = _profile([(1e8, 0.0)], f=0.1, b=2.0, o=0.05)  # 1.5 s allreduce from t=0, inside a 2 s backward
    cl = C22.with_(cpu_per_byte=1e-9)  # 0.1 CPU s per rank for 1e8 bytes
    ov = OVERLAP
    assert close(predict_step(prof, cl, ov)["step_s"], 2.15)  # cores = inf: communication has its own
    r = predict_step(prof, cl.with_(cores=2.0), ov)
    # 4 ranks fill 2 cores: their 4 x 0.1 CPU s are shared by 2 cores: backward 0.2 s longer
    assert close(r["contention_s"], 0.2) and close(r["step_s"], 2.35)
    # 8 cores for 4 ranks: the spare cores absorb it
    assert close(predict_step(prof, cl.with_(cores=8.0), ov)["contention_s"], 0.0)
    # communication after backward (no overlap) competes with nothing
    sync = predict_step(prof, cl.with_(cores=2.0), PLAIN)
    assert close(sync["contention_s"], 0.0) and close(sync["step_s"], 2.15 + 1.5)


def test_local_sgd_averages_parameters_in_registration_chunks_without_buffers():
    from experiments.costmodel.simulate import average_chunks

    ps = [ParamGrad("a", 3 * 2**20, 0.3), ParamGrad("b", 2**20, 0.1), ParamGrad("c", 2**20, 0.2)]
    assert [c.names for c in average_chunks(ps, 2.0)] == [("a",), ("b", "c")]
    assert [c.names for c in average_chunks(ps, None)] == [("a",), ("b",), ("c",)]
    prof = Profile(0.1, 0.2, 0.05, (ParamGrad("w", int(1e8), 0.2),), buffers=(10**6,))
    k4 = PLAIN.replace(use_local_sgd=True, local_sgd_steps=4)
    assert close(_predict_step(prof, C22, k4)["step_s"], 0.35 + 1.5 / 4)  # no buffer broadcast between averagings
    assert close(_predict_step(prof, C22, PLAIN)["step_s"], 0.35 + 1.5 + cm.broadcast(1e6, C22))


def test_calibrate_and_predict_calibration_refuse_bad_use(tmp_path, capsys):
    from experiments.costmodel.calibrate import fit
    from experiments.costmodel.cli import main

    with pytest.raises(SystemExit):  # argparse: --cluster is required
        main(["calibrate", "--out", str(tmp_path / "c.json")])
    assert "--cluster" in capsys.readouterr().err
    spec = parse_cluster("2x2:inter=800mbit")
    cal = fit(spec, _synthetic_rows(spec, lambda m: 1e-3, 5e-4, 3e-4, 2e8, 2e-9), cores=2)
    cpath, ppath = tmp_path / "cal.json", tmp_path / "p.json"
    cpath.write_text(cal.to_json())
    ppath.write_text(json.dumps(_profile([(1e8, 0.2), (1e6, 0.1)]).to_dict()))
    assert main(["predict", "--cluster", "2x4:inter=800mbit", "--profile", str(ppath), "--calibration",
                 str(cpath)]) == 2
    assert "fitted on 2x2:inter=800mbit" in capsys.readouterr().err
    assert main(["predict", "--cluster", "2x2:inter=800mbit", "--profile", str(ppath), "--calibration",
                 str(cpath), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert all(math.isfinite(r["step_s"]) and r["step_s"] > 0.35 for r in rows)


def test_gloo_lanes_let_one_communicator_run_two_collectives_at_once():
    cl = C22.with_(inter_lat=0.01, async_lanes=2)  # latency part 0.06 s, bandwidth part 1.5 s each
    bs = [Bucket(int(1e8), 0.0), Bucket(int(1e8), 0.0)]
    assert close(simulate_comm(bs, cl, comm_num=1), 0.06 + 3.0)  # both in flight: latencies overlap
    assert close(simulate_comm(bs, cl.with_(async_lanes=1), comm_num=1), 2 * 1.56)
    # the two-level chain runs on one thread per communicator: one at a time whatever the lanes
    h = cm.allreduce(1e8, cl, hierarchical=True)
    assert close(simulate_comm(bs, cl, comm_num=1, hierarchical=True), 2 * h)
    with pytest.raises(ValueError, match="async_lanes"):
        cm.Cluster(2, 2, B, async_lanes=0)


def test_one_noisy_small_size_does_not_bend_the_small_message_latency():
    from experiments.costmodel.calibrate import fit

    spec = parse_cluster("2x2:inter=800mbit")
    bw = 1e8 * cm.tcp_payload_efficiency()
    rows = [{"kind": "allreduce", "bytes": n, "seconds": 6 * (a + n / 4 / bw), "cpu_seconds": 0.0}
            for n, a in ((1024, 3e-3), (4096, 1e-3), (16384, 1.1e-3))]  # wire time: under 10% of each
    cal = fit(spec, rows, cores=2)
    assert all(close(a, 1.1e-3, 1e-6) for _, a in cal.alpha_table)  # the median of the three, for all three


def test_cluster_figure_renders_kept_measurements_with_the_current_model():
    """The figure's measurements are plain data; rendering re-fits the kept micro-benchmark rows, predicts
    every setting, and lists each row outside 15% with the noise measured alongside it."""
    from experiments.costmodel import figure as fig

    spec = parse_cluster("2x2:inter=800mbit")
    rows = _synthetic_rows(spec, lambda m: 1e-3, 5e-4, 3e-4, 2e8, 2e-9)
    prof = Profile(0.01, 0.03, 0.005, tuple(ParamGrad(f"l{i}.weight", 2**20, 0.003 * (10 - i)) for i in range(10)),
                   per_rank_batch=16, buffers=(4096,))
    raw = {"rounds": 3, "steps": 4, "hier": [], "comm": [],
           "calibrations": {str(spec): {"cluster": str(spec), "rows": rows, "cores": 2, "load": [1.0, 1.2]}},
           "profiles": {"2x2/mlp": {"batch": 16, "profile": prof.to_dict()}},
           "runs": [{"model": "mlp", "shape": "2x2", "cluster": str(spec), "setting": name, "batch": 16,
                     "measured": [1.0], "compute": [0.09, 0.1, 0.11], "load": [1.0, 1.5]}
                    for name, _, _ in fig.strategy_variants(2)]}
    predicted = [r.predicted_s for r in fig.prediction_rows(raw)]
    assert all(math.isfinite(p) and p > 0.1 for p in predicted)
    for run, p in zip(raw["runs"], predicted):
        run["measured"] = [p * 1.05] * 3
    raw["runs"][0]["measured"] = [predicted[0] * 1.5] * 3
    text = fig.render(raw)
    assert "**5 of 6 rows within 15%**" in text
    assert "- mlp 2x2 800 Mbit/s, plain: -33%; the no-communication windows timed with it vary by 20%" in text
    assert "**EXTRAPOLATION**" in text and "| 2x2:inter=800mbit | 1000 |" in text


def test_cluster_figure_rechecks_the_misses_and_says_whether_they_repeat():
    """Rows outside 15% are re-measured in fresh ranks (kept as data like the rest); the figure says per miss
    whether the re-measurements repeat it, and for a latency-bound row what share of the charged latency the
    measured step leaves."""
    from experiments.costmodel import figure as fig

    spec = parse_cluster("2x2:inter=800mbit")
    rows = _synthetic_rows(spec, lambda m: 1e-3, 5e-4, 3e-4, 2e8, 2e-9)
    prof = Profile(0.01, 0.03, 0.005, tuple(ParamGrad(f"l{i}.weight", 2**20, 0.003 * (10 - i)) for i in range(10)),
                   per_rank_batch=16, buffers=(4096,))
    cal = {"cluster": str(spec), "rows": rows, "cores": 2, "load": [1.0, 1.2]}
    runs = [{"model": "mlp", "shape": "2x2", "cluster": str(spec), "setting": name, "batch": 16,
             "measured": [1.0], "compute": [0.1, 0.1, 0.1], "load": [1.0, 1.5]}
            for name, _, _ in fig.strategy_variants(2)]
    raw = {"rounds": 3, "steps": 4, "hier": [], "comm": [], "calibrations": {str(spec): cal},
           "profiles": {"2x2/mlp": {"batch": 16, "profile": prof.to_dict()}}, "runs": runs}
    predicted = [r.predicted_s for r in fig.prediction_rows(raw)]
    for run, p in zip(runs, predicted):
        run["measured"] = [p] * 3
    runs[0]["measured"] = [predicted[0] * 1.5] * 3  # plain: a -33% miss
    assert fig.to_recheck(raw) == [("mlp", str(spec))]
    again = [dict(run, measured=[p * 1.02] * 3) for run, p in zip(runs, predicted)]
    raw["rechecks"] = [{"model": "mlp", "cluster": str(spec), "repeat": 1, "calibration": cal, "runs": again}]
    text = fig.render(raw)
    assert "measured again 1 time(s) in fresh ranks with fresh calibrations: -2% (within 15% every time: the miss " \
           "is the first measurement's, it does not repeat)" in text, text
    assert "| mlp | 2x2 | 800 | plain | again 1 |" in text and "6 of 6 rows within 15%" in text
    # the latency share the measured step leaves: (measured - prediction without latency) / latency charged
    row = fig.PredRow("m", "2x4", 100, "plain", 16, 0.05, [0.5], 0.6, 0.0, [0.05], [], latency_s=0.5)
    assert row.latency_bound and close(row.latency_used, 0.8, 1e-12)


def test_the_calibrations_blocks_run_on_real_ranks_through_timed_block(pool2):
    """calibration_on_rank on world 2 without a cluster (one node of 2 ranks: the allreduce and broadcast rows):
    each row's seconds and CPU seconds per call, one of each per round, through suite.runtime.device.timed_block
    (no timing asserted: finite and positive)."""
    from experiments.costmodel.calibrate import calibration_on_rank

    got = pool2.run(calibration_on_rank, {"sizes": {"allreduce": [4096], "broadcast": [1024]}, "ranks_per_node": 2,
                                          "iters": 2, "rounds": 3, "warmup": 1})
    for answer in got:
        assert [r["kind"] for r in answer["rows"]] == ["allreduce", "broadcast"]
        for r in answer["rows"]:
            assert len(r["seconds"]) == len(r["cpu_seconds"]) == 3, r
            assert all(math.isfinite(x) and x > 0 for x in r["seconds"]) and all(x >= 0 for x in r["cpu_seconds"])


def test_cluster_figure_options_are_checked_before_anything_runs(capsys):
    """(moved from tests/test_figures.py) a bad model or rate is refused when the options are built, before any
    cluster comes up."""
    from experiments.costmodel.cli import main

    assert main(["figure", "--models", "mlp,nope"]) == 2
    assert "figures cluster: models nope unknown; allowed: mlp, resnet, resnet50, gpt2" in capsys.readouterr().err
    assert main(["figure", "--rates", "fast"]) == 2
    assert "rate='fast': expected a number and a unit" in capsys.readouterr().err
