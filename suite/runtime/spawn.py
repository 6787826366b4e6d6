"""Spawned processes that never put the current directory first on ``sys.path``.

``multiprocessing``'s spawn starts a child as ``python -c 'from multiprocessing.spawn import spawn_main; …'``:
``-c`` puts the current directory first on the child's path, so a ``multiprocessing.py`` (or ``torch.py``, …)
in the directory a user runs fleetbench from would run in every rank, in a user factory's child and in the
resource tracker, before any of fleetbench's code.  Every process fleetbench spawns goes through
:func:`spawn_context` and starts inside :func:`safe_start`:

- the child runs with ``PYTHONSAFEPATH=1`` (Python 3.11+: ``-c``, ``-m`` and scripts prepend nothing), which its
  own children inherit;
- the path the child takes over from its parent (multiprocessing sends ``sys.path`` along) has the current
  directory moved to the end, where a module of the user's (a ``--model`` factory) is still found, after the
  standard library and the installed packages; an entry that PYTHONPATH names stays where it is (the user
  named it).
"""
from __future__ import annotations

import contextlib
import multiprocessing as mp
import multiprocessing.spawn as _mp_spawn
import os
import threading
from collections.abc import Iterator

__all__ = ["spawn_context", "safe_start", "child_sys_path", "SAFE_ENV"]

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
    set in this process's environment for the block only (children inherit the environment at their start)."""
    with _LOCK:
        saved = {k: os.environ.get(k) for k in SAFE_ENV}
        os.environ.update(SAFE_ENV)
        try:
            yield
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
