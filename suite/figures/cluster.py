"""Figures of the emulated cluster: the cost model checked against namespaces + tbf links.

This figure set ignores the pool it is handed: it brings up its own emulated clusters (2x2,
2x4; network namespaces, so it needs root or CAP_NET_ADMIN) with a rank pool placed in them,
changes the link rate between sections while the ranks keep running, and takes everything
down at the end.  ``args.rounds`` interleaved rounds per measurement; ``args.steps`` steps per
training window.  Environment knobs for a quick look: FLEETBENCH_CLUSTER_SIZES (bytes, comma
separated), FLEETBENCH_CLUSTER_RATES (e.g. 100mbit,1gbit), FLEETBENCH_CLUSTER_SHAPES (2x2,2x4),
FLEETBENCH_CLUSTER_MODELS (mlp,resnet).

1. Flat ring against two-level allreduce, speedup per size and rate, against the model.
   The two-level allreduce measured is the suite's (``suite.comm.hierarchical``, "scatter").
2. ``nccl_comm_num`` 1 against 2: four buckets launched at once on 1 or 2 communicators.
3. ``fleetbench predict`` against measured training steps (MLP, ResNet) on 2x2: the profile
   is measured on the same ranks without communication, the step with the engine's plain
   gradient path (and the suite's bucketed/overlap/hierarchical settings when they exist).
"""
from __future__ import annotations

import importlib.util
import os
import statistics

from ..cluster.probes import timed_allreduce
from ..cluster.profile import record_profile
from ..measure.stats import bootstrap_median_ci, paired_speedup, window_seconds
from ..measure.timing import time_on_rank
from ..workload import WorkloadSpec

DESCRIPTION = ("emulated 2x2/2x4 clusters (namespaces + tbf): flat vs hierarchical allreduce, nccl_comm_num 1 vs 2, "
               "predict vs measured (own pools; needs root)")

MB = 1_000_000
ALPHA = [1e-4]  # seconds per ring step, calibrated per cluster by _calibrate_alpha


def _calibrate_alpha(cluster, pool, rounds) -> float:
    """alpha per message step: a 4 KB flat allreduce (bytes negligible) takes 2(p-1) steps."""
    n, reps = 4096, 20
    res = pool.run(timed_allreduce,
                   {"sizes": [n], "variants": ["flat"], "rounds": rounds, "warmup": 1,
                    "ranks_per_node": cluster.spec.ranks_per_node, "buffers": reps})
    t = statistics.median(_slowest(res, f"flat/{n}")) / reps
    ALPHA[0] = t / (2 * (cluster.spec.world_size - 1))
    return ALPHA[0]


def _env_list(name: str, default: str) -> list[str]:
    return [x.strip() for x in os.environ.get(name, default).split(",") if x.strip()]


def _slowest(res: list[dict], key: str) -> list[float]:
    return [max(r[key][i] for r in res) for i in range(len(res[0][key]))]


def _fmt_ci(x: float, ci) -> str:
    return f"{x:.2f} [{ci[0]:.2f}, {ci[1]:.2f}]"


def _hier_section(cluster, pool, sizes, rates, rounds) -> list[str]:
    from ..cluster import costmodel as cm

    spec = cluster.spec
    rows = []
    for rate in rates:
        cluster.set_rates(rate)
        model = cm.from_spec(cluster.spec, inter_lat=ALPHA[0], intra_lat=ALPHA[0])
        res = pool.run(timed_allreduce,
                       {"sizes": sizes, "variants": ["flat", "hier", "intra_only"], "rounds": rounds, "warmup": 1,
                        "ranks_per_node": spec.ranks_per_node})
        for n in sizes:
            flat, hier, intra = (_slowest(res, f"{v}/{n}") for v in ("flat", "hier", "intra_only"))
            sp = paired_speedup(flat, hier)
            pred_flat = cm.ring_allreduce(n, model)
            pred_hier_net = cm.hierarchical_allreduce(n, model)["total"]  # intra phases free
            pred_hier = pred_hier_net + statistics.median(intra)  # + the measured intra phases
            pred_sp = pred_flat / pred_hier
            rows.append(
                f"| {spec.nodes}x{spec.ranks_per_node} | {cluster.spec.inter_bps / 1e6:g} | {n / MB:g} "
                f"| {statistics.median(flat) * 1e3:.1f} (model {pred_flat * 1e3:.1f}) "
                f"| {statistics.median(hier) * 1e3:.1f} (model {pred_hier * 1e3:.1f}) "
                f"| {statistics.median(intra) * 1e3:.1f} | {_fmt_ci(sp['speedup'], sp['ci'])} "
                f"| {pred_sp:.2f} | {cm.hierarchical_speedup_bound(model):.2f} "
                f"| {sp['speedup'] / pred_sp - 1:+.0%} |")
    return rows


def _comm_num_section(cluster, pool, rates, rounds, total=16 * MB, buffers=4) -> list[str]:
    from ..cluster import costmodel as cm
    from ..cluster.simulate import Bucket, simulate_comm

    spec = cluster.spec
    rows = []
    for rate in rates:
        cluster.set_rates(rate)
        model = cm.from_spec(cluster.spec, inter_lat=ALPHA[0], intra_lat=ALPHA[0])
        res = pool.run(timed_allreduce,
                       {"sizes": [total], "variants": ["flat_comm1", "flat_comm2"], "rounds": rounds, "warmup": 1,
                        "ranks_per_node": spec.ranks_per_node, "buffers": buffers})
        one, two = _slowest(res, f"flat_comm1/{total}"), _slowest(res, f"flat_comm2/{total}")
        sp = paired_speedup(one, two)
        bs = [Bucket(total // buffers, 0.0)] * buffers
        p1, p2 = simulate_comm(bs, model, comm_num=1), simulate_comm(bs, model, comm_num=2)
        rows.append(f"| {spec.nodes}x{spec.ranks_per_node} | {rate / 1e6:g} | {buffers} x {total / buffers / MB:g} "
                    f"| {statistics.median(one) * 1e3:.1f} | {statistics.median(two) * 1e3:.1f} "
                    f"| {_fmt_ci(sp['speedup'], sp['ci'])} | {p1 / p2:.2f} |")
    return rows


def _strategy_variants(ranks_per_node: int) -> list[tuple]:
    """(name, config, predict Setting) of the training variants this branch can run."""
    from ..cluster.simulate import Setting

    out: list[tuple] = [("plain", {}, Setting("plain", bucket_mb=None, overlap=False))]
    if importlib.util.find_spec("suite.comm.bucketed") is not None:
        fused = {"fuse_all_reduce_ops": True, "fuse_grad_size_in_MB": 16.0}
        out += [
            ("fused 16 MiB", fused, Setting("fused", bucket_mb=16, overlap=False)),
            ("fused+overlap, comm_num 2", {**fused, "sync_nccl_allreduce": False, "nccl_comm_num": 2},
             Setting("ov2", bucket_mb=16, overlap=True, comm_num=2)),
        ]
        if importlib.util.find_spec("suite.comm.hierarchical") is not None:
            out.append(("fused+overlap+hierarchical",
                        {**fused, "sync_nccl_allreduce": False, "nccl_comm_num": 2,
                         "use_hierarchical_allreduce": True, "hierarchical_allreduce_inter_nranks": ranks_per_node},
                        Setting("hier", bucket_mb=16, overlap=True, comm_num=2, hierarchical=True)))
    return out


def _predict_section(cluster, pool, models, rates, rounds, steps) -> tuple[list[str], list[float]]:
    from ..cluster import costmodel as cm
    from ..cluster.profile import summarize_profile
    from ..cluster.simulate import Profile, predict_step

    spec = cluster.spec
    variants = _strategy_variants(spec.ranks_per_node)
    rows, errors = [], []
    for model_name in models:
        batch = 16
        profile = Profile.from_dict(summarize_profile(
            pool.run(record_profile, {"workload_spec": WorkloadSpec(model_name, per_rank_batch=batch)})))
        for rate in rates:
            cluster.set_rates(rate)
            model = cm.from_spec(cluster.spec, inter_lat=ALPHA[0], intra_lat=ALPHA[0])
            answers = pool.run(time_on_rank,
                               {"workload_spec": WorkloadSpec(model_name, per_rank_batch=batch),
                                "variants": [{"name": n, "config": c} for n, c, _ in variants],
                                "warmup": 1, "steps": steps, "rounds": rounds})
            for name, _, setting in variants:
                per_step = [w / steps for w in window_seconds(answers, name)]
                meas = statistics.median(per_step)
                lo, hi = bootstrap_median_ci(per_step)
                pred = predict_step(profile, model, setting)["step_s"]
                err = pred / meas - 1
                errors.append(err)
                rows.append(f"| {model_name} | {spec.nodes}x{spec.ranks_per_node} | {rate / 1e6:g} | {name} "
                            f"| {profile.compute_s * 1e3:.1f} | {meas * 1e3:.1f} [{lo * 1e3:.1f}, {hi * 1e3:.1f}] "
                            f"| {pred * 1e3:.1f} | {err:+.0%} |")
    return rows, errors


def run(pool, args) -> str:
    from ..cluster.emulate import unavailable_reason
    from ..cluster.launch import cluster_pool
    from ..cluster.spec import parse_cluster, parse_rate

    reason = unavailable_reason()
    if reason:
        return f"## Emulated cluster\n\nNot measured: cannot emulate a cluster here: {reason}."
    rounds = max(3, args.rounds)
    steps = max(2, args.steps)
    sizes = [int(float(x)) for x in _env_list("FLEETBENCH_CLUSTER_SIZES", "1e6,4e6,16e6")]
    rates = [parse_rate(r) for r in _env_list("FLEETBENCH_CLUSTER_RATES", "100mbit,1gbit")]
    shapes = _env_list("FLEETBENCH_CLUSTER_SHAPES", "2x2,2x4")
    models = _env_list("FLEETBENCH_CLUSTER_MODELS", "mlp,resnet")
    timeout = getattr(args, "timeout", 1800.0)
    hier_rows, comm_rows, pred_rows, errors, alphas = [], [], [], [], []
    for shape in shapes:
        spec = parse_cluster(f"{shape}:inter={rates[0]}bit")
        with cluster_pool(spec, timeout=timeout, pg_timeout=max(120.0, timeout / 4), num_threads=1) as (cl, p):
            alphas.append(f"{shape} {_calibrate_alpha(cl, p, rounds) * 1e6:.0f} µs")
            hier_rows += _hier_section(cl, p, sizes, rates, rounds)
            comm_rows += _comm_num_section(cl, p, rates, rounds)
            if shape == shapes[0] and models:
                r, e = _predict_section(cl, p, models, rates, rounds, steps)
                pred_rows += r
                errors += e
    variants_note = ("the engine's plain gradient path only: the suite's bucketed / overlap / hierarchical "
                     "strategies are not on this branch yet, so their predictions are not validated here"
                     if importlib.util.find_spec("suite.comm.bucketed") is None else
                     "every gradient strategy this branch has")
    out = [
        "## Emulated cluster: the model against namespaces + tbf links",
        "",
        "Links are veth pairs through a switch namespace, each node's link limited by tbf in both directions "
        "(netem is absent from this kernel: no added latency). Model bandwidth = tbf rate x TCP payload "
        "efficiency (1448/1514); model alpha per message step calibrated from a 4 KB flat allreduce on the same "
        f"ranks ({', '.join(alphas)}: mostly the scheduling of more ranks than cores, not the wire). "
        f"{rounds} interleaved rounds; medians, speedups paired by round with 95% bootstrap intervals "
        "(> 1 = hierarchical / 2 communicators faster).",
        "",
        "### Flat ring against two-level allreduce",
        "",
        "'model' speedup uses the measured intra-node phases (gloo's reduce-scatter + allgather on this CPU, "
        "column 'intra phases') plus the formula's inter-node phase; 'bound' counts only the inter-node link "
        "(1.5x for 2x2, 1.75x for 2x4).",
        "",
        "| cluster | Mbit/s | MB | flat ms (model) | two-level ms (model) | intra phases ms | speedup [95% CI] "
        "| model speedup | bound | measured vs model |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        *hier_rows,
        "",
        "### nccl_comm_num 1 against 2 (four 4 MB buckets launched at once)",
        "",
        "| cluster | Mbit/s | buckets | 1 comm ms | 2 comms ms | speedup [95% CI] | model speedup |",
        "|---|---:|---:|---:|---:|---:|---:|",
        *comm_rows,
    ]
    if pred_rows:
        worst = max(abs(e) for e in errors)
        out += [
            "",
            f"### `fleetbench predict` against measured training steps ({shapes[0]})",
            "",
            f"Validated: {variants_note}. Prediction error = predicted / measured - 1; worst |error| "
            f"{worst:.0%} (aim 15%).",
            "",
            "| model | cluster | Mbit/s | setting | compute ms | measured step ms [95% CI] | predicted ms | error |",
            "|---|---|---:|---|---:|---:|---:|---:|",
            *pred_rows,
        ]
    return "\n".join(out)
