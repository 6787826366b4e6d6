"""Fixtures of the experiments' tests (``python -m pytest experiments/tests -p no:cacheprovider`` from the
repository root; `make test` does not collect them): one rank pool of 2, and ``no_ranks``."""
from __future__ import annotations

import pytest

from suite.runtime import RankPool

_POOLS: dict[int, RankPool] = {}


@pytest.fixture(scope="session")
def pool2() -> RankPool:
    if 2 not in _POOLS:
        _POOLS[2] = RankPool(2, timeout=240.0, pg_timeout=60.0, num_threads=1)
    return _POOLS[2]


def pytest_sessionfinish(session, exitstatus):
    for pool in _POOLS.values():
        pool.close()
    _POOLS.clear()


class _NoRanks:
    def __init__(self, *a, **k):
        raise AssertionError("a rank pool was started (despite bad input, or before the point under test)")


@pytest.fixture
def no_ranks(monkeypatch):
    """Starting a rank pool fails the test: what is tested happens before any rank starts."""
    import suite.runtime

    monkeypatch.setattr(suite.runtime, "RankPool", _NoRanks)
