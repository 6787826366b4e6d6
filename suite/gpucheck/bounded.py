"""A bounded phase command: a subprocess in its own process group, killed (SIGTERM, then SIGKILL) when its time is
up; what it printed so far is kept, so a phase that hangs still reports what it finished."""
from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass

__all__ = ["Outcome", "run_bounded", "tail"]

GRACE_S = 5.0  # after SIGTERM, before SIGKILL


@dataclass
class Outcome:
    rc: int | None  # None: killed at its bound
    timed_out: bool
    stdout: str
    stderr: str
    seconds: float


def _killpg(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def run_bounded(cmd: list[str], timeout: float, env: dict | None = None, cwd: str | None = None) -> Outcome:
    """``cmd`` with at most ``timeout`` seconds; its output captured whatever happens."""
    t0 = time.monotonic()
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                text=True, errors="replace", env=env, cwd=cwd, start_new_session=True)
    except OSError as exc:
        return Outcome(127, False, "", f"{cmd[0]}: {exc}", time.monotonic() - t0)
    try:
        out, err = proc.communicate(timeout=max(1.0, timeout))
        return Outcome(proc.returncode, False, out, err, time.monotonic() - t0)
    except subprocess.TimeoutExpired:
        _killpg(proc, signal.SIGTERM)
        try:
            out, err = proc.communicate(timeout=GRACE_S)
        except subprocess.TimeoutExpired:
            _killpg(proc, signal.SIGKILL)
            out, err = proc.communicate()
        return Outcome(None, True, out or "", err or "", time.monotonic() - t0)
    except BaseException:  # Ctrl-C: the phase's whole group goes too
        _killpg(proc, signal.SIGKILL)
        proc.wait()
        raise


def tail(text: str, lines: int = 12, chars: int = 1500) -> str:
    """The last non-empty lines of ``text`` (at most ``chars``)."""
    kept = [ln for ln in (text or "").splitlines() if ln.strip()][-lines:]
    return "\n".join(kept)[-chars:]
