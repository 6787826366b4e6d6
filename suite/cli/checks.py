"""Checks shared by the sub-commands' arguments: numbers in range, local rank counts, writable paths.

The one error style of the command line: each ``require_*`` raises a :class:`~suite.config.ConfigError`
(``fleetbench CMD: error: ...``, exit 2) naming the option or path, the value and what is allowed, so a command
refuses bad input before any rank starts; it returns nothing when the value is fine.  A value of None is an
option not given: fine (the command chooses it later).  What a run specification's fields accept is checked
by the spec itself (``suite/run_spec.py``), with the option's name in its refusal.
"""
from __future__ import annotations

import math
import os

from ..config import ConfigError
from ..outputs import output_problem
from ..run_spec import MAX_ROUNDS, MAX_STEPS, WEEK

__all__ = ["MAX_STEPS", "MAX_ROUNDS", "WEEK", "require_number", "require_seconds", "require_nproc",
           "require_writable", "oversubscribed", "local_rank_limit", "max_local_ranks", "available_memory"]


def require_number(option: str, value, *, minimum=None, above=None, maximum=None, unit: str = "") -> None:
    """A ConfigError unless ``value`` is a finite number within the bounds (or None: not given), naming the
    option, the value and what is allowed (``minimum``/``maximum`` inclusive, ``above`` exclusive)."""
    if (problem := _number_problem(option, value, minimum=minimum, above=above, maximum=maximum, unit=unit)):
        raise ConfigError(problem)


def _number_problem(option: str, value, *, minimum=None, above=None, maximum=None, unit: str = "") -> str | None:
    if value is None:
        return None
    shown = f"{value:g}" if isinstance(value, float) else str(value)
    kind = "a whole number" if isinstance(value, int) else "a finite number"
    parts = []
    if minimum is not None:
        parts.append(f">= {minimum:g}" if isinstance(minimum, float) else f">= {minimum}")
    if above is not None:
        parts.append(f"> {above:g}" if isinstance(above, float) else f"> {above}")
    if maximum is not None:
        parts.append(f"<= {maximum:g}" if isinstance(maximum, float) else f"<= {maximum}")
    allowed = f"must be {kind}" + (" " + " and ".join(parts) if parts else "") + (f" ({unit})" if unit else "")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return f"{option} {shown}: {allowed}"
    if (minimum is not None and value < minimum) or (above is not None and value <= above) or \
            (maximum is not None and value > maximum):
        return f"{option} {shown}: {allowed}"
    return None


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


def require_seconds(option: str, value, maximum: float | None = WEEK, unit: str = "seconds") -> None:
    """:func:`require_number` for a wait in seconds: > 0, and at most ``maximum`` (default a week)."""
    require_number(option, value, above=0.0, maximum=maximum, unit=unit)


def require_nproc(value, device: str | None = "cpu", option: str = "--nproc") -> None:
    """A ConfigError unless ``value`` local ranks (None: not given) fit this machine, saying what does and why."""
    if value is None:
        return
    require_number(option, value, minimum=1)
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
