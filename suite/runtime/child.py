"""A child command, bounded: the one way fleetbench starts a command and waits for it (the nightly's stages, the
GPU check's phases and its interpreter probes, the doctor's torchrun job).

:func:`run_child` starts ``cmd`` from :data:`suite.runtime.spawn.keeper` with a parent-death signal (a killed
fleetbench takes it along), as the leader of its own process group; its output is captured, streamed to a file
object, or inherited.  At its bound, or on Ctrl-C / a cancel in the parent, the child gets ``stop`` (SIGTERM unless
asked otherwise) and ``grace`` seconds to clean up, then its whole group is killed; when it ends by itself what it
left in its group is killed too.  The answer is a typed :class:`ChildResult`: its exit status (None when it was
stopped), whether it hit its bound, its seconds, and what it printed (captured streams only; what a stopped child
printed before is kept).  Torch-free: the GPU check imports it under any python3.
"""
from __future__ import annotations

import signal
import subprocess
import time
from dataclasses import dataclass
from typing import IO

from .spawn import keeper, kill_group, pdeathsig_preexec

__all__ = ["ChildResult", "run_child", "CAPTURE", "INHERIT", "tail"]

CAPTURE = subprocess.PIPE  # the stream is read into the result
INHERIT = None  # the stream is this process's own


@dataclass(frozen=True)
class ChildResult:
    rc: int | None  # None: stopped at its bound or on a cancel
    timed_out: bool
    stdout: str
    stderr: str
    seconds: float

    @property
    def ok(self) -> bool:
        return self.rc == 0


def _stop(proc: subprocess.Popen, stop: int, grace: float) -> tuple[str, str]:
    """``stop`` to the child, ``grace`` seconds, then SIGKILL to its group; what it printed meanwhile."""
    try:
        proc.send_signal(stop)
    except ProcessLookupError:
        pass
    try:
        out, err = proc.communicate(timeout=grace)
    except subprocess.TimeoutExpired:
        kill_group(proc.pid)
        try:
            out, err = proc.communicate(timeout=grace)
        except subprocess.TimeoutExpired:  # a grandchild outside the group holds a pipe: what was read is kept
            proc.kill()
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()
            proc.wait()
            out, err = "", ""
    kill_group(proc.pid)  # what it started and left behind
    return out or "", err or ""


def run_child(cmd: list[str], timeout: float | None, *, env: dict | None = None, cwd: str | None = None,
              stdout: int | IO | None = CAPTURE, stderr: int | IO | None = CAPTURE, stop: int = signal.SIGTERM,
              grace: float = 5.0, death_signal: int = signal.SIGTERM) -> ChildResult:
    """``cmd`` with at most ``timeout`` seconds (None: unbounded), in its own process group, dying with this process
    (``death_signal``).  A cancel (KeyboardInterrupt) stops the child as its bound does, then propagates."""
    t0 = time.monotonic()
    text = {"text": True, "errors": "replace"} if CAPTURE in (stdout, stderr) else {}
    try:
        proc = keeper.call(subprocess.Popen, cmd, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr, env=env,
                           cwd=cwd, start_new_session=True, preexec_fn=pdeathsig_preexec(death_signal), **text)
    except OSError as exc:
        return ChildResult(127, False, "", f"{cmd[0]}: {exc}", time.monotonic() - t0)
    end = None if timeout is None else t0 + max(1.0, timeout)
    try:
        while True:
            try:  # reads both streams while it waits (a full pipe never blocks the child)
                out, err = proc.communicate(timeout=0.5 if end is None else max(0.01, min(0.5, end - time.monotonic())))
                break
            except subprocess.TimeoutExpired:
                if proc.poll() is not None:  # it ended; what it left in its group holds the streams open
                    out, err = _stop(proc, stop, grace)
                    break
                if end is not None and time.monotonic() >= end:
                    out, err = _stop(proc, stop, grace)
                    return ChildResult(None, True, out, err, time.monotonic() - t0)
    except BaseException:  # Ctrl-C or a cancel: the child's whole group goes too, then the cancel goes on
        _stop(proc, stop, grace)
        raise
    kill_group(proc.pid)
    return ChildResult(proc.returncode, False, out or "", err or "", time.monotonic() - t0)


def tail(text: str, lines: int = 12, chars: int = 1500) -> str:
    """The last non-empty lines of ``text`` (at most ``chars``)."""
    kept = [ln for ln in (text or "").splitlines() if ln.strip()][-lines:]
    return "\n".join(kept)[-chars:]
