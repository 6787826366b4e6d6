"""The trial server: one revision's side of `fleetbench ab` (see :mod:`suite.ab.protocol`).

Started as ``python -m suite.cli.main trial-server`` in the revision's worktree with
``PYTHONPATH=<worktree>``, so every module it and its ranks import is the revision's own.
It keeps one rank pool (``RankPool``) for its whole life; cases are prepared on it and timed
window by window, each window a *trial* of the A/B comparison.  The protocol's stdout is a
private copy of file descriptor 1: fd 1 itself is pointed at stderr, so whatever the ranks or
libraries print can never corrupt an answer.
"""
from __future__ import annotations

import dataclasses
import math
import os
import sys
import traceback
from typing import TYPE_CHECKING, Any

from ..measure.metadata import collect
from ..measure.utilization import others_cpu
from ..run_spec import RunSpec
from .protocol import (
    Prepared,
    RankOrigin,
    RecordAnswer,
    SelectedCase,
    TrialAnswer,
    TrialMachine,
    decode,
    encode,
    hello,
)

if TYPE_CHECKING:
    from ..runner import CaseRunner
    from ..runtime import RankPool

__all__ = ["serve", "origin_on_rank"]


# ---- rank functions (module level: the pool pickles them by reference) ---------------------------
def origin_on_rank() -> RankOrigin:
    import suite

    from ..runtime.context import current

    return RankOrigin(current().rank, os.path.abspath(suite.__file__))


# ---- the server ----------------------------------------------------------------------------------
class _State:
    def __init__(self, nproc: int, timeout: float, pg_timeout: float, device: str | None):
        self.nproc, self.timeout, self.pg_timeout, self.device = nproc, timeout, pg_timeout, device
        self.pool: RankPool | None = None
        self.cases: dict[str, Any] = {}  # key -> (runner, resolved case, prepared case)
        self.metadata: dict | None = None
        self.backend = "nccl" if device == "cuda" else "gloo"

    def get_pool(self) -> RankPool:
        if self.pool is None:
            from ..runtime import RankPool  # heavy (torch): imported once the server has said hello

            self.pool = RankPool(self.nproc, device=self.device, timeout=self.timeout, pg_timeout=self.pg_timeout)
        self.pool.start()
        return self.pool


def _spec(req: dict) -> RunSpec:
    """The request's run specification (``RunSpec.to_dict`` of the client's): its selection and run options.  Its
    ``ab`` part (the comparison's own options, which the server does not use) is left out: a client of another
    revision may spell them otherwise."""
    data = req.get("spec")
    if isinstance(data, dict):
        data = {k: v for k, v in data.items() if k != "ab"}
    return RunSpec.from_dict(data, f"the {req.get('op')} request's spec")


def _selection(spec: RunSpec, nproc: int, names: tuple | None = None) -> list:
    from ..models import default_size
    from ..selection import base_cases, resolve_at

    sel = spec.selection if names is None else dataclasses.replace(spec.selection, cases=names, tags=(), models=())
    size = sel.size or default_size(sel.device or "cpu")
    return resolve_at(sel, base_cases(sel, size), nproc, size=size)


def _op_select(st: _State, req: dict) -> dict:
    return {"cases": [SelectedCase(rc.case.name, rc.case.model, rc.case.variant, rc.config.to_dict(), rc.skip).to_dict()
                      for rc in _selection(_spec(req), st.nproc)]}


def _runner(st: _State, spec: RunSpec) -> CaseRunner:
    """A runner for the spec's options on this server's ranks: each trial is one window it times itself (one
    round), with no utilization sampling; every call bounded by the server's --timeout."""
    from ..models import default_size
    from ..runner import CaseRunner

    if st.metadata is None:
        st.metadata = collect(world_size=st.nproc, backend=st.backend)
    opts = dataclasses.replace(spec.run, rounds=1, timeout=st.timeout, utilization=False)
    facts = spec.facts(spec.selection.size or default_size(st.device or "cpu"), st.device or "cpu", st.backend)
    return CaseRunner(st.get_pool(), st.nproc, opts, metadata=st.metadata, reporter=False, spec=spec, facts=facts)


def _op_prepare(st: _State, req: dict) -> dict:
    spec = _spec(req)
    rcs = [rc for rc in _selection(spec, st.nproc, (req["case"],)) if rc.case.name == req["case"]]
    if not rcs:
        raise ValueError(f"case {req['case']!r} is not in this revision's registry")
    rc = rcs[0]
    if rc.skip:
        raise ValueError(f"case {rc.case.name} cannot run at world size {st.nproc}: {rc.skip}")
    prepared = _runner(st, spec).prepare(rc)
    st.cases[prepared.key] = (prepared.runner, rc, prepared)
    return Prepared(prepared.key, prepared.describe, rc.config.to_dict()).to_dict()


def _op_trial(st: _State, req: dict) -> dict:
    prepared = st.cases[req["key"]][2]
    answers = prepared.window(steps=int(req["steps"]), warmup=int(req["warmup"]))
    window = [a.window_s for a in answers]
    steps = [max(ts) for ts in zip(*(a.step_times_s for a in answers))]  # per step, the slowest rank
    machine = None
    machines = [a.machine for a in answers]
    if all(machines):  # the CPU time others took during the window (ab: machine busy)
        others_s, share = others_cpu(machines)
        if math.isfinite(share):
            machine = TrialMachine(others_s, machines[0]["host_total_s"])
    return TrialAnswer(max(window) / int(req["steps"]), window, steps, answers[0].losses, machine).to_dict()


def _op_structure(st: _State, req: dict) -> dict:
    runner, rc, prepared = st.cases[req["key"]]
    check = runner.check(rc)
    rec = runner.record(rc, check, prepared.metrics())
    import json

    return RecordAnswer(json.loads(rec.to_json())).to_dict()


def _op_close(st: _State, req: dict) -> dict:
    entry = st.cases.pop(req["key"], None)
    if entry is not None:
        entry[2].close()
    return {"closed": entry is not None}


def _op_origin(st: _State, req: dict) -> dict:
    return {"ranks": [o.to_dict() for o in st.get_pool().run(origin_on_rank, timeout=st.timeout)]}


def _op_start(st: _State, req: dict) -> dict:
    pool = st.get_pool()
    return {"nproc": pool.nproc, "pids": pool.pids}


OPS = {"select": _op_select, "start": _op_start, "origin": _op_origin, "prepare": _op_prepare,
       "trial": _op_trial, "structure": _op_structure, "close": _op_close}


def serve(nproc: int, timeout: float = 600.0, pg_timeout: float = 120.0, device: str | None = None) -> int:
    # The protocol gets a private copy of stdout; fd 1 goes to stderr for everything else.
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    out.write(encode(hello()))
    st = _State(nproc, timeout, pg_timeout, device)
    try:
        for line in sys.stdin:
            if not line.strip():
                continue
            try:
                req = decode(line)
                rid = req.get("id")
            except Exception as exc:  # noqa: BLE001 - a broken line is answered, not fatal
                out.write(encode({"id": None, "ok": False, "kind": "ProtocolError",
                                  "error": f"not a JSON request: {exc}"}))
                continue
            op = req.get("op")
            if op == "shutdown":
                out.write(encode({"id": rid, "ok": True}))
                break
            fn = OPS.get(op)
            if fn is None:
                out.write(encode({"id": rid, "ok": False, "kind": "ProtocolError",
                                  "error": f"unknown op {op!r}; this server speaks {sorted(OPS) + ['shutdown']}"}))
                continue
            try:
                answer = fn(st, req)
                answer.update(id=rid, ok=True)
            except Exception as exc:  # noqa: BLE001 - every failure is an answer
                from ..runner import short_error

                answer = {"id": rid, "ok": False, "kind": type(exc).__name__, "error": short_error(exc, 4000),
                          "traceback": traceback.format_exc()[-6000:]}
            out.write(encode(answer))
    finally:
        if st.pool is not None:
            st.pool.close()
    return 0
