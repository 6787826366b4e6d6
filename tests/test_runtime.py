"""The rank pool: results in rank order, errors with tracebacks, and no hang when a rank dies or sticks."""
from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from suite.check.harness import check_on_rank
from suite.runtime import RankError, RankFailure, RankPool
from suite.runtime.probes import allreduce_rank_sum, sleep_then_allreduce, whoami
from suite.workload import WorkloadSpec
from tests.clitools import interruptible


def test_pool_runs_on_every_rank(pool2):
    out = pool2.run(whoami)
    assert [o["rank"] for o in out] == [0, 1]
    assert {o["world_size"] for o in out} == {2}
    assert pool2.run(allreduce_rank_sum) == [1.0, 1.0]


def test_exception_on_one_rank_is_reported_with_its_traceback(pool2):
    with pytest.raises((RankError, RankFailure)) as info:
        pool2.run(check_on_rank, {"workload_spec": WorkloadSpec("no-such-model"), "config": {}})
    assert "no-such-model" in str(info.value)
    assert pool2.run(allreduce_rank_sum) == [1.0, 1.0]


def test_rank_killed_inside_a_collective_is_reported_and_the_pool_recovers(pool2):
    pool2.start()
    victim = pool2.pids[1]
    restarts = pool2.restarts
    # Rank 0 enters the allreduce at once; rank 1 sleeps first and is killed while rank 0 waits in it.
    threading.Timer(1.0, lambda: os.kill(victim, signal.SIGKILL)).start()
    t0 = time.monotonic()
    with pytest.raises(RankFailure) as info:
        pool2.run(sleep_then_allreduce, {"seconds": 60, "sleeper": 1}, timeout=45)
    elapsed = time.monotonic() - t0
    assert info.value.ranks == [1], str(info.value)
    assert "died" in str(info.value) and "sleep_then_allreduce" in str(info.value)
    assert elapsed < 45, f"the failure took {elapsed:.1f}s, past the call's bound"
    # The pool restarts on the next call and runs another case.
    assert pool2.run(allreduce_rank_sum) == [1.0, 1.0]
    assert pool2.restarts == restarts + 1
    assert victim not in pool2.pids


def test_a_stuck_rank_is_reported_within_the_timeout(pool2):
    t0 = time.monotonic()
    with pytest.raises(RankFailure) as info:
        pool2.run(sleep_then_allreduce, {"seconds": 60, "sleeper": 0}, timeout=3)
    assert "did not answer within 3 s" in str(info.value)
    assert time.monotonic() - t0 < 30
    assert pool2.run(allreduce_rank_sum) == [1.0, 1.0]


def test_pool_rejects_a_bad_size():
    with pytest.raises(ValueError, match="nproc=0"):
        RankPool(0)


def test_two_pools_side_by_side_do_not_collide(pool2):
    other = RankPool(2, num_threads=1, timeout=120)
    try:
        assert other.run(allreduce_rank_sum) == [1.0, 1.0]
        assert pool2.run(allreduce_rank_sum) == [1.0, 1.0]
    finally:
        other.close()


def communicators_on_rank() -> dict:
    """comm_groups asked for 3, then 2, then 1 communicators: how many were made, and whether the smaller asks got
    the first of the same ones."""
    from suite.runtime import groups

    groups.reset()
    three, two, one = groups.comm_groups(3), groups.comm_groups(2), groups.comm_groups(1)
    made = {id(g) for g in three + two + one}
    labels = [groups.label_of(g) for g in three]
    import torch
    import torch.distributed as dist

    t = torch.ones(4)
    dist.all_reduce(t, group=two[1])  # a shared communicator still reduces over every rank
    groups.reset()
    return {"made": len(made), "same": two == three[:2] and one == three[:1], "labels": labels, "sum": float(t[0])}


def test_engines_of_fewer_communicators_reuse_the_first_ones(pool2):
    """At world 8 each rank held 10 to 19 communicators, one set per nccl_comm_num asked (issue 43.8): now 1, 2 and 3
    communicators are the first 1, 2 and 3 of one list, 3 groups in all, labelled comm0..comm2."""
    for r in pool2.run(communicators_on_rank):
        assert r == {"made": 3, "same": True, "labels": ["comm0", "comm1", "comm2"], "sum": 2.0}, r


def _blocked_signals(conn) -> None:
    import signal as _signal

    conn.send(sorted(int(s) for s in _signal.pthread_sigmask(_signal.SIG_BLOCK, [])))


def test_children_start_with_sigint_blocked_and_the_parent_keeps_its_own_mask():
    """A terminal's Ctrl-C reaches every process of the foreground group: a rank or factory child interrupted while
    its interpreter started printed a fatal error and a traceback each (issue 46.6).  Children started in
    safe_start inherit a blocked SIGINT; the starting thread's mask is as it was after."""
    from suite.runtime.spawn import safe_start, spawn_context

    before = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    ctx = spawn_context()
    recv, send = ctx.Pipe(duplex=False)
    with safe_start():
        proc = ctx.Process(target=_blocked_signals, args=(send,), daemon=True)
        proc.start()
    send.close()
    try:
        assert recv.poll(120), "the child did not answer"
        assert int(signal.SIGINT) in recv.recv()
    finally:
        proc.join(30)
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == before


def test_ctrl_c_while_a_command_imports_is_one_line_and_exit_130(tmp_path):
    """SIGINT to the command's process group while `fleetbench run` imports its modules (torch: seconds): one line,
    exit 130, no traceback (issue 46.6; make test-slow sends it at several later moments too)."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "suite.cli.main", "run", "--case", "mlp/plain", "--nproc", "2",
                             "--results", str(tmp_path / "r.jsonl")], cwd=os.path.dirname(os.path.dirname(
                                 os.path.abspath(__file__))), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, preexec_fn=interruptible)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # torch's libraries mapped: the command is importing its modules
        try:
            if "libtorch" in open(f"/proc/{proc.pid}/maps").read():
                break
        except OSError:
            pass
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, (out, err)
    assert err.strip().splitlines() == ["fleetbench run: interrupted"] or (
        len(err.strip().splitlines()) == 1 and err.startswith("fleetbench run: interrupted")), err


@pytest.mark.heavy  # several runs interrupted at later moments: about a minute on 2 cores
@pytest.mark.parametrize("after", [2.0, 4.0, 6.0, 9.0, 14.0])
def test_ctrl_c_at_any_moment_of_a_run_with_a_users_model_is_one_line(tmp_path, after):
    """SIGINT to the whole process group (what a terminal's Ctrl-C does) while the factory's child, the ranks, the
    check or the timing run: one line on stderr, exit 130, nothing left running (issue 46.6: about 90 lines of
    tracebacks from the children before)."""
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root)
    proc = subprocess.Popen([sys.executable, "-m", "suite.cli.main", "run", "--model", "my_models:make_spec",
                             "--nproc", "2", "--rounds", "40", "--results", str(tmp_path / "r.jsonl")],
                            cwd=os.path.join(root, "tests", "scripts"), env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True, preexec_fn=interruptible)
    time.sleep(after)
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 130, (proc.returncode, out[-2000:], err[-3000:])
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fleetbench run: interrupted"), err[-3000:]
    assert _group_gone_within(proc.pid, 10.0), _group_members(proc.pid)  # nothing of its group left


def _group_members(pgid: int) -> list[str]:
    """The live processes of process group ``pgid`` (pid and command line), read from /proc."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                with open(f"/proc/{pid}/cmdline", "rb") as fh:
                    cmd = fh.read().replace(b"\0", b" ").decode(errors="replace")
                out.append(f"{pid} {cmd[:200]}")
        except (OSError, IndexError, ValueError):
            continue
    return out


def _group_gone_within(pgid: int, seconds: float) -> bool:
    """Whether every process of group ``pgid`` has ended within ``seconds`` (ranks end on their parent-death signal,
    a moment after the parent: a bounded wait, not a timing)."""
    deadline = time.monotonic() + seconds
    while _group_members(pgid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True
