"""Checks shared by the sub-commands' arguments: numbers in range, local rank counts, writable paths.

Each returns one line naming the option or path, the value and what is allowed (None when fine), so a
command can refuse bad input before any rank starts.  A value of None is an option not given: fine (the
command chooses it later).
"""
from __future__ import annotations

import math
import os
import stat

# Bounds on the timing options: steps in a timed window, timed rounds, and a wait in seconds (a week: a timedelta
# of 1e300 s overflows in the ranks).
MAX_STEPS, MAX_ROUNDS, WEEK = 10**6, 10**5, 7 * 86400


def check_number(option: str, value, *, minimum=None, above=None, maximum=None, unit: str = "") -> str | None:
    """None when ``value`` is a finite number within the bounds (or None: not given), else one line naming the
    option, the value and what is allowed (``minimum``/``maximum`` inclusive, ``above`` exclusive)."""
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


def max_local_ranks(device: str | None = "cpu") -> int:
    """Ranks are processes on this machine: at most 32 or one per CPU, whichever is more, and no more
    than the available memory holds (:data:`RANK_MEMORY` each); on CUDA, one per GPU."""
    if device == "cuda":
        import torch

        return max(1, torch.cuda.device_count())
    cap = max(32, os.cpu_count() or 1)
    avail = available_memory()
    return cap if avail is None else min(cap, max(1, avail // RANK_MEMORY))


def check_seconds(option: str, value, maximum: float | None = WEEK, unit: str = "seconds") -> str | None:
    """:func:`check_number` for a wait in seconds: > 0, and at most ``maximum`` (default a week)."""
    return check_number(option, value, above=0.0, maximum=maximum, unit=unit)


def check_nproc(value, device: str | None = "cpu", option: str = "--nproc") -> str | None:
    """None when ``value`` local ranks fit this machine, else one line saying what does."""
    return check_number(option, value, minimum=1, maximum=max_local_ranks(device),
                        unit="local ranks this machine holds: its CPUs (32 at least), its memory "
                             f"({RANK_MEMORY // 2**20} MiB a rank){', its GPUs' if device == 'cuda' else ''}")


def unwritable(path: str):
    """Why ``path`` cannot be written as a file (None when it can, as far as can be told beforehand)."""
    if os.path.isdir(path):
        return "is a directory; give a file name"
    if os.path.islink(path):
        return "is a symbolic link; give the file itself"
    if os.path.exists(path) and not stat.S_ISREG(os.stat(path).st_mode):
        return "is not a regular file (a FIFO, device or socket)"
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        return f"the directory {parent} does not exist"
    if not os.access(parent, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        return "not writable"
    return None
