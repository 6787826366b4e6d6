"""The run specification: what to run and how, one typed value from the command line to the record.

A :class:`RunSpec` is three frozen parts:

- :class:`Selection`: which cases (names or globs, tags, models), at which size, world sizes and device, with
  which ``--config`` file and ``--set`` overrides (resolved into cases and configs by ``suite/selection.py``);
- :class:`RunOptions`: how each case is measured (batch, steps, rounds, warm-up, check, timeouts, traces,
  utilization, the baseline): what was asked.  What the command resolves (size, device, backend, the overrides
  the baseline takes, where traces go) is :class:`RunFacts` (``RunSpec.facts``), never in the spec's dict;
- :class:`AbOptions` (``fleetbench ab`` and ``bisect`` only): the trials and the sequential statistics'
  :class:`SeqOptions` (their rules are ``suite/ab/stats.py``'s).

Every default of a run and of ``ab`` is stated here, once: ``fleetbench run``, ``ab`` (and its trial servers),
``nightly``, pytest-benchmark and asv take them from these classes.  So is every option of a spec: a field's
metadata holds its option's name, help, bounds and choices, and where it is one (:data:`SURFACES`);
``suite/spec_options.py`` makes from it the commands' argparse options, pytest's ``--fleetbench-*`` and asv's
``FLEETBENCH_BENCH_*``, and builds the spec back from any of them (``spec_from``, the one builder).  The records
carry the spec (``CaseRecord.spec``, schema 4), ``run --resume`` reads it back, ``ab`` sends it to its trial servers
and ``nightly`` hands it to its stages (``run --spec FILE``, ``FLEETBENCH_BENCH_SPEC``).

:meth:`RunSpec.to_dict` / :meth:`RunSpec.from_dict` are versioned (:data:`SPEC_VERSION`) and strict: an
unknown key, a value of the wrong type or out of range is one :class:`SpecError` naming the field, the value
and what is allowed (``suite/validate.py``, the one validation of the knobs, the specs and the records); a key
left out takes its default.  Torch-free, layer 1 (docs/architecture.md).

:class:`ResolvedCase` (a selected case with its validated config) lives here too, so that the selection and
the runner it feeds share it without importing each other.
"""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from .config import ConfigError, StrategyConfig, baseline_sets
from .validate import Invalid, check_options, field_specs, show, spec

__all__ = ["RunSpec", "Selection", "RunOptions", "RunFacts", "AbOptions", "SeqOptions", "ResolvedCase", "SpecError",
           "SPEC_VERSION", "SIZES", "DEVICES", "AB_ROTATE", "MAX_STEPS", "MAX_ROUNDS", "WEEK", "RUN_ROUNDS_FOR_95",
           "SURFACES", "run_setup"]

SPEC_VERSION = 1  # of to_dict/from_dict: a change of meaning of a field is a new version

SIZES = ("full", "cpu", "tiny")  # the sizes every model is built at (suite/models; --size)
DEVICES = ("cpu", "cuda")

# Bounds on the timing options: steps in a timed window, timed rounds, and a wait in seconds (a week: a timedelta
# of 1e300 s overflows in the ranks).
MAX_STEPS, MAX_ROUNDS, WEEK = 10**6, 10**5, 7 * 86400

# The fewest rounds whose range can cover the median with 95% probability (1 - 2**(1 - n) >= 0.95): the default
# rounds of a run (suite/measure/stats.py says why the range is the interval at small n).
RUN_ROUNDS_FOR_95 = next(n for n in range(1, 64) if 1 - 2.0 ** (1 - n) >= 0.95)


class SpecError(ConfigError):
    """A run specification that cannot be used: names the field (or the option), the value and what is allowed."""


# Where a field of the specification is an option (``suite/spec_options.py`` makes each): the commands run, ab,
# bisect and nightly (argparse, suite/cli), pytest-benchmark (``--fleetbench-*``, bench_cases/conftest.py) and asv
# (``FLEETBENCH_BENCH_*`` variables, bench_cases/_matrix.py).  A field of the selection or of the run options is an
# option everywhere unless its metadata's ``on`` names fewer; one of ab's parts only where ``on`` names it.
SURFACES = ("run", "ab", "bisect", "nightly", "pytest", "asv")
AB = ("ab", "bisect")
NOWHERE = ()


def _check_options(obj: Any) -> None:
    """Every field of ``obj`` checked (values converted: a list to a tuple, an int to a float); a refusal names
    the command-line option, as a command that built ``obj`` from its options says it."""
    check_options(obj, SpecError)


def split_names(text: list | tuple) -> tuple[str, ...]:
    """Names given as options are repeatable or comma-separated: "a,b" is two."""
    return tuple(p.strip() for v in text for p in str(v).split(",") if p.strip())


# ---- the selection ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Selection:
    """What to run, as a command's options say it (nothing resolved yet: ``suite.selection.resolve``).

    ``cases`` are names or globs, ``tags`` and ``models`` select as ``fleetbench run`` does (with none of the
    three: ``default_tag``); ``worlds`` empty means the device's default; ``device`` None means CUDA where there
    is a GPU; ``size`` None the device's default; ``config`` a TOML file and ``sets`` ``KEY=VALUE`` overrides
    applied on top of every case.

    Each field's metadata says its option: ``option`` (the command line's name; ``names``: comma-separated names,
    compared as a set), ``on`` (where it is one), ``pytest``/``env`` (a harness's name where it is not the derived
    one), ``sep`` (an asv variable's separator), ``metavar``, ``path`` (a file, taken as an absolute path)."""

    cases: tuple[str, ...] = spec((), "case name or glob; repeatable or comma-separated", option="--case",
                                  metavar="NAME", names=True)
    tags: tuple[str, ...] = spec((), "cases with this tag; repeatable", option="--tag", names=True)
    models: tuple[str, ...] = spec((), "every case of this model", option="--model", metavar="MODEL", names=True)
    size: str | None = spec(None, "model size (default: the device's)", choices=SIZES)
    worlds: tuple[int, ...] = spec((), "world size (repeatable; default one: 2 on CPU, every GPU on CUDA)", ge=1,
                                   option="world size", pytest="--fleetbench-world", on=("pytest", "asv"))
    device: str | None = spec(None, "default: cuda where torch sees a GPU, else cpu", choices=DEVICES)
    config: str | None = spec(None, "TOML file of strategy fields applied on top of every case", path=True)
    sets: tuple[str, ...] = spec((), "a strategy field; repeatable", option="--set",
                                 metavar="KEY=VALUE", env="SET", sep=";")
    set_baseline: bool = spec(False, "apply --config's and --set's strategy knobs to the baseline too (by default "
                              "it stays plain data parallel; workload knobs, marked in `fleetbench config --list`, "
                              "apply to every case)", option="--set-baseline")
    varies: tuple[str, ...] = spec((), "each selected case but the baseline once per value, named CASE+KEY:VALUE, "
                                   "timed interleaved with the baseline (several: every combination); repeatable",
                                   option="--vary", metavar="KEY=V1,V2", env="VARY", sep=";")
    strategies: tuple[str, ...] = spec((), "your own strategy, a DDP communication hook or a gradient synchronizer "
                                       "(docs/strategies.md): one case of it per selected model; repeatable",
                                       option="--strategy", metavar="MODULE:FUNCTION", env="STRATEGY", names=True)
    default_tag: str = spec("default", "the tag selected when no case, tag or model is given", on=NOWHERE)

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):  # "a,b" is two, as figures' --cases takes them
            value = getattr(self, f.name)
            if f.metadata.get("names") and isinstance(value, (list, tuple)):
                object.__setattr__(self, f.name, split_names(value))
        _check_options(self)


# ---- how a case is measured -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RunOptions:
    """How cases are run: what a command asks of each measurement (argparse stays in ``suite.cli``).  What the
    command resolves (the size, the device, the backend ...) is :class:`RunFacts`, never asked."""

    per_rank_batch: int | None = spec(None, "per-rank batch size (default: the model's at its size)", ge=1,
                                      option="--batch", on=("run", *AB))
    steps: int = spec(5, "steps per timed window", ge=1, le=MAX_STEPS)
    rounds: int = spec(RUN_ROUNDS_FOR_95, "interleaved timed rounds (the fewest whose speedup interval covers 95%)",
                       ge=1, le=MAX_ROUNDS, on=("run", "nightly", "pytest", "asv"))
    warmup: int = spec(2, "warm-up steps per case, not recorded", ge=0, le=MAX_STEPS, on=("run", *AB))
    check_steps: int = spec(3, "steps of the correctness check", ge=1, le=MAX_STEPS, on=("run", *AB))
    check: bool = spec(True, "skip the correctness check", option="--no-check", on=("run", *AB, "pytest"))
    timeout: float | None = spec(None, "bound on each multi-rank call, seconds (default: scaled to the model)",
                                 gt=0.0, le=float(WEEK), unit="seconds", note="a week", on=("run", "pytest"),
                                 invocation=True)
    pg_timeout: float = spec(120.0, "bound on each collective wait, seconds", gt=0.0, le=float(WEEK),
                             unit="seconds", note="a week", on=("run",), invocation=True)
    trace_steps: int = spec(0, "traced steps per case after timing (0: no trace)", ge=0, le=MAX_STEPS,
                            metavar="N", on=("run",), invocation=True)
    utilization: bool = spec(True, "do not sample CPU/GPU utilization", option="--no-utilization", on=("run",),
                             invocation=True)
    baseline: str | None = spec(None, "the variant every timing group carries (None: the model's baseline case)",
                                on=NOWHERE)
    memory_budget: int | None = spec(None, "bytes all ranks' engines may hold at once (None: probed)", ge=1,
                                     on=NOWHERE)

    def __post_init__(self) -> None:
        _check_options(self)


@dataclass(frozen=True)
class RunFacts:
    """What a command resolved for the runner (``RunSpec.facts``), never asked and never in the spec's dict: the
    models' size and the platform of the resolved selection, what the baseline takes of the selection's
    ``--config`` and ``--set`` (``suite.config.baseline_sets``) and where traces go (``results_dir/traces/RUN_ID/``)."""

    size: str = spec("cpu", "the models' size the selection resolved to", choices=SIZES)
    device: str | None = spec(None, "what the ranks run on (None: the CPU)", choices=DEVICES)
    backend: str = spec("", "gloo | nccl, recorded")
    baseline_overrides: tuple[str, ...] = spec((), "what the baseline takes of the selection's --config and --set "
                                               "(suite.config.baseline_sets)")
    results_dir: str = spec("results", "traces go to results_dir/traces/RUN_ID/")

    def __post_init__(self) -> None:
        _check_options(self)


# ---- ab: trials and the sequential statistics -------------------------------------------------------------------
AB_ROTATE = 5  # `ab --rotate`'s default: the case prepared afresh on both sides every 5 blocks (docs/figures/gate.md)


@dataclass(frozen=True)
class SeqOptions:
    """The sequential ABBA comparison's settings (its rules: ``suite/ab/stats.py``)."""

    delta: float = spec(0.02, "equivalence margin on the step-time ratio (0.02: ±2%): 'same' inside it", gt=0.0,
                        lt=1.0, note="a fraction: 0.02 is 2%", on=AB)
    threshold: float = spec(0.05, "the gate's question: slower by this much or more? ('not slower' below it)",
                            gt=0.0, lt=1.0, note="a fraction: 0.05 is 5%", on=AB)
    confidence: float = spec(0.99, "of the intervals, over all the looks of one comparison (alpha = 1 - it)",
                             gt=0.5, lt=1.0, on=AB)
    max_blocks: int = spec(2000, "blocks at most per case", ge=3, on=AB)
    budget_s: float = spec(180.0, "timed blocks per case, seconds (prepare and check not counted)", gt=0.0,
                           unit="seconds", option="--budget", on=AB)
    trim: float = spec(0.2, "trimmed mean of the block log ratios", ge=0.0, lt=0.5)
    seed: int = spec(0, "seed of the block orders and the bootstrap", ge=0, le=2**32 - 1, on=AB)
    split: float | None = spec(None, "bisection: a log ratio; above it 'slower', below it 'same' (two regions)")
    rotate: int = spec(AB_ROTATE, "blocks per pair of preparations: the case prepared afresh on both sides every N",
                       ge=2, note="blocks per pair of preparations", on=AB)
    min_pairs: int = spec(3, "pairs of preparations before any verdict")
    restart: int = spec(2, "every K-th fresh preparation on fresh servers (0: never, 1: always)", on=AB)

    def __post_init__(self):
        _check_options(self)  # each field's range; the combinations below, in the same style
        if self.delta > self.threshold:
            raise SpecError(f"--delta {self.delta:g} is above --threshold {self.threshold:g}: the equivalence "
                            f"margin ('same') must lie within the threshold ('not slower by {self.threshold:.0%}')")
        if self.restart < 0:
            raise ValueError(f"--restart {self.restart!r}: must be a whole number >= 0 (fresh servers every K-th "
                             f"rotation; 0: never)")
        if self.min_pairs < 2:
            raise ValueError(f"min_pairs {self.min_pairs!r}: must be a whole number >= 2")
        if self.max_blocks < self.rotate * self.min_pairs:
            raise ValueError(f"--max-blocks {self.max_blocks}: must be >= {self.rotate * self.min_pairs} (--rotate "
                             f"{self.rotate} blocks x {self.min_pairs} pairs of preparations, the fewest a verdict "
                             f"looks at)")


@dataclass(frozen=True)
class AbOptions:
    """What `fleetbench ab` (and `bisect`) adds to a run's selection and options: its trials and statistics."""

    trial_warmup: int = spec(1, "discarded steps before each trial", ge=0, le=MAX_STEPS, on=AB)
    timeout: float = spec(600.0, "bound on each request to a trial server, seconds", gt=0.0, le=float(WEEK),
                          unit="seconds", note="a week", on=AB)
    seq: SeqOptions = field(default_factory=SeqOptions)
    python: str | None = spec(None, "interpreter of the trial servers (default: this one)", on=AB)
    total_budget_s: float | None = spec(None, "one budget of timed blocks for all cases", gt=0.0, le=float(WEEK),
                                        unit="seconds", note="a week", option="--total-budget", metavar="SECONDS",
                                        on=("ab",))

    def __post_init__(self) -> None:
        _check_options(self)


# ---- the whole specification ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RunSpec:
    """One run's specification: ``selection``, ``run`` and, for ``ab``/``bisect``, ``ab``."""

    selection: Selection = field(default_factory=Selection)
    run: RunOptions = field(default_factory=RunOptions)
    ab: AbOptions | None = None

    VERSION: ClassVar[int] = SPEC_VERSION

    @property
    def world(self) -> int | None:
        """The one world size the selection names (a run's, an ab's), or None (none, or several)."""
        return self.selection.worlds[0] if len(self.selection.worlds) == 1 else None

    def replace(self, selection: Mapping | None = None, run: Mapping | None = None, ab: Mapping | None = None
                ) -> RunSpec:
        """A copy with fields of the parts replaced: ``spec.replace(run={"check": False})``."""
        return RunSpec(dataclasses.replace(self.selection, **(selection or {})),
                       dataclasses.replace(self.run, **(run or {})),
                       dataclasses.replace(self.ab, **(ab or {})) if self.ab is not None else None)

    # ---- as data -------------------------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        """The spec as JSON-able data (tuples as lists), with its version."""
        run = {f.name: _data(getattr(self.run, f.name)) for f in dataclasses.fields(self.run)}
        ab = None
        if self.ab is not None:
            ab = {f.name: _data(getattr(self.ab, f.name)) for f in dataclasses.fields(self.ab) if f.name != "seq"}
            ab["seq"] = {f.name: getattr(self.ab.seq, f.name) for f in dataclasses.fields(self.ab.seq)}
        return {"spec_version": SPEC_VERSION,
                "selection": {f.name: _data(getattr(self.selection, f.name))
                              for f in dataclasses.fields(self.selection)},
                "run": run, "ab": ab}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: Any, where: str = "run specification") -> RunSpec:
        """The spec ``data`` states (:meth:`to_dict`'s form; a key left out takes its default); one SpecError
        naming ``where``, the field, the value and what is allowed for anything else."""
        if not isinstance(data, Mapping):
            raise SpecError(f"{where}: expected an object (a run specification), got {show(data)}")
        _known(data, ("spec_version", "selection", "run", "ab"), where, "", "part of a run specification")
        version = data.get("spec_version", SPEC_VERSION)
        if version != SPEC_VERSION:
            raise SpecError(f"{where}: field 'spec_version' is {show(version)}; this fleetbench reads run "
                            f"specifications of version {SPEC_VERSION}")
        selection = _part(Selection, data.get("selection"), where, "selection.")
        run = _part(RunOptions, data.get("run"), where, "run.")
        ab = None
        if data.get("ab") is not None:
            raw = data["ab"]
            if not isinstance(raw, Mapping):
                raise SpecError(f"{where}: field 'ab' is {show(raw)}; expected null or an object")
            seq = _part(SeqOptions, raw.get("seq"), where, "ab.seq.")
            ab = _part(AbOptions, {k: v for k, v in raw.items() if k != "seq"}, where, "ab.",
                       tuple(f.name for f in dataclasses.fields(AbOptions) if f.name != "seq"), seq=seq)
        return cls(selection, run, ab)

    @classmethod
    def from_json(cls, text: str, where: str = "run specification") -> RunSpec:
        try:
            data = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise SpecError(f"{where}: not a JSON run specification ({str(exc)[:200]})") from None
        return cls.from_dict(data, where)

    # ---- what the runner is given ---------------------------------------------------------------------------
    def facts(self, size: str, device: str | None, backend: str, results_dir: str = "results") -> RunFacts:
        """What the runner is told besides the run's options (``CaseRunner(launcher, world, spec.run,
        facts=spec.facts(...))``): the resolved size and platform, what the baseline takes of the selection's
        ``--config`` and ``--set`` (its workload knobs; every knob with ``--set-baseline``) and where traces go."""
        sel = self.selection
        return RunFacts(size=size, device=device, backend=backend, results_dir=results_dir,
                        baseline_overrides=baseline_sets(sel.config, sel.sets, sel.set_baseline))


def _data(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def _known(data: Mapping, names: tuple, where: str, prefix: str, what: str) -> None:
    for key in data:
        if key not in names:
            raise SpecError(f"{where}: field '{prefix}{key}' is not a {what}; allowed: {', '.join(names)}")


def _part(cls: type, data: Any, where: str, prefix: str, names: tuple | None = None, **given: Any) -> Any:
    """One part of a spec from its data: every key known, every value checked (field, value, what is allowed)."""
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise SpecError(f"{where}: field '{prefix.rstrip('.')}' is {show(data)}; expected an object")
    names = names or tuple(f.name for f in dataclasses.fields(cls))
    _known(data, names, where, prefix, f"field of the run specification's {prefix.rstrip('.')}")
    specs = field_specs(cls)
    kw: dict = {}
    for key, value in data.items():
        try:
            kw[key] = specs[key].check(value)
        except Invalid as exc:
            raise SpecError(exc.field(where, prefix)) from None
    try:
        return cls(**kw, **given)
    except ValueError as exc:  # a combination (e.g. ab's delta above its threshold)
        raise SpecError(f"{where}: {prefix.rstrip('.')}: {exc}") from None


# ---- the setup ---------------------------------------------------------------------------------------------------
def run_setup(*, device: str | None, backend: str | None, size: str | None, steps: int | None, rounds: int | None,
              warmup: int | None, sets: tuple[str, ...] | list[str] = (), config: Mapping | None = None,
              **more: Any) -> dict:
    """A benchmark's *setup*: what its numbers depend on besides the code and the machine: the device
    (``cpu``/``cuda``) and backend, the models' size, steps per timed window, timed windows (rounds), the engine's
    warm-up steps, the strategy overrides (``--set``, in order) and the ``--config`` file's fields (None without
    one, JSON-able); ``more`` adds a harness's own (asv: ``processes``).  Not the selection: which cases and world
    sizes ran is in each benchmark's name.

    The one definition: pytest-benchmark records it (``machine_info["fleetbench"]["setup"]``, its compare warns when
    a compared run's differs) and asv's benchmark ``version`` depends on it, through ``bench_cases/_matrix.py``'s
    ``setup_of`` (a resolved selection and its options: what is asked); the nightly's export writes it from a
    record (``suite/results/export.py``: what ran)."""
    fields = json.loads(json.dumps(dict(config), default=str)) if config is not None else None
    return {"device": device, "backend": backend, "size": size, "steps": steps, "rounds": rounds, "warmup": warmup,
            "sets": list(sets), "config": fields, **more}


# ---- a selected case ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ResolvedCase:
    """A selected case (a ``suite.cases.Case``) with its validated config; ``skip`` says why it cannot run at this
    world size; ``plan``: what its gradient sync will do there (``suite.comm.buckets.CommPlan``, None where it
    buckets nothing), compared with what the engine built when the case is recorded."""

    case: Any
    config: StrategyConfig
    skip: str | None = None
    plan: Any = None

    def __post_init__(self) -> None:
        self.config.refuse_unused("run")  # run, ab, nightly and the benchmark harnesses all run cases here
