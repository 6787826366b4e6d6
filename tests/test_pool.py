"""The rank pool's processes and files: its ranks (and their children) die with the parent however it dies and
wherever they are (inside a call, in the rendezvous), a local pool listens on loopback only and keeps its store
private, an interrupted start leaves nothing, and dead runs' temporary directories are swept by the next command.
"""
from __future__ import annotations

import json
import os
import selectors
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.clitools import alive as _alive
from tests.clitools import cli as _cli
from tests.clitools import gone_within, tagged

ROOT = Path(__file__).resolve().parent.parent


# ---- ranks die with their parent -----------------------------------------------------------------------------------
PARENT_SCRIPT = ROOT / "tests" / "scripts" / "pool_parent.py"


def _start_parent(*flags: str) -> tuple[subprocess.Popen, dict]:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen([sys.executable, str(PARENT_SCRIPT), *flags], stdout=subprocess.PIPE, text=True,
                            cwd=str(ROOT), env=env)
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if sel.select(timeout=1.0):
            line = proc.stdout.readline()
            if line.startswith("{"):
                return proc, json.loads(line)
            if not line:
                break
        if proc.poll() is not None:
            break
    proc.kill()
    proc.wait()
    pytest.fail(f"the parent script did not report its ranks (exit code {proc.returncode})")


def _kill_parent_and_watch(sig: int, *flags: str) -> dict:
    proc, info = _start_parent(*flags)
    watched = info["ranks"] + info["grandchildren"]
    try:
        assert len(info["ranks"]) == 2 and all(_alive(p) for p in watched), info
        time.sleep(1.5)  # the ranks are inside the long call now, not waiting between calls
        assert all(_alive(p) for p in watched), "a rank died before its parent"
        os.kill(info["parent"], sig)
        proc.wait(timeout=30)  # the parent is dead (and reaped) from here on
        survivors = gone_within(watched, 2.0)
        assert not survivors, (f"processes of the run still alive 2 s after the parent died "
                               f"({signal.Signals(sig).name}): {survivors} of ranks {info['ranks']}, "
                               f"their children {info['grandchildren']}")
        if info["store"]:
            deadline = time.monotonic() + 2.0
            while os.path.exists(os.path.dirname(info["store"])) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert not os.path.exists(os.path.dirname(info["store"])), "the store directory was left behind"
        return info
    finally:
        for p in [info["parent"]] + watched + ([info["forked"]] if info.get("forked") else []):
            if _alive(p):
                try:
                    os.kill(p, signal.SIGKILL)
                except OSError:
                    pass
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if info["store"]:  # when the ranks were killed here (the test failed), their store is still there
            shutil.rmtree(os.path.dirname(info["store"]), ignore_errors=True)


def test_ranks_and_their_children_die_within_2s_of_a_killed_parent():
    """The one kill-the-parent scenario of make test: a parent that started its pool from a short-lived thread and
    forked a child of its own (no exec), its ranks each with a child, killed -9 while the ranks are inside a call:
    the ranks and their children go within 2 s, the store with them; the forked child (holding copies of the
    parent's descriptors) lives on and does not keep them alive; the pool had outlived its starting thread.  The
    tests below take each of these alone, and a SIGTERM instead of a SIGKILL (the ranks see the same death: the
    parent sets no handler), in make test-slow."""
    info = _kill_parent_and_watch(signal.SIGKILL, "--grandchild", "--fork", "--thread")
    assert len(info["grandchildren"]) == 2, info
    assert info["forked"] and _alive(info["forked"]), "the forked child should still be running"
    assert info["after_thread"] == {"alive": True, "allreduce": [1.0, 1.0]}, info


@pytest.mark.heavy  # one more parent and its pool (about 7 s); the same death as SIGKILL's, above: make test-slow
def test_ranks_die_within_2s_of_a_terminated_parent():
    _kill_parent_and_watch(signal.SIGTERM)


@pytest.mark.heavy  # one more parent and its pool (about 7 s); asserted in the scenario above too: make test-slow
def test_a_forked_child_of_the_parent_does_not_keep_the_ranks_alive():
    info = _kill_parent_and_watch(signal.SIGKILL, "--fork")
    assert info["forked"] and _alive(info["forked"]), "the forked child should still be running"


@pytest.mark.heavy  # one more parent and its pool (about 8 s); asserted in the scenario above too: make test-slow
def test_pool_started_from_a_thread_outlives_the_thread_but_not_the_process():
    info = _kill_parent_and_watch(signal.SIGKILL, "--thread")
    # The starting thread had ended before this: the same ranks were alive and answered a collective.
    assert info["after_thread"] == {"alive": True, "allreduce": [1.0, 1.0]}, info


def _kill_in_rendezvous(tmp_path: Path, *flags: str) -> tuple[list[int], dict]:
    """Start the rendezvous parent, wait until both ranks are inside their store (blocked in C, holding the
    GIL), SIGKILL the parent; the ranks still alive 3 s later, and the parent's report."""
    import subprocess
    import sys
    import time

    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "scripts" / "rendezvous_parent.py"), *flags],
                            stdout=subprocess.PIPE, text=True, env=env, cwd=str(ROOT))
    info: dict = {}
    try:
        info = json.loads(proc.stdout.readline())  # type: ignore[union-attr]
        deadline = time.monotonic() + 300
        inside = [f"{info['store']}.{r}" for r in range(2)]
        while not all(map(os.path.exists, inside)) and time.monotonic() < deadline:  # a condition, not a timing
            time.sleep(0.1)
        assert all(map(os.path.exists, inside)), "the ranks never reached their store"
        time.sleep(0.5)
        assert all(_alive(p) for p in info["ranks"]), "a rank died before its parent"
        os.kill(info["parent"], signal.SIGKILL)
        proc.wait(timeout=30)
        deadline = time.monotonic() + 3.0
        while any(_alive(p) for p in info["ranks"]) and time.monotonic() < deadline:
            time.sleep(0.05)
        return [p for p in info["ranks"] if _alive(p)], info
    finally:
        for p in info.get("ranks", []):
            if _alive(p):
                os.kill(p, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_ranks_killed_in_the_rendezvous_die_with_their_parent_and_the_next_pool_removes_the_store(tmp_path,
                                                                                                  monkeypatch):
    import tempfile

    from suite.runtime.pool import owned_tempdir, remove_stale

    survivors, info = _kill_in_rendezvous(tmp_path)
    assert not survivors, f"ranks {survivors} outlived their parent by 3 s while in the rendezvous"
    # the parent's lock died with it: the next pool's sweep removes its store directory, not a live one's
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    live, fd = owned_tempdir("fleetbench-store-")
    store = os.path.dirname(info["store"])
    try:
        # a rank's watching thread may have removed it already (it races the kernel's SIGKILL); else the sweep does
        assert set(remove_stale()) <= {store} and not os.path.exists(store)
        assert os.path.isdir(live) and sorted(os.listdir(tmp_path)) == [os.path.basename(live)]
    finally:
        os.close(fd)
    assert remove_stale() == [live] and os.listdir(tmp_path) == []


# ---- no listener beyond loopback, a private store ------------------------------------------------------------------
def _listening_sockets() -> dict[int, str]:
    """inode -> "address:port" of every listening TCP socket (IPv4 and IPv6) in this network namespace."""
    import ipaddress

    out = {}
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(name).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            local, state, inode = f[1], f[3], int(f[9])
            if state != "0A":  # TCP_LISTEN
                continue
            hexaddr, hexport = local.split(":")
            raw = bytes.fromhex(hexaddr)
            # /proc writes the address as 32-bit words in host (little-endian) order
            raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
            addr = ipaddress.ip_address(raw)
            out[inode] = (addr, int(hexport, 16))
    return out


def _socket_inodes(pid: int) -> set[int]:
    inodes = set()
    fd_dir = f"/proc/{pid}/fd"
    for fd in os.listdir(fd_dir):
        try:
            target = os.readlink(os.path.join(fd_dir, fd))
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def _off_host_listeners(pids) -> list[str]:
    listening = _listening_sockets()
    bad = []
    for pid in pids:
        for inode in _socket_inodes(pid) & set(listening):
            addr, port = listening[inode]
            mapped = getattr(addr, "ipv4_mapped", None)
            if not (addr.is_loopback or (mapped is not None and mapped.is_loopback)):
                bad.append(f"pid {pid} listens on [{addr}]:{port}")
    return bad


def test_a_local_pool_binds_gloo_to_loopback_whatever_the_environment_says(monkeypatch):
    from suite.runtime import RankPool
    from suite.runtime.probes import allreduce_rank_sum

    others = [n for _, n in socket.if_nameindex() if n != "lo" and _ipv4_of(n)]
    if not others:
        pytest.skip("this machine has no network interface with an address besides loopback")
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", others[0])  # e.g. left over from a multi-node set-up
    pool = RankPool(2, num_threads=1, timeout=120)
    try:
        assert pool.run(allreduce_rank_sum) == [1.0, 1.0]
        assert not _off_host_listeners(pool.pids), _off_host_listeners(pool.pids)
    finally:
        pool.close()


def _ipv4_of(ifname: str):
    import fcntl
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:  # SIOCGIFADDR
            return fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", ifname.encode()[:15]))[20:24]
        except OSError:
            return None


def test_a_local_pool_listens_on_no_address_beyond_loopback_and_keeps_its_store_private():
    from suite.runtime import RankFailure, RankPool
    from suite.runtime.probes import allreduce_rank_sum, crash

    pool = RankPool(2, num_threads=1, timeout=120)
    try:
        assert pool.run(allreduce_rank_sum) == [1.0, 1.0]  # the ranks are connected (gloo's listeners exist)
        pids = [os.getpid()] + pool.pids
        assert not _off_host_listeners(pids), _off_host_listeners(pids)
        assert any(_socket_inodes(p) & set(_listening_sockets()) for p in pool.pids), \
            "found no gloo listener at all: the check looks at the wrong sockets"
        # The rendezvous file: in a private directory, gone when the pool is torn down, fresh on restart.
        first = getattr(pool, "store_path", None)
        assert first and stat.S_IMODE(os.stat(os.path.dirname(first)).st_mode) == 0o700
        with pytest.raises(RankFailure):
            pool.run(crash, {"rank": 1}, timeout=60)
        assert not os.path.exists(os.path.dirname(first)), "the store survived the teardown after a crash"
        assert pool.run(allreduce_rank_sum) == [1.0, 1.0]
        second = pool.store_path
        assert second and second != first and os.path.exists(second)
    finally:
        pool.close()
    assert not os.path.exists(os.path.dirname(second)), "the store survived close()"


def test_an_interrupted_start_leaves_no_rank_and_no_store(monkeypatch):
    from suite.runtime import RankPool

    pool = RankPool(2, num_threads=1, timeout=120)
    seen = {}

    def interrupted(*a, **k):  # Ctrl-C while the ranks join the process group
        seen.update(pids=[p.pid for p in pool._procs], store=getattr(pool, "store_path", None))
        raise KeyboardInterrupt

    monkeypatch.setattr(pool, "_collect", interrupted)
    try:
        with pytest.raises(KeyboardInterrupt):
            pool.start()
        assert seen["pids"] and not [p for p in seen["pids"] if _alive(p)], seen
        assert seen["store"] and not os.path.exists(os.path.dirname(seen["store"])), seen
    finally:
        pool.close()


# ---- temporary directories -----------------------------------------------------------------------------------------
def test_a_command_sweeps_dead_runs_temp_directories_first(tmp_path, monkeypatch, capsys, no_ranks):
    """A run killed -9 leaves its store; the next command that starts processes removes it (its owner's lock is
    free), and leaves a live owner's alone."""
    import tempfile

    from suite.runtime.pool import OWNER_FILE, owned_tempdir

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = tmp_path / "fleetbench-store-4242-dead"
    dead.mkdir()
    (dead / OWNER_FILE).write_text("")  # nobody holds its lock
    (dead / "store").write_text("x")
    live, fd = owned_tempdir("fleetbench-store-")
    try:
        code, out, err = _cli(["run", "--case", "mlp/plain", "--size", "tiny", "--list"], capsys)
        assert code == 0, err
        assert not dead.exists() and os.path.isdir(live)
        assert os.path.basename(live).startswith(f"fleetbench-store-{os.getpid()}-")  # named per run
    finally:
        os.close(fd)
        import shutil

        shutil.rmtree(live, ignore_errors=True)


@pytest.mark.statistical  # a real run's ranks: make test-slow
@pytest.mark.timeout(600)
def test_sigterm_during_a_run_removes_its_temp_directories_and_keeps_its_records(tmp_path):
    import time

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp)}
    proc = subprocess.Popen([sys.executable, "-m", "suite.cli.main", "run", "--case", "mlp/plain", "--size", "tiny",
                             "--nproc", "2", "--steps", "100000", "--rounds", "3", "--no-check", "--no-utilization",
                             "--results", str(tmp_path / "runs.jsonl")], env=env, cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not list(tmp.glob("fleetbench-store-*/store")):
            time.sleep(0.1)
        assert list(tmp.glob("fleetbench-store-*/store")), "the ranks never started"
        time.sleep(3.0)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        deadline = time.monotonic() + 5
        while os.listdir(tmp) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert proc.returncode == 130 and "interrupted" in err, err[-2000:]
        assert os.listdir(tmp) == [], os.listdir(tmp)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# ---- kills at any moment (make test-slow) --------------------------------------------------------------------------
SWEEP = ["run", "--case", "mlp/plain", "--case", "mlp/overlap", "--size", "tiny", "--device", "cpu", "--nproc", "2",
         "--steps", "2", "--rounds", "2", "--warmup", "1", "--check-steps", "2", "--no-utilization",
         "--trace-steps", "1"]


# (phase, the marker after which the run is in it): the last marker printed tells the phase at a kill
MARKERS = [("rendezvous", "fleetbench run "), ("check", " check "), ("timing", "timing "), ("write", "samples/s")]


def _run_and_kill(tmp: Path, token: str, at: float | None, trigger: str | None) -> tuple[str, list[int]]:
    """Start a run, SIGKILL its parent ``at`` seconds in (or as soon as ``trigger`` shows: the marker of a
    phase, or "store" for a store a rank wrote to); the phase it was in and what lived on 3 s later."""
    import subprocess
    import sys
    import threading
    import time

    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp / "tmp"), "FLEETBENCH_SWEEP": token,
           "TORCHINDUCTOR_CACHE_DIR": str(tmp / "inductor"), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "suite.cli.main", *SWEEP, "--results", str(tmp / "runs.jsonl")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=str(tmp))
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True).start()  # type: ignore

    def phase() -> str:
        seen = [name for name, marker in MARKERS if any(marker in ln for ln in lines)]
        return seen[-1] if seen else "import"

    def stored() -> bool:
        stores = list((tmp / "tmp").glob("fleetbench-store-*/store"))
        return any(s.exists() and s.stat().st_size > 0 for s in stores)

    t0 = time.monotonic()
    while proc.poll() is None and time.monotonic() - t0 < 600:
        if (at is not None and time.monotonic() - t0 >= at) or (trigger == "store" and stored()) or \
                (trigger is not None and trigger != "store" and any(trigger in ln for ln in lines)):
            break
        time.sleep(0.02)
    killed = proc.poll() is None
    where = ("rendezvous" if trigger == "store" else phase()) if killed else "finished"
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 3.0
    while tagged(token) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = tagged(token)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return where, left


@pytest.mark.statistical
@pytest.mark.timeout(3600)
def test_kill_9_of_the_parent_at_any_moment_leaves_no_process_and_no_temp_entry(tmp_path):
    from suite.runtime.pool import remove_stale

    (tmp_path / "tmp").mkdir()
    plan = [(i * 0.5, None) for i in range(1, 21)]  # every 0.5 s of the first 10 s
    plan += [(None, "store")] + [(None, marker) for _, marker in MARKERS[1:]]  # each phase surely hit once
    hits: dict = {}
    problems = []
    for n, (at, trigger) in enumerate(plan):
        where, left = _run_and_kill(tmp_path, f"fleetbench-sweep-{os.getpid()}-{n}", at, trigger)
        hits[where] = hits.get(where, 0) + 1
        if left:
            problems.append(f"killed at {at} s / on {trigger!r} ({where}): processes {left} alive 3 s later")
    remove_stale(tmp=str(tmp_path / "tmp"))  # what the next run does first: leftovers of dead owners go
    left_in_tmp = sorted(os.listdir(tmp_path / "tmp"))
    assert not problems, "\n".join(problems)
    assert {"import", "rendezvous", "check", "timing", "write"} <= set(hits), hits
    assert left_in_tmp == [], left_in_tmp
