"""Results as typed records with a schema version, appended atomically as JSON lines.

One line per finished case, written with a single ``write`` under an exclusive lock and
fsynced, so an interrupted run keeps every case that finished and a reader never sees half
a record.  Reading validates every line against the schema (each field's type); a corrupt,
truncated, non-UTF-8 or hostile file gets an error naming the file, the line and the field,
and nothing already recorded is rewritten.  A line longer than :data:`MAX_LINE_BYTES` is
refused without being read whole.

Schema versions: 2 (current) adds ``size``, ``backend``, ``device``, ``structure`` and
``fallback``; schema-1 records (stored last-good results) are read and upgraded in memory:
``size`` unknown (None), backend and device from their metadata, ``structure`` derived from
what they recorded (``suite.results.structure``).
"""
from __future__ import annotations

import dataclasses
import fcntl
import json
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

__all__ = ["SCHEMA_VERSION", "READABLE_VERSIONS", "MAX_LINE_BYTES", "CaseRecord", "ResultsFileError",
           "append_record", "read_records", "iter_records", "jsonable"]

SCHEMA_VERSION = 2
READABLE_VERSIONS = (1, 2)
MAX_LINE_BYTES = 8 * 2**20  # one record; a real one is a few KB to a few hundred KB
STATUSES = ("ok", "error", "skipped")
VERDICTS = ("pass", "fail", "n/a", "error", "skipped")


class ResultsFileError(ValueError):
    """A results file that cannot be used: names the file, the line and what is wrong."""


@dataclass
class CaseRecord:
    case: str  # registry name, e.g. "resnet/overlap"
    model: str
    world_size: int
    config: dict  # the full resolved StrategyConfig
    run_id: str
    status: str = "ok"  # ok | error | skipped
    verdict: str = "n/a"  # pass | fail | n/a | error | skipped
    tags: list = field(default_factory=list)
    timestamp: str = ""
    size: str | None = None  # full | cpu | tiny (None: a schema-1 record, size unknown)
    backend: str = ""  # gloo | nccl
    device: str = ""  # "cpu", or "cuda" with the GPU's name
    check: dict | None = None  # CheckResult.to_dict()
    metrics: dict = field(default_factory=dict)  # samples_per_s, step_time_s, speedup, step_times_s …
    describe: dict = field(default_factory=dict)  # what the engine set up (buckets, fusion counts …)
    structure: dict = field(default_factory=dict)  # exact facts the structural gate compares
    fallback: str | None = None  # why the case was timed alone rather than interleaved with its model's cases
    error: str | None = None
    metadata: dict = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION
    kind: str = "fleetbench.case"

    REQUIRED = ("case", "model", "world_size", "config", "run_id")

    def to_json(self) -> str:
        return json.dumps(jsonable(dataclasses.asdict(self)), sort_keys=True, allow_nan=False)

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
        _validate(values, where)
        rec = cls(**values)
        if version == 1:
            _upgrade_v1(rec)
        return rec

    @property
    def samples_per_s(self) -> float:
        v = self.metrics.get("samples_per_s")
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else math.nan


def _is_str_list(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


# field -> (check, what is allowed); a field absent from the record keeps its default
_FIELD_CHECKS: dict = {
    "case": (lambda v: isinstance(v, str) and v != "", "a non-empty string"),
    "model": (lambda v: isinstance(v, str), "a string"),
    "world_size": (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1, "a whole number >= 1"),
    "config": (lambda v: isinstance(v, dict), "an object"),
    "run_id": (lambda v: isinstance(v, str) and v != "", "a non-empty string"),
    "status": (lambda v: v in STATUSES, "one of " + ", ".join(STATUSES)),
    "verdict": (lambda v: v in VERDICTS, "one of " + ", ".join(VERDICTS)),
    "tags": (_is_str_list, "a list of strings"),
    "timestamp": (lambda v: isinstance(v, str), "a string"),
    "size": (lambda v: v is None or v in ("full", "cpu", "tiny"), "null, full, cpu or tiny"),
    "backend": (lambda v: isinstance(v, str), "a string"),
    "device": (lambda v: isinstance(v, str), "a string"),
    "check": (lambda v: v is None or isinstance(v, dict), "null or an object"),
    "metrics": (lambda v: isinstance(v, dict), "an object"),
    "describe": (lambda v: isinstance(v, dict), "an object"),
    "structure": (lambda v: isinstance(v, dict), "an object"),
    "fallback": (lambda v: v is None or isinstance(v, str), "null or a string"),
    "error": (lambda v: v is None or isinstance(v, str), "null or a string"),
    "metadata": (lambda v: isinstance(v, dict), "an object"),
}


def _number_or_nonfinite(v: Any) -> bool:
    if isinstance(v, bool):
        return False
    return isinstance(v, (int, float)) or v in ("nan", "inf", "-inf")


# metrics the readers use: key -> (check, what is allowed)
_METRIC_CHECKS: dict = {
    "samples_per_s": (_number_or_nonfinite, "a number"),
    "speedup": (_number_or_nonfinite, "a number"),
    "step_times_s": (lambda v: isinstance(v, list) and all(_number_or_nonfinite(x) for x in v),
                     "a list of numbers (seconds)"),
    "window_s": (lambda v: isinstance(v, list) and all(_number_or_nonfinite(x) for x in v),
                 "a list of numbers (seconds)"),
    "speedup_ci": (lambda v: isinstance(v, list) and len(v) == 2 and all(_number_or_nonfinite(x) for x in v),
                   "a list of two numbers"),
    "step_time_s": (lambda v: isinstance(v, dict), "an object"),
    "comm_calls_per_step": (lambda v: isinstance(v, dict) and all(_number_or_nonfinite(x) for x in v.values()),
                            "an object of numbers"),
    "comm_bytes_per_step": (lambda v: isinstance(v, dict) and all(_number_or_nonfinite(x) for x in v.values()),
                            "an object of numbers"),
    "trace_file": (lambda v: isinstance(v, str), "a string (a path under the results directory's traces/)"),
}


def _validate(values: dict, where: str) -> None:
    for name, value in values.items():
        check = _FIELD_CHECKS.get(name)
        if check is not None and not check[0](value):
            raise ResultsFileError(f"{where}: field {name!r} is {_show(value)}; expected {check[1]}")
    for name, value in (values.get("metrics") or {}).items():
        check = _METRIC_CHECKS.get(name)
        if check is not None and not check[0](value):
            raise ResultsFileError(f"{where}: field 'metrics.{name}' is {_show(value)}; expected {check[1]}")


def _show(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _upgrade_v1(rec: CaseRecord) -> None:
    """A schema-1 record in schema 2's terms (in memory only; the file is never rewritten)."""
    from .structure import structure_of

    meta = rec.metadata or {}
    rec.backend = rec.backend or (meta.get("backend") or "")
    gpu = meta.get("gpu") or {}
    rec.device = rec.device or ("cuda: " + ", ".join(gpu.get("names") or []) if gpu.get("available") else "cpu")
    if not rec.structure and rec.status == "ok":
        rec.structure = structure_of(rec.describe, rec.metrics, rec.check)


def jsonable(obj: Any) -> Any:
    """JSON has no inf/nan: they become the strings "inf", "-inf", "nan"."""
    if isinstance(obj, float):
        if math.isfinite(obj):
            return obj
        return "nan" if obj != obj else ("inf" if obj > 0 else "-inf")
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    return obj


def append_record(path: str, record: CaseRecord) -> None:
    """Append one record as one line, atomically (exclusive lock, single write, fsync)."""
    line = (record.to_json() + "\n").encode()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        # A previous writer killed mid-line would leave no newline: start on a fresh line.
        size = os.fstat(fd).st_size
        if size:
            with open(path, "rb") as fh:
                fh.seek(size - 1)
                if fh.read(1) != b"\n":
                    line = b"\n" + line
        os.write(fd, line)
        os.fsync(fd)
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def iter_records(path: str) -> Iterator[CaseRecord]:
    try:
        fh = open(path, "rb")
    except FileNotFoundError:
        raise ResultsFileError(f"{path}: no such results file") from None
    except IsADirectoryError:
        raise ResultsFileError(f"{path}: is a directory; expected a results file (JSON lines)") from None
    except PermissionError:
        raise ResultsFileError(f"{path}: cannot be read (permission denied)") from None
    with fh:
        lineno = 0
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
                continue
            try:
                data = json.loads(line)
            except json.JSONDecodeError as exc:
                hint = " (truncated: the file ends mid-record)" if not line.endswith("\n") else ""
                raise ResultsFileError(f"{where}: not valid JSON{hint}: {exc.msg} at column {exc.colno}") from None
            yield CaseRecord.from_dict(data, where)


def read_records(path: str) -> list[CaseRecord]:
    return list(iter_records(path))
