"""A long-lived pool of local ranks, driven from the parent process.

Ranks are started once (spawned processes joined in one gloo/NCCL world); the parent
then sends them calls ("run function F with these arguments on every rank") and
collects one result per rank.  Every call is bounded by a timeout.  A rank that dies
or hangs is reported (which rank, doing what) as :class:`RankFailure`, the pool is torn
down, and the next call starts a fresh pool: nothing ever hangs.

Rank functions are passed as function objects: module-level functions, which pickle by
reference (module and name), so a spawned rank imports them; a lambda or a closure is
refused with a clear error before anything is sent.

Nothing outlives the parent and nothing listens on the network for a local run:

- every rank watches a pipe whose only write end the parent holds (the pool keeps it, whatever
  thread started the pool); when the parent process dies (SIGKILL, SIGTERM, a crash) the
  kernel closes it, the rank reads EOF at once, kills its own descendants (reader workers, …)
  and exits, in the middle of a call too;
- local ranks meet through a ``FileStore`` in a private temporary directory (mode 0700, a
  fresh one on every start, removed when the pool closes or is torn down after a rank died),
  and gloo binds the loopback interface: no socket of the run listens beyond 127.0.0.1/::1.
  Only ranks in emulated cluster nodes (``store_netns``/``store_host``) use a TCPStore, which
  then listens inside node 0's network namespace.
"""
from __future__ import annotations

import fcntl
import os
import pickle
import queue
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .netns import enter_netns
from .spawn import descendants as _descendants
from .spawn import safe_start, spawn_context

__all__ = ["RankPool", "RankFailure", "RankError", "RankFn", "fn_name", "check_rank_fn", "owned_tempdir",
           "remove_stale"]

RankFn = Callable[..., Any]


class RankFailure(RuntimeError):
    """A rank died or did not answer in time; the pool has been torn down."""

    def __init__(self, message: str, ranks: list[int], what: str):
        super().__init__(message)
        self.ranks = ranks
        self.what = what


class RankError(RuntimeError):
    """The called function raised on one or more ranks (the pool is still usable if all answered)."""

    def __init__(self, message: str, tracebacks: dict[int, str]):
        super().__init__(message)
        self.tracebacks = tracebacks


def fn_name(fn: RankFn) -> str:
    return f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', repr(fn))}"


def check_rank_fn(fn: Any) -> None:
    """A rank function must be a module-level callable that pickles by reference."""
    if isinstance(fn, str) or not callable(fn):
        raise TypeError(f"rank function {fn!r}: pass the function object itself (a module-level function), "
                        f"not a name")
    try:
        pickle.dumps(fn)
    except Exception as exc:  # noqa: BLE001 - pickle raises several kinds
        raise TypeError(f"rank function {fn_name(fn)} cannot be sent to the ranks ({type(exc).__name__}: {exc}); "
                        f"define it at module level (lambdas and closures do not pickle)") from None


@dataclass
class _Options:
    device: str | None
    pg_timeout: float
    num_threads: int | None
    env: dict = field(default_factory=dict)
    netns: str | None = None  # network namespace the rank enters first (emulated cluster node)
    parent: int = 0  # pid of the parent, when it started the ranks from its main thread (parent-death signal)


def _kill_descendants() -> None:
    """Stop the whole tree below this process first (so nothing forks away meanwhile), then kill it."""
    me, stopped = os.getpid(), set()
    for _ in range(5):
        new = [p for p in _descendants(me) if p not in stopped]
        if not new:
            break
        for p in new:
            try:
                os.kill(p, signal.SIGSTOP)
            except OSError:
                pass
            stopped.add(p)
    for p in stopped:
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass


def _orphaned(store_dir: str | None) -> None:
    """The parent is gone: take this rank's processes down and leave no store behind."""
    try:
        if store_dir:
            shutil.rmtree(store_dir, ignore_errors=True)
        _kill_descendants()
    finally:
        os._exit(3)


def _watch_parent(conn, store_dir: str | None) -> None:
    """A thread that blocks on the pipe from the parent: it only ever ends in EOF, when the parent's
    write end is closed, which the kernel does when the parent process dies."""

    def watch():
        try:
            while True:
                conn.recv_bytes()
        except BaseException:  # noqa: BLE001 - EOFError (the parent is gone) or the pipe broke
            pass
        _orphaned(store_dir)

    threading.Thread(target=watch, name="fleetbench-parent-watch", daemon=True).start()


def _parent_death_signal(sig: int) -> bool:
    """``prctl(PR_SET_PDEATHSIG, sig)``: the kernel sends ``sig`` to this process when the thread that
    started it ends (Linux; elsewhere nothing happens and False is returned)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(1, sig, 0, 0, 0) == 0  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return False


def _worker(rank: int, world: int, store_at: tuple, cmd_q, res_q, opts: _Options, watch=None) -> None:
    # Until the rendezvous is over the main thread may sit in C++ (FileStore, init_process_group) holding
    # the GIL, so the watching thread could not run: the kernel kills the rank instead if the parent dies
    # meanwhile (its store directory is then removed by the next pool, see remove_stale).  Set only when
    # the parent started the ranks from its main thread, which lives as long as the process.
    deathsig = bool(opts.parent) and _parent_death_signal(signal.SIGKILL)
    if opts.parent and os.getppid() != opts.parent:  # the parent died before the signal was set
        os._exit(3)
    os.environ.update(opts.env)
    parent = os.getppid()
    store_dir = os.path.dirname(store_at[1]) if store_at[0] == "file" else None
    if watch is not None:
        _watch_parent(watch, store_dir)
    try:
        if opts.netns:
            enter_netns(opts.netns)
        import torch.distributed as dist

        from .launch import init_rank

        store: dist.Store
        if store_at[0] == "file":
            store = dist.FileStore(store_at[1], world)
            store.set_timeout(_td(opts.pg_timeout))
        else:
            _, host, port = store_at
            store = dist.TCPStore(host, port, world_size=None, is_master=False, timeout=_td(opts.pg_timeout))
        init_rank(
            rank, world, rank, world, store=store, device=opts.device, pg_timeout=opts.pg_timeout,
            num_threads=opts.num_threads,
        )
        if deathsig:  # from here the watching thread takes the rank's children and store down with it
            _parent_death_signal(0)
        res_q.put(("__ready__", rank, True, os.getpid()))
    except BaseException:  # noqa: BLE001 - reported to the parent
        res_q.put(("__ready__", rank, False, traceback.format_exc()))
        return
    while True:
        try:
            msg = cmd_q.get(timeout=1.0)
        except queue.Empty:
            if os.getppid() != parent:  # the parent is gone: do not linger
                _orphaned(store_dir)
            continue
        if msg is None:
            break
        call_id, fn, kwargs = msg
        try:
            result = fn(**kwargs)
            res_q.put((call_id, rank, True, result))
        except BaseException:  # noqa: BLE001 - reported to the parent
            res_q.put((call_id, rank, False, traceback.format_exc()))
    from .launch import shutdown

    try:
        shutdown()
    except Exception:  # noqa: BLE001 - exiting anyway
        pass


def _td(seconds: float):
    import datetime

    return datetime.timedelta(seconds=seconds)


class RankPool:
    """``nproc`` local ranks, started once and driven by :meth:`run`.

    >>> from suite.runtime.probes import whoami
    >>> with RankPool(2) as pool:
    ...     results = pool.run(whoami)
    """

    def __init__(
        self,
        nproc: int,
        *,
        device: str | None = None,
        timeout: float = 300.0,
        pg_timeout: float = 60.0,
        start_timeout: float = 120.0,
        num_threads: int | None = None,
        env: dict | None = None,
        grace: float = 5.0,
        rank_netns: list | None = None,
        rank_env: list | None = None,
        store_host: str | None = None,
        store_netns: str | None = None,
    ):
        """``rank_netns``/``rank_env`` (one entry per rank) start rank r inside network namespace
        ``rank_netns[r]`` with ``rank_env[r]`` added to its environment; the rendezvous store then
        listens on ``store_host`` inside ``store_netns`` (see ``suite.cluster.launch``).  Without
        ``store_host``/``store_netns`` the ranks meet through a file store (no network listener)."""
        if not isinstance(nproc, int) or nproc < 1:
            raise ValueError(f"nproc={nproc!r}: must be a whole number >= 1")
        self.nproc = nproc
        self.timeout = timeout
        self.start_timeout = start_timeout
        self.grace = grace
        self.opts = _Options(device=device, pg_timeout=pg_timeout, num_threads=num_threads, env=dict(env or {}))
        self._procs: list = []
        self._cmd_qs: list = []
        self._res_q: Any = None  # the spawn context's Queue of (call id, rank, ok, payload)
        self._store: Any = None  # the TCPStore server (emulated cluster only)
        self._watch_w: Any = None  # write end of the pipe every rank watches (EOF: the parent is gone)
        self._owner: int | None = None  # the locked owner file of the store directory (see owned_tempdir)
        self.store_path: str | None = None  # the FileStore of a local pool (in a private directory)
        self._call = 0
        self.pids: list[int] = []
        self.restarts = 0
        self._started_once = False
        for what, per in (("rank_netns", rank_netns), ("rank_env", rank_env)):
            if per is not None and len(per) != nproc:
                raise ValueError(f"{what} has {len(per)} entries; expected one per rank ({nproc})")
        self.rank_netns, self.rank_env = rank_netns, rank_env
        self.store_host, self.store_netns = store_host, store_netns

    # ---- life cycle ---------------------------------------------------------------
    @property
    def alive(self) -> bool:
        return bool(self._procs) and all(p.is_alive() for p in self._procs)

    def start(self) -> None:
        if self.alive:
            return
        self.close()

        if self._started_once:
            self.restarts += 1
        self._started_once = True
        try:
            self._spawn()
            ready = self._collect("__ready__", "starting and joining the process group", self.start_timeout)
        except BaseException:  # a failed or interrupted start leaves no rank, store or pipe behind
            self.close()
            raise
        self.pids = [ready[r] for r in range(self.nproc)]

    def _spawn(self) -> None:
        if self.store_host is not None or self.store_netns is not None:
            # Emulated cluster: ranks in other network namespaces reach the store over the network.
            # Port 0: the OS picks a free port, so two runs side by side never collide.
            host = self.store_host or "127.0.0.1"
            self._store = _master_store(host, self.opts.pg_timeout, self.store_netns)
            store_at: tuple = ("tcp", host, self._store.port)
        else:
            # A fresh file in a private directory (mkdtemp: mode 0700) on every start: no listener.
            remove_stale()
            store_dir, self._owner = owned_tempdir("fleetbench-store-")
            self.store_path = os.path.join(store_dir, "store")
            os.close(os.open(self.store_path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
            store_at = ("file", self.store_path)
        env = dict(self.opts.env)
        if store_at[0] == "file":
            # Local ranks talk only to each other: gloo binds the loopback interface, also when the
            # environment names another one (only an explicit env= of this pool can change it).
            env.setdefault("GLOO_SOCKET_IFNAME", _loopback_ifname())
        else:
            env.setdefault("GLOO_SOCKET_IFNAME", os.environ.get("GLOO_SOCKET_IFNAME", _loopback_ifname()))
        main = threading.current_thread() is threading.main_thread()
        opts = [_Options(self.opts.device, self.opts.pg_timeout, self.opts.num_threads,
                         {**env, **(self.rank_env[r] if self.rank_env else {})},
                         self.rank_netns[r] if self.rank_netns else None, os.getpid() if main else 0)
                for r in range(self.nproc)]
        # The ranks (and multiprocessing's resource tracker) never have the current directory first on their
        # path: a multiprocessing.py there would run in each of them (suite/runtime/spawn.py).
        ctx = spawn_context()
        with safe_start():
            self._res_q = ctx.Queue()
            self._cmd_qs = [ctx.Queue() for _ in range(self.nproc)]
            # Spawned ranks inherit only the read end (multiprocessing passes exactly the fds it sends);
            # the write end stays here, so the ranks see EOF when this process dies, whichever thread
            # started them (prctl's parent-death signal would follow the starting *thread* instead).
            watch_r, self._watch_w = ctx.Pipe(duplex=False)
            self._procs = [
                ctx.Process(target=_worker,
                            args=(r, self.nproc, store_at, self._cmd_qs[r], self._res_q, opts[r], watch_r),
                            daemon=True, name=f"fleetbench-rank{r}")
                for r in range(self.nproc)
            ]
            _LIVE_POOLS.add(self)
            try:
                for p in self._procs:
                    p.start()
            finally:
                watch_r.close()

    def close(self) -> None:
        """Stop every rank (politely, then by force) and forget them."""
        for q in self._cmd_qs:
            try:
                q.put_nowait(None)
            except Exception:  # noqa: BLE001
                pass
        deadline = time.monotonic() + 3.0
        for p in self._procs:
            if p.pid is not None:  # started
                p.join(timeout=max(0.0, deadline - time.monotonic()))
        for p in self._procs:
            if p.is_alive():
                tree = _descendants(p.pid) if p.pid else []  # its reader workers etc. go with it
                p.kill()
                for pid in tree:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except OSError:
                        pass
                p.join(timeout=5.0)
        for q in self._cmd_qs + ([self._res_q] if self._res_q is not None else []):
            try:
                q.cancel_join_thread()
                q.close()
            except Exception:  # noqa: BLE001
                pass
        if self._watch_w is not None:
            try:
                self._watch_w.close()
            except Exception:  # noqa: BLE001
                pass
        if self.store_path is not None:
            shutil.rmtree(os.path.dirname(self.store_path), ignore_errors=True)
        if self._owner is not None:
            os.close(self._owner)
            self._owner = None
        self._procs, self._cmd_qs, self._res_q, self._store, self.pids = [], [], None, None, []
        self._watch_w, self.store_path = None, None
        _LIVE_POOLS.discard(self)

    def __enter__(self) -> RankPool:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass

    # ---- calls ----------------------------------------------------------------------
    def run(self, fn: RankFn, kwargs: dict | None = None, *, timeout: float | None = None,
            per_rank: list[dict] | None = None) -> list[Any]:
        """Run ``fn(**kwargs)`` on every rank; return the results in rank order.

        ``per_rank`` adds rank-specific keyword arguments.  Raises :class:`RankError` when
        the function raised (with every rank's traceback) and :class:`RankFailure` when a rank
        died or did not answer within ``timeout`` (the pool is then torn down).
        """
        check_rank_fn(fn)
        self.start()
        ref = fn_name(fn)
        self._call += 1
        call_id = self._call
        for r, q in enumerate(self._cmd_qs):
            kw = dict(kwargs or {})
            if per_rank is not None:
                kw.update(per_rank[r])
            q.put((call_id, fn, kw))
        answers = self._collect(call_id, f"running {ref}", timeout or self.timeout, raw=True)
        errors = {r: payload for r, (ok, payload) in answers.items() if not ok}
        if errors:
            first = min(errors)
            raise RankError(
                f"{ref} raised on rank(s) {sorted(errors)}; rank {first}:\n{errors[first]}", errors
            )
        return [answers[r][1] for r in range(self.nproc)]

    def _collect(self, call_id: Any, what: str, timeout: float, raw: bool = False) -> dict[int, Any]:
        deadline = time.monotonic() + timeout
        got: dict[int, tuple[bool, Any]] = {}
        first_error_at: float | None = None
        while len(got) < self.nproc:
            try:
                cid, rank, ok, payload = self._res_q.get(timeout=0.2)
            except queue.Empty:
                cid = None
            except (EOFError, OSError) as exc:
                self._fail(list(range(self.nproc)), what, f"the result queue broke ({exc!r})")
            if cid == call_id:
                got[rank] = (ok, payload)
                if not ok and first_error_at is None:
                    first_error_at = time.monotonic()
                continue
            missing = [r for r in range(self.nproc) if r not in got]
            dead = [r for r in missing if not self._procs[r].is_alive()]
            if dead:
                codes = ", ".join(f"rank {r} exit code {self._procs[r].exitcode}" for r in dead)
                self._fail(dead, what, f"rank(s) {dead} died ({codes})", got)
            now = time.monotonic()
            if first_error_at is not None and now - first_error_at > self.grace:
                # A rank raised; the others are most likely stuck in a collective waiting for it.
                self._fail(missing, what, f"rank(s) {missing} stuck after another rank raised", got)
            if now > deadline:
                self._fail(missing, what, f"rank(s) {missing} did not answer within {timeout:.0f} s (stuck)", got)
        if not raw:
            bad = {r: p for r, (ok, p) in got.items() if not ok}
            if bad:
                r = min(bad)
                self.close()
                raise RankFailure(f"rank {r} failed while {what}:\n{bad[r]}", sorted(bad), what)
            return {r: p for r, (ok, p) in got.items()}
        return got

    def _fail(self, ranks: list[int], what: str, why: str, got: dict | None = None) -> None:
        detail = ""
        for r, (ok, payload) in sorted((got or {}).items()):
            if not ok:
                detail += f"\n--- rank {r} raised:\n{payload}"
        self.close()
        raise RankFailure(f"{why} while {what}; the pool was torn down and restarts on the next call{detail}",
                          ranks, what)


# Pools whose ranks are running: a child forked from this process (without exec) must not keep
# their watch pipes open, or the ranks would outlive this process as long as that child lives.
_LIVE_POOLS: weakref.WeakSet[RankPool] = weakref.WeakSet()


def _close_watch_pipes_in_child() -> None:
    for pool in list(_LIVE_POOLS):
        w = pool._watch_w
        if w is not None:
            try:
                w.close()
            except Exception:  # noqa: BLE001
                pass
        if pool._owner is not None:  # the lock stays the parent's alone (it is shared until closed here)
            os.close(pool._owner)
        # The ranks and the store belong to the parent: this copy of the pool must not stop or remove them.
        pool._watch_w, pool._procs, pool._cmd_qs, pool._res_q, pool.store_path = None, [], [], None, None
        pool._owner = None


os.register_at_fork(after_in_child=_close_watch_pipes_in_child)


OWNER_FILE = "owner.lock"


def owned_tempdir(prefix: str) -> tuple[str, int]:
    """A fresh private temporary directory and the descriptor of its owner file, locked (flock) for as
    long as the descriptor is open, i.e. while this process lives: :func:`remove_stale` removes the
    directory only once that lock is free.  The file is locked before it gets its name, so no sweep
    ever sees it unlocked."""
    d = tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-")  # named per run: its owner's pid
    tmp = os.path.join(d, ".owner")
    fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_RDWR | getattr(os, "O_CLOEXEC", 0), 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.rename(tmp, os.path.join(d, OWNER_FILE))
    return d, fd


def remove_stale(prefix: str = "fleetbench-", tmp: str | None = None) -> list[str]:
    """Remove the leftovers of dead runs from the temporary directory: each ``prefix*`` directory whose
    owner file (see :func:`owned_tempdir`) nobody holds locked any more (a directory without one, or of
    a live owner, is left alone).  Returns the removed paths."""
    tmp = tmp or tempfile.gettempdir()
    removed = []
    try:
        names = [n for n in os.listdir(tmp) if n.startswith(prefix)]
    except OSError:
        return []
    for name in names:
        d = os.path.join(tmp, name)
        try:
            fd = os.open(os.path.join(d, OWNER_FILE), os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)  # its owner lives
            continue
        try:
            if not os.path.islink(d):
                shutil.rmtree(d, ignore_errors=True)
                removed.append(d)
        finally:
            os.close(fd)
    return removed


def _master_store(host: str, timeout: float, netns: str | None):
    """The rendezvous store's server, listening in ``netns`` when given (made from a helper thread
    that enters it: the socket stays there, this process's threads stay where they are)."""
    import torch.distributed as dist

    def make():
        return dist.TCPStore(host, 0, world_size=None, is_master=True, timeout=_td(timeout), wait_for_workers=False)

    if not netns:
        return make()
    from concurrent.futures import ThreadPoolExecutor

    def in_netns():
        enter_netns(netns)
        return make()

    with ThreadPoolExecutor(1) as ex:  # a fresh thread: it ends with the call, taking the namespace along
        return ex.submit(in_netns).result(timeout=timeout + 10)


def _loopback_ifname() -> str:
    """The loopback interface's name (flag IFF_LOOPBACK), "lo" when it cannot be told."""
    try:
        names = [n for _, n in socket.if_nameindex()]
    except OSError:
        return "lo"
    if "lo" in names:
        return "lo"
    for name in names:
        try:
            with open(f"/sys/class/net/{name}/flags") as fh:
                if int(fh.read().strip(), 16) & 0x8:  # IFF_LOOPBACK
                    return name
        except (OSError, ValueError):
            continue
    return "lo"
