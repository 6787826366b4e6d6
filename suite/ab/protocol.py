"""The trial protocol: JSON lines between `fleetbench ab` and one revision's trial server.

The server (``fleetbench trial-server``, :mod:`suite.ab.server`) writes one *hello* line when
it starts, then answers each request line with exactly one answer line::

    -> hello   {"protocol": "fleetbench-trial", "version": 1, "suite": <suite/__init__.py it imported>, ...}
    <- request {"id": 2, "op": "prepare", "case": "mlp/plain", "spec": {"spec_version": 1, "run": ...}}
    <- request {"id": 3, "op": "trial", "key": "mlp/plain@2", "steps": 5, "warmup": 1}
    -> answer  {"id": 3, "ok": true, "window_s": [0.41, 0.41], "step_s": 0.082, "losses": [...]}
    -> error   {"id": 3, "ok": false, "error": "RankFailure: ...", "kind": "RankFailure"}

Operations (version 2): ``select`` (the revision's own cases for a run specification), ``start``
(the rank pool), ``origin`` (where the ranks imported ``suite`` from), ``prepare`` (build and warm
up a case's engine on the ranks, as its run specification says), ``trial`` (``warmup`` discarded
steps, then one timed window of ``steps``),
``structure`` (the correctness check and the case's record: structure, verdict, metrics),
``close`` (drop a prepared case), ``shutdown``.

``select`` and ``prepare`` carry the run specification (``suite.run_spec.RunSpec.to_dict``: the
selection, the run options), and the server builds from ``RunSpec.from_dict``, so every default is
the spec's (version 1 sent the selection's and options' fields one by one, the server filling in
its own defaults).

The version changes whenever a request or an answer changes meaning; the client refuses a
server of another version, and a revision older than the protocol (no trial server at all)
with a message that says so.

The answers are typed here, once (:class:`Hello`, :class:`SelectedCase`, :class:`RankOrigin`,
:class:`Prepared`, :class:`TrialAnswer` with its :class:`TrialMachine`, :class:`RecordAnswer`): the
server writes ``to_dict()`` (every field, so a client of an earlier checkout reads the keys it knows) and
the client reads each answer once with ``from_dict()`` (each field checked against its annotation,
``suite/validate.py``; a field the answer lacks takes its default, keys a type does not know are left, so
a revision's server that answers more is still read), then reads attributes.  An answer that does not hold
what its type says is a :class:`ProtocolError` naming the field.
"""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from ..results.records import jsonable
from ..validate import Invalid, field_specs, show

__all__ = ["PROTOCOL", "VERSION", "SUPPORTED_VERSIONS", "MARKER_PATH", "encode", "decode", "hello", "ProtocolError",
           "Hello", "SelectedCase", "RankOrigin", "Prepared", "TrialMachine", "TrialAnswer", "RecordAnswer"]

PROTOCOL = "fleetbench-trial"
VERSION = 2  # 2: select and prepare carry the run specification
SUPPORTED_VERSIONS = (2,)
# A revision has the trial server when this file exists in its tree (checked before anything starts).
MARKER_PATH = "suite/ab/protocol.py"


def encode(obj: Any) -> str:
    """One line of JSON (nan/inf as strings, as the records write them)."""
    return json.dumps(jsonable(obj), allow_nan=False, separators=(",", ":")) + "\n"


def decode(line: str) -> Any:
    return json.loads(line)


class ProtocolError(ValueError):
    """An answer that does not hold what its operation answers (a field missing, or of another type)."""


T = TypeVar("T", bound="_Answer")


class _Answer:
    """A typed answer: ``to_dict()`` for the line the server writes, ``from_dict()`` where the client reads it."""

    __dataclass_fields__: ClassVar[dict[str, Any]]  # every answer is a dataclass

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls: type[T], data: Any, where: str = "") -> T:
        where = where or cls.__name__
        if not isinstance(data, Mapping):
            raise ProtocolError(f"{where}: expected a JSON object, got {show(data)}")
        kw: dict[str, Any] = {}
        required = {f.name for f in dataclasses.fields(cls)
                    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
        answer: type = cls  # field_specs is cached: the class as a plain type (mypy: type[X] is no Hashable)
        for name, fs in field_specs(answer, lenient=True).items():
            if name not in data:
                if name in required:
                    raise ProtocolError(f"{where}: field '{name}' is missing; expected {fs.expected()}")
                continue
            try:
                value = fs.check(data[name])
            except Invalid as exc:
                raise ProtocolError(exc.field(where)) from None
            if fs.nested is not None and value is not None and not isinstance(value, fs.nested):
                value = fs.nested.from_dict(value, f"{where}: {name}")
            kw[name] = value
        return cls(**kw)


@dataclass(frozen=True)
class Hello(_Answer):
    """The server's first line (read once the protocol and its version are known to match)."""

    protocol: str
    version: int
    suite: str  # the suite/__init__.py it imported
    python: str = ""
    pid: int = 0


@dataclass(frozen=True)
class SelectedCase(_Answer):
    """One case of a ``select`` answer: the revision's own case and config at the server's world size."""

    case: str
    model: str = ""
    variant: str = ""
    config: dict = field(default_factory=dict)
    skip: str | None = None  # why it cannot run at this world size


@dataclass(frozen=True)
class RankOrigin(_Answer):
    """Where one rank imported ``suite`` from (an ``origin`` answer)."""

    rank: int
    suite: str


@dataclass(frozen=True)
class Prepared(_Answer):
    """A ``prepare`` answer: the prepared case's key, what its engine set up, its config."""

    key: str
    describe: dict = field(default_factory=dict)
    config: dict = field(default_factory=dict)


@dataclass(frozen=True)
class TrialMachine(_Answer):
    """The CPU time processes other than the ranks took during a trial's window, and the machine's."""

    others_cpu_s: float
    host_total_s: float


@dataclass(frozen=True)
class TrialAnswer(_Answer):
    """A ``trial`` answer: one timed window of every rank (the slowest rank's per step), and rank 0's losses."""

    step_s: float  # the slowest rank's window over the steps
    window_s: list[float] = field(default_factory=list)  # each rank's window
    step_times_s: list[float] = field(default_factory=list)  # per step, the slowest rank's
    losses: list[float] = field(default_factory=list)  # rank 0's (nan/inf read back as floats)
    machine: TrialMachine | None = None  # None: not measured (/proc/stat unreadable, or an older server)


@dataclass(frozen=True)
class RecordAnswer(_Answer):
    """A ``structure`` answer: the case's whole record as JSON (the client reads it into a ``CaseRecord``)."""

    record: dict


def hello() -> dict:
    import os
    import sys

    import suite

    return Hello(PROTOCOL, VERSION, os.path.abspath(suite.__file__), sys.executable, os.getpid()).to_dict()
