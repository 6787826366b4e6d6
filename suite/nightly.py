"""The nightly's plan: its stages, the cases × world sizes, the gate's cases and budget, and how long
each stage should take, known before anything runs (``fleetbench nightly --plan``).

Estimates come from the last night's stage durations on the same machine (``nightly.json`` in the
results directory, which the workflow keeps between nights), scaled by how many (case, world) pairs
each stage has tonight against then; with no such night, from :data:`ROUGH_STEP_S`, a small table of
step times per model that is **rough** (a guess to size a first night, not a measurement), or from step times
measured on the machine (``--step-times FILE``: :func:`read_step_times`, e.g. what ``.ci/gpu-check`` measured).

Each case x world size is timed once, by the ``run`` stage; the pytest-benchmark and asv stages export its records
(``suite/results/export.py``), so their estimates are an export's and asv's discovery and publishing, not timings.

The gate's set-up (two worktrees, a trial server per revision and world size, a check and a preparation of both
revisions per case: ``suite/ab/trials.py``) comes on top of its budget of timed trials.  A night that skipped the
gate (no last good commit) is no basis for it; a cancelled gate's time is kept as a lower bound.

Only a night of the same profile is a basis: a smoke night (one case per family, a short gate) says nothing of a
full night's stages, whose fixed costs (asv's discovery, the gate's set-up) do not scale with the pairs.  The state
keeps each profile's last finished stages apart (``earlier``: profile -> stage -> entry).

How a night measures is the run specification's (:class:`suite.run_spec.RunOptions`: its defaults are the night's,
so the nightly's speedups are resolved by the same rule as ``fleetbench run``'s); the night adds its traced steps
and the gate's budget (:class:`NightlyOptions`).  A scheduled workflow's own options (steps, the gate's budget and
cases, the profile, the limit) live in :data:`WORKFLOWS`, read by the workflow (``--workflow NAME``) and by whatever
plans its nights (``.ci/gpu-check``'s phase 5): one place.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field

from .model_registry import REGISTRY
from .outputs import read_input
from .run_spec import RunOptions

__all__ = ["STAGES", "EXPORTS", "ROUGH_STEP_S", "NightlyOptions", "StagePlan", "Plan", "make_plan", "last_night",
           "STATE_FILE", "finished_stages", "stage_history", "read_step_times", "gate_setup_s", "PROFILES",
           "SMOKE_LIMIT_S", "SMOKE_GATE_BUDGET_S", "choose_profile", "smoke_green", "smoke_cases", "Workflow",
           "WORKFLOWS", "overlap_variants", "gate_ran"]

STAGES = ("run", "pytest-benchmark", "asv", "report", "gate", "history")
EXPORTS = ("pytest-benchmark", "asv")  # stages that export the run stage's records (their state entry: exported)
STATE_FILE = "nightly.json"  # in the results directory: tonight's stages as each ends (durations, exit codes)

# Rough seconds per training step, one rank, at each device's default size (cpu: the `cpu` size, cuda: `full`): the
# registry's (suite/model_registry.py), only used until a night on this machine has recorded its stages.
ROUGH_STEP_S = {device: {m.name: m.rough_step_s[i] for m in REGISTRY} for i, device in enumerate(("cpu", "cuda"))}
ROUGH_OTHER_STEP_S = {"cpu": 2.0, "cuda": 0.5}  # a user's own model
CASE_OVERHEAD_S = 15.0  # per (case, world): engine build, warm-up bookkeeping, the harness's own start
WORLD_OVERHEAD_S = 30.0  # per world size and stage: a rank pool (and for the gate, two revisions' servers)
RANK_START_S = 5.0  # the gate's trial servers: per rank of a world (interpreter, CUDA context, communicator)
WORKTREE_S = 60.0  # the gate: each revision's worktree (git worktree add and its checkout)
EXPORT_S = 10.0  # pytest-benchmark: the run's records read and written as its JSON
ASV_EXPORT_S = 90.0  # asv: its machine file, discovery (one import of bench_cases), the results file, publish


NIGHT_TRACE_STEPS = 2  # the night traces each case (its report draws the timeline); `run` traces none by default


@dataclass(frozen=True)
class NightlyOptions:
    """A night's options: how each case is measured (``run``: the run specification's own defaults, and the night's
    traced steps) and the gate's budget of timed trials, all its cases and world sizes together."""

    run: RunOptions = field(default_factory=lambda: RunOptions(trace_steps=NIGHT_TRACE_STEPS))
    gate_budget_s: float = 1800.0


@dataclass(frozen=True)
class Workflow:
    """A scheduled workflow's own choices: what its command line passes to every night (``--workflow NAME``) and
    what a plan of its nights assumes (the GPU check's phase 5)."""

    name: str
    device: str
    tag: str  # the cases it selects when no --case, --tag or --model is given
    steps: int  # per timed window (rounds: the run specification's default)
    gate_budget_min: float
    gate_cases: tuple[str, ...]
    profile: str
    limit_min: float  # the job's limit for the night itself (its timeout-minutes less set-up and upload)

    def args(self) -> list[str]:
        """The night's options as `fleetbench nightly` takes them."""
        return ["--device", self.device, "--tag", self.tag, "--steps", str(self.steps), "--gate-budget",
                f"{self.gate_budget_min:g}", *[x for g in self.gate_cases for x in ("--gate-case", g)], "--profile",
                self.profile, "--limit", f"{self.limit_min:g}"]


# .github/workflows/nightly-gpu.yml runs `.ci/nightly --workflow gpu` (tests/test_nightly.py reads both)
WORKFLOWS = {"gpu": Workflow("gpu", device="cuda", tag="nightly-gpu", steps=10, gate_budget_min=45.0,
                             gate_cases=("resnet50/*", "gpt2/*", "bert/*"), profile="auto", limit_min=330.0)}


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
    profile: str = "full"  # or "smoke": one case per family at each world size, `ab` on one gate case

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
        out = [f"nightly plan ({self.profile} profile): machine {self.machine}, device {self.device}, world sizes "
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


def _step_s(model: str, device: str, measured: dict | None = None, case: str | None = None) -> float:
    """Seconds per step of ``case`` (of ``model``): measured (``--step-times``: the case's, else its model's), else
    :data:`ROUGH_STEP_S`."""
    measured = measured or {}
    for table, key in ((measured.get("cases") or {}, case), (measured.get("models") or {}, model)):
        if key in table:
            return float(table[key])
    return ROUGH_STEP_S[device].get(model, ROUGH_OTHER_STEP_S[device])


def read_step_times(path: str) -> dict:
    """``--step-times FILE``: ``{"models": {model: seconds per step}, "cases": {case: seconds}}`` (either may be
    missing; other keys are kept as notes), each a positive finite number, else one error naming the file and field."""
    import math

    try:
        with open(path) as fh:
            data = json.load(fh)
    except (OSError, ValueError) as exc:
        raise ValueError(f"--step-times {path}: cannot be read as JSON ({exc})") from None
    if not isinstance(data, dict) or not any(isinstance(data.get(k), dict) for k in ("models", "cases")):
        raise ValueError(f"--step-times {path}: expected an object with 'models' and/or 'cases' (name -> seconds "
                         f"per step)")
    for table in ("models", "cases"):
        for name, v in (data.get(table) or {}).items():
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise ValueError(f"--step-times {path}: {table}.{name} is {v!r}; expected seconds per step, a "
                                 f"positive number")
    return data


def gate_setup_s(gate: list, models: dict, device: str, o: NightlyOptions, measured: dict | None = None) -> float:
    """The gate's set-up beside its budget of timed trials (``suite/ab/trials.py``): two worktrees; per world size a
    trial server of that many ranks per revision; per (case, world) a check and a first preparation of each
    revision."""
    if not gate:
        return 0.0
    r = o.run
    check = (2 * r.check_steps if r.check else 0)
    worlds = sorted({w for _, w in gate})
    servers = sum(2 * (WORLD_OVERHEAD_S + RANK_START_S * w) for w in worlds)
    cases = sum(2 * (CASE_OVERHEAD_S + (check + r.warmup) * _step_s(models[c], device, measured, c)) for c, _ in gate)
    return 2 * WORKTREE_S + servers + cases


def _rough(stage: str, pairs: list, gate: list, models: dict, device: str, o: NightlyOptions,
           measured: dict | None = None) -> float:
    worlds = len({w for *_, w in pairs}) or 1
    r = o.run
    check = (2 * r.check_steps if r.check else 0)  # the check runs the case and its reference

    def step(c: str, m: str) -> float:
        return _step_s(m, device, measured, c)

    if stage == "run":  # the night's one timing of each (case, world): the other harnesses export it
        return worlds * WORLD_OVERHEAD_S + sum(
            CASE_OVERHEAD_S + (check + r.warmup + r.trace_steps + r.rounds * r.steps) * step(c, m) for c, m in pairs)
    if stage == "pytest-benchmark":
        return EXPORT_S + 0.1 * len(pairs)
    if stage == "asv":
        return ASV_EXPORT_S + 0.1 * len(pairs)
    if stage == "gate":
        return o.gate_budget_s + gate_setup_s(gate, models, device, o, measured) if gate else 0.0
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


def _gate_skipped(entry: dict, state: dict, own: bool) -> bool:
    """A gate that compared nothing (no last good commit): its seconds hold no set-up.  ``skipped`` is recorded since
    this rule; an older night's own gate with ``last_good`` null (and no ``base``: a smoke night compares against
    HEAD~1 before there is a last good commit) is one too."""
    gate = state.get("gate") or {}
    legacy = own and "gate" in state and gate.get("base", gate.get("last_good")) is None
    return bool(entry.get("skipped")) or legacy


def _profile_layers(state: dict) -> list[tuple[bool, str, dict]]:
    """(own night?, profile, {stage: entry}) of a state, the older layers first: ``earlier`` (profile -> stages; a
    state written before profiles were kept apart holds one flat layer, a full night's), then its own stages."""
    layers: list[tuple[bool, str, dict]] = []
    earlier = state.get("earlier") or {}
    if isinstance(earlier, dict):
        if any(k in STAGES for k in earlier):
            layers.append((False, "full", earlier))
        else:
            layers += [(False, str(p), v) for p, v in earlier.items() if isinstance(v, dict)]
    own = state.get("stages") or {}
    if isinstance(own, dict):
        layers.append((True, str(state.get("profile") or "full"), own))
    return layers


def stage_history(state: dict | None) -> dict[str, dict]:
    """Per profile, the stages its nights finished (cancelled ones left out), the latest night's over those it
    carried from earlier nights: a night cancelled half-way still leaves estimates for every stage.  The gate: one
    skipped for want of a last good commit is left out (the earlier gate, or the rough set-up, stands), and a
    cancelled one is kept when it ran longer than the gate it would replace (its time is a lower bound, ``exit``
    says so).  A night carries this forward as its ``earlier``."""
    state = state or {}
    out: dict[str, dict] = {}
    for own, profile, layer in _profile_layers(state):
        mine = out.setdefault(profile, {})
        for k, v in layer.items():
            if not isinstance(v, dict):
                continue
            if k == "gate":
                if _gate_skipped(v, state, own):
                    continue
                if v.get("exit") == "cancelled" and float(v.get("seconds") or 0) <= float(
                        (mine.get("gate") or {}).get("seconds") or 0):
                    continue
            elif v.get("exit") == "cancelled":
                continue
            mine[k] = v
    return {p: v for p, v in out.items() if v}


def finished_stages(state: dict | None, profile: str = "full") -> dict:
    """The stages the nights of ``profile`` finished (:func:`stage_history`): the basis of that profile's plan."""
    return stage_history(state).get(profile, {})


def make_plan(resolved, gate_names: list[str], machine: str, o: NightlyOptions, last: dict | None = None,
              step_times: dict | None = None, profile: str = "full") -> Plan:
    """The plan of a night over ``resolved`` (a :class:`suite.selection.Resolved`); ``gate_names`` the cases the
    gate compares (at every world size where they run); ``step_times`` measured (:func:`read_step_times`) instead of
    the rough ones."""
    pairs = [(rc.case.name, rc.case.model, w, rc.skip) for rc, w in resolved.matrix()]
    runnable = [(c, m) for c, m, _, skip in pairs if skip is None]
    models = {c: m for c, m, _, _ in pairs}
    gate = [(c, w) for c, _, w, skip in pairs if skip is None and c in gate_names]
    stages = []
    for name in STAGES:
        rough = _rough(name, runnable, gate, models, resolved.device, o, step_times)
        done = finished_stages(last, profile).get(name)
        if name in EXPORTS and isinstance(done, dict) and not done.get("exported"):
            done = None  # a night before measure-once timed the pairs again in this stage: no basis for an export
        if isinstance(done, dict) and isinstance(done.get("seconds"), (int, float)) and done.get("pairs"):
            now = len(gate) if name == "gate" else len(runnable)
            scale = now / done["pairs"]
            if name == "gate":  # the budget is tonight's; the rest (preparations, checks) scales with the pairs
                extra = max(0.0, done["seconds"] - float(done.get("budget_s", 0.0)))
                seconds = o.gate_budget_s + extra * scale if gate else 0.0
            else:
                seconds = done["seconds"] * scale
            basis = f"last night's {done['seconds'] / 60:.1f} min for {done['pairs']} pair(s), scaled"
            if done.get("exit") == "cancelled":  # it ran this long before it was stopped: a lower bound
                seconds = max(done["seconds"] * scale, rough)
                basis = (f"last night's cancelled gate ran {done['seconds'] / 60:.1f} min for {done['pairs']} pair(s) "
                         f"(a lower bound), or the rough set-up if longer")
        elif isinstance(done, dict) and isinstance(done.get("seconds"), (int, float)) and name in ("report", "history"):
            seconds, basis = float(done["seconds"]), "last night's"
        elif step_times is not None:
            seconds, basis = rough, "measured step times (--step-times)"
        else:
            seconds, basis = rough, "rough step times (suite/nightly.py ROUGH_STEP_S)"
        setup = gate_setup_s(gate, models, resolved.device, o, step_times)
        detail = {"gate": f"{len(gate)} pair(s), budget {o.gate_budget_s / 60:.0f} min of timed trials + set-up "
                          f"(rough: {setup / 60:.0f} min)",
                  "report": "", "history": ""}.get(name, f"{len(runnable)} pair(s)")
        stages.append(StagePlan(name, float(seconds), basis, detail))
    source = "measured step times (--step-times)" if step_times is not None else "rough step times"
    notes: tuple[str, ...] = ()
    if not last:
        notes = (f"no earlier night recorded for this machine: estimates from {source}",)
    elif not finished_stages(last, profile):
        others = ", ".join(sorted(stage_history(last))) or "none"
        notes = (f"no earlier {profile} night recorded for this machine (nights of other profiles: {others}; they are "
                 f"no basis): estimates from {source}",)
    if profile == "smoke":
        notes += ("smoke profile: one case per strategy family, `ab` on one gate case, within "
                  f"{SMOKE_LIMIT_S / 60:.0f} min; the scheduled night runs it until one smoke night is green "
                  "(--profile auto), then the full profile",)
    return Plan(machine, resolved.device, resolved.worlds, tuple(pairs), tuple(gate), o.gate_budget_s,
                tuple(stages), notes, profile)


# ---- profiles: smoke until one smoke night is green, then full ---------------------------------------------------


def overlap_variants() -> dict[str, int]:
    """The variants whose buckets are launched during backward (what a smoke night must have run green), each with
    how many of the registry's requirements it has (multicomm: overlap on several communicators, 2)."""
    from .cases import VARIANTS  # a plan of the full profile needs no registry

    return {v.name: len(v.requires) for v in VARIANTS if "overlap" in v.requires}
PROFILES = ("full", "smoke", "auto")
SMOKE_LIMIT_S = 3600.0  # a smoke night fits an hour on the runner (8 GPUs), whatever --limit allows
SMOKE_GATE_BUDGET_S = 600.0  # its gate: `ab` on one gate case


def gate_ran(state: dict | None) -> bool:
    """Whether a night's gate compared something: a base commit, and at some world size `ab` timed cases against it
    (not "identical": the same code on both sides times nothing)."""
    gate = (state or {}).get("gate") or {}
    worlds = gate.get("worlds") or {}
    return bool(gate.get("base")) and any(isinstance(w, dict) and w.get("cases") and not w.get("identical")
                                          for w in worlds.values())


def smoke_green(state: dict | None) -> bool:
    """Whether a smoke night has ever been green on this machine: the state says so (``smoke_green``, carried from
    night to night), or its own night was a smoke one that ended with status 0, whose gate ran (:func:`gate_ran`:
    against the last good commit, or HEAD~1 on a first night) and which ran an overlap case (``overlap_cases``:
    buckets launched during backward, the path NCCL's streams matter most for)."""
    state = state or {}
    if state.get("smoke_green"):
        return True
    return (state.get("profile") == "smoke" and state.get("status") == 0 and gate_ran(state)
            and bool(state.get("overlap_cases")))


def choose_profile(asked: str, state: dict | None) -> str:
    """``auto`` (what the scheduled workflow asks): ``smoke`` until one smoke night is green in the state, then
    ``full``; ``full`` and ``smoke`` as asked."""
    if asked not in PROFILES:
        raise ValueError(f"--profile {asked!r}: expected one of {', '.join(PROFILES)}")
    if asked != "auto":
        return asked
    return "full" if smoke_green(state) else "smoke"


def smoke_cases(resolved, gate_names: list[str]) -> tuple[list[str], str]:
    """A smoke night's cases: one per strategy family (``suite.cases.FAMILIES``) among the selected ones that run at
    the largest world size (the communication family's an overlap case on several communicators where one runs,
    else an overlap case; otherwise a gate case preferred), and the one gate case its `ab` compares (of
    ``gate_names``, the night's gate cases, which must not be empty)."""
    from .cases import VARIANTS  # the smoke profile only: the registry is not needed for a plan otherwise

    family = {v.name: v.family for v in VARIANTS}
    overlap = overlap_variants()
    at = resolved.at[max(resolved.worlds)]
    chosen: dict[str, str] = {}
    for rc in sorted((rc for rc in at if rc.skip is None),
                     key=lambda rc: (-overlap.get(rc.case.variant, 0), rc.case.name not in gate_names)):
        chosen.setdefault(family.get(rc.case.variant, rc.case.variant), rc.case.name)
    names = sorted(chosen.values())
    gate = next((n for n in names if n in gate_names), gate_names[0])
    return sorted(set(names) | {gate}), gate
