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
from typing import Any

from ..measure.metadata import collect
from ..measure.utilization import others_cpu
from ..run_spec import RunSpec
from .isolation import gc_freeze_on_rank, layout_pad_on_rank
from .protocol import decode, encode, hello

__all__ = ["serve", "trial_on_rank", "inject_on_rank", "origin_on_rank"]


# ---- rank functions (module level: the pool pickles them by reference) ---------------------------
def origin_on_rank() -> dict:
    import suite

    from ..runtime.context import current

    return {"rank": current().rank, "suite": os.path.abspath(suite.__file__)}


def pin_on_rank() -> list:
    """Pin this rank to one core (rank r -> the r-th allowed core, wrapping), so both revisions' rank r
    run on the same core: a symmetric placement, not one the scheduler draws differently per pool."""
    from ..runtime.context import current

    allowed = sorted(os.sched_getaffinity(0))
    core = allowed[current().rank % len(allowed)]
    os.sched_setaffinity(0, {core})
    return [core]


def trial_on_rank(key: str, steps: int, warmup: int = 1) -> dict:
    """``warmup`` steps not recorded, then one recorded window of ``steps`` steps of the prepared case."""
    import torch

    from ..measure.timing import _PREPARED, run_window

    if warmup:
        if key not in _PREPARED:
            raise KeyError(f"case {key!r} is not prepared on this rank (prepared: {sorted(_PREPARED)})")
        before = torch.get_num_threads()
        try:
            _PREPARED[key].window(warmup, record=False)
        finally:
            torch.set_num_threads(before)
    return run_window(key, steps)


_INJECTED: dict = {}  # key -> (the engine's own train_step, the calibrated step time)


def inject_on_rank(key: str, fraction: float, calibration_steps: int = 5, calibration_windows: int = 3) -> dict:
    """Slow the prepared case's training step by ``fraction`` of its measured step time (a calibration knob).

    First ``calibration_windows`` windows of ``calibration_steps`` steps, not recorded, measure the step as the
    trials do: a window's time between its barriers over its steps (the median of the windows); then every step
    adds ``fraction`` x that through ``Platform.busy``: on a GPU a spin kernel on the compute stream after the
    step's kernels (a host spin would overlap the GPU's work and slow nothing), on CPU busy work on the host.
    So "+5%" is 5% of the step the trials measure (the median of single steps, which the calibration read before,
    leaves out a window's barriers and start, so small models were slowed by less than they said).  Calling it
    again on the same case reuses the first calibration and replaces the slowdown (``fraction`` 0 removes it), so
    ``figures gate_sources --calibration`` can switch it on and off between trials of one preparation.  Used by
    ``fleetbench figures gate`` and, through ``FLEETBENCH_AB_INJECT``, by tests; it touches only the prepared
    engine of this trial process.
    """
    import statistics

    import torch

    from ..measure.timing import _PREPARED

    tc = _PREPARED[key]
    if key in _INJECTED and hasattr(tc.engine, "_injected"):  # this engine was injected here: keep its calibration
        real, step_s = _INJECTED[key]
    else:
        real = tc.engine.train_step
        before = torch.get_num_threads()
        try:
            step_s = statistics.median(tc.window(calibration_steps, record=False).seconds / calibration_steps
                                       for _ in range(max(1, calibration_windows)))
        finally:
            torch.set_num_threads(before)
        _INJECTED[key] = (real, step_s)
    added = fraction * step_s
    platform = tc.wl.platform
    if platform.is_cuda and added > 0:
        platform.spin_rate()  # the spin kernel's calibration (one synchronize) now, not inside a timed step

    def slowed(inputs, targets):
        out = real(inputs, targets)
        platform.busy(added)
        return out

    # an instance attribute over the method, on purpose; `_injected` marks it as ours (and which slowdown)
    setattr(tc.engine, "train_step", slowed if added > 0 else real)  # noqa: B010
    setattr(tc.engine, "_injected", added)  # noqa: B010
    return {"step_s": step_s, "added_s": added}


# ---- the server ----------------------------------------------------------------------------------
class _State:
    def __init__(self, nproc: int, timeout: float, pg_timeout: float, device: str | None):
        self.nproc, self.timeout, self.pg_timeout, self.device = nproc, timeout, pg_timeout, device
        self.pool = None
        self.cases: dict[str, Any] = {}  # key -> (runner, resolved case, prepared case)
        self.metadata: dict | None = None
        self.backend = "nccl" if device == "cuda" else "gloo"

    def get_pool(self):
        if self.pool is None:
            from ..runtime import RankPool  # heavy (torch): imported once the server has said hello

            self.pool = RankPool(self.nproc, device=self.device, timeout=self.timeout, pg_timeout=self.pg_timeout)
        self.pool.start()
        return self.pool


def _spec(req: dict) -> RunSpec:
    """The request's run specification (``RunSpec.to_dict`` of the client's): its selection and run options."""
    return RunSpec.from_dict(req.get("spec"), f"the {req.get('op')} request's spec")


def _selection(spec: RunSpec, nproc: int, names: tuple | None = None) -> list:
    from ..models import default_size
    from ..selection import base_cases, resolve_at

    sel = spec.selection if names is None else dataclasses.replace(spec.selection, cases=names, tags=(), models=())
    size = sel.size or default_size(sel.device or "cpu")
    return resolve_at(sel, base_cases(sel, size), nproc, size=size)


def _op_select(st: _State, req: dict) -> dict:
    return {"cases": [{"case": rc.case.name, "model": rc.case.model, "variant": rc.case.variant,
                       "config": rc.config.to_dict(), "skip": rc.skip} for rc in _selection(_spec(req), st.nproc)]}


def _runner(st: _State, spec: RunSpec):
    """A runner for the spec's options on this server's ranks: each trial is one window it times itself (one
    round), with no utilization sampling; every call bounded by the server's --timeout."""
    from ..models import default_size
    from ..runner import CaseRunner

    if st.metadata is None:
        st.metadata = collect(world_size=st.nproc, backend=st.backend)
    opts = dataclasses.replace(spec.run_options(spec.selection.size or default_size(st.device or "cpu"),
                                                st.device or "cpu", st.backend),
                               rounds=1, timeout=st.timeout, utilization=False)
    return CaseRunner(st.get_pool(), st.nproc, opts, metadata=st.metadata, reporter=False, spec=spec)


def _op_prepare(st: _State, req: dict) -> dict:
    spec = _spec(req)
    rcs = [rc for rc in _selection(spec, st.nproc, (req["case"],)) if rc.case.name == req["case"]]
    if not rcs:
        raise ValueError(f"case {req['case']!r} is not in this revision's registry")
    rc = rcs[0]
    if rc.skip:
        raise ValueError(f"case {rc.case.name} cannot run at world size {st.nproc}: {rc.skip}")
    runner = _runner(st, spec)
    if req.get("layout_pad"):  # `figures gate-sources`: each preparation at other addresses

        runner.launcher.run(layout_pad_on_rank, dict(seed=int(req.get("seed", 0))),
                            timeout=st.timeout)
    prepared = runner.prepare(rc)
    if req.get("gc_frozen"):
        runner.launcher.run(gc_freeze_on_rank, {}, timeout=st.timeout)
    inject = float(req.get("inject") or 0.0)
    if inject:
        runner.launcher.run(inject_on_rank, dict(key=prepared.key, fraction=inject), timeout=st.timeout)
    st.cases[prepared.key] = (runner, rc, prepared)
    return {"key": prepared.key, "describe": prepared.describe, "config": rc.config.to_dict(), "inject": inject}


def _op_trial(st: _State, req: dict) -> dict:
    runner, _, prepared = st.cases[req["key"]]
    answers = runner.launcher.run(trial_on_rank, dict(key=req["key"], steps=int(req["steps"]),
                                                      warmup=int(req["warmup"])), timeout=st.timeout)
    prepared.windows.append(answers)
    window = [a["window_s"] for a in answers]
    steps = [max(ts) for ts in zip(*(a["step_times_s"] for a in answers))]  # per step, the slowest rank
    out = {"window_s": window, "step_s": max(window) / int(req["steps"]), "step_times_s": steps,
           "losses": answers[0]["losses"]}
    if all(a.get("machine") for a in answers):  # the CPU time others took during the window (ab: machine busy)
        others_s, share = others_cpu([a["machine"] for a in answers])
        if math.isfinite(share):
            out["machine"] = {"others_cpu_s": others_s, "host_total_s": answers[0]["machine"]["host_total_s"]}
    return out


def _op_inject(st: _State, req: dict) -> dict:
    """Slow an already prepared case from now on (``figures gate_sources --calibration``: the same preparation
    timed before and after, so neither a preparation's nor a process's own speed enters the ratio)."""
    runner = st.cases[req["key"]][0]
    answers = runner.launcher.run(inject_on_rank, dict(key=req["key"], fraction=float(req["fraction"])),
                                  timeout=st.timeout)
    return {"ranks": answers}


def _op_structure(st: _State, req: dict) -> dict:
    runner, rc, prepared = st.cases[req["key"]]
    check = runner.check(rc)
    rec = runner.record(rc, check, prepared.metrics())
    import json

    return {"record": json.loads(rec.to_json())}


def _op_close(st: _State, req: dict) -> dict:
    entry = st.cases.pop(req["key"], None)
    if entry is not None:
        entry[2].close()
    return {"closed": entry is not None}


def _op_origin(st: _State, req: dict) -> dict:
    return {"ranks": st.get_pool().run(origin_on_rank, timeout=st.timeout)}


def _op_start(st: _State, req: dict) -> dict:
    pool = st.get_pool()
    cores = pool.run(pin_on_rank, timeout=st.timeout) if req.get("pin") else None
    return {"nproc": pool.nproc, "pids": pool.pids, "cores": cores}


OPS = {"select": _op_select, "start": _op_start, "origin": _op_origin, "prepare": _op_prepare,
       "trial": _op_trial, "structure": _op_structure, "close": _op_close, "inject": _op_inject}


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
