"""Entering a named network namespace from inside a process (setns(2) via ctypes).

``ip netns add NAME`` bind-mounts the namespace at ``/var/run/netns/NAME``; opening that
file and calling ``setns(fd, CLONE_NEWNET)`` moves the *calling thread* into it.  Threads
and sockets created afterwards by that thread live there; sockets made before stay where
they were made.  So a rank calls :func:`enter_netns` first thing, before any socket (the
process-group store, gloo) exists; multiprocessing's pipes are not network sockets and
keep working.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os

__all__ = ["NETNS_DIR", "CLONE_NEWNET", "enter_netns"]

NETNS_DIR = "/var/run/netns"
CLONE_NEWNET = 0x40000000

_libc = None


def _setns():
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    return _libc.setns


def enter_netns(name: str) -> None:
    """Move the calling thread into the network namespace ``name`` (a name under /var/run/netns)."""
    if not name or "/" in name:
        raise ValueError(f"network namespace name {name!r}: expected a plain name as listed by `ip netns list`")
    path = os.path.join(NETNS_DIR, name)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise RuntimeError(f"network namespace {name!r} does not exist ({path} is missing)") from None
    try:
        if _setns()(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({path}, CLONE_NEWNET) failed: {os.strerror(err)} (needs CAP_SYS_ADMIN)")
    finally:
        os.close(fd)
