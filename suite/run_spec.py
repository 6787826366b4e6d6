"""The run specification: what to run and how, one typed value from the command line to the record.

A :class:`RunSpec` is three frozen parts:

- :class:`Selection`: which cases (names or globs, tags, models), at which size, world sizes and device, with
  which ``--config`` file and ``--set`` overrides (resolved into cases and configs by ``suite/selection.py``);
- :class:`RunOptions`: how each case is measured (batch, steps, rounds, warm-up, check, timeouts, traces,
  utilization, the baseline); its last fields are *resolved* facts (size, device, backend, the overrides the
  baseline takes, where traces go) that the command fills in once the selection is resolved: they are never in
  the spec's dict;
- :class:`AbOptions` (``fleetbench ab`` and ``bisect`` only): the trials and the sequential statistics'
  :class:`SeqOptions` (their rules are ``suite/ab/stats.py``'s).

Every default of a run and of ``ab`` is stated here, once: ``fleetbench run``, ``ab`` (and its trial servers),
``nightly``, pytest-benchmark and asv take them from these classes.  Each command builds its spec from its
own options inside ``suite/cli/`` (nothing outside it sees an argparse ``Namespace``); the records carry it
(``CaseRecord.spec``, schema 4), ``run --resume`` reads it back, ``ab`` sends it to its trial servers and
``nightly`` hands it to its stages (``run --spec FILE``, ``FLEETBENCH_BENCH_SPEC``).

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

from .config import ConfigError, StrategyConfig
from .validate import Invalid, field_specs, show, spec

__all__ = ["RunSpec", "Selection", "RunOptions", "AbOptions", "SeqOptions", "ResolvedCase", "SpecError",
           "SPEC_VERSION", "SIZES", "DEVICES", "AB_ROTATE", "MAX_STEPS", "MAX_ROUNDS", "WEEK", "RUN_ROUNDS_FOR_95",
           "run_setup"]

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
    """A run specification that cannot be used: names the field, the value and what is allowed."""


def _option(f: dataclasses.Field) -> str:
    return f.metadata.get("option") or "--" + f.name.replace("_", "-")


def _check_options(obj: Any) -> None:
    """Every field of ``obj`` checked (values converted: a list to a tuple, an int to a float); a refusal names
    the command-line option, as a command that built ``obj`` from its options says it."""
    options = {f.name: _option(f) for f in dataclasses.fields(obj)}
    cls: Any = type(obj)
    for name, fs in field_specs(cls).items():
        value = getattr(obj, name)
        try:
            checked = fs.check(value)
        except Invalid as exc:
            if fs.choices is not None:
                raise SpecError(f"{options[name]} {value!r}: allowed values are "
                                f"{', '.join(map(str, fs.choices))}") from None
            raise SpecError(exc.option(options[name])) from None
        if checked is not value:
            object.__setattr__(obj, name, checked)


def _names(text: list | tuple) -> tuple[str, ...]:
    """Names given as options are repeatable or comma-separated: "a,b" is two."""
    return tuple(p.strip() for v in text for p in str(v).split(",") if p.strip())


# ---- the selection ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Selection:
    """What to run, as a command's options say it (nothing resolved yet: ``suite.selection.resolve``).

    ``cases`` are names or globs, ``tags`` and ``models`` select as ``fleetbench run`` does (with none of the
    three: ``default_tag``); ``worlds`` empty means the device's default; ``device`` None means CUDA where there
    is a GPU; ``size`` None the device's default; ``config`` a TOML file and ``sets`` ``KEY=VALUE`` overrides
    applied on top of every case."""

    cases: tuple[str, ...] = spec((), "case names or globs", option="--case")
    tags: tuple[str, ...] = spec((), "case tags", option="--tag")
    models: tuple[str, ...] = spec((), "models: every case of each", option="--model")
    size: str | None = spec(None, "model size (None: the device's)", choices=SIZES)
    worlds: tuple[int, ...] = spec((), "world sizes (empty: the device's one default)", ge=1, option="world size")
    device: str | None = spec(None, "cpu or cuda (None: cuda where torch sees a GPU)", choices=DEVICES)
    config: str | None = spec(None, "a TOML file of strategy fields applied on top of every case")
    sets: tuple[str, ...] = spec((), "KEY=VALUE strategy fields applied on top of every case", option="--set")
    default_tag: str = spec("default", "the tag selected when no case, tag or model is given")

    def __post_init__(self) -> None:
        for name in ("cases", "tags", "models"):  # "a,b" is two, as figures' --cases takes them
            value = getattr(self, name)
            if isinstance(value, (list, tuple)):
                object.__setattr__(self, name, _names(value))
        for w in self.worlds if isinstance(self.worlds, (list, tuple)) else ():
            if isinstance(w, bool) or not isinstance(w, int) or w < 1:  # named alone, not the whole list
                raise SpecError(f"world size {w!r}: must be a whole number >= 1")
        _check_options(self)


# ---- how a case is measured -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RunOptions:
    """How cases are run: what a command asks of each measurement (argparse stays in ``suite.cli``).

    The fields after ``memory_budget`` are resolved, not asked: the command sets them from the resolved selection
    (``RunSpec.run_options``); they are not part of the spec's dict."""

    per_rank_batch: int | None = spec(None, "per-rank batch (None: each model's own at its size)", ge=1,
                                      option="--batch")
    steps: int = spec(5, "steps per timed window", ge=1, le=MAX_STEPS)
    rounds: int = spec(RUN_ROUNDS_FOR_95, "interleaved timed rounds (the fewest whose speedup interval covers 95%)",
                       ge=1, le=MAX_ROUNDS)
    warmup: int = spec(2, "warm-up steps per case, not recorded", ge=0, le=MAX_STEPS)
    check: bool = spec(True, "the correctness check first", option="--no-check")
    check_steps: int = spec(3, "steps of the correctness check", ge=1, le=MAX_STEPS)
    timeout: float | None = spec(None, "bound on every multi-rank call (None: scaled, CaseRunner.call_timeout)",
                                 gt=0.0, le=float(WEEK), unit="seconds", note="a week")
    pg_timeout: float = spec(120.0, "bound on each collective wait", gt=0.0, le=float(WEEK), unit="seconds",
                             note="a week")
    trace_steps: int = spec(0, "traced steps per case after timing (0: no trace)", ge=0, le=MAX_STEPS)
    utilization: bool = spec(True, "CPU/GPU utilization sampled while timing", option="--no-utilization")
    baseline: str | None = spec(None, "the variant every timing group carries (None: the model's baseline case)")
    memory_budget: int | None = spec(None, "bytes all ranks' engines may hold at once (None: probed)", ge=1)
    # ---- resolved by the command, never in the spec's dict ------------------------------------------------------
    size: str = spec("cpu", "the models' size the selection resolved to", choices=SIZES, resolved=True)
    device: str | None = spec(None, "what the ranks run on (None: the CPU)", choices=DEVICES, resolved=True)
    backend: str = spec("", "gloo | nccl, recorded", resolved=True)
    baseline_overrides: tuple[str, ...] = spec((), "the selection's --set, applied to the baseline too",
                                               resolved=True)
    results_dir: str = spec("results", "traces go to results_dir/traces/RUN_ID/", resolved=True)

    def __post_init__(self) -> None:
        _check_options(self)

    @classmethod
    def asked(cls) -> tuple[str, ...]:
        """The fields a spec carries (not the resolved ones)."""
        return tuple(f.name for f in dataclasses.fields(cls) if not f.metadata.get("resolved"))


# ---- ab: trials and the sequential statistics -------------------------------------------------------------------
AB_ROTATE = 5  # `ab --rotate`'s default: the case prepared afresh on both sides every 5 blocks (docs/figures/gate.md)


@dataclass(frozen=True)
class SeqOptions:
    """The sequential ABBA comparison's settings (its rules: ``suite/ab/stats.py``)."""

    delta: float = spec(0.02, "equivalence margin on the step-time ratio (0.02: ±2%): 'same' inside it")
    threshold: float = spec(0.05, "the gate's question: slower by this much or more? ('not slower' below it)")
    confidence: float = spec(0.99, "of the intervals, over all the looks of one comparison (alpha = 1 - it)")
    max_blocks: int = spec(2000, "blocks at most per case")
    budget_s: float = spec(180.0, "timed blocks per case, seconds (prepare and check not counted)", option="--budget")
    trim: float = spec(0.2, "trimmed mean of the block log ratios")
    seed: int = spec(0, "seed of the block orders and the bootstrap", ge=0, le=2**32 - 1)
    split: float | None = spec(None, "bisection: a log ratio; above it 'slower', below it 'same' (two regions)")
    rotate: int = spec(AB_ROTATE, "blocks per pair of preparations: the case prepared afresh on both sides every N")
    min_pairs: int = spec(3, "pairs of preparations before any verdict")
    restart: int = spec(2, "every K-th fresh preparation on fresh servers (0: never, 1: always)")

    def __post_init__(self):
        _check_options(self)  # types and the seed's range; the rest below, with the statistics' own words
        if not 0 < self.delta < 1:
            raise ValueError(f"--delta {self.delta!r}: must be a fraction in (0, 1) (0.02 = 2%)")
        if not 0 < self.threshold < 1:
            raise ValueError(f"--threshold {self.threshold!r}: must be a fraction in (0, 1) (0.05 = 5%)")
        if self.delta > self.threshold:
            raise ValueError(f"--delta {self.delta:g} is above --threshold {self.threshold:g}: the equivalence "
                             f"margin ('same') must lie within the threshold ('not slower by {self.threshold:.0%}')")
        if not (0.5 < self.confidence < 1):
            raise ValueError(f"--confidence {self.confidence!r}: must be in (0.5, 1)")
        if not (self.budget_s > 0 and self.budget_s != float("inf")):
            raise ValueError(f"--budget {self.budget_s!r}: must be a finite number of seconds > 0")
        if not (0 <= self.trim < 0.5):
            raise ValueError(f"trim {self.trim!r}: must be in [0, 0.5)")
        if self.rotate < 2:
            raise ValueError(f"--rotate {self.rotate!r}: must be a whole number >= 2 (blocks per pair of "
                             f"preparations)")
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

    trial_warmup: int = spec(1, "discarded steps before each trial", ge=0, le=MAX_STEPS)
    timeout: float = spec(600.0, "bound on each request to a trial server", gt=0.0, le=float(WEEK), unit="seconds",
                          note="a week")
    seq: SeqOptions = field(default_factory=SeqOptions)
    python: str | None = spec(None, "interpreter of the trial servers (None: this one)")
    total_budget_s: float | None = spec(None, "one budget of timed blocks for all cases", gt=0.0, le=float(WEEK),
                                        unit="seconds", note="a week", option="--total-budget")

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
        """The spec as JSON-able data (tuples as lists; the run's resolved fields left out), with its version."""
        run = {k: _data(getattr(self.run, k)) for k in RunOptions.asked()}
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
        run = _part(RunOptions, data.get("run"), where, "run.", RunOptions.asked())
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
    def run_options(self, size: str, device: str | None, backend: str, results_dir: str = "results"
                    ) -> RunOptions:
        """The run's options with the resolved facts filled in: the selection's size and platform, its ``--set``
        (the baseline takes them too) and where traces go."""
        return dataclasses.replace(self.run, size=size, device=device, backend=backend,
                                   baseline_overrides=tuple(self.selection.sets), results_dir=results_dir)


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
