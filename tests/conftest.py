"""Shared fixtures: long-lived rank pools (world sizes 2 and 4), started once per test session.

Multi-rank tests drive these pools instead of starting processes per test, so `make test`
pays the process start once per world size.  A test that breaks a pool (kills a rank) is
fine: the pool restarts itself on its next call.
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile

import pytest

from suite.runtime import RankPool

# The session's own TMPDIR: every temporary entry a test (or the fleetbench code it runs, in this process or a child)
# makes is in it, and at the end none may be a fleetbench-* leftover (pytest_sessionfinish checks; issue 36).  Under
# pytest-xdist (make test's workers) the controller makes it and checks it once every worker has finished; a worker
# works in the controller's, which it inherits as its TMPDIR (a worker's own check could not fail the run: xdist
# takes the exit status from the tests' reports).
XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER")
if XDIST_WORKER:
    SESSION_TMP = os.environ["TMPDIR"]
else:
    SESSION_TMP = tempfile.mkdtemp(prefix="fbtests-")
    os.environ["TMPDIR"] = SESSION_TMP
tempfile.tempdir = SESSION_TMP

_POOLS: dict[int, RankPool] = {}

# Generous bounds: the machine is small and noisy, but nothing may hang.
CALL_TIMEOUT = float(os.environ.get("FLEETBENCH_TEST_CALL_TIMEOUT", "240"))
PG_TIMEOUT = float(os.environ.get("FLEETBENCH_TEST_PG_TIMEOUT", "60"))


def get_pool(world: int) -> RankPool:
    pool = _POOLS.get(world)
    if pool is None:
        pool = _POOLS[world] = RankPool(world, timeout=CALL_TIMEOUT, pg_timeout=PG_TIMEOUT, num_threads=1)
    # started here, not by its first call: a `fleetbench run` driven in-process on a borrowed pool sweeps, at its end,
    # the processes that carry its run token, which ranks it started itself would
    pool.start()
    return pool


@pytest.fixture(scope="session")
def pool2() -> RankPool:
    return get_pool(2)


@pytest.fixture(scope="session")
def pool4() -> RankPool:
    return get_pool(4)


@pytest.fixture(scope="session")
def pools():
    """``pools(world)`` -> the session's pool of that world size."""
    return get_pool


def pytest_sessionfinish(session, exitstatus):
    for pool in _POOLS.values():
        pool.close()
    _POOLS.clear()
    if XDIST_WORKER:  # the controller checks the shared TMPDIR after the last worker (above)
        return
    left = sorted(n for n in os.listdir(SESSION_TMP) if n.startswith("fleetbench-"))
    if left:
        print(f"\nfleetbench-* entries left in the tests' TMPDIR {SESSION_TMP} (the code must remove what it makes): "
              f"{', '.join(left[:20])}", file=sys.stderr)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    if os.environ.get("FLEETBENCH_KEEP_TEST_TMP"):  # a failure's files kept for a look
        print(f"\nthe tests' TMPDIR is kept (FLEETBENCH_KEEP_TEST_TMP): {SESSION_TMP}", file=sys.stderr)
    else:
        shutil.rmtree(SESSION_TMP, ignore_errors=True)


class _NoRanks:
    def __init__(self, *a, **k):
        raise AssertionError("a rank pool was started (despite bad input, or before the point under test)")


@pytest.fixture
def no_ranks(monkeypatch):
    """Starting a rank pool fails the test: what is tested happens before any rank starts."""
    import suite.runtime

    monkeypatch.setattr(suite.runtime, "RankPool", _NoRanks)


@pytest.fixture
def bounded():
    """In-process calls that must not block: a hang becomes a failure after 30 s."""
    from tests.clitools import bounded_by

    with bounded_by(30):
        yield


@pytest.fixture
def fake_rank_pool(monkeypatch):
    """``suite.runtime.RankPool`` replaced by :class:`tests.fakes.FakeRankPool` (synthetic timings, no process)."""
    import suite.runtime
    from tests.fakes import FakeRankPool

    monkeypatch.setattr(suite.runtime, "RankPool", FakeRankPool)
    monkeypatch.setattr(FakeRankPool, "made", [])
    return FakeRankPool


def _sigint_state() -> tuple[bool, bool]:
    """(ignored by this process, blocked in the main thread) for SIGINT, as the kernel has them (/proc: a disposition
    set in C, by a library, shows there too); both are inherited by every process started from here."""
    import signal

    with open("/proc/self/status", encoding="ascii") as fh:
        masks = dict(line.split(":", 1) for line in fh if line.startswith(("SigIgn", "SigBlk")))
    bit = 1 << (signal.SIGINT - 1)
    return bool(int(masks["SigIgn"], 16) & bit), bool(int(masks["SigBlk"], 16) & bit)


@pytest.fixture(autouse=True)
def _sigint_as_found():
    """Every test leaves this process's SIGINT as it found it (its handler, not ignored, not blocked in the main
    thread): a test that left Ctrl-C ignored or blocked would break every later test of its worker that sends one,
    and every command they start (both are inherited).  The state is restored and the test fails naming it."""
    import signal

    handler, state = signal.getsignal(signal.SIGINT), _sigint_state()
    yield
    left = []
    if signal.getsignal(signal.SIGINT) is not handler or _sigint_state()[0] != state[0]:
        left.append(f"the SIGINT handler {signal.getsignal(signal.SIGINT)!r}, ignored {_sigint_state()[0]} (found "
                    f"{handler!r}, ignored {state[0]})")
        signal.signal(signal.SIGINT, handler if handler is not None else signal.default_int_handler)
    if _sigint_state()[1] != state[1]:
        left.append("SIGINT " + ("unblocked" if state[1] else "blocked") + " in the main thread")
        signal.pthread_sigmask(signal.SIG_BLOCK if state[1] else signal.SIG_UNBLOCK, {signal.SIGINT})
    assert not left, "this test left " + " and ".join(left)
