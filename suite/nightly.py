"""The nightly's plan: its stages, the cases × world sizes, the gate's cases and budget, and how long
each stage should take, known before anything runs (``fleetbench nightly --plan``).

Estimates come from the last night's stage durations on the same machine (``nightly.json`` in the
results directory, which the workflow keeps between nights), scaled by how many (case, world) pairs
each stage has tonight against then; with no such night, from :data:`ROUGH_STEP_S`, a small table of
step times per model that is **rough** (a guess to size a first night, not a measurement).
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field

from .outputs import read_input

__all__ = ["STAGES", "ROUGH_STEP_S", "NightlyOptions", "StagePlan", "Plan", "make_plan", "last_night", "STATE_FILE",
           "finished_stages"]

STAGES = ("run", "pytest-benchmark", "asv", "report", "gate", "history")
STATE_FILE = "nightly.json"  # in the results directory: tonight's stages as each ends (durations, exit codes)

# Rough seconds per training step, one rank, at each device's default size (cpu: the `cpu` size, cuda: `full`).
# Stated as rough: orders of magnitude from this project's CPU runs and published GPU throughputs, only used
# until a night on this machine has recorded its stages.
ROUGH_STEP_S = {
    "cpu": {"mlp": 0.01, "resnet": 0.05, "transformer": 0.05, "resnet50": 1.5, "gpt2": 2.0, "bert": 1.5},
    "cuda": {"mlp": 0.002, "resnet": 0.005, "transformer": 0.005, "resnet50": 0.15, "gpt2": 0.35, "bert": 0.25},
}
ROUGH_OTHER_STEP_S = {"cpu": 2.0, "cuda": 0.5}  # a user's own model
CASE_OVERHEAD_S = 15.0  # per (case, world): engine build, warm-up bookkeeping, the harness's own start
WORLD_OVERHEAD_S = 30.0  # per world size and stage: a rank pool (and for the gate, two revisions' servers)


@dataclass(frozen=True)
class NightlyOptions:
    rounds: int = 3
    steps: int = 3
    check: bool = True
    check_steps: int = 3
    warmup: int = 1
    trace_steps: int = 2
    asv_processes: int = 2  # FLEETBENCH_BENCH_PROCESSES
    gate_budget_s: float = 1800.0  # the gate's timed trials, all cases and world sizes together


@dataclass(frozen=True)
class StagePlan:
    name: str
    seconds: float
    basis: str  # "last night (…)" or "rough step times"
    detail: str


@dataclass(frozen=True)
class Plan:
    machine: str
    device: str
    worlds: tuple[int, ...]
    pairs: tuple = ()  # (case, model, world, skip reason or None)
    gate: tuple = ()  # (case, world) the gate compares
    gate_budget_s: float = 0.0
    stages: tuple[StagePlan, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def seconds(self) -> float:
        return sum(s.seconds for s in self.stages)

    def over(self, limit_s: float) -> tuple[StagePlan, float] | None:
        """The first stage that does not end within ``limit_s`` and when it would end, or None."""
        end = 0.0
        for s in self.stages:
            end += s.seconds
            if end > limit_s:
                return s, end
        return None

    def lines(self) -> list[str]:
        run = [p for p in self.pairs if p[3] is None]
        out = [f"nightly plan: machine {self.machine}, device {self.device}, world sizes "
               f"{', '.join(map(str, self.worlds))}; {len(run)} (case, world) pair(s) run, "
               f"{len(self.pairs) - len(run)} skipped", "", "cases x world sizes:"]
        for case, _, world, skip in self.pairs:
            out.append(f"  {case}@{world}" + (f"  [skip: {skip}]" if skip else ""))
        out += ["", f"gate: {len(self.gate)} (case, world) pair(s), one total budget of "
                    f"{self.gate_budget_s / 60:.0f} min of timed trials (left-over time goes to inconclusive cases):"]
        out += [f"  {c}@{w}" for c, w in self.gate] or ["  (none)"]
        out += ["", "stages (estimated duration):"]
        end = 0.0
        for s in self.stages:
            end += s.seconds
            out.append(f"  {s.name:17s} {s.seconds / 60:7.1f} min  (ends at {end / 60:.1f} min; {s.basis}) {s.detail}")
        out.append(f"  {'total':17s} {self.seconds / 60:7.1f} min")
        return out + [f"note: {n}" for n in self.notes]

    def to_dict(self) -> dict:
        return asdict(self)


def _step_s(model: str, device: str) -> float:
    return ROUGH_STEP_S[device].get(model, ROUGH_OTHER_STEP_S[device])


def _rough(stage: str, pairs: list, gate: list, models: dict, device: str, o: NightlyOptions) -> float:
    worlds = len({w for *_, w in pairs}) or 1
    check = (2 * o.check_steps if o.check else 0)  # the check runs the case and its reference
    per_pair = {
        "run": lambda m: CASE_OVERHEAD_S + (check + o.warmup + o.trace_steps + o.rounds * o.steps) * _step_s(m, device),
        "pytest-benchmark": lambda m: CASE_OVERHEAD_S + (check + o.warmup + o.rounds * o.steps) * _step_s(m, device),
        "asv": lambda m: o.asv_processes * (CASE_OVERHEAD_S + (o.warmup + o.rounds * o.steps) * _step_s(m, device)),
    }
    if stage in per_pair:
        return worlds * WORLD_OVERHEAD_S + sum(per_pair[stage](m) for _, m in pairs)
    if stage == "gate":
        if not gate:
            return 0.0
        prep = sum(2 * (CASE_OVERHEAD_S + (check + o.warmup) * _step_s(models[c], device)) for c, _ in gate)
        return o.gate_budget_s + prep + worlds * 2 * WORLD_OVERHEAD_S
    return {"report": 30.0 + len(pairs), "history": 30.0}[stage]


def last_night(out_dir: str, machine: str) -> dict | None:
    """The last night's recorded stages on ``machine`` (None without one, or from another machine)."""
    path = os.path.join(out_dir, STATE_FILE)
    try:  # a regular file only: a FIFO or a device planted there is no night (and never blocks the read)
        state = json.loads(read_input(path, "nightly state (JSON)", 64 * 2**20))
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(state, dict) or state.get("machine") != machine or not isinstance(state.get("stages"), dict):
        return None
    return state


def finished_stages(state: dict | None) -> dict:
    """The stages a night finished (cancelled ones left out), over those it carried from earlier nights: a night
    cancelled half-way still leaves estimates for every stage."""
    state = state or {}
    layers = (state.get("earlier") or {}, state.get("stages") or {})
    return {k: v for layer in layers for k, v in layer.items() if isinstance(v, dict) and v.get("exit") != "cancelled"}


def make_plan(resolved, gate_names: list[str], machine: str, o: NightlyOptions, last: dict | None = None) -> Plan:
    """The plan of a night over ``resolved`` (a :class:`suite.selection.Resolved`); ``gate_names`` the cases the
    gate compares (at every world size where they run)."""
    pairs = [(rc.case.name, rc.case.model, w, rc.skip) for rc, w in resolved.matrix()]
    runnable = [(c, m) for c, m, _, skip in pairs if skip is None]
    models = {c: m for c, m, _, _ in pairs}
    gate = [(c, w) for c, _, w, skip in pairs if skip is None and c in gate_names]
    stages = []
    for name in STAGES:
        rough = _rough(name, runnable, gate, models, resolved.device, o)
        done = finished_stages(last).get(name)
        if isinstance(done, dict) and isinstance(done.get("seconds"), (int, float)) and done.get("pairs"):
            now = len(gate) if name == "gate" else len(runnable)
            scale = now / done["pairs"]
            if name == "gate":  # the budget is tonight's; the rest (preparations, checks) scales with the pairs
                extra = max(0.0, done["seconds"] - float(done.get("budget_s", 0.0)))
                seconds = o.gate_budget_s + extra * scale if gate else 0.0
            else:
                seconds = done["seconds"] * scale
            basis = f"last night's {done['seconds'] / 60:.1f} min for {done['pairs']} pair(s), scaled"
        elif isinstance(done, dict) and isinstance(done.get("seconds"), (int, float)) and name in ("report", "history"):
            seconds, basis = float(done["seconds"]), "last night's"
        else:
            seconds, basis = rough, "rough step times (suite/nightly.py ROUGH_STEP_S)"
        detail = {"gate": f"{len(gate)} pair(s), budget {o.gate_budget_s / 60:.0f} min of timed trials + set-up",
                  "report": "", "history": ""}.get(name, f"{len(runnable)} pair(s)")
        stages.append(StagePlan(name, float(seconds), basis, detail))
    notes = () if last else ("no earlier night recorded for this machine: estimates from rough step times",)
    return Plan(machine, resolved.device, resolved.worlds, tuple(pairs), tuple(gate), o.gate_budget_s,
                tuple(stages), notes)
