"""Results as typed records with a schema version, appended atomically as JSON lines.

One line per finished case, written with a single ``write`` under an exclusive lock and
fsynced, so an interrupted run keeps every case that finished and a reader never sees half
a record.  Reading validates every line; a corrupt or truncated file gets an error naming
the file and the line, and nothing already recorded is rewritten.
"""
from __future__ import annotations

import dataclasses
import fcntl
import json
import math
import os
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional

__all__ = ["SCHEMA_VERSION", "CaseRecord", "ResultsFileError", "append_record", "read_records", "jsonable"]

SCHEMA_VERSION = 1


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
    check: Optional[dict] = None  # CheckResult.to_dict()
    metrics: dict = field(default_factory=dict)  # samples_per_s, step_time_s, speedup, step_times_s …
    describe: dict = field(default_factory=dict)  # what the engine set up (buckets, fusion counts …)
    error: Optional[str] = None
    metadata: dict = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION
    kind: str = "fleetbench.case"

    REQUIRED = ("case", "model", "world_size", "config", "run_id")

    def to_json(self) -> str:
        return json.dumps(jsonable(dataclasses.asdict(self)), sort_keys=True, allow_nan=False)

    @classmethod
    def from_dict(cls, data: dict, where: str = "") -> "CaseRecord":
        if not isinstance(data, dict):
            raise ResultsFileError(f"{where}: expected a JSON object, got {type(data).__name__}")
        if data.get("kind") != "fleetbench.case":
            raise ResultsFileError(f"{where}: not a fleetbench case record (kind={data.get('kind')!r})")
        version = data.get("schema_version")
        if version != SCHEMA_VERSION:
            raise ResultsFileError(
                f"{where}: schema_version={version!r}; this fleetbench reads schema version {SCHEMA_VERSION}"
            )
        missing = [k for k in cls.REQUIRED if k not in data]
        if missing:
            raise ResultsFileError(f"{where}: record lacks {', '.join(missing)}")
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    @property
    def samples_per_s(self) -> float:
        v = self.metrics.get("samples_per_s")
        return float(v) if isinstance(v, (int, float)) else math.nan


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
        fh = open(path, encoding="utf-8")
    except FileNotFoundError:
        raise ResultsFileError(f"{path}: no such results file") from None
    with fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                data = json.loads(line)
            except json.JSONDecodeError as exc:
                hint = " (truncated: the file ends mid-record)" if not line.endswith("\n") else ""
                raise ResultsFileError(f"{where}: not valid JSON{hint}: {exc.msg} at column {exc.colno}") from None
            yield CaseRecord.from_dict(data, where)


def read_records(path: str) -> list[CaseRecord]:
    return list(iter_records(path))
