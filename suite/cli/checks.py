"""Checks shared by the sub-commands' arguments that no field's metadata can state: local rank counts (what this
machine runs), writable paths.

The one error style of the command line: each ``require_*`` raises a :class:`~suite.config.ConfigError`
(``fleetbench CMD: error: ...``, exit 2) naming the option or path, the value and what is allowed, so a command
refuses bad input before any rank starts; it returns nothing when the value is fine.  A value of None is an
option not given: fine (the command chooses it later).  Numbers in range are no check of their own: each bound is
its field's metadata (``suite/validate.py``'s ``spec``: the run specification's fields, ``suite/run_spec.py``,
and each command's own options, ``suite/cli/options.py``'s ``from_args``), said as ``--steps 0: must be ...``.
"""
from __future__ import annotations

import os

from ..config import ConfigError
from ..outputs import output_problem
from ..run_spec import MAX_ROUNDS, MAX_STEPS, WEEK

__all__ = ["MAX_STEPS", "MAX_ROUNDS", "WEEK", "require_nproc", "require_writable", "oversubscribed",
           "local_rank_limit", "max_local_ranks", "available_memory"]


RANK_MEMORY = 300 * 2**20  # what one CPU rank holds at least (torch imported, a small model)


def available_memory() -> int | None:
    """Bytes of memory available for new allocations (MemAvailable), or None when unknown."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return None


def local_rank_limit(device: str | None = "cpu") -> tuple[int, str]:
    """The most ranks this machine runs, and why, in words: on the CPU at most 32 or one per CPU, whichever is
    more, and no more than the available memory holds (:data:`RANK_MEMORY` each); on CUDA, one per GPU."""
    if device == "cuda":
        import torch

        gpus = torch.cuda.device_count()
        return max(1, gpus), f"one per GPU; torch sees {gpus} GPU(s)"
    cpus = os.cpu_count() or 1
    cap = max(32, cpus)
    why = f"fleetbench's cap is max(32, CPUs) = {cap}, this machine has {cpus} CPU(s)"
    avail = available_memory()
    if avail is None:
        return cap, why + "; its available memory is unknown"
    fit = max(1, avail // RANK_MEMORY)
    return min(cap, fit), why + f"; its available memory holds {fit} at {RANK_MEMORY // 2**20} MiB a rank"


def max_local_ranks(device: str | None = "cpu") -> int:
    """The most ranks this machine runs (:func:`local_rank_limit`)."""
    return local_rank_limit(device)[0]


def require_nproc(value, device: str | None = "cpu", option: str = "--nproc") -> None:
    """A ConfigError unless ``value`` local ranks (None: not given) fit this machine, saying what does and why."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{option} {value}: must be a whole number >= 1")
    limit, why = local_rank_limit(device)
    if value > limit:
        raise ConfigError(f"{option} {value}: at most {limit} local ranks on this machine ({why})")


def oversubscribed(nproc: int, device: str | None = "cpu") -> str | None:
    """A warning when ``nproc`` CPU ranks outnumber this machine's CPUs (allowed, but slower and noisier)."""
    cpus = os.cpu_count() or 1
    if device == "cuda" or nproc <= cpus:
        return None
    return f"{nproc} ranks on {cpus} CPU(s): ranks share cores, steps are slower and timings noisier"


def require_writable(option: str, path: str | None) -> None:
    """A ConfigError when ``path`` (None: not given) cannot be written as a file, as far as can be told beforehand
    (:func:`suite.outputs.output_problem`, the writer's own rule): ``--out 'x': why``."""
    if path and (why := output_problem(path)):
        raise ConfigError(f"{option} {path!r}: {why}")
