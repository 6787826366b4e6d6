"""matplotlib, imported without writing under the user's home: every drawing module takes it from here.

Unless ``MPLCONFIGDIR`` says where, matplotlib keeps its font list in ``~/.cache/matplotlib`` and makes
``~/.config/matplotlib``.  fleetbench draws (reports, figures), so it imports matplotlib with ``MPLCONFIGDIR`` a
private temporary directory of this process (named with its pid and locked while it lives: a killed process's is
removed by the next command, ``suite.runtime.pool.remove_stale``), removed as soon as matplotlib has read it: the
font list is built once per process (a fraction of a second) and kept in memory.  The environment is restored, so
no process started later is pointed there.  A ``MPLCONFIGDIR`` of the user's own is used as given, and a
matplotlib imported before (by the user's code) is left as it is.
"""
from __future__ import annotations

import os
import shutil
import sys

from ..runtime.pool import owned_tempdir

__all__ = ["matplotlib", "plt", "Line2D", "Patch", "NullLocator"]


def _private_config_dir() -> tuple[str, int] | None:
    if os.environ.get("MPLCONFIGDIR") or "matplotlib" in sys.modules:
        return None
    try:
        path, owner = owned_tempdir("fleetbench-mpl-")
    except OSError:  # no room in TMPDIR: matplotlib's own choice, rather than no drawing at all
        return None
    os.environ["MPLCONFIGDIR"] = path
    return path, owner


_PRIVATE = _private_config_dir()
try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    from matplotlib.ticker import NullLocator
finally:
    if _PRIVATE is not None:
        os.environ.pop("MPLCONFIGDIR", None)
        shutil.rmtree(_PRIVATE[0], ignore_errors=True)
        os.close(_PRIVATE[1])
