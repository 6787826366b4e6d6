"""The launcher used under torchrun: every rank runs the function itself; rank 0 collects.

It offers the rank pool's ``run(fn, kwargs)`` so ``fleetbench run`` drives both the same way.

Outcomes travel through the c10d store (TCP), never through a collective.  A rank whose function
raised may have left its peers inside a collective (an allreduce it never joined): any collective of
its own (``gather_object``) would pair with theirs — garbage exchanged on gloo, a hang on NCCL until the
watchdog kills every process, and the error never reported.  So each rank writes its outcome (ok, or
its traceback) to the store and polls for the others':

- every rank reported: a function that raised anywhere raises :class:`RankError` on every rank (the
  same path everywhere), naming each rank's traceback; otherwise rank 0 gets every rank's result (read
  from the store, then deleted).  Under NCCL the world is rebuilt first (:meth:`TorchrunLauncher.rebuild`):
  a peer of the failing rank may have queued a collective on its NCCL stream that the failing rank never
  issued (NCCL collectives are asynchronous), and the next case's first collective would pair with it;
  so every communicator is aborted and a new default process group is built, on every rank, before the
  next case.  Gloo runs a collective synchronously inside the call, so its world stays usable;
- a rank that raised, or saw another rank's error, waits at most ``report_timeout`` for the others;
  one that succeeded waits at most the call's ``timeout``.  A rank still missing then is stuck in a
  collective: the world cannot be used any more, so this rank prints the report (its own traceback,
  the errors seen, the missing ranks) and exits at once with status 1, and torchrun's agent stops the
  others.  Nothing waits for the NCCL watchdog.
"""
from __future__ import annotations

import datetime
import os
import pickle
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

from . import groups
from .context import current
from .pool import RankError, RankFn, check_rank_fn, fn_name

__all__ = ["TorchrunLauncher", "EXIT_WORLD_BROKEN", "rebuild_world", "rebuild_world_on_rank"]

EXIT_WORLD_BROKEN = 1
POLL_S = 0.05


def rebuild_world(store, tag: str) -> None:
    """Abort every communicator of this process and build a new default process group over the prefix
    ``tag`` of ``store``; every rank calls it with the same ``tag``.  NCCL: ``_abort_process_group``
    (``ncclCommAbort`` on every communicator, torch's ``distributed_c10d.py``), since destroying would wait
    for an orphaned collective; gloo: ``destroy_process_group``.  Cached groups are dropped, so the next
    engines ask for new ones."""
    ctx = current()
    groups.reset()
    if ctx.platform.backend == "nccl":
        dist.distributed_c10d._abort_process_group()
    else:
        dist.destroy_process_group()
    kwargs: dict[str, Any] = dict(backend=ctx.platform.backend, rank=ctx.rank, world_size=ctx.world_size,
                                  store=dist.PrefixStore(f"fleetbench/world/{tag}", store),
                                  timeout=datetime.timedelta(seconds=ctx.pg_timeout))
    if ctx.platform.is_cuda:
        kwargs["device_id"] = ctx.platform.device
    dist.init_process_group(**kwargs)


def rebuild_world_on_rank(tag: str) -> bool:
    """A rank function: :func:`rebuild_world` over the store the world was built on (a rank pool's)."""
    rebuild_world(dist.distributed_c10d._get_default_store(), tag)
    return True


class TorchrunLauncher:
    def __init__(self, ctx, store=None, report_timeout: float | None = None, timeout: float = 3600.0,
                 exit_fn: Callable[[int], Any] = os._exit, rebuild_on_error: bool | None = None):
        """``store``: the rendezvous store (default: the default process group's); ``report_timeout``:
        how long a failing rank waits for the others (default: the process group's timeout, at most
        60 s); ``timeout``: how long a succeeding rank waits (a call's ``timeout`` overrides it);
        ``rebuild_on_error``: rebuild the world after a rank error (default: yes, under NCCL and gloo alike: a
        peer's orphaned collective would pair with the next call's, ``suite.runner.CaseRunner.recover``)."""
        self.ctx = ctx
        self.nproc = ctx.world_size
        self.is_reporter = ctx.rank == 0
        self.store = store if store is not None else dist.distributed_c10d._get_default_store()
        self.report_timeout = report_timeout if report_timeout is not None else min(ctx.pg_timeout, 60.0)
        self.timeout = timeout
        self.exit_fn = exit_fn
        self._call = 0
        self.rebuild_on_error = True if rebuild_on_error is None else rebuild_on_error
        self.rebuilds = 0

    def run(self, fn: RankFn, kwargs: dict | None = None, *, timeout: float | None = None,
            per_rank: list[dict] | None = None) -> list[Any] | None:
        check_rank_fn(fn)
        ref = fn_name(fn)
        kw = dict(kwargs or {})
        if per_rank is not None:
            kw.update(per_rank[self.ctx.rank])
        self._call += 1  # every rank makes the same calls in the same order: the same key prefix
        prefix = f"fleetbench/torchrun/call{self._call}"
        rank = self.ctx.rank
        try:
            ok, payload = True, fn(**kw)
        except Exception:  # noqa: BLE001 - reported through the store
            ok, payload = False, traceback.format_exc()
        if ok and rank != 0:
            self.store.set(f"{prefix}/result{rank}", pickle.dumps(payload))  # type: ignore[arg-type]  # bytes work
        self.store.set(f"{prefix}/status{rank}", pickle.dumps((ok, None if ok else payload)))  # type: ignore[arg-type]

        statuses = self._collect(prefix, ok, timeout or self.timeout)
        missing = [r for r in range(self.nproc) if r not in statuses]
        errors = {r: tb for r, (good, tb) in statuses.items() if not good}
        if missing:
            self._abort(ref, missing, errors)
        if errors:
            if self.rebuild_on_error:
                self.rebuild()
            first = min(errors)
            raise RankError(f"{ref} raised on rank(s) {sorted(errors)}; rank {first}:\n{errors[first]}", errors)
        if not self.is_reporter:
            return None
        results = [payload]
        for r in range(1, self.nproc):
            key = f"{prefix}/result{r}"
            results.append(pickle.loads(self.store.get(key)))
            self.store.delete_key(key)
        return results

    def share(self, value: Any) -> Any:
        """Rank 0's ``value``, on every rank (through the store): a decision made once (memory groups),
        so ranks on hosts whose own state differs still build the same engines in the same order."""
        self._call += 1
        key = f"fleetbench/torchrun/call{self._call}/shared"
        if self.is_reporter:
            self.store.set(key, pickle.dumps(value))  # type: ignore[arg-type]  # bytes work
            return value
        self.store.wait([key], datetime.timedelta(seconds=self.timeout))
        return pickle.loads(self.store.get(key))

    def gather(self, value: Any) -> list | None:
        """Every rank's ``value`` on rank 0, in rank order (through the store); None on the other ranks."""
        self._call += 1
        prefix = f"fleetbench/torchrun/call{self._call}/gathered"
        if not self.is_reporter:
            self.store.set(f"{prefix}{self.ctx.rank}", pickle.dumps(value))  # type: ignore[arg-type]  # bytes work
            return None
        out = [value]
        for r in range(1, self.nproc):
            key = f"{prefix}{r}"
            self.store.wait([key], datetime.timedelta(seconds=self.timeout))
            out.append(pickle.loads(self.store.get(key)))
            self.store.delete_key(key)
        return out

    def rebuild(self) -> None:
        """:func:`rebuild_world` on every rank (all of them reported, so all of them are here)."""
        self.rebuilds += 1
        rebuild_world(self.store, f"torchrun{self.rebuilds}")

    def _collect(self, prefix: str, ok: bool, timeout: float) -> dict:
        """Every rank's (ok, traceback) that arrives in time: ``timeout`` while all is well,
        ``report_timeout`` from the moment this rank or another is known to have failed."""
        statuses: dict = {}
        start = time.monotonic()
        failed_at = None if ok else start
        while len(statuses) < self.nproc:
            for r in range(self.nproc):
                key = f"{prefix}/status{r}"
                if r not in statuses and self.store.check([key]):
                    statuses[r] = pickle.loads(self.store.get(key))
                    if not statuses[r][0] and failed_at is None:
                        failed_at = time.monotonic()
            if len(statuses) == self.nproc:
                break
            now = time.monotonic()
            if (failed_at is not None and now - failed_at > self.report_timeout) or now - start > timeout:
                break
            time.sleep(POLL_S)
        return statuses

    def _abort(self, ref: str, missing: list, errors: dict) -> None:
        waited = f"{self.report_timeout:.0f} s after the first error" if errors else "the call's timeout"
        lines = [f"fleetbench (torchrun rank {self.ctx.rank}): {ref}: rank(s) {missing} did not report within "
                 f"{waited}; they are most likely stuck in a collective that the failing rank(s) left. "
                 f"The process group cannot be used any more: this rank exits and torchrun stops the others."]
        for r, tb in sorted(errors.items()):
            lines.append(f"--- rank {r} raised:\n{tb}")
        print("\n".join(lines), file=sys.stderr, flush=True)
        sys.stdout.flush()
        self.exit_fn(EXIT_WORLD_BROKEN)
        raise SystemExit(EXIT_WORLD_BROKEN)  # an exit_fn that returns (tests) still leaves the call

    def close(self) -> None:
        pass
