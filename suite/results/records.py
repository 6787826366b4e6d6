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
import errno
import fcntl
import json
import math
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

__all__ = ["SCHEMA_VERSION", "READABLE_VERSIONS", "MAX_LINE_BYTES", "CaseRecord", "ResultsFileError",
           "append_record", "read_records", "iter_records", "jsonable", "open_input", "loads_bounded", "ShortWrite",
           "name_problem", "plain"]

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


class ShortWrite(OSError):
    """An append that the file system took only part of (a full disk): the file was cut back to its
    previous end, so it holds every earlier record and nothing of this one."""


def append_record(path: str, record: CaseRecord) -> None:
    """Append one record as one line, all or nothing: an exclusive lock, one write whose count is
    checked, fsync.  A short write (a full disk) truncates the file back to where it ended and raises
    :class:`ShortWrite`; any OSError leaves the file as it was.  A symbolic link as ``path`` is refused
    (it could lead the write anywhere)."""
    line = (record.to_json() + "\n").encode()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, f"{path} is not a regular file")
        fcntl.flock(fd, fcntl.LOCK_EX)
        # A previous writer killed mid-line would leave no newline: start on a fresh line.
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            line = b"\n" + line
        try:
            written = os.write(fd, line)
            if written != len(line):
                raise ShortWrite(errno.ENOSPC, f"only {written} of {len(line)} bytes written")
            os.fsync(fd)
        except OSError:
            os.ftruncate(fd, size)  # nothing half-written stays behind
            raise
    finally:
        os.close(fd)  # closing releases the lock


MAX_RESULTS_BYTES = 2**30  # a results file read whole (records are a few KB to a few hundred KB each)
MAX_DEPTH = 64  # nesting of a record's JSON (a real one nests 5 deep)


def open_input(path: str, what: str = "results file", limit: int = MAX_RESULTS_BYTES):
    """``path`` opened for reading in binary, if it is a regular file of at most ``limit`` bytes;
    otherwise :class:`ResultsFileError` naming it.  A FIFO or device is refused without blocking
    (the open is non-blocking, the type read from the open file)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except FileNotFoundError:
        raise ResultsFileError(f"{path}: no such {what}") from None
    except PermissionError:
        raise ResultsFileError(f"{path}: cannot be read (permission denied)") from None
    except (OSError, ValueError) as exc:
        raise ResultsFileError(f"{path}: cannot be opened ({exc})") from None
    st = os.fstat(fd)
    kind = ("is a directory" if stat.S_ISDIR(st.st_mode) else "is a FIFO (named pipe)"
            if stat.S_ISFIFO(st.st_mode) else "is a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)
            else "is a socket" if stat.S_ISSOCK(st.st_mode) else None)
    if kind is None and st.st_size > limit:
        kind = f"is {st.st_size} bytes, more than the {limit // 2**20} MiB a {what} may have"
    if kind is not None:
        os.close(fd)
        raise ResultsFileError(f"{path}: {kind}; expected a regular file ({what})")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def loads_bounded(text, where: str) -> Any:
    """``json.loads`` with its failures as :class:`ResultsFileError` naming ``where``: invalid JSON,
    nesting deeper than :data:`MAX_DEPTH`, an integer of more digits than Python converts."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        hint = " (truncated: the file ends mid-record)" if not str(text).endswith("\n") else ""
        raise ResultsFileError(f"{where}: not valid JSON{hint}: {exc.msg} at column {exc.colno}") from None
    except RecursionError:
        raise ResultsFileError(f"{where}: JSON nested deeper than {MAX_DEPTH} levels; not a fleetbench "
                               f"record") from None
    except ValueError as exc:  # an integer beyond sys.get_int_max_str_digits()
        raise ResultsFileError(f"{where}: not usable JSON ({exc})") from None
    todo = [(data, 1)]
    while todo:
        value, depth = todo.pop()
        if depth > MAX_DEPTH:
            raise ResultsFileError(f"{where}: JSON nested deeper than {MAX_DEPTH} levels; not a fleetbench record")
        if isinstance(value, dict):
            todo += [(v, depth + 1) for v in value.values()]
        elif isinstance(value, list):
            todo += [(v, depth + 1) for v in value if isinstance(v, (dict, list))]
    return data


NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-:@+")


def name_problem(value: Any) -> str | None:
    """Why ``value`` cannot be one component of a file name the suite builds (a run id, a case name
    with its '/' replaced): None when it is 1-128 characters of letters, digits and ``._-:@+``, not
    starting with '.'; a name is never a path."""
    if not isinstance(value, str) or not 1 <= len(value) <= 128 or value.startswith(".") \
            or not set(value) <= NAME_CHARS:
        return (f"{_show(value)} is not a name: expected 1-128 letters, digits and . _ - : @ +, not starting "
                f"with '.'")
    return None


_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def plain(text: Any, keep: str = "") -> str:
    """A record's text made safe for a terminal or a Markdown file: control characters (ANSI escapes
    included) and bidirectional overrides shown as ``\\uXXXX`` instead of acting; ``keep`` names the
    ones left as they are (e.g. a newline)."""
    return _UNSAFE.sub(lambda m: m.group() if m.group() in keep else f"\\u{ord(m.group()):04x}", str(text))


MAX_WORLD = 2**20  # a world size beyond any machine (and beyond a usable file name)


def iter_records(path: str) -> Iterator[CaseRecord]:
    with open_input(path) as fh:
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
            rec = CaseRecord.from_dict(loads_bounded(line, where), where)
            if rec.world_size > MAX_WORLD:
                raise ResultsFileError(f"{where}: field 'world_size' is {_show(rec.world_size)}; expected at most "
                                       f"{MAX_WORLD}")
            yield rec


def read_records(path: str) -> list[CaseRecord]:
    return list(iter_records(path))
