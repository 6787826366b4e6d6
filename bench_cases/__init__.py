"""fleetbench's benchmark matrix for pytest-benchmark (``test_*.py``) and asv (``asv_cases.py``).

Both read the one case registry (``suite.cases``).  asv imports every module of this
package when it discovers benchmarks (and again in each process that runs one); pytest
collects only ``test_*.py`` (``asv_cases.py`` is not a test module).  What importing does:
this file puts the checkout first on ``sys.path`` (below); ``asv_cases.py`` reads the
FLEETBENCH_BENCH_* variables and resolves the selection (asv needs the parameters when it
discovers), which imports torch and, with no device given, asks it for a GPU.  Nothing is
started (no rank, no process group) and nothing is written; ranks start on the first timed
call.  A variable it cannot use stops the import with one error naming it.
"""

import os as _os
import sys as _sys

# The benchmarks measure the checkout they live in, not some other installed fleetbench:
# asv runs them with PYTHONPATH discarded (ASV_PYTHONPATH aside), so put this repo first.
_ROOT = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if _sys.path[:1] != [_ROOT]:
    _sys.path.insert(0, _ROOT)
