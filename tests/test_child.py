"""The one bounded-child helper (suite/runtime/child.py), which the nightly's stages, the GPU check's phases and
probes, and the doctor's torchrun job all start through: a child at its bound gets its stop signal, then its whole
group is killed (a grandchild too); what it printed is kept; a cancel in the parent stops it the same way and goes
on; an inherited or file stream is the child's own."""
from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from suite.runtime.child import run_child, tail
from tests.clitools import ctrl_c_raises


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_a_child_at_its_bound_is_stopped_with_its_group_and_what_it_printed_is_kept(tmp_path):
    """A shell that prints, starts a grandchild that ignores SIGTERM, and sleeps: at the 2 s bound the shell gets
    SIGTERM, the group SIGKILL after the grace; both pids are gone, the first line is kept."""
    pids = tmp_path / "pids"
    script = (f'echo started; (trap "" TERM; echo $$ > /dev/null; sleep 600) & echo $! > "{pids}"; '
              f'echo $$ >> "{pids}"; exec sleep 600')
    t0 = time.monotonic()
    got = run_child(["/bin/sh", "-c", script], 2.0, grace=1.0)
    assert got.timed_out and got.rc is None and got.stdout.startswith("started")
    assert time.monotonic() - t0 < 30  # bounded (the bound is 2 s and a 1 s grace; generous for a loaded machine)
    for pid in map(int, pids.read_text().split()):
        for _ in range(50):
            if _gone(pid):
                break
            time.sleep(0.1)
        assert _gone(pid), f"pid {pid} outlived its bound"


def test_a_child_that_ends_returns_its_status_and_output_and_leaves_nothing_in_its_group(tmp_path):
    pid_file = tmp_path / "pid"
    got = run_child(["/bin/sh", "-c", f'sleep 600 & echo $! > "{pid_file}"; echo out; echo err >&2; exit 3'], 30)
    assert (got.rc, got.timed_out, got.stdout, got.stderr) == (3, False, "out\n", "err\n") and not got.ok
    pid = int(pid_file.read_text())
    for _ in range(50):
        if _gone(pid):
            break
        time.sleep(0.1)
    assert _gone(pid), "a process the child left in its group outlived it"


def test_a_stream_given_is_the_childs_own_and_a_missing_command_is_exit_127(tmp_path):
    with open(tmp_path / "out.txt", "w") as fh:
        got = run_child(["/bin/sh", "-c", "echo into the file"], 30, stdout=fh)
    assert got.rc == 0 and got.stdout == "" and (tmp_path / "out.txt").read_text() == "into the file\n"
    missing = run_child([str(tmp_path / "no-such-command")], 30)
    assert missing.rc == 127 and "no-such-command" in missing.stderr


def test_a_cancel_in_the_parent_stops_the_child_with_its_stop_signal_then_goes_on(tmp_path):
    """Ctrl-C (KeyboardInterrupt) while waiting: the child gets ``stop`` (the nightly's SIGINT, so it cleans up) and
    the KeyboardInterrupt propagates."""
    seen = tmp_path / "seen"
    script = f'trap "echo INT > {seen}; exit 130" INT; while :; do sleep 0.1; done'
    timer = threading.Timer(1.0, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    try:
        with ctrl_c_raises(), pytest.raises(KeyboardInterrupt):
            run_child(["/bin/sh", "-c", script], 60, stop=signal.SIGINT, grace=5.0)
    finally:
        timer.cancel()
    assert seen.read_text().strip() == "INT"


def test_tail_keeps_the_last_non_empty_lines():
    assert tail("a\n\nb\nc\n", 2) == "b\nc" and tail("", 3) == "" and len(tail("x" * 5000, 1, 100)) == 100
