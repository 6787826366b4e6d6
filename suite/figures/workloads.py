"""Figures of the published workloads (``fleetbench figures workloads``): ResNet-50 and GPT-2 small.

1. Speedup over torch DDP of the registry's cases on each model (``plain``, ``fusion``,
   ``overlap``, ``multicomm``, ``fused_optimizer``, ``grad_bf16``: the same configs ``fleetbench
   run --model M`` runs), with exposed communication (step time − the ``none`` case's, measured in
   the same group) and the allreduces each step issues (161 per step on ResNet-50 without fusion).
   Beside it, the engine's own cost: fleetbench's engine in DDP's configuration (the preset
   ``ddp_configuration``, ``suite/figures/engine_cost.py``) runs in every group, so each strategy's
   speedup over DDP is shown beside its speedup over the engine in DDP's configuration (what the
   strategy changes, the engine's Python left out).  Every interval says whether it resolves a 5%
   difference (95% interval no wider than 0.05) and, where not, about how many rounds would.
2. Fused allreduce vs one allreduce of the same bytes: each model's gradient collectives alone
   (no compute), as buckets and per parameter, against one allreduce of all gradient bytes (busbw).

Timing follows ``fleetbench run``: variants interleaved round by round in one process group
(``suite.measure.timing.time_on_rank``), in memory-bounded groups (a ``cpu``-size GPT-2 engine
holds ~2 GB per rank), each group carrying DDP (the baseline of the speedups) and ``none`` (the
compute-only step of the exposed communication), so every ratio is paired within one group.

The groups and their timing are the runner's (``CaseRunner.groups`` and ``measure``, with DDP as the
baseline, each planned group timed in fresh ranks); this module turns them into the figure's data
(:func:`measure`) and the Markdown (:func:`render`).

Size: ``cpu`` (the models' full parameter layout, CPU-affordable activations; ``docs/models.md``).
``--size tiny`` runs the same figure on the ``tiny`` models (to validate the code; its numbers say
nothing about the real models).  ``--memory-gb`` bounds the memory the ranks' engines may hold at once
(default: 60% of the machine's available memory), which sets the groups.
"""
from __future__ import annotations

import math
import os
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..cases import get_case
from ..comm.table import busbw_factor
from ..config import StrategyConfig
from ..measure.stats import bootstrap_median_ci, paired_speedup
from ..measure.summary import COMPUTE_ONLY, Timed
from ..models import count_parameters, get_model
from ..run_spec import ResolvedCase, RunFacts, RunOptions
from ..runner import CaseRunner
from ..runtime.device import host_available_memory
from ..selection import case_fields
from ..workload import WorkloadSpec
from . import PoolOptions
from .comm import comm_alone_on_rank
from .engine_cost import ENGINE_CASE, WIDTH, engine_case, needed_rounds

DESCRIPTION = ("published workloads (resnet50, gpt2 at cpu size): speedup over DDP of plain, fused, overlap "
               "(1/2 comms), fused optimizer, bf16 gradients; exposed comm; fused vs single allreduce busbw")

MODELS = ("resnet50", "gpt2")
BASE = "ddp"
ENGINE = ENGINE_CASE  # fleetbench's engine in DDP's configuration, in every group
ROWS = ("plain", "fusion", "overlap", "multicomm", "fused_optimizer", "grad_bf16",
        # torch DDP at its best and with torch's own hooks, beside Paddle's strategies (the registry's cases)
        "ddp_best", "ddp_fp16_compress", "ddp_powersgd_r4")
# The gradient collectives timed alone (table 2): one allreduce of every byte, then the cases' own paths.
ALONE = ("single", "fusion", "overlap", "multicomm", "plain")
LABELS = {
    "ddp": "DDP (baseline)", "none": "no communication", "plain": "plain (one allreduce per gradient)",
    "fusion": "fused, synchronous (25 MB buckets)", "overlap": "overlap, 1 communicator (25 MB buckets)",
    "multicomm": "overlap, 2 communicators (4 MB buckets)", "fused_optimizer": "fused optimizer (plain comm)",
    "grad_bf16": "bf16 gradient communication (plain comm)", "single": "one allreduce of all gradient bytes",
    "ddp_best": "DDP, gradients as bucket views, static graph", "ddp_fp16_compress": "DDP, fp16_compress_hook",
    "ddp_powersgd_r4": "DDP, PowerSGD rank 4 (one bucket on gloo)",
    ENGINE: "the engine in DDP's configuration (its own cost)",
}
MiB = 2**20


@dataclass(frozen=True)
class Options(PoolOptions):
    """What `fleetbench figures workloads` measures (see the module docstring): the pool's options and these."""

    size: str = "cpu"
    memory_gb: float | None = None  # None: 60% of the machine's available memory

    def __post_init__(self):
        if self.memory_gb is not None and not self.memory_gb > 0:
            raise ValueError(f"figures workloads: memory_gb {self.memory_gb!r}: must be > 0")


def rows_for(model: str) -> tuple:
    """The rows of a model's table: the registry's cases (on a BatchNorm model, fusion, overlap and multicomm
    broadcast its buffers over flat buckets, as DDP coalesces its own; plain broadcasts per tensor)."""
    return ROWS


def variant_config(model: str, variant: str, size: str = "cpu") -> dict:
    """The registry case's config at ``size`` (sized buckets included): the figure measures what ``fleetbench run``
    runs."""
    return case_fields(get_case(f"{model}/{variant}"), size)


def _cases(model: str, rows: tuple, size: str = "cpu", engine: bool = True) -> list[ResolvedCase]:
    """DDP, ``none``, the engine in DDP's configuration (``engine``) and the rows as the runner's cases (the
    registry's configs; the engine's is this figure's own case)."""
    out = [ResolvedCase(get_case(f"{model}/{n}"), StrategyConfig.from_dict(variant_config(model, n, size)))
           for n in (BASE, COMPUTE_ONLY, *rows)]
    if engine:
        case = engine_case(model)
        out.insert(2, ResolvedCase(case, StrategyConfig.from_dict(case.config)))
    return out


def _default_budget() -> int:
    """Bytes all ranks' engines may hold at once when --memory-gb is not given: 60% of this host's available
    memory (the ranks of a figure run on this one host, so planning needs no probe of the ranks)."""
    return int(0.6 * host_available_memory())


def _runner(launcher: Any, world: int, options: Options, budget: int | None = None) -> CaseRunner:
    opts = RunOptions(steps=options.steps, rounds=options.rounds, check=False,
                      timeout=options.timeout, utilization=False, baseline=BASE, memory_budget=budget)
    return CaseRunner(launcher, world, opts, metadata={}, reporter=False, facts=RunFacts(size=options.size))


def groups(model: str, size: str, world: int, rows: tuple | None = None, budget: int | None = None
           ) -> list[list[str]]:
    """Variants timed together: the runner's groups of DDP, ``none`` and as many rows as the ranks' memory holds
    (16 bytes per parameter per engine per rank), each group then carrying the engine in DDP's configuration too
    (one row fewer per group where the memory bounds them)."""
    budget = budget if budget is not None else _default_budget()
    rows = rows_for(model) if rows is None else rows
    plan = _runner(None, world, Options(size=size), budget).groups(_cases(model, rows, size, engine=False))
    head = [BASE, COMPUTE_ONLY]
    if len(plan) == 1:
        return [head + [ENGINE] + [n for n in plan[0] if n not in head]]
    per = max(1, len(plan[0]) - len(head) - 1)  # the runner's group size, one place left for the engine
    return [head + [ENGINE] + list(rows[i:i + per]) for i in range(0, len(rows), per)]


class _FreshRanks:
    """The pool, its ranks stopped after every call (the pool starts fresh ones on its next call).

    Every group runs in new rank processes: nothing a previous group built (or its allocator's
    history) weighs on the next, and an engine with bucketed gradients, which stays alive after
    its job until ``BucketedGradSync.close()`` (its gradient hooks hold it; see the report of the
    workloads issue), cannot pile up: at ``cpu`` size each such GPT-2 engine holds ~1 GB per rank."""

    def __init__(self, pool: Any):
        self.pool, self.nproc = pool, pool.nproc

    def run(self, fn: Callable, kwargs: dict | None = None, timeout: float | None = None) -> Any:
        try:
            return self.pool.run(fn, kwargs, timeout=timeout)
        finally:
            self.pool.close()


def _allreduces(s: dict) -> tuple[float, float, float]:
    """Allreduces per step, their bytes, and broadcasts per step (rank 0, through suite.comm.collectives)."""
    calls = sum(v for k, v in s["comm_calls_per_step"].items() if k.endswith("/all_reduce"))
    nbytes = sum(v for k, v in s["comm_bytes_per_step"].items() if k.endswith("/all_reduce"))
    bcasts = sum(v for k, v in s["comm_calls_per_step"].items() if k.endswith("/broadcast"))
    return calls, nbytes, bcasts


def _ms(x: float) -> str:
    return f"{x * 1e3:.1f}" if math.isfinite(x) else "n/a"


def measure_model(pool, model: str, options: Options) -> dict:
    """Every group's interleaved timing through the runner (DDP its baseline), each group in fresh ranks; per
    variant its summary and group index, DDP's and ``none``'s per group, and the model's facts (JSON-able)."""
    spec = get_model(model, options.size)
    world = pool.nproc
    budget = int(options.memory_gb * 2**30) if options.memory_gb else _default_budget()
    rcs = _cases(model, rows_for(model), options.size)
    plan = groups(model, options.size, world, budget=budget)
    timer = _runner(_FreshRanks(pool), world, options, budget=1 << 62)  # a planned group is timed as one
    load_before = [round(x, 2) for x in os.getloadavg()]
    out: dict[str, dict] = {}
    for gi, names in enumerate(plan, 1):
        got, fallback = timer.measure([rc for rc in rcs if rc.case.variant in names])
        for n in names:
            t = got[n]
            if not isinstance(t, Timed):
                raise RuntimeError(f"{model}/{n}: not timed ({t!r}; {fallback.get(n, '')})")
            s = dict(t.metrics.to_dict(), describe=t.describe.to_dict(), group=gi, fallback=fallback.get(n))
            if n in (BASE, COMPUTE_ONLY, ENGINE):
                out.setdefault(n, {"groups": []})["groups"].append(s)
            else:
                out[n] = s
    tensors, elements = count_parameters(spec)
    return {"variants": out, "groups": plan, "load": [load_before, [round(x, 2) for x in os.getloadavg()]],
            "spec": {"name": spec.name, "size": spec.size, "description": spec.description,
                     "per_rank_batch": spec.per_rank_batch, "tensors": tensors, "elements": elements}}


def _resolution(*intervals: tuple, rounds: int) -> str:
    """Whether intervals resolve a 5% difference (each no wider than WIDTH), else about how many rounds would."""
    widths = [hi - lo for lo, hi in intervals if math.isfinite(lo) and math.isfinite(hi)]
    if not widths:
        return "n/a"
    worst = max(widths)
    return "yes" if worst <= WIDTH else f"no (width {worst:.3f}; ~{needed_rounds(rounds, worst)} rounds)"


def _over_engine(s: dict, engine: dict | None) -> tuple[float, tuple]:
    """A case's speedup over the engine in DDP's configuration of its own group, paired round by round."""
    if engine is None or not s.get("window_s") or not engine.get("window_s"):
        return math.nan, (math.nan, math.nan)
    sp = paired_speedup(engine["window_s"], s["window_s"])
    return sp["speedup"], tuple(sp["ci"])


def _span(x: float, ci: tuple) -> str:
    return "n/a" if not math.isfinite(x) else f"{x:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]"


def strategy_table(model: str, measured: dict, options: Options, world: int) -> tuple[str, dict | None]:
    """A model's table of cases (``measured``: :func:`measure_model`'s data; data measured before the engine in
    DDP's configuration joined the groups renders with its column empty)."""
    spec = measured["spec"]
    tensors, elements = spec["tensors"], spec["elements"]
    v = measured["variants"]
    grad_mib = 4 * elements / MiB
    n_groups = len(measured["groups"])
    engines = {s["group"]: s for s in v.get(ENGINE, {}).get("groups", [])}
    head = (f"**{model}** (`{spec['size']}`: {spec['description'] or spec['name']}; batch {spec['per_rank_batch']} "
            f"per rank), {world} ranks; {tensors} gradient tensors, {grad_mib:.1f} MiB fp32; {options.rounds} rounds "
            f"x {options.steps} steps; {n_groups} group(s): "
            + "; ".join("{" + ", ".join(g) + "}" for g in measured["groups"]))
    lines = [head, "",
             "| case | what | group | step (ms) | speedup over DDP [95% CI] | over the engine in DDP's configuration "
             "[95% CI] | resolves 5%? | exposed comm (ms) | allreduces/step | allreduce MiB/step | broadcasts/step |",
             "|---|---|---:|---:|---|---|---|---:|---:|---:|---:|"]
    for special in (BASE, ENGINE, COMPUTE_ONLY):
        for s in v.get(special, {}).get("groups", []):
            sp = s.get("speedup"), s.get("speedup_ci")
            calls, nbytes, bcasts = _allreduces(s)
            exposed = "0 (by definition)" if special == COMPUTE_ONLY else _ms(s["exposed_comm_s"])
            counts = "(DDP's own)" if special == BASE else f"{calls:.0f}"
            bc = "(DDP's own)" if special == BASE else f"{bcasts:.0f}"
            eng = _over_engine(s, engines.get(s["group"])) if special == COMPUTE_ONLY else (math.nan, ())
            res = _resolution(tuple(sp[1]), rounds=options.rounds) if special != BASE else ""
            lines.append(f"| {model}/{special} | {LABELS[special]} | {s['group']} | "
                         f"{_ms(s['step_time_s']['median'])} | {sp[0]:.3f} [{sp[1][0]:.3f}, {sp[1][1]:.3f}] | "
                         f"{_span(*eng) if eng[1] else ''} | {res} | "
                         f"{exposed} | {counts} | {'' if special == BASE else f'{nbytes / MiB:.1f}'} | {bc} |")
    for n in rows_for(model):
        s = v[n]
        calls, nbytes, bcasts = _allreduces(s)
        eng = _over_engine(s, engines.get(s["group"]))
        res = _resolution(tuple(s["speedup_ci"]), *([eng[1]] if math.isfinite(eng[0]) else []), rounds=options.rounds)
        lines.append(f"| {model}/{n} | {LABELS[n]} | {s['group']} | {_ms(s['step_time_s']['median'])} | "
                     f"{s['speedup']:.3f} [{s['speedup_ci'][0]:.3f}, {s['speedup_ci'][1]:.3f}] | {_span(*eng)} | "
                     f"{res} | {_ms(s['exposed_comm_s'])} | {calls:.0f} | {nbytes / MiB:.1f} | {bcasts:.0f} |")
    if engines:
        parts = []
        for g, e in sorted(engines.items()):
            cost = 1 / e["speedup"] if e["speedup"] else math.nan
            lo, hi = e["speedup_ci"]
            parts.append(f"{cost:.3f} [{1 / hi:.3f}, {1 / lo:.3f}] in group {g}" if lo > 0 and hi > 0
                         else f"{cost:.3f} in group {g}")
        lines += ["", f"- The engine's own cost: in DDP's configuration its step takes {'; '.join(parts)} x DDP's "
                      "(> 1: slower; `fleetbench figures engine_cost` profiles it). A strategy's speedup over the "
                      "engine in DDP's configuration is what the strategy itself changes."]
    else:
        lines += ["", "- The engine in DDP's configuration was not in these groups (data measured before it "
                      "joined them): its own cost is not shown; `fleetbench figures engine_cost` measures it."]
    ov = v.get("overlap")
    if ov is not None:
        d = ov.get("describe", {})
        lines += [f"- Allreduce ops {d.get('allreduce_ops_before_fusion')} before fusion, "
                  f"{d.get('allreduce_ops')} after (overlap's buckets)."]
        lo, hi = ov["speedup_ci"]
        met = "not resolved (the interval spans 1)" if lo < 1 < hi else "met" if ov["speedup"] >= 1 else "not met"
        lines.append(f"- Aim (overlap + bucketing at least as fast as DDP), overlap: speedup {ov['speedup']:.3f} "
                     f"[{ov['speedup_ci'][0]:.3f}, {ov['speedup_ci'][1]:.3f}]: **{met}** on this run.")
    lines += [f"- {model}/{n}: {s['fallback']}." for n, s in v.items() if isinstance(s, dict) and s.get("fallback")]
    load = measured.get("load")
    if load:
        lines.append(f"- Load average (1, 5, 15 min) before {' '.join(map(str, load[0]))}, after "
                     f"{' '.join(map(str, load[1]))}.")
    return "\n".join(lines), ov


# ---------------------------------------------------------------------------------------
# the gradient collectives alone (no compute)
# ---------------------------------------------------------------------------------------
def measure_alone(pool, model: str, options: Options) -> dict:
    """The gradient collectives alone: per path the slowest rank's seconds per round, and the gradient bytes."""
    variants = [{"name": n} if n == "single" else {"name": n, "config": variant_config(model, n, options.size)}
                for n in ALONE]
    answers = _FreshRanks(pool).run(comm_alone_on_rank,
                                    dict(workload_spec=WorkloadSpec(model, options.size), variants=variants,
                                         rounds=options.rounds, reps=options.steps), timeout=options.timeout)
    per = {n: [max(ts) for ts in zip(*(a["times"][n] for a in answers))] for n in ALONE}  # slowest rank
    return {"times": per, "bytes": answers[0]["bytes"]}


def alone_table(model: str, alone: dict, options: Options, world: int) -> str:
    per, nbytes = alone["times"], alone["bytes"]
    factor = busbw_factor("all_reduce", world)
    lines = [f"**{model}**: all gradients ({nbytes / MiB:.1f} MiB) reduced by each case's path vs one allreduce of "
             f"the same bytes (collectives alone, no compute; {options.rounds} rounds x {options.steps} repetitions)",
             "", "| path | time (ms) | busbw (GB/s) | busbw ratio to one allreduce [95% CI] |", "|---|---:|---:|---|"]
    for n in ALONE:
        t = statistics.median(per[n])
        ratios = [s / x for s, x in zip(per["single"], per[n]) if x > 0]
        r = statistics.median(ratios)
        lo, hi = bootstrap_median_ci(ratios)
        label = LABELS[n] if n == "single" else f"{model}/{n}: {LABELS[n]}"
        lines.append(f"| {label} | {_ms(t)} | {nbytes / t / 1e9 * factor:.3f} | {r:.3f} [{lo:.3f}, {hi:.3f}] |")
    return "\n".join(lines)


def measure(options: Options, pool) -> dict:
    """Both tables' data for every model (JSON-able)."""
    strategies = {model: measure_model(pool, model, options) for model in MODELS}
    return {"world": pool.nproc, "strategies": strategies,
            "alone": {model: measure_alone(pool, model, options) for model in MODELS}}


def render(raw: dict, options: Options) -> str:
    size, world = options.size, raw["world"]
    parts = [f"## Published workloads at size `{size}`: speedup over torch DDP ({world} ranks)", "",
             "How this was measured: `fleetbench figures workloads` "
             f"(`--nproc {world} --rounds {options.rounds} --steps {options.steps}`). Each model's cases are the "
             "registry's (`fleetbench run --model M` runs the same configs), timed interleaved round by round "
             "(rotated order, warm-up 2 steps) in groups bounded by the ranks' memory; every group also runs DDP, "
             "`none` and fleetbench's engine in DDP's configuration (preset `ddp_configuration`), so each speedup is "
             "a per-round ratio to the DDP of its own group (and to the engine in DDP's configuration of its own "
             "group: the strategy's effect without the engine's own cost) and each exposed communication is the "
             "step time minus the `none` step of its own group. Step times are medians over every rank's steps; "
             f"intervals are bootstrap 95% intervals of the median of the paired ratios; `resolves 5%?` says "
             f"whether a row's intervals are no wider than {WIDTH} (else about how many rounds would make them so, "
             "from the width falling as one over the square root of the rounds).", ""]
    for model in MODELS:
        table, _ = strategy_table(model, raw["strategies"][model], options, world)
        parts += [table, ""]
    parts += ["### Fused allreduce vs one allreduce of the same bytes", ""]
    for model in MODELS:
        parts += [alone_table(model, raw["alone"][model], options, world), ""]
    parts += ["`allreduces/step` and `MiB/step` count the collectives through `suite.comm.collectives` on rank 0 "
              "(DDP's own allreduces are not counted there). busbw is nccl-tests' formula, bytes / time x 2(n-1)/n."]
    return "\n".join(parts)
