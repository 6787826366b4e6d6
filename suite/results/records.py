"""Results as typed records with a schema version, appended atomically as JSON lines.

One line per finished case, written with a single ``write`` under an exclusive lock and
fsynced, so an interrupted run keeps every case that finished and a reader never sees half
a record.  Reading validates every line against the schema (each field's type); a corrupt,
truncated, non-UTF-8 or hostile file gets an error naming the file, the line and the field,
and nothing already recorded is rewritten.  A line longer than :data:`MAX_LINE_BYTES` is
refused without being read whole.

A record's parts are typed here, once: :class:`Metrics` (its fields are *the* list of metric
names, :data:`METRIC_NAMES`; the step times' summary a :class:`Stat`, the first non-finite loss a
:class:`NonfiniteLoss`), :class:`Describe` (what the engine set up, and the :class:`Precision` torch
ran in), :class:`Structure` (the exact facts the structural gate compares) and :class:`CheckSummary`
(the correctness check).  A field left ``None`` is absent from the JSON; numbers are numbers (JSON
has no nan/inf: they are stored as the strings "nan", "inf", "-inf" and read back as floats),
intervals are ``[lo, hi]`` lists, counts are whole numbers.  Readers read the parts' fields as
attributes (``rec.metrics.speedup``, ``rec.metrics.step_time_s.median``): a part is not a mapping,
so a name that is not a field is an error (mypy's, and AttributeError), never a silent None; a
metric a record lacks reads as None.  The JSON is the parts' ``to_dict()`` (the fields present),
the same keys whatever the types in memory.

Schema versions: 4 (current) adds ``spec``, the run specification (``suite.run_spec.RunSpec``).  3
types the parts (an unknown metric, describe or structure name is refused), adds
``describe.precision``, ``metrics.footprint_bytes`` and the status ``not_run`` (a case the job never
got to; ``error`` says why, as it does for ``skipped``).  2 added ``size``, ``backend``, ``device``,
``structure`` and ``fallback``.  Records of schemas 1 to 3 (stored last-good results) are read and
upgraded in memory, never rewritten: names schema 4 does not know are dropped, the rest is validated
as in schema 4; for schema 1, ``size`` is unknown (None), backend and device come from the metadata,
``structure`` is derived from what was recorded (``suite.results.structure``).
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..outputs import InputError, append_whole, loads_bounded, open_input
from ..run_spec import SIZES, RunSpec, SpecError
from ..validate import FieldSpec, Invalid, field_specs, show, spec
from .structure import structure_of

__all__ = ["SCHEMA_VERSION", "READABLE_VERSIONS", "MAX_LINE_BYTES", "MAX_RESULTS_BYTES", "CaseRecord",
           "ResultsFileError", "Metrics", "Stat", "NonfiniteLoss", "METRIC_NAMES", "METRIC_UNITS", "NUMERIC_METRICS",
           "Describe", "Precision", "Structure", "CheckSummary", "STATUSES", "VERDICTS", "append_record",
           "read_records", "iter_records", "jsonable", "plain", "run_ids_held", "runs_newest_first",
           "allreduce_total"]

SCHEMA_VERSION = 4
READABLE_VERSIONS = (1, 2, 3, 4)
MAX_LINE_BYTES = 8 * 2**20  # one record; a real one is a few KB to a few hundred KB
STATUSES = ("ok", "error", "skipped", "not_run")  # skipped / not_run: ``error`` holds the reason
VERDICTS = ("pass", "fail", "n/a", "error", "skipped", "not_run")
Interval = list  # [lo, hi]: two numbers


class ResultsFileError(ValueError):
    """A results file that cannot be used: names the file, the line and what is wrong."""


class _Part:
    """A typed part of a record: its fields are read as attributes (``rec.metrics.speedup``), a field that is None
    is absent from its JSON.  A part is not a mapping: a name that is not a field is an AttributeError (and a type
    error for mypy), never a silent None.  It is true when it holds any field (as the mapping it once was), so
    ``rec.check or ...`` still reads as before; readers ask :attr:`empty` where that is what they mean."""

    WHAT: ClassVar[str] = "name"

    @property
    def empty(self) -> bool:
        """No field recorded (every optional field None, as a record of a case that did not run has it)."""
        return not self.to_dict()

    def __bool__(self) -> bool:
        return not self.empty

    def to_dict(self) -> dict:
        """The fields that are not None (nested parts as theirs), for JSON: what the record's line holds."""
        out = {}
        kind: type = type(self)  # the cached helpers take the class as a plain type (mypy: type[X] is no Hashable)
        for k in _names(kind):
            v = getattr(self, k)
            if v is not None:
                out[k] = v.to_dict() if isinstance(v, _Part) else v
        return out

    @classmethod
    def from_dict(cls, data: Mapping, where: str = "", prefix: str = "", strict: bool = True) -> Any:
        """Validated and converted (``suite/validate.py``); ``strict``: a name this schema does not know is an error
        (else dropped).  A field given as null is absent."""
        kw = {}
        part: type = cls
        specs = _part_specs(part)
        for key, value in data.items():
            fs = specs.get(key)
            if fs is None:
                if strict:
                    raise ResultsFileError(f"{where}: field '{prefix}{key}' is not a {cls.WHAT} of schema "
                                           f"{SCHEMA_VERSION}; allowed: {', '.join(_names(part))}")
                continue
            if value is None and _fields(part)[key].default is None:
                continue
            try:
                value = fs.check(value)
            except Invalid as exc:
                raise ResultsFileError(exc.field(where, prefix)) from None
            kw[key] = fs.nested.from_dict(value, where, f"{prefix}{key}.", strict) if fs.nested else value
        try:
            return cls(**kw)
        except TypeError as exc:  # a required field missing
            raise ResultsFileError(f"{where}: {prefix.rstrip('.') or cls.__name__}: {exc}") from None


@functools.cache
def _fields(cls: type) -> dict:
    return {f.name: f for f in dataclasses.fields(cls)}


@functools.cache
def _names(cls: type) -> tuple:
    return tuple(f.name for f in dataclasses.fields(cls))


@functools.cache
def _part_specs(cls: type) -> dict[str, FieldSpec]:
    """What each field of a part accepts, a record's numbers read leniently (``"nan"``); a part's field that is
    None is absent, so a value given is said against the type alone ("expected a whole number")."""
    return {k: dataclasses.replace(fs, optional=False) for k, fs in field_specs(cls, lenient=True).items()}


@dataclass(frozen=True)
class Stat(_Part):
    """A sample's summary (``suite.measure.stats.describe``): how many values, their median, quartiles and IQR,
    least, greatest and mean.  Each field may be absent from a record that wrote fewer."""

    WHAT: ClassVar[str] = "statistic"

    n: int | None = None
    median: float | None = None
    q25: float | None = None
    q75: float | None = None
    iqr: float | None = None  # q75 - q25
    min: float | None = None
    max: float | None = None
    mean: float | None = None


@dataclass(frozen=True)
class NonfiniteLoss(_Part):
    """Where the first nan/inf loss of the timed windows was: its rank and its 1-based step."""

    WHAT: ClassVar[str] = "field"

    rank: int
    step: int


@dataclass(frozen=True)
class Metrics(_Part):
    """What a case measured: these fields are the one list of metric names (``METRIC_NAMES``)."""

    WHAT: ClassVar[str] = "metric"

    samples_per_s: float | None = None  # median over rounds of global batch x steps / the slowest rank's window
    samples_per_s_ci: Interval | None = None  # its bootstrap 95% interval
    throughput_per_round: list[float] | None = None  # samples/s of each round
    window_s: list[float] | None = None  # each round's window (the slowest rank's), seconds
    step_time_s: Stat | None = None  # per-step seconds over every rank: n, median, q25, q75, iqr, min ..
    step_times_s: list[float] | None = None  # every rank's per-step seconds
    rank_median_step_s: list[float] | None = None  # each rank's median step
    slowest_rank: int | None = None
    losses: list[float] | None = None  # rank 0's loss per timed step
    nonfinite_loss: NonfiniteLoss | None = None  # the first nan/inf loss
    comm_calls_per_step: dict[str, float] | None = None  # per "group label/collective"
    comm_bytes_per_step: dict[str, float] | None = None
    host_syncs: int | None = None  # device-to-host syncs in the timed windows
    threads: int | None = None  # intra-op threads per rank
    peak_memory_bytes: int | None = None  # transient peak above a window's start (the largest rank's)
    peak_memory_kind: str | None = None  # what measured it (process_rss, cuda_max_allocated ..)
    footprint_bytes: int | None = None  # parameters + gradients + buckets + optimizer state, per rank
    global_batch: int | None = None
    steps_per_window: int | None = None
    speedup: float | None = None  # over ``baseline``, paired round by round (> 1 faster)
    speedup_ci: Interval | None = None
    baseline: str | None = None
    # the rounds agree on the side of 1 the speedup's interval is on (suite.measure.stats.round_consistency): False
    # is "not resolved (rounds disagree)"; None where not judged (an interval spanning 1, or a record before it)
    speedup_consistent: bool | None = None
    speedup_disagreement: str | None = None  # why not: the round the interval rests on, the rounds across 1
    exposed_comm_s: float | None = None  # step time - the ``none`` variant's (compute alone)
    compute_s: float | None = None
    busbw_GBps: float | None = None  # nccl-tests' bus bandwidth over the exposed communication
    utilization: dict | None = None  # suite.measure.utilization's summary
    workload: dict | None = None  # the workload's description (harnesses that time rounds themselves)
    trace_file: str | None = None  # under the results directory's traces/: a directory (one torch.profiler trace
    # per rank, timeline.json) since --trace-steps wrote torch.profiler traces, one file before
    trace_error: str | None = None  # why the trace is missing
    # the machine's state (suite.measure.utilization.busy_reason reads them; optional: older records lack them)
    load_avg_start: float | None = None  # the 1-minute load average when the case's timing started
    load_avg_end: float | None = None  # ... and when it ended
    cpu_cores: int | None = None  # the cores the load average is read against (os.cpu_count)
    others_cpu_s: float | None = None  # CPU seconds of processes other than the ranks during the timed windows
    others_cpu_share: float | None = None  # ... over the machine's CPU seconds then (every core)


def allreduce_total(per_step: Mapping[str, float] | None) -> float:
    """The allreduces' share of ``comm_bytes_per_step`` or ``comm_calls_per_step`` ("group label/collective" ->
    bytes or calls): the flat allreduces, and a two-level one counted once, by its first step over the whole
    buffer (the intra-node reduce-scatter, or reduce: ``suite.comm.hierarchical``), not by the shards its
    inter-node allreduce moves.  So a hierarchical case's bytes are the gradients it averages, as a flat one's."""
    total = 0.0
    for key, n in (per_step or {}).items():
        group, _, op = str(key).rpartition("/")
        if (op == "all_reduce" and not group.startswith("inter")) or op == "reduce_scatter" or (
                op == "reduce" and group.startswith("intra")):
            total += n if isinstance(n, (int, float)) and math.isfinite(n) else 0.0
    return total


METRIC_NAMES = _names(Metrics)
# the units of the metrics a benchmark's extra_info carries (pytest-benchmark JSON: bench_cases, the nightly's export)
METRIC_UNITS = {
    "window_s": "s: per window, the slowest rank's window",
    "step_times_s": "s: every step of every rank, window after window",
    "rank_median_step_s": "s: each rank's median step",
    "samples_per_s": "samples/s: global batch x steps per window / the slowest rank's window, median over windows",
    "throughput_per_round": "samples/s, per window",
    "peak_memory_bytes": "bytes",
    "speedup": "ratio: the baseline's window / this case's, paired round by round (> 1: faster), median; "
               "speedup_ci its 95% interval",
}
NUMERIC_METRICS = tuple(f.name for f in dataclasses.fields(Metrics)  # numbers and intervals (the report's table)
                        if f.type.removesuffix(" | None") in ("float", "int", "Interval"))


@dataclass(frozen=True)
class Precision(_Part):
    """The float precision settings torch reported while the case ran (``torch.backends``)."""

    matmul_allow_tf32: bool | None = None
    cudnn_allow_tf32: bool | None = None
    float32_matmul_precision: str | None = None  # highest | high | medium
    cudnn_benchmark: bool | None = None
    cudnn_deterministic: bool | None = None
    cudnn_version: int | None = None


@dataclass(frozen=True)
class Describe(_Part):
    """What the engine set up (its ``describe()``: strategy, buckets, fusion counts ..), and the precision.

    The engine's keys are its own (each strategy adds some) and stay as they are, at the top level of the JSON;
    read them from :attr:`engine` (a plain dict: ``rec.describe.engine.get("buckets")``)."""

    engine: dict = field(default_factory=dict)
    precision: Precision | None = None

    def to_dict(self) -> dict:
        """The engine's keys at the top level, and ``precision`` beside them where it was reported."""
        out = {k: v for k, v in self.engine.items() if k != "precision"}
        if self.precision is not None:
            out["precision"] = self.precision.to_dict()
        return out

    @classmethod
    def from_dict(cls, data: Mapping, where: str = "", prefix: str = "", strict: bool = True) -> Describe:
        precision = data.get("precision")
        if precision is not None and not isinstance(precision, Mapping):
            raise ResultsFileError(f"{where}: field '{prefix}precision' is {show(precision)}; expected an object")
        return cls({k: v for k, v in data.items() if k != "precision"},
                   Precision.from_dict(precision, where, prefix + "precision.", strict) if precision else None)


@dataclass(frozen=True)
class Structure(_Part):
    """The exact facts the structural gate compares (``suite.results.structure``)."""

    WHAT: ClassVar[str] = "structural fact"

    strategy: str | None = None
    allreduce_ops_before_fusion: int | None = None
    allreduce_ops: int | None = None
    fuse_all_reduce_ops: bool | None = None
    overlap: bool | None = None
    launched_in_backward: int | None = None  # the fewest buckets launched before backward ended in a step
    nccl_comm_num: int | None = None
    hierarchical: dict | None = None
    init_broadcasts: int | None = None
    buckets: list | None = None  # [{"params", "bytes", "comm"}]
    fused_ops: dict | None = None
    optimizer_ops: dict | None = None
    comm_calls_per_step: dict[str, float] | None = None
    comm_bytes_per_step: dict[str, float] | None = None
    loss_trajectory: list[str] | None = None  # float.hex of each check loss (deterministic configs only)
    precision: dict | None = None  # the Precision values torch reported: a precision change is a structure change


@dataclass(frozen=True)
class CheckSummary(_Part):
    """The correctness check: what ``suite.check.harness`` answers and the record keeps (one type)."""

    WHAT: ClassVar[str] = "check field"

    verdict: str  # pass | fail | n/a | error
    reference: str = ""  # the reference's class (suite.check.reference)
    kind: str = "exact"  # the check that ran: exact | bounded error | convergence (a strategy declares it)
    tolerance_key: str = ""  # its row of suite.check.tolerances
    param_tol: float = 0.0
    loss_tol: float = 0.0
    param_error: float = math.inf  # the worst over steps and ranks (relative)
    param_error_at: str = ""  # the parameter where it was
    loss_error: float = math.inf
    buffer_error: float = 0.0
    ranks_identical: bool = False
    steps: int = 0
    per_step: list = field(default_factory=list)  # per step: its errors, whether the ranks agreed, the worst param
    losses: list[float] = field(default_factory=list)  # rank 0's loss at each step (the structural gate compares)
    precision: str = "float32"  # the dtype the check ran in (float64 for BatchNorm models: check_precision)
    message: str = ""

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"


_PARTS: dict[str, Any] = {"check": CheckSummary, "metrics": Metrics, "describe": Describe, "structure": Structure}


@dataclass
class CaseRecord:
    case: str = spec(help="registry name, e.g. resnet/overlap", nonempty=True)
    model: str = spec()
    world_size: int = spec(ge=1)
    config: dict = spec()  # the full resolved StrategyConfig
    run_id: str = spec(nonempty=True)
    status: str = spec("ok", choices=STATUSES)  # skipped, not_run: ``error`` says why
    verdict: str = spec("n/a", choices=VERDICTS)
    tags: list[str] = field(default_factory=list)
    timestamp: str = ""
    size: str | None = spec(None, choices=SIZES)  # None: a schema-1 record, size unknown
    backend: str = ""  # gloo | nccl
    device: str = ""  # "cpu", or "cuda" with the GPU's name
    check: CheckSummary | None = None
    metrics: Metrics = field(default_factory=Metrics)
    describe: Describe = field(default_factory=Describe)
    structure: Structure = field(default_factory=Structure)
    fallback: str | None = None  # why the case was timed alone rather than interleaved with its model's cases
    error: str | None = None
    metadata: dict = field(default_factory=dict)
    spec: RunSpec | None = None  # what the run was asked (schema 4; None before): `run --resume` reads it
    schema_version: int = SCHEMA_VERSION
    kind: str = "fleetbench.case"

    REQUIRED = ("case", "model", "world_size", "config", "run_id")

    def __post_init__(self) -> None:
        for name, part in _PARTS.items():  # plain objects (a caller's, a test's) become the typed parts
            value = getattr(self, name)
            if isinstance(value, Mapping) and not isinstance(value, part):
                setattr(self, name, part.from_dict(value, f"record {self.case}", name + "."))

    def to_json(self) -> str:
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return json.dumps(jsonable(data), sort_keys=True, allow_nan=False)

    @classmethod
    def from_dict(cls, data: Any, where: str = "") -> CaseRecord:
        if not isinstance(data, dict):
            raise ResultsFileError(f"{where}: expected a JSON object, got {type(data).__name__}")
        if data.get("kind") != "fleetbench.case":
            raise ResultsFileError(f"{where}: not a fleetbench case record (kind={data.get('kind')!r})")
        version = data.get("schema_version")
        if version not in READABLE_VERSIONS:
            raise ResultsFileError(
                f"{where}: schema_version={version!r}; this fleetbench reads schema versions "
                f"{', '.join(map(str, READABLE_VERSIONS))}"
            )
        missing = [k for k in cls.REQUIRED if k not in data]
        if missing:
            raise ResultsFileError(f"{where}: record lacks {', '.join(missing)}")
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        if version == SCHEMA_VERSION:
            extra = [k for k in data if k not in known]
            if extra:
                raise ResultsFileError(f"{where}: field {extra[0]!r} is not a field of a schema-{SCHEMA_VERSION} "
                                       f"record; allowed: {', '.join(sorted(known))}")
        else:
            values.pop("spec", None)  # a record before schema 4 has none (resume reads its metadata["run"])
        _validate(values, where)
        for name, part in _PARTS.items():  # older schemas: names schema 4 does not know are dropped
            if values.get(name) is not None:
                values[name] = part.from_dict(values[name], where, name + ".", strict=version == SCHEMA_VERSION)
        if values.get("spec") is not None:
            try:
                values["spec"] = RunSpec.from_dict(values["spec"], f"{where}: spec")
            except SpecError as exc:
                raise ResultsFileError(str(exc)) from None
        rec = cls(**values)
        if version == 1:
            _upgrade_v1(rec, where)
        return rec

    @property
    def samples_per_s(self) -> float:
        v = self.metrics.samples_per_s
        return float(v) if v is not None else math.nan

    def derived_structure(self, deterministic: bool = False, strict: bool = True, where: str = "") -> Structure:
        """The structural facts of what this record holds (``suite.results.structure.structure_of``): the engine's
        describe, the collectives per step and, where ``deterministic``, the check's losses bit for bit."""
        facts = structure_of(self.describe.to_dict(), self.metrics.comm_calls_per_step,
                             self.metrics.comm_bytes_per_step, self.check.losses if self.check is not None else None,
                             deterministic=deterministic)
        return Structure.from_dict(facts, where or f"case {self.case}", "structure.", strict=strict)


def _validate(values: dict, where: str) -> None:
    """Each top-level field given checked against :class:`CaseRecord`'s own (``suite/validate.py``); the parts
    (metrics, describe, structure, check) only as objects here, field by field by their own classes."""
    specs = field_specs(CaseRecord, lenient=True)
    for name, value in values.items():
        try:
            specs[name].check(value)
        except Invalid as exc:
            raise ResultsFileError(exc.field(where)) from None


def _show(value: Any) -> str:
    return show(value)


def _upgrade_v1(rec: CaseRecord, where: str) -> None:
    """A schema-1 record in schema 2's terms (in memory only; the file is never rewritten)."""
    meta = rec.metadata or {}
    rec.backend = rec.backend or (meta.get("backend") or "")
    gpu = meta.get("gpu") or {}
    rec.device = rec.device or ("cuda: " + ", ".join(gpu.get("names") or []) if gpu.get("available") else "cpu")
    if rec.structure.empty and rec.status == "ok":
        rec.structure = rec.derived_structure(strict=False, where=where)


def jsonable(obj: Any) -> Any:
    """JSON has no inf/nan: they become the strings "inf", "-inf", "nan"."""
    if isinstance(obj, float):
        if math.isfinite(obj):
            return obj
        return "nan" if obj != obj else ("inf" if obj > 0 else "-inf")
    if isinstance(obj, (_Part, RunSpec)):
        return jsonable(obj.to_dict())
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    return obj


def append_record(path: str, record: CaseRecord) -> None:
    """Append one record as one line, all or nothing (:func:`suite.outputs.append_whole`: an exclusive lock, one
    write whose count is checked, fsync).  A short write (a full disk) truncates the file back to where it ended
    and raises :class:`ShortWrite`; any OSError leaves the file as it was.  A symbolic link, a FIFO or a device
    as ``path`` is refused (it could lead the write anywhere)."""
    append_whole(path, (record.to_json() + "\n").encode())


MAX_RESULTS_BYTES = 2**30  # a results file read whole (records are a few KB to a few hundred KB each)


def runs_newest_first(records: list) -> list:
    """The run ids of ``records`` (in the order read), newest first: by each run's latest timestamp (UTC ISO
    text), then by its last record's position."""
    newest: dict = {}
    for i, rec in enumerate(records):
        newest[rec.run_id] = max(newest.get(rec.run_id, ("", -1)), (rec.timestamp or "", i))
    return sorted(newest, key=lambda r: newest[r], reverse=True)


def run_ids_held(records: list, limit: int = 5) -> str:
    """The run ids of ``records`` (in the order read) for an error message: the last ``limit`` runs, newest first
    (by each run's latest timestamp, UTC ISO text, then by its last record's position), with their counts."""
    counts: dict = {}
    for rec in records:
        counts[rec.run_id] = counts.get(rec.run_id, 0) + 1
    if not counts:
        return "no run ids"
    order = runs_newest_first(records)
    shown = ", ".join(f"{r} ({counts[r]} record{'s' if counts[r] != 1 else ''})" for r in order[:limit])
    return shown + (f", and {len(order) - limit} older run(s)" if len(order) > limit else "")


_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def plain(text: Any, keep: str = "") -> str:
    """A record's text made safe for a terminal or a Markdown file: control characters (ANSI escapes
    included) and bidirectional overrides shown as ``\\uXXXX`` instead of acting; ``keep`` names the
    ones left as they are (e.g. a newline)."""
    return _UNSAFE.sub(lambda m: m.group() if m.group() in keep else f"\\u{ord(m.group()):04x}", str(text))


MAX_WORLD = 2**20  # a world size beyond any machine (and beyond a usable file name)
MAX_BLANK_LINES = 10_000  # blank lines a results file may hold (a run writes none; an editor leaves a few)


def iter_records(path: str) -> Iterator[CaseRecord]:
    """The records of the results file ``path``, one per line, each validated (:meth:`CaseRecord.from_dict`); a
    file that cannot be used is a :class:`ResultsFileError` naming it, the line and what is wrong (a FIFO or a
    device is refused without blocking: :func:`suite.outputs.open_input`)."""
    try:
        fh = open_input(path, "results file", MAX_RESULTS_BYTES)
    except InputError as exc:
        raise ResultsFileError(str(exc)) from None
    with fh:
        lineno = blank = 0
        while True:
            raw = fh.readline(MAX_LINE_BYTES + 1)
            if not raw:
                return
            lineno += 1
            where = f"{path}:{lineno}"
            if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
                raise ResultsFileError(f"{where}: the line is longer than {MAX_LINE_BYTES // 2**20} MiB, the limit "
                                       f"for one record; not a fleetbench results file")
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ResultsFileError(f"{where}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
            if not line.strip():
                blank += 1
                if blank > MAX_BLANK_LINES:
                    raise ResultsFileError(f"{where}: more than {MAX_BLANK_LINES} blank lines; not a fleetbench "
                                           f"results file (a run writes none)")
                continue
            try:
                data = loads_bounded(line, where)
            except InputError as exc:
                raise ResultsFileError(str(exc)) from None
            rec = CaseRecord.from_dict(data, where)
            if rec.world_size > MAX_WORLD:
                raise ResultsFileError(f"{where}: field 'world_size' is {_show(rec.world_size)}; expected at most "
                                       f"{MAX_WORLD}")
            yield rec


def read_records(path: str) -> list[CaseRecord]:
    return list(iter_records(path))
