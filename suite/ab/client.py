"""The client side of the trial protocol: one revision's trial server, started and spoken to.

:class:`TrialServer` starts ``python -m suite.cli.main trial-server`` in a revision's worktree
with ``PYTHONPATH=<worktree>`` (first), reads its hello, refuses a server of another protocol
version or one that imported ``suite`` from anywhere but the worktree, and sends requests
bounded by a timeout.  A server that dies is reported with the tail of its log.
"""
from __future__ import annotations

import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from typing import Any

from ..runtime.pool import owned_tempdir
from ..runtime.spawn import keeper, kill_group, pdeathsig_preexec
from .protocol import PROTOCOL, SUPPORTED_VERSIONS, VERSION, Hello, ProtocolError, decode, encode

__all__ = ["TrialServer", "TrialError", "ProtocolMismatch"]


class TrialError(RuntimeError):
    """A request failed on the server (``kind`` is the exception's type there), or the server died."""

    def __init__(self, message: str, kind: str = "", traceback: str = ""):
        super().__init__(message)
        self.kind = kind
        self.traceback = traceback


class ProtocolMismatch(TrialError):
    """The revision has no trial server, or speaks another version of the protocol: unusable input."""


def _under(path: str, root: str) -> bool:
    path, root = os.path.realpath(path), os.path.realpath(root)
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


class TrialServer:
    def __init__(self, root: str, label: str, nproc: int = 2, python: str | None = None, timeout: float = 600.0,
                 start_timeout: float = 180.0, device: str | None = None, log_path: str | None = None,
                 env: dict | None = None, wait: bool = True):
        self.root, self.label, self.nproc, self.timeout = os.path.abspath(root), label, nproc, timeout
        self._own_log = log_path is None  # a log made here is removed on close (errors quote its tail)
        self._log_dir: str | None = None
        self._log_owner: int | None = None
        if log_path is None:  # in a temp directory of this process's (swept by the next run if it is killed)
            self._log_dir, self._log_owner = owned_tempdir(f"fleetbench-trial-{label}-")
            log_path = os.path.join(self._log_dir, "server.log")
        self.log_path = log_path
        pypath = os.environ.get("PYTHONPATH")
        child_env = {**os.environ, **(env or {})}  # the caller's env wins
        child_env["PYTHONPATH"] = self.root + (os.pathsep + pypath if pypath else "")
        child_env.setdefault("PYTHONUNBUFFERED", "1")
        cmd = [python or sys.executable, "-m", "suite.cli.main", "trial-server", "--nproc", str(nproc),
               "--timeout", str(timeout)]
        if device:
            cmd += ["--device", device]
        self._log = open(self.log_path, "w")
        # A session of its own: a Ctrl-C in the terminal reaches `ab`, which shuts the servers down in order.
        # The server dies with `ab` (SIGTERM from the kernel when `ab` dies, killed -9 too; its ranks follow
        # through their parent pipe): it is started from the keeper thread (suite.runtime.spawn), which lives as
        # long as this process, so a server started for a figure's worker thread does not die with that thread.
        self.proc = keeper.call(subprocess.Popen, cmd, cwd=self.root, env=child_env, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=self._log, text=True, bufsize=1, start_new_session=True,
                                preexec_fn=pdeathsig_preexec(signal.SIGTERM))
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self._stdin, self._stdout = self.proc.stdin, self.proc.stdout
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True, name=f"trial-{label}")
        self._reader.start()
        self._id = 0
        self.start_timeout = start_timeout
        self.hello: Hello | None = None
        if wait:
            try:
                self.ready()
            except BaseException:  # nothing of a server that could not start is left behind
                self.kill()
                raise

    def ready(self) -> Hello:
        """Wait for the server's hello (and check it) once."""
        if self.hello is None:
            self.hello = self._hello(self.start_timeout)
        return self.hello

    # ---- plumbing ---------------------------------------------------------------------------------
    def _read(self) -> None:
        try:
            for line in self._stdout:
                self._lines.put(line)
        finally:
            self._lines.put(None)

    def log_tail(self, lines: int = 25) -> str:
        try:
            self._log.flush()
            with open(self.log_path, errors="replace") as fh:
                return "".join(fh.readlines()[-lines:]).rstrip()
        except OSError:
            return ""

    def _next_line(self, timeout: float, what: str) -> dict:
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise TrialError(f"{self.label}: the trial server did not answer {what} within {timeout:.0f} s") from None
        if line is None:
            code = self.proc.wait(timeout=30)
            raise TrialError(f"{self.label}: the trial server exited (code {code}) while {what}; its log "
                             f"({self.log_path}) ends:\n{self.log_tail()}", kind="ServerDied")
        try:
            return decode(line)
        except ValueError:
            raise TrialError(f"{self.label}: the trial server wrote a line that is not JSON while {what}: "
                             f"{line[:200]!r}", kind="ProtocolError") from None

    def _hello(self, timeout: float) -> Hello:
        try:
            msg = self._next_line(timeout, "starting")
        except TrialError as exc:
            log = self.log_tail(60)
            if "invalid choice: 'trial-server'" in log or "No module named 'suite.ab" in log:
                raise ProtocolMismatch(
                    f"{self.label}: this revision has no trial server; `fleetbench ab` compares revisions that speak "
                    f"the trial protocol ({PROTOCOL} version {VERSION}): pick revisions at or after the commit that "
                    f"added `fleetbench ab`") from None
            raise exc
        if not isinstance(msg, dict) or msg.get("protocol") != PROTOCOL:
            raise ProtocolMismatch(f"{self.label}: the trial server did not introduce itself as {PROTOCOL} "
                                   f"(first line: {str(msg)[:200]})")
        if msg.get("version") not in SUPPORTED_VERSIONS:
            ours = ", ".join(map(str, SUPPORTED_VERSIONS))
            raise ProtocolMismatch(f"{self.label}: the revision's trial server speaks {PROTOCOL} version "
                                   f"{msg.get('version')}, this fleetbench speaks {ours}: run `fleetbench ab` from "
                                   f"a checkout whose protocol matches")
        try:
            hello = Hello.from_dict(msg, f"{self.label}: the trial server's hello")
        except ProtocolError as exc:
            raise ProtocolMismatch(str(exc)) from None
        if not _under(hello.suite, self.root):
            raise TrialError(f"{self.label}: the trial server imported suite from {hello.suite}, not from the "
                             f"revision's worktree {self.root} (PYTHONPATH did not win over the installed fleetbench)",
                             kind="ImportPath")
        return hello

    def send(self, op: str, **fields: Any) -> int:
        if self.proc.poll() is not None:
            raise TrialError(f"{self.label}: the trial server has exited (code {self.proc.returncode}); its log "
                             f"ends:\n{self.log_tail()}", kind="ServerDied")
        self._id += 1
        try:
            self._stdin.write(encode({"id": self._id, "op": op, **fields}))
            self._stdin.flush()
        except (BrokenPipeError, OSError):
            raise TrialError(f"{self.label}: the trial server closed its input; its log ends:\n{self.log_tail()}",
                             kind="ServerDied") from None
        return self._id

    def receive(self, rid: int, what: str, timeout: float | None = None) -> dict:
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            msg = self._next_line(max(1.0, deadline - time.monotonic()), what)
            if msg.get("id") == rid:
                break
        if not msg.get("ok"):
            raise TrialError(f"{self.label}: {what} failed: {msg.get('error')}", kind=msg.get("kind", ""),
                             traceback=msg.get("traceback", ""))
        return msg

    def request(self, op: str, timeout: float | None = None, **fields: Any) -> dict:
        return self.receive(self.send(op, **fields), f"{op} {fields.get('case') or fields.get('key') or ''}".strip(),
                            timeout)

    def kill(self, grace: float = 2.0) -> None:
        """Stop the server now (an interrupted `ab`): SIGTERM, so its ranks see it gone and remove their
        store; after ``grace`` seconds its whole process group is killed."""
        if self.proc.poll() is None:
            try:
                self.proc.terminate()
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # ranks still there (the server's session is its own)
        except OSError:
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        self._close_log()

    def _close_log(self) -> None:
        try:
            self._log.close()
            if self._own_log and self._log_dir:
                shutil.rmtree(self._log_dir, ignore_errors=True)
        except OSError:
            pass
        if self._log_owner is not None:
            os.close(self._log_owner)
            self._log_owner = None

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self._stdin.write(encode({"id": -1, "op": "shutdown"}))
                self._stdin.flush()
                self._stdin.close()
            except (BrokenPipeError, OSError, ValueError):
                pass
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.terminate()
                try:
                    self.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(timeout=10)
        kill_group(self.proc.pid)  # the sweep: whatever of the server's session is left (its session is its own)
        self._close_log()

    def __enter__(self) -> TrialServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
