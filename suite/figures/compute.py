"""Compute fusion and fused optimizers: each fusion on/off on the ResNet (step time, bytes kept for
backward; eager and compiled), and the fused optimizer against torch's loop, foreach and fused."""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

import torch

from ..compute.fused_optim import FlatOptimizer
from ..compute.fusion import fuse_model
from ..compute.saved_bytes import measure_saved
from ..config import StrategyConfig
from ..data.synthetic import make_dataset, prepare
from ..measure.interleave import interleaved_rounds, timed_block
from ..measure.stats import bootstrap_median_ci, paired_speedup
from ..measure.summary import variant_summary
from ..measure.timing import RankTiming, time_on_rank
from ..models import get_model
from ..results.records import Stat
from ..strategies.optim import torch_optimizer
from ..workload import WorkloadSpec, workload
from . import PoolOptions

DESCRIPTION = ("compute fusion on/off on the ResNet (step time, saved-activation bytes, eager and compiled); "
               "fused optimizer vs torch loop/foreach/fused")

ALL = dict(fuse_bn_act_ops=True, fuse_elewise_add_act_ops=True, fuse_relu_depthwise_conv=True)
FUSION_VARIANTS: list[tuple[str, dict]] = [
    ("unfused", {}),
    ("bn_act", dict(fuse_bn_act_ops=True)),
    ("elewise_add_act", dict(fuse_elewise_add_act_ops=True)),
    ("relu_depthwise_conv", dict(fuse_relu_depthwise_conv=True)),
    ("all (eager)", dict(ALL)),
    ("all (compile)", dict(ALL, fusion_backend="compile")),
]


def _ms(seconds: float | None) -> str:
    return f"{seconds * 1e3:.2f}" if seconds is not None else "-"


def _fmt_ci(lo: float, hi: float, digits: int = 2) -> str:
    return f"[{lo:.{digits}f}, {hi:.{digits}f}]"


def timing_table(answers: list[RankTiming], names: list, global_batch: int, steps: int, baseline: str,
                 extra_cols=None) -> str:
    """One row per variant: median step time (ms) with IQR, throughput with a 95% CI, paired speedup."""
    extra_cols = extra_cols or {}
    head = "| variant | step time ms, median [IQR] | samples/s, median [95% CI] | speedup vs " \
           f"{baseline} [95% CI] |" + "".join(f" {c} |" for c in extra_cols) + "\n"
    head += "|---|---|---|---|" + "---|" * len(extra_cols) + "\n"
    base = variant_summary(answers, baseline, global_batch, steps)
    rows = []
    for name in names:
        s = variant_summary(answers, name, global_batch, steps)
        st = s.step_time_s if s.step_time_s is not None else Stat()
        sp = paired_speedup(base.window_s or [], s.window_s or [])
        extra = "".join(f" {fn(name, s)} |" for fn in extra_cols.values())
        (lo, hi), (sp_lo, sp_hi) = s.samples_per_s_ci or [math.nan, math.nan], sp["ci"]
        rows.append(f"| {name} | {_ms(st.median)} [{_ms(st.q25)}, {_ms(st.q75)}] | "
                    f"{s.samples_per_s:.0f} {_fmt_ci(lo, hi, 0)} | "
                    f"{sp['speedup']:.3f} {_fmt_ci(sp_lo, sp_hi, 3)} |{extra}")
    return head + "\n".join(rows)


# ---------------------------------------------------------------------------------------
# saved bytes (single process: the fusion pass and a forward under saved_tensors_hooks)
# ---------------------------------------------------------------------------------------
def saved_bytes_rows(model: str = "resnet", batch: int = 16, scale: int = 1) -> dict:
    spec = get_model(model)
    data = make_dataset(spec, batch, 0)
    x, _ = data.get(torch.arange(batch))
    x = prepare(data, x, "cpu")
    out = {}
    for name, cfg in FUSION_VARIANTS:
        if "compile" in name:
            continue  # the same autograd functions (compiled inside): the same saved tensors
        net = spec.make(0)
        report = None
        if cfg:
            net, report = fuse_model(net, bn_act=cfg.get("fuse_bn_act_ops", False),
                                     elewise_add_act=cfg.get("fuse_elewise_add_act_ops", False),
                                     relu_depthwise_conv=cfg.get("fuse_relu_depthwise_conv", False))
        def forward(net: torch.nn.Module = net) -> torch.Tensor:
            return net(x)

        _, sb = measure_saved(forward, exclude=list(net.parameters()))
        fused = sum(r["fused"] for k, r in report.items() if isinstance(r, dict) and "fused" in r) if report else 0
        out[name] = {"saved": sb.saved, "unique": sb.unique, "tensors": sb.tensors, "fused_ops": fused}
    return out


# ---------------------------------------------------------------------------------------
# optimizers (on every rank, each rank alone; rank 0 reported)
# ---------------------------------------------------------------------------------------
def optimizer_bench_on_rank(workload_spec: WorkloadSpec, rounds: int = 7, steps: int = 20) -> dict:
    wl = workload(workload_spec)  # on a GPU runner the optimizers run on the rank's GPU
    results: dict = {}
    impls = ["loop", "foreach", "fused", "flat (ours)"]
    for kind in ("sgd", "momentum", "adam"):
        cfg = StrategyConfig(optimizer=kind, weight_decay=1e-4)
        opts: dict[str, Any] = {}
        for impl in impls:
            net = wl.module()
            params = [p for p in net.parameters() if p.requires_grad]
            g = torch.Generator().manual_seed(1)
            for p in params:  # drawn on the host (the same values on any device), then moved
                p.grad = torch.randn(p.shape, generator=g, device="cpu").mul_(1e-3).to(wl.device)
            opt: torch.optim.Optimizer | FlatOptimizer
            if impl == "flat (ours)":
                opt = FlatOptimizer(params, kind, lr=cfg.lr, momentum=cfg.momentum if kind == "momentum" else 0.0,
                                    weight_decay=cfg.weight_decay)
            else:
                extra = {"loop": dict(foreach=False), "foreach": dict(foreach=True), "fused": dict(fused=True)}[impl]
                opt = torch_optimizer(params, cfg, **extra)
            for _ in range(3):
                opt.step()  # warm-up (state allocated)
            opts[impl] = opt
        # each rank alone (no barriers); the device's queued work is not counted, nor left out
        times = interleaved_rounds([opts[i] for i in impls], rounds,
                                   lambda opt: timed_block(opt.step, steps, wl.platform, "none"))
        results[kind] = dict(zip(impls, times))
    return {"results": results, "tensors": len(list(net.parameters())),
            "numel": sum(p.numel() for p in net.parameters()), "device": str(wl.device)}


def _optimizer_table(res: dict) -> str:
    lines = ["| optimizer | implementation | step µs, median [95% CI] | speedup vs loop [95% CI] |",
             "|---|---|---|---|"]
    for kind, impls in res["results"].items():
        base = impls["loop"]
        for impl, times in impls.items():
            lo, hi = bootstrap_median_ci(times)
            sp = paired_speedup(base, times)
            lines.append(f"| {kind} | {impl} | {statistics.median(times) * 1e6:.0f} [{lo * 1e6:.0f}, {hi * 1e6:.0f}] | "
                         f"{sp['speedup']:.2f} {_fmt_ci(*sp['ci'])} |")
    return "\n".join(lines)


@dataclass(frozen=True)
class Options(PoolOptions):
    """The pool's options (``PoolOptions``), nothing of its own."""


PER_RANK_BATCH = 16


def measure(options: Options, pool) -> dict:
    """Fusion on/off timed on the ranks (compute only), the bytes saved for backward (this process), and the
    optimizers on every rank, rank 0 kept (JSON-able)."""
    rounds, steps = options.rounds, options.steps
    # 1. fusion on/off: compute only (data_parallel='none'), so communication noise stays out
    variants = [{"name": n, "config": dict(c, data_parallel="none")} for n, c in FUSION_VARIANTS]
    resnet = WorkloadSpec("resnet", per_rank_batch=PER_RANK_BATCH)  # the optimizers below reuse its workload
    answers = [a.to_dict() for a in pool.run(time_on_rank, dict(workload_spec=resnet, variants=variants, warmup=3,
                                                                 steps=steps, rounds=rounds))]
    saved = saved_bytes_rows("resnet", PER_RANK_BATCH)
    # 2. optimizers
    opt = pool.run(optimizer_bench_on_rank, dict(workload_spec=resnet, rounds=max(rounds, 5), steps=20))[0]
    opt_mlp = pool.run(optimizer_bench_on_rank, dict(workload_spec=WorkloadSpec("mlp"), rounds=max(rounds, 5),
                                                     steps=5))[0]
    return {"world": pool.nproc, "answers": answers, "saved": saved, "optimizers": {"resnet": opt, "mlp": opt_mlp}}


def render(raw: dict, options: Options) -> str:
    rounds, steps, nproc = options.rounds, options.steps, raw["world"]
    per_rank_batch, saved = PER_RANK_BATCH, raw["saved"]
    answers = [RankTiming.from_dict(a) for a in raw["answers"]]
    opt, opt_mlp = raw["optimizers"]["resnet"], raw["optimizers"]["mlp"]
    ran = answers[0].variants["all (compile)"].describe.get("compute_fusion", {}).get("backend", {})

    def kb(field):
        return lambda name, s: f"{saved[name][field] / 1024:.0f}" if name in saved else "(as eager)"

    names = [n for n, _ in FUSION_VARIANTS]
    table = timing_table(answers, names, per_rank_batch * nproc, steps, "unfused",
                         {"saved for backward KiB (sum)": kb("saved"), "distinct storages KiB": kb("unique")})
    counts = answers[0].variants["all (eager)"].describe.get("compute_fusion", {})
    count_line = ", ".join(f"{k}: found {v['found']}, fused {v['fused']}" for k, v in counts.items()
                           if isinstance(v, dict) and "found" in v)
    return "\n\n".join([
        f"### Compute fusion on the ResNet ({nproc} ranks, batch {per_rank_batch}/rank, compute only: "
        f"data_parallel='none'; {rounds} interleaved rounds of {steps} steps)",
        f"Pattern counts: {count_line}.  Compiled variant ran: `{ran.get('ran')}`.",
        table,
        "Saved bytes: one forward of the batch under `saved_tensors_hooks`, parameters excluded. "
        "'sum' counts a tensor each time an op saves it (the per-op measure of the tests); 'distinct "
        "storages' is the activation memory actually kept alive.",
        f"### Fused optimizer vs torch.optim (rank 0 on {opt['device']}; step() alone; "
        f"ResNet: {opt['tensors']} tensors, "
        f"{opt['numel']:,} elements)",
        _optimizer_table(opt),
        f"### Fused optimizer vs torch.optim (rank 0 on {opt_mlp['device']}; step() alone; "
        f"MLP: {opt_mlp['tensors']} tensors, "
        f"{opt_mlp['numel']:,} elements)",
        _optimizer_table(opt_mlp),
    ])
