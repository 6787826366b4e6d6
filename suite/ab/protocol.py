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
"""
from __future__ import annotations

import json
from typing import Any

from ..results.records import jsonable

__all__ = ["PROTOCOL", "VERSION", "SUPPORTED_VERSIONS", "MARKER_PATH", "encode", "decode", "hello"]

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


def hello() -> dict:
    import os
    import sys

    import suite

    return {"protocol": PROTOCOL, "version": VERSION, "suite": os.path.abspath(suite.__file__),
            "python": sys.executable, "pid": os.getpid()}
