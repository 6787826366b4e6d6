"""Spawned processes: never the current directory first on ``sys.path``, and dead with fleetbench.

``multiprocessing``'s spawn starts a child as ``python -c 'from multiprocessing.spawn import spawn_main; …'``:
``-c`` puts the current directory first on the child's path, so a ``multiprocessing.py`` (or ``torch.py``, …)
in the directory a user runs fleetbench from would run in every rank, in a user factory's child and in the
resource tracker, before any of fleetbench's code.  Every process fleetbench spawns goes through
:func:`spawn_context` and starts inside :func:`safe_start`:

- the child runs with ``PYTHONSAFEPATH=1`` (Python 3.11+: ``-c``, ``-m`` and scripts prepend nothing), which its
  own children inherit;
- the child starts with SIGINT blocked (a thread's signal mask is inherited through fork and exec): a Ctrl-C in the
  terminal, which reaches every process of the foreground group, interrupts fleetbench alone, which stops its
  children itself; a rank interrupted while its interpreter starts printed a fatal error and a traceback each;
- the path the child takes over from its parent (multiprocessing sends ``sys.path`` along) has the current
  directory moved to the end, where a module of the user's (a ``--model`` factory) is still found, after the
  standard library and the installed packages; an entry that PYTHONPATH names stays where it is (the user
  named it).

Every process fleetbench starts dies with it: a child that must not outlive it is started from :data:`keeper` (a
thread that lives for the run: ``PR_SET_PDEATHSIG`` fires when the *thread* that forked the child ends) with a
parent-death signal (:func:`set_parent_death_signal`, :func:`pdeathsig_preexec`), as the leader of its own
process group, which is killed when its work is done (:func:`kill_group`).  A command's processes carry its token
(``RUN_TOKEN`` in their environment); at its end :func:`sweep` kills what is left below it and names what went off
into a session of its own.
"""
from __future__ import annotations

import contextlib
import multiprocessing as mp
import multiprocessing.spawn as _mp_spawn
import os
import threading
from collections.abc import Iterator

__all__ = ["spawn_context", "safe_start", "child_sys_path", "SAFE_ENV", "keeper", "set_parent_death_signal",
           "pdeathsig_preexec", "kill_group", "RUN_TOKEN", "processes_with_token", "sweep", "descendants"]

SAFE_ENV = {"PYTHONSAFEPATH": "1"}
_LOCK = threading.RLock()


def _pythonpath() -> list[str]:
    return [os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]


def child_sys_path(path: list[str], cwd: str | None = None) -> list[str]:
    """``path`` as a spawned child gets it: the current directory ('' or its absolute path, unless PYTHONPATH
    names it) moved from wherever it is to the end."""
    cwd = os.path.abspath(cwd or os.getcwd())
    named = set(_pythonpath())
    out = [entry for entry in path
           if not (entry in ("", ".") or (os.path.abspath(entry) == cwd and cwd not in named))]
    if cwd not in {os.path.abspath(p) for p in out if p}:
        out.append(cwd)
    return out


_original_preparation = _mp_spawn.get_preparation_data


def _preparation_data(name):
    data = _original_preparation(name)
    data["sys_path"] = child_sys_path(list(data.get("sys_path") or []), data.get("dir"))
    return data


def spawn_context():
    """multiprocessing's spawn context, with every child's path as :func:`child_sys_path` makes it."""
    if _mp_spawn.get_preparation_data is not _preparation_data:
        _mp_spawn.get_preparation_data = _preparation_data
    return mp.get_context("spawn")


@contextlib.contextmanager
def safe_start() -> Iterator[None]:
    """Processes started (and multiprocessing's resource tracker, if it starts now) inherit ``PYTHONSAFEPATH=1``:
    set in this process's environment for the block only (children inherit the environment at their start); and
    a blocked SIGINT: this thread blocks it for the block (a Ctrl-C meanwhile goes to another thread of this process,
    or waits until the block ends: it is not lost)."""
    import signal
    from multiprocessing import resource_tracker

    with _LOCK:
        saved = {k: os.environ.get(k) for k in SAFE_ENV}
        os.environ.update(SAFE_ENV)
        # the tracker first: starting it unblocks SIGINT and SIGTERM in this thread (multiprocessing's
        # resource_tracker.ensure_running blocks them around its spawn, then unblocks them)
        resource_tracker.ensure_running()
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            yield
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


# ---- processes that die with fleetbench -------------------------------------------------------------------------
PR_SET_PDEATHSIG = 1


def set_parent_death_signal(sig: int) -> bool:
    """``prctl(PR_SET_PDEATHSIG, sig)`` for this process: the kernel sends ``sig`` when the *thread* that started
    it ends (Linux; elsewhere False).  Start the process from :func:`keeper` so that thread lives for the run."""
    import sys

    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def pdeathsig_preexec(sig: int):
    """A ``preexec_fn`` (run in the child between fork and exec) setting the parent-death signal ``sig``, or None
    where it cannot be set (not Linux).  The ctypes function is looked up here; the child only calls it."""
    import sys

    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def run() -> None:
        prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the signal was set: nobody would send it
            os._exit(3)

    return run


class _Keeper:
    """One thread that lives as long as the process and starts the children that ask for a parent-death signal:
    ``PR_SET_PDEATHSIG`` fires when the thread that forked the child ends, so a child started from a short-lived
    thread (a figure's worker, a thread pool) would be signalled when that thread ends, not when fleetbench does."""

    def __init__(self):
        import queue

        self._q: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def _loop(self) -> None:
        while True:
            fn, args, kwargs, box, done = self._q.get()
            try:
                box["value"] = fn(*args, **kwargs)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                box["error"] = exc
            finally:
                done.set()

    def call(self, fn, *args, **kwargs):
        """``fn(*args, **kwargs)`` run on the keeper thread (its processes are this thread's children)."""
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="fleetbench-keeper", daemon=True)
                self._thread.start()
        if threading.current_thread() is self._thread:
            return fn(*args, **kwargs)
        box: dict = {}
        done = threading.Event()
        self._q.put((fn, args, kwargs, box, done))
        interrupted = None
        while not done.is_set():
            try:
                done.wait(0.5)
            except BaseException as exc:  # noqa: BLE001 - Ctrl-C while the child starts: it finishes starting first
                interrupted = exc
        if interrupted is not None:
            if "value" in box and hasattr(box["value"], "kill"):
                with contextlib.suppress(Exception):
                    box["value"].kill()
            raise interrupted
        if "error" in box:
            raise box["error"]
        return box["value"]


keeper = _Keeper()


def kill_group(pgid: int | None) -> None:
    """SIGKILL to every process of the process group ``pgid`` (a child started as a group leader and what it
    forked): the sweep when its work is done or the run ends."""
    if not pgid:
        return
    import signal

    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


# ---- what outlived the run ---------------------------------------------------------------------------------------
RUN_TOKEN = "FLEETBENCH_RUN_TOKEN"


def processes_with_token(token: str, exclude: tuple[int, ...] = ()) -> list[tuple[int, str]]:
    """(pid, name) of live processes whose environment holds ``RUN_TOKEN=token``: what this run started, and what
    those started, wherever they went (a new session, re-parented to init)."""
    needle = f"{RUN_TOKEN}={token}".encode()
    out = []
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return []
    for pid in pids:
        if pid in exclude:
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as fh:
                if needle not in fh.read().split(b"\0"):
                    continue
            with open(f"/proc/{pid}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        state = stat.rsplit(b")", 1)[1].split()[0]
        if state in (b"Z", b"X"):
            continue
        name = stat[stat.index(b"(") + 1: stat.rindex(b")")].decode(errors="replace")
        out.append((pid, name))
    return out


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (children, their children, …), read from /proc."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read()
            ppid = int(stat.rsplit(b")", 1)[1].split()[1])  # the name in (…) may hold spaces and ')'
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), ()):
            out.append(c)
            todo.append(c)
    return out


def sweep(token: str, exclude: tuple[int, ...] = ()) -> list[tuple[int, str]]:
    """At the end of a command: what it started (the run's token in their environment) and left running.  Its
    descendants are killed (the sweep); the (pid, name) of the others, which went off into a session of their own
    (a daemon a user's code started), are returned to be reported by name, and left alone."""
    import signal

    skip = {os.getpid(), *exclude}
    with contextlib.suppress(Exception):  # multiprocessing's resource tracker: this process's own, ends with it
        from multiprocessing import resource_tracker

        pid = getattr(resource_tracker._resource_tracker, "_pid", None)
        if pid:
            skip.add(pid)
    left = processes_with_token(token, tuple(skip))
    if not left:
        return []
    below = set(descendants(os.getpid()))
    for pid, _ in left:
        if pid in below:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    return [(pid, name) for pid, name in left if pid not in below]
