"""The engine's own cost (`fleetbench figures engine_cost`): fleetbench's engine in DDP's configuration against
torch DDP itself, so that every speedup over DDP can be read as the strategy's and not as fleetbench's Python.

DDP's configuration is the preset ``ddp_configuration`` (``suite/config.py``): 25 MiB buckets with DDP's 1 MiB
first bucket (``first_bucket_MB``, see ``suite/comm/buckets.py`` for why it is not Paddle's default), overlapped on
one communicator, gradients as bucket views, buffers broadcast over flat buckets.  DDP is torch's
``DistributedDataParallel`` as every fleetbench case builds it (``bucket_cap_mb`` left at its default, 25 MiB with
a 1 MiB first bucket), twice: at its default (``*/ddp``: ``gradient_as_bucket_view`` False, it copies) and at its best
(``*/ddp_best``: ``gradient_as_bucket_view`` True, no copies, and ``static_graph``), so the engine, whose gradients
are bucket views too, is compared with DDP doing the least work it can.

Per model (``mlp``, ``resnet50``, ``gpt2`` at ``cpu`` size; each in fresh ranks):

1. **the ratios**: the three cases prepared once (the runner's :class:`suite.runner.PreparedCase`) and timed window
   by window, interleaved round by round (:func:`suite.measure.interleave.interleaved_rounds`, the order rotated), for
   ``rounds`` rounds (at least 60); then, while the 95% interval of either median ratio is wider than
   :data:`WIDTH`, :data:`BLOCK` rounds more, up to ``max_rounds`` (stopping on the interval's width, never on its
   position); an interval still wider says so, with the rounds it would take.  Each round's ratio is the engine's
   window over DDP's (the slowest rank's; > 1: the engine is slower); the median with a bootstrap interval
   (:func:`suite.measure.stats.bootstrap_median_ci`).  The machine's state is recorded with it: the 1-minute load
   average before, during (every window) and after, and the CPU time other processes took during the windows.
2. **the profile** (:func:`suite.measure.engine_cost.profile_on_rank`): where each step's time goes, the same rows
   on both sides, and the timed gap attributed in ms to them.
3. **outside the hot path** (:func:`suite.measure.engine_cost.side_costs_on_rank`): ``plain``'s per-tensor buffer
   broadcasts (Paddle's default ``fuse_broadcast_ops=False``) against one flat broadcast, and the check's digest
   of the parameters.

A benchmark, never a test: ``resnet50`` and ``gpt2`` at ``cpu`` size take tens of minutes.  ``--size tiny`` runs
the same code on the tiny models in seconds (its numbers say nothing; ``tests/test_engine_cost.py``).
"""
from __future__ import annotations

import math
import os
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..cases import Case, get_case
from ..config import PRESETS, StrategyConfig
from ..measure.engine_cost import ROWS, profile_on_rank, side_costs_on_rank
from ..measure.interleave import interleaved_rounds
from ..measure.stats import bootstrap_median_ci
from ..measure.utilization import BUSY_SHARE, others_cpu
from ..run_spec import ResolvedCase, RunFacts, RunOptions
from ..runner import CaseRunner
from ..workload import WorkloadSpec

DESCRIPTION = ("the engine's own cost: fleetbench's engine in DDP's configuration vs DDP (mlp, resnet50, gpt2 at "
               "cpu size), interleaved 60+ rounds; a profile of both; plain's buffer broadcasts; the check's digest")

MODELS = ("mlp", "resnet50", "gpt2")
BASE, BEST, ENGINE = "ddp", "ddp_best", "engine"
BASES = (BASE, BEST)  # the engine against each: DDP at its default, DDP at its best
PRESET = "ddp_configuration"
GOAL = 1.02  # the engine in DDP's configuration within 2% of DDP (the median ratio)
WIDTH = 0.05  # the widest 95% interval of a ratio that resolves a 5% difference
BLOCK = 20  # rounds added while the interval is wider than WIDTH
AGAINST = {BASE: "DDP, default (copies)", BEST: "DDP, bucket views + static graph"}
LABELS = {
    "before_forward": "before the forward (buffer broadcast; DDP: its buffer sync and reducer preparation)",
    "forward": "forward (the model and the loss)",
    "backward": "backward: autograd's own work",
    "hooks": "gradient hooks: per-parameter bookkeeping (and autograd's accumulation-node overhead, on both sides)",
    "copy_in": "copies into the buckets (DDP: `mul_out`, with the division)",
    "average": "division by the world size (the engine: one `div_` per bucket)",
    "launch": "allreduce launches",
    "wait": "wait after the last gradient for the allreduces still running",
    "copy_out": "copies out of the buckets into the gradients",
    "optimizer": "optimizer step",
    "zero_grad": "zeroing the gradients",
    "other": "the rest of the step (precision switches, per-rank seeding, Python between phases)",
}


@dataclass(frozen=True)
class Options:
    """What `fleetbench figures engine_cost` measures (see the module docstring)."""

    nproc: int = 2
    rounds: int = 60  # timed rounds at least, per model
    max_rounds: int = 160  # the most, while the interval is wider than WIDTH
    steps: int = 2  # steps per timed window
    timeout: float = 1800.0
    size: str = "cpu"
    models: tuple = MODELS
    profile_steps: int = 5

    def __post_init__(self):
        if self.max_rounds < self.rounds:
            raise ValueError(f"figures engine_cost: max_rounds {self.max_rounds} is below rounds {self.rounds}")
        if self.profile_steps < 1:
            raise ValueError(f"figures engine_cost: profile_steps {self.profile_steps}: at least 1")


ENGINE_CASE = "engine_in_ddp_configuration"  # its variant name, in this figure's timing and `figures workloads`


def engine_case(model: str) -> Case:
    """The engine in DDP's configuration on ``model``: a case of this figure (and of `figures workloads`), not of
    the registry."""
    return Case(name=f"{model}/{ENGINE_CASE}", model=model, variant=ENGINE_CASE, config=dict(PRESETS[PRESET]),
                description="fleetbench's engine in DDP's configuration")


def _cases(model: str) -> dict[str, ResolvedCase]:
    base, best, engine = get_case(f"{model}/{BASE}"), get_case(f"{model}/{BEST}"), engine_case(model)
    return {BASE: ResolvedCase(base, StrategyConfig.from_dict(base.config)),
            BEST: ResolvedCase(best, StrategyConfig.from_dict(best.config)),
            ENGINE: ResolvedCase(engine, StrategyConfig.from_dict(engine.config))}


def _variants(model: str) -> list[dict]:
    return [{"name": n, "config": rc.config.to_dict()} for n, rc in _cases(model).items()]


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def needed_rounds(rounds: int, width: float, target: float = WIDTH) -> int:
    """Rounds an interval of ``width`` from ``rounds`` rounds would need to narrow to ``target`` (width falls as one
    over the square root of the rounds)."""
    if not (math.isfinite(width) and width > 0):
        return rounds
    return max(rounds, math.ceil(rounds * (width / target) ** 2))


def time_model(launcher: Any, world: int, model: str, options: Options,
               say: Callable[[str], None] = lambda _msg: None) -> dict:
    """The engine's and DDP's windows, interleaved round by round, ``rounds`` of them and then :data:`BLOCK` more
    while the ratio's interval is wider than :data:`WIDTH` (up to ``max_rounds``); with the load and the others'
    CPU time (JSON-able)."""
    opts = RunOptions(steps=options.steps, rounds=options.rounds, warmup=2, check=False,
                      timeout=options.timeout, utilization=False, baseline=BASE, memory_budget=1 << 62)
    runner = CaseRunner(launcher, world, opts, metadata={}, reporter=False, facts=RunFacts(size=options.size))
    load_before = _load()
    names = list(_cases(model))
    prepared = [runner.prepare(rc) for rc in _cases(model).values()]
    windows: list[list[float]] = [[] for _ in names]
    machine: list[dict] = [dict(cpu_s=0.0, host_busy_s=0.0, host_total_s=0.0) for _ in range(world)]
    loads: list[float] = []

    def one(i: int) -> float:
        answers = prepared[i].window()
        loads.append(round(os.getloadavg()[0], 2))
        for a in answers:
            for k in ("cpu_s", "host_busy_s", "host_total_s"):
                machine[a.rank][k] += (a.machine or {}).get(k, math.nan)
            machine[a.rank]["host"] = (a.machine or {}).get("host")
        return max(a.window_s for a in answers)

    engine = names.index(ENGINE)
    try:
        target = options.rounds
        while True:
            got = interleaved_rounds(list(range(len(names))), target - len(windows[0]), one)
            for i in range(len(names)):
                windows[i] += got[i]
            widths = []
            for base in BASES:
                ratios = [e / d for d, e in zip(windows[names.index(base)], windows[engine])]
                lo, hi = bootstrap_median_ci(ratios)
                widths.append(hi - lo)
                say(f"{model}: {len(ratios)} rounds, engine / {base} {statistics.median(ratios):.3f} [{lo:.3f}, "
                    f"{hi:.3f}], load {os.getloadavg()[0]:.2f}")
            if max(widths) <= WIDTH or len(windows[0]) >= options.max_rounds:
                break
            target = min(options.max_rounds, len(windows[0]) + BLOCK)
    finally:
        for pc in prepared:
            pc.close()
    others_s, others_share = others_cpu(machine)
    return {"windows": dict(zip(names, windows)), "load_before": load_before, "load_after": _load(),
            "load_during": loads, "others_cpu_share": others_share, "others_cpu_s": others_s,
            "describe": prepared[engine].describe}


def measure(options: Options, pool, say: Callable[[str], None] | None = None) -> dict:
    """Every model's ratio, profile and side costs (JSON-able); each model's phases in fresh ranks."""
    say = say or (lambda msg: print(msg, flush=True))
    out: dict[str, Any] = {"world": pool.nproc, "models": {}}
    for model in options.models:
        ws = WorkloadSpec(model, options.size)
        say(f"{model}: profiling {options.profile_steps} steps of each (load {os.getloadavg()[0]:.2f})")
        prof = pool.run(profile_on_rank, dict(workload_spec=ws, variants=_variants(model), steps=options.profile_steps),
                        timeout=options.timeout)
        side = pool.run(side_costs_on_rank, dict(workload_spec=ws), timeout=options.timeout)
        pool.close()
        timing = time_model(pool, pool.nproc, model, options, say)
        pool.close()
        out["models"][model] = {"profile": [a["variants"] for a in prof], "side": side, "timing": timing}
    return out


# ---------------------------------------------------------------------------------------------------------------
# the figure
# ---------------------------------------------------------------------------------------------------------------
def ratio_summary(timing: dict, steps: int, against: str = BASE) -> dict:
    """The median ratio (engine / DDP ``against``: at its default or at its best), its interval, its width, the
    rounds, the median step times (ms) and, when the interval is wider than :data:`WIDTH`, the rounds it would
    need."""
    base, eng = timing["windows"][against], timing["windows"][ENGINE]
    ratios = [e / d for d, e in zip(base, eng) if d > 0 and e > 0]
    lo, hi = bootstrap_median_ci(ratios)
    width = hi - lo
    return {"ratio": statistics.median(ratios), "ci": (lo, hi), "width": width, "rounds": len(ratios),
            "base_ms": statistics.median(base) / steps * 1e3, "engine_ms": statistics.median(eng) / steps * 1e3,
            "needed": needed_rounds(len(ratios), width) if not width <= WIDTH else None}


def verdict(s: dict, timing: dict) -> str:
    """What the ratio says, in words (the goal, the interval's width, the machine's state)."""
    busy = timing.get("others_cpu_share")
    quiet = not (isinstance(busy, float) and math.isfinite(busy) and busy > BUSY_SHARE)
    parts = []
    if s["needed"] is not None:
        parts.append(f"not resolved to {WIDTH}: the interval is {s['width']:.3f} wide; about {s['needed']} rounds "
                     "would narrow it")
    if s["ratio"] <= GOAL:
        parts.append(f"median within {GOAL:.2f}")
    else:
        parts.append(f"median above {GOAL:.2f} by {(s['ratio'] - GOAL) * 100:.1f} points (see the profile)")
    if not quiet:
        parts.append(f"machine busy: other processes took {busy:.0%} of the CPU during the windows")
    return "; ".join(parts)


def _ms(x: float | None) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{x:.1f}"


def _median_rows(per_rank: list[dict], name: str) -> dict:
    """A variant's median rows, the slowest rank's step (every row from that rank)."""
    rank = max(range(len(per_rank)), key=lambda r: per_rank[r][name]["median"]["step"])
    return per_rank[rank][name]["median"] | {"hook_us": per_rank[rank][name]["hook_us"],
                                              "params": per_rank[rank][name]["params"]}


def profile_table(model: str, data: dict, s: dict, options: Options) -> str:
    prof = data["profile"]
    d, e = _median_rows(prof, BASE), _median_rows(prof, ENGINE)
    b = _median_rows(prof, BEST) if BEST in prof[0] else None  # a raw file from before ddp_best has none
    desc = prof[0][ENGINE]["describe"]
    lines = [f"**{model}**: {options.profile_steps} profiled steps of each, interleaved (medians; the slower rank's; "
             f"ms per step); the engine: {desc.get('allreduce_ops')} bucket(s) for "
             f"{desc.get('allreduce_ops_before_fusion')} gradients", ""]
    if b is None:
        lines += ["| row | DDP (ms) | engine (ms) | engine − DDP (ms) |", "|---|---:|---:|---:|"]
        lines += [f"| {LABELS[k]} | {d[k]:.2f} | {e[k]:.2f} | {e[k] - d[k]:+.2f} |" for k in ROWS]
        lines.append(f"| **step (profiled)** | {d['step']:.1f} | {e['step']:.1f} | {e['step'] - d['step']:+.1f} |")
    else:
        lines += ["| row | DDP (ms) | DDP at its best (ms) | engine (ms) | engine − DDP (ms) | engine − DDP at its "
                  "best (ms) |", "|---|---:|---:|---:|---:|---:|"]
        lines += [f"| {LABELS[k]} | {d[k]:.2f} | {b[k]:.2f} | {e[k]:.2f} | {e[k] - d[k]:+.2f} | {e[k] - b[k]:+.2f} |"
                  for k in ROWS]
        lines.append(f"| **step (profiled)** | {d['step']:.1f} | {b['step']:.1f} | {e['step']:.1f} | "
                     f"{e['step'] - d['step']:+.1f} | {e['step'] - b['step']:+.1f} |")
    lines += ["",
              f"- First allreduce launched {_ms(d['first_launch'])} ms (DDP) and {_ms(e['first_launch'])} ms (engine) "
              f"after backward began; the last gradient at {_ms(d['last_grad'])} and {_ms(e['last_grad'])} ms; the "
              f"allreduces ran {_ms(d['allreduce'])} and {_ms(e['allreduce'])} ms (gloo's threads).",
              f"- Gradient hooks per parameter ({e['params']} parameters): {d['hooks'] / d['params'] * 1e3:.1f} µs "
              f"(DDP) and {e['hooks'] / e['params'] * 1e3:.1f} µs (engine) in the profile; the engine's hook alone, "
              f"without the profiler: {e['hook_us']:.1f} µs." if e.get("hook_us") is not None else "",
              f"- Host syncs (`.item()`) per step: {d['host_syncs']:.0f} (DDP), {e['host_syncs']:.0f} (engine)."]
    gap = s["engine_ms"] - s["base_ms"]
    diffs = sorted(((e[k] - d[k], k) for k in ROWS), key=lambda t: -abs(t[0]))
    top = "; ".join(f"{k} {v:+.1f}" for v, k in diffs[:4])
    profiled = e["step"] - d["step"]
    lines.append(f"- The gap attributed: timed, the engine's step is {gap:+.1f} ms against DDP's "
                 f"({s['engine_ms']:.1f} vs {s['base_ms']:.1f} ms, medians of the timed windows); profiled, "
                 f"{profiled:+.1f} ms, the rows that differ most: {top} ms; the rest, {gap - profiled:+.1f} ms, is "
                 "what the profiler's own cost and the rounds' noise leave unexplained.")
    return "\n".join(x for x in lines if x is not None)


def side_table(raw: dict, models: tuple, options: Options) -> str:
    lines = ["| model | buffers | rank 0's buffers, one broadcast each (ms) | one flat broadcast (ms) | step, DDP (ms) "
             "| per-tensor broadcasts: share of a step | check's digest (ms) | digest: share of a step |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for model in models:
        data = raw["models"][model]
        side = max(data["side"], key=lambda a: a["digest_ms"])
        s = ratio_summary(data["timing"], options.steps)
        step = s["base_ms"]
        b = side.get("broadcast_ms")
        per, fused = (b["per_tensor"], b["fused"]) if b else (math.nan, math.nan)
        share = f"{per / step:.1%}" if b else "no buffers"
        lines.append(f"| {model} | {side['buffers']} | {_ms(per)} | {_ms(fused)} | {step:.1f} | {share} | "
                     f"{side['digest_ms']:.1f} | {side['digest_ms'] / step:.1%} |")
    return "\n".join(lines)


def render(raw: dict, options: Options) -> str:
    world = raw["world"]
    models = tuple(m for m in options.models if m in raw["models"])
    preset = ", ".join(f"{k}={v}" for k, v in PRESETS[PRESET].items())
    parts = [f"## The engine's own cost: fleetbench's engine in DDP's configuration against torch DDP "
             f"({world} ranks, size `{options.size}`)", "",
             f"How this was measured: `fleetbench figures engine_cost --nproc {world} --rounds {options.rounds} "
             f"--max-rounds {options.max_rounds} --steps {options.steps} --size {options.size}`. The engine: preset "
             f"`{PRESET}` ({preset}). DDP: torch's `DistributedDataParallel` as fleetbench builds it (25 MiB buckets "
             "with a 1 MiB first bucket), at its default (gradients copied into and out of the buckets) and at its "
             "best (`ddp_best`: gradient_as_bucket_view and static_graph, no copies). Each round times a window of "
             f"{options.steps} steps of each, interleaved (the order rotated round by round); the ratio is the "
             "engine's window over DDP's (the slower rank's; > 1: the engine is slower), the median over rounds with "
             f"a bootstrap 95% interval; from {options.rounds} rounds on, {BLOCK} more while the interval is wider "
             f"than {WIDTH} (at most {options.max_rounds}). Load: the 1-minute load average before and after "
             "(`/proc/loadavg`'s three values) and its median during the windows; others' CPU: the CPU time other "
             "processes took during the windows, as a share of the machine's.", "",
             "| model | against | DDP step (ms) | engine step (ms) | engine / DDP [95% CI] | width | rounds "
             "| load before → after (median during) | others' CPU | verdict |",
             "|---|---|---:|---:|---|---:|---:|---|---:|---|"]
    for model in models:
        t = raw["models"][model]["timing"]
        during = statistics.median(t["load_during"]) if t["load_during"] else math.nan
        busy = t.get("others_cpu_share")
        others = f"{busy:.1%}" if isinstance(busy, float) and math.isfinite(busy) else "n/a"
        for against in (b for b in BASES if b in t["windows"]):  # a raw file from before ddp_best: DDP's default
            s = ratio_summary(t, options.steps, against)
            parts.append(f"| {model} | {AGAINST[against]} | {s['base_ms']:.1f} | {s['engine_ms']:.1f} | "
                         f"{s['ratio']:.3f} [{s['ci'][0]:.3f}, {s['ci'][1]:.3f}] | {s['width']:.3f} | {s['rounds']} | "
                         f"{' '.join(map(str, t['load_before']))} → {' '.join(map(str, t['load_after']))} "
                         f"({during:.2f}) | {others} | {verdict(s, t)} |")
    parts += ["", "### Where a step's time goes", "",
              "Rows of `suite/measure/engine_cost.py` (its docstring says what each holds); they add up to the "
              "profiled step. The profiler costs a few µs per event on both sides, so profiled steps run slower "
              "than timed ones.", ""]
    for model in models:
        s = ratio_summary(raw["models"][model]["timing"], options.steps)
        parts += [profile_table(model, raw["models"][model], s, options), ""]
    parts += ["### Outside the engine's hot path", "",
              "`plain` (Paddle's default `fuse_broadcast_ops=False`, kept) broadcasts rank 0's buffers one tensor at a "
              "time before every forward; the variants compared with DDP broadcast them over one flat bucket. The "
              "correctness check digests every rank's parameters once per check step (on the parameters' device; "
              "one small tensor of sums reaches the host). Both timed on the ranks (medians of 10, the slower rank), "
              "against DDP's timed step:", "", side_table(raw, models, options)]
    return "\n".join(parts)

