"""fleetbench's benchmark matrix for pytest-benchmark (``test_*.py``) and asv (``asv_cases.py``).

Both read the one case registry (``suite.cases``).  asv imports every module of this
package when it discovers benchmarks, so nothing here may have import-time side effects;
pytest collects only ``test_*.py`` (``asv_cases.py`` is not a test module).
"""

import os as _os
import sys as _sys

# The benchmarks measure the checkout they live in, not some other installed fleetbench:
# asv runs them with PYTHONPATH discarded (ASV_PYTHONPATH aside), so put this repo first.
_ROOT = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if _sys.path[:1] != [_ROOT]:
    _sys.path.insert(0, _ROOT)
