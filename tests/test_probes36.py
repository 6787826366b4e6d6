"""Issue 36's probes that had no test of their own (docs/benchmarks.md, "Issue 36's probes and their tests", maps
every probe to its test): a taken ``MASTER_PORT``, a killed ``doctor`` while its torchrun job runs, a killed trial
server, a revision's or a ``build()``'s daemon, an ``ab`` killed -9 with its two worktrees, commit subjects on the
terminal.
"""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.clitools import alive as _alive
from tests.clitools import cli as _cli
from tests.clitools import nested_pytest_env
from tests.clitools import one_error as _one_error

ROOT = Path(__file__).resolve().parent.parent
HOSTILE = "evil\x1b[31mred\x1b[0m\u202eright\x07"


def _gone_within(pids, seconds: float) -> list[int]:
    """The pids still alive after waiting up to ``seconds`` for them to end (a bounded wait, not a timing)."""
    deadline = time.monotonic() + seconds
    while any(map(_alive, pids)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [p for p in pids if _alive(p)]


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _has_socket(pid: int) -> bool:
    try:
        return any(os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:") for fd in os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return False


@contextlib.contextmanager
def _taken_port():
    """A loopback port another process (this one) listens on."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    try:
        yield s.getsockname()[1]
    finally:
        s.close()


# ---- the six tracebacks: MASTER_PORT taken ------------------------------------------------------------------------
def test_a_taken_master_port_under_torchrun_is_one_line_naming_the_address(tmp_path, monkeypatch, capsys):
    """The probe: MASTER_PORT taken ended in a traceback.  Under torchrun (its agent's TORCHELASTIC_RUN_ID set),
    rank 0 cannot listen on the port: one line naming the address and the port, nothing recorded."""
    import torch.distributed as dist

    with _taken_port() as port:
        for k, v in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                     "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "TORCHELASTIC_RUN_ID": "probe"}.items():
            monkeypatch.setenv(k, v)
        results = tmp_path / "runs.jsonl"
        code, _, err = _cli(["run", "--case", "mlp/plain", "--size", "tiny", "--results", results,
                             "--no-utilization"], capsys)
    _one_error(code, err, f"MASTER_ADDR=127.0.0.1 MASTER_PORT={port}", "address already in use",
               "is the port taken")
    assert not dist.is_initialized() and not results.exists()


@pytest.mark.heavy  # a real run's rank (about 10 s): make test-slow
@pytest.mark.timeout(300)
def test_a_local_run_with_a_taken_master_port_in_the_environment_runs_on_its_own_port(tmp_path):
    """The same probe without torchrun: a local run's ranks meet at a store of their own on a free loopback port,
    so MASTER_ADDR/MASTER_PORT left in the shell (the port taken) change nothing: exit 0, no traceback, a record."""
    with _taken_port() as port:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path), "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(port)}
        proc = subprocess.run([sys.executable, "-m", "suite.cli.main", "run", "--case", "mlp/plain", "--size", "tiny",
                               "--nproc", "1", "--steps", "1", "--rounds", "1", "--warmup", "0", "--no-check",
                               "--no-utilization", "--results", str(tmp_path / "runs.jsonl")], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert len((tmp_path / "runs.jsonl").read_text().splitlines()) == 1


# ---- 7. processes outlive their parent ------------------------------------------------------------------------------
DOCTOR_TORCHRUN = """
import sys
from suite import doctor

class Ctx:  # what item_torchrun asks of the doctor's run: its device, and to let go of the pool's GPUs
    device = "cpu"

    def release(self):
        pass

print(doctor.item_torchrun(Ctx()), flush=True)
"""


def _rank_of_the_job(pid: int) -> bool:
    line = _cmdline(pid)
    return "suite.cli.main torchrun-probe" in line and "torch.distributed.run" not in line


def _kill_the_doctor_while_torchrun_runs(tmp_path: Path, sig: int, when: str) -> tuple[list[int], list[str]]:
    """The doctor's torchrun item (torchrun and its 2 ranks) in a process killed with ``sig`` as soon as both ranks
    have started (``when="started"``: importing) or have met at the rendezvous (``"met"``: a socket open each).
    What of the job is alive 3 s later, and the leftovers in its TMPDIR once a sweep of dead runs' directories has
    run (what the next command does first)."""
    from suite.runtime.pool import remove_stale
    from suite.runtime.spawn import RUN_TOKEN, processes_with_token

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    token = f"probe36-doctor-{os.getpid()}-{sig}-{when}"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp), RUN_TOKEN: token}
    doctor = subprocess.Popen([sys.executable, "-c", DOCTOR_TORCHRUN], cwd=tmp_path, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    job: list[int] = []
    try:
        deadline = time.monotonic() + 240
        ranks: list[int] = []
        while time.monotonic() < deadline and doctor.poll() is None:
            job = [p for p, _ in processes_with_token(token, (doctor.pid,))]
            ranks = [p for p in job if _rank_of_the_job(p)]
            if len(ranks) == 2 and (when == "started" or all(map(_has_socket, ranks))):
                break
            time.sleep(0.02)
        assert len(ranks) == 2 and doctor.poll() is None, f"torchrun's ranks never {when} ({job}, {doctor.poll()})"
        assert any("torch.distributed.run" in _cmdline(p) for p in job), [_cmdline(p) for p in job]
        doctor.send_signal(sig)
        doctor.wait(timeout=30)
        left = _gone_within(job, 3.0)
        remove_stale(tmp=str(tmp))
        return left, sorted(os.listdir(tmp))
    finally:
        for pid in job + [doctor.pid]:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        doctor.wait()


@pytest.mark.heavy  # torchrun and two ranks started, each time (15-40 s on 2 cores): make test-slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("sig,when", [(signal.SIGKILL, "started"), (signal.SIGKILL, "met"), (signal.SIGTERM, "met")],
                         ids=["SIGKILL-importing", "SIGKILL-met", "SIGTERM-met"])
def test_a_killed_doctor_takes_torchrun_and_its_ranks_along(tmp_path, sig, when):
    """The probe: a killed `doctor` left torchrun and 2 ranks about 10 s (until the job ended by itself).  Killed
    while the ranks import torch (seconds), each rank goes at once too: its parent-death signal is set first."""
    left, entries = _kill_the_doctor_while_torchrun_runs(tmp_path, sig, when)
    assert not left, f"{[(p, _cmdline(p)[:80]) for p in left]} outlived the doctor by 3 s"
    assert entries == [], entries


@pytest.mark.heavy  # a trial server and its 2 ranks (about 10 s on 2 cores): make test-slow
@pytest.mark.timeout(300)
def test_a_killed_trial_server_takes_its_ranks_along():
    """Issue 36, item 4: `ab`'s trial servers die with `ab` (their parent-death signal); here the server itself is
    killed -9 with its 2 ranks started: they go with it (their pipe to it closes), none lives 3 s on."""
    from suite.ab.client import TrialServer

    srv = TrialServer(str(ROOT), "A", nproc=2, timeout=240)
    ranks: list[int] = []
    try:
        ranks = srv.request("start")["pids"]
        assert len(ranks) == 2 and all(map(_alive, ranks)), ranks
        os.kill(srv.proc.pid, signal.SIGKILL)
        srv.proc.wait(timeout=30)
        left = _gone_within(ranks, 3.0)
        assert not left, f"the killed trial server's ranks {left} lived 3 s on"
    finally:
        for pid in ranks:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        srv.kill()


# ---- 7. what user code daemonizes is named at the end -------------------------------------------------------------
def _revision_with_a_daemon(tmp: Path) -> Path:
    """A revision whose trial server (its `suite/cli/main.py`) starts a new-session `sleep 600`, then says hello
    as a trial server of this protocol does and waits for its input to close."""
    from suite.ab.protocol import PROTOCOL, VERSION

    root = tmp / "revision"
    (root / "suite" / "cli").mkdir(parents=True)
    (root / "suite" / "__init__.py").write_text("")
    (root / "suite" / "cli" / "__init__.py").write_text("")
    hello = {"protocol": PROTOCOL, "version": VERSION, "suite": str(root / "suite" / "__init__.py")}
    (root / "suite" / "cli" / "main.py").write_text(
        "import json, subprocess, sys\n"
        "if __name__ == '__main__':\n"
        "    daemon = subprocess.Popen(['setsid', 'sleep', '600'], stdin=subprocess.DEVNULL,\n"
        "                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
        f"    open({str(tmp / 'daemon.pid')!r}, 'w').write(str(daemon.pid))\n"
        f"    sys.stdout.write(json.dumps({hello!r}) + '\\n')\n"
        "    sys.stdout.flush()\n"
        "    sys.stdin.readline()\n")
    return root


def test_a_daemon_a_revision_started_is_named_at_the_end_of_ab(tmp_path, monkeypatch, capsys):
    """The probe: a revision that started a new-session `sleep 600` left it, unsaid.  A trial server carries the
    command's token like every process it starts, so `ab`'s closing sweep (main's) names what it daemonized."""
    import shutil

    from suite.ab.client import TrialServer
    from suite.cli.main import _sweep
    from suite.runtime.spawn import RUN_TOKEN

    if shutil.which("setsid") is None:
        pytest.skip("no setsid here: a daemon in a session of its own cannot be started")
    token = f"probe36-revision-{os.getpid()}"
    monkeypatch.setenv(RUN_TOKEN, token)  # what main() sets for `ab` before it starts anything
    found: list[int] = []
    try:
        with TrialServer(str(_revision_with_a_daemon(tmp_path)), "HEAD", start_timeout=60):
            pass
        _sweep("ab", token)
        err = capsys.readouterr().err
        found = [int(x.split(")")[0]) for x in err.split("(pid ")[1:]]
        assert "outlived it in a session of their own" in err and ("sleep (pid " in err or "setsid (pid " in err), err
        assert found and all(map(_alive, found)), err
    finally:
        if (tmp_path / "daemon.pid").exists():  # said or not, the daemon goes
            found.append(int((tmp_path / "daemon.pid").read_text()))
        for pid in found:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


BUILD_DAEMON = '''
import dataclasses, os, subprocess
from suite.models import get_model

def _build_and_daemonize(build):
    def build_it():
        daemon = subprocess.Popen(["setsid", "sleep", "600"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        with open(os.environ["DAEMON_PIDS"], "a") as fh:
            fh.write(f"{daemon.pid}\\n")
        return build()
    return build_it

def make(size):
    spec = get_model("mlp", size)
    return dataclasses.replace(spec, build=_build_and_daemonize(spec.build))
'''


@pytest.mark.heavy  # a real run's rank (about 10 s): make test-slow
@pytest.mark.timeout(300)
def test_a_daemon_a_models_build_started_in_a_rank_is_named_at_the_end(tmp_path):
    """The probe: a `build()` that started a new-session `sleep 600` (in a rank) left it, unsaid."""
    import shutil

    if shutil.which("setsid") is None:
        pytest.skip("no setsid here: a daemon in a session of its own cannot be started")
    (tmp_path / "daemonic.py").write_text(BUILD_DAEMON)
    pids = tmp_path / "daemon.pids"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path), "DAEMON_PIDS": str(pids)}
    proc = subprocess.run([sys.executable, "-m", "suite.cli.main", "run", "--model", "daemonic:make", "--case",
                           "make/plain", "--size", "tiny", "--nproc", "1", "--steps", "1", "--rounds", "1", "--warmup",
                           "0", "--no-check", "--no-utilization", "--results", str(tmp_path / "runs.jsonl")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=280)
    found = [int(x.split(")")[0]) for x in proc.stderr.split("(pid ")[1:]]
    try:
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "outlived it in a session of their own" in proc.stderr, proc.stderr[-3000:]
        assert ("sleep (pid " in proc.stderr or "setsid (pid " in proc.stderr) and found, proc.stderr[-3000:]
        assert all(map(_alive, found)), proc.stderr[-3000:]
    finally:
        if pids.exists():  # said or not, the daemons go
            found += [int(p) for p in pids.read_text().split()]
        for pid in found:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


# ---- 10. temporary directories and worktrees after SIGKILL ---------------------------------------------------------
def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


KILLED_AB = """
import os, signal, sys
from suite.ab.worktrees import Worktrees

wt = Worktrees(sys.argv[1])
commit = wt.resolve("HEAD")
wt.add(commit, "base")
wt.add(commit, "head")
print(wt.dir, flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # as `ab` killed -9 with both revisions checked out
"""


def test_ab_killed_9_leaves_its_worktrees_to_the_next_command_which_removes_them(tmp_path, monkeypatch, capsys,
                                                                               no_ranks):
    """The probe: after SIGKILL, `fleetbench-ab-*` with two registered worktrees stayed.  Nothing can run in a
    process killed -9: its directory is named with its pid and locked while it lives, so the next command that starts
    processes removes it (its lock free), and the next `ab` on the repository prunes the registrations."""
    import tempfile

    from suite.ab.worktrees import Worktrees

    repo, tmp = tmp_path / "repo", tmp_path / "tmp"
    repo.mkdir()
    tmp.mkdir()
    for args in (["init", "-q"], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m",
                                  "one"]):
        _git(repo, *args)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp)}
    proc = subprocess.run([sys.executable, "-c", KILLED_AB, str(repo)], env=env, capture_output=True, text=True,
                          timeout=120)
    left = Path(proc.stdout.strip())
    assert proc.returncode == -signal.SIGKILL and left.parent == tmp and left.name.startswith("fleetbench-ab-"), proc
    assert len(list(left.iterdir())) == 3 and _git(repo, "worktree", "list").count("\n") == 3  # the probe's leftovers
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    code, _, err = _cli(["run", "--case", "mlp/plain", "--size", "tiny", "--list"], capsys)
    assert code == 0 and not left.exists() and os.listdir(tmp) == [], (err, os.listdir(tmp))
    wt = Worktrees(str(repo))
    try:
        wt.add(wt.resolve("HEAD"), "base")
        listed = _git(repo, "worktree", "list", "--porcelain")
        assert listed.count("worktree ") == 2 and str(left) not in listed, listed
    finally:
        wt.remove()


# ---- 10. terminal escapes in commit subjects and a profile's model name ------------------------------------------
def _raw_controls(text: str) -> list[str]:
    return [c for c in text if c in "\x1b\x07\u202e"]


def test_a_commit_subject_reaches_the_terminal_with_its_control_characters_escaped(tmp_path):
    """The probe: `ab` and `bisect` printed commit subjects raw, terminal escapes and all."""
    from suite.ab.worktrees import Worktrees

    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", f"fix {HOSTILE}")
    wt = Worktrees(str(repo))
    subject = wt.subject(wt.resolve("HEAD"))
    assert not _raw_controls(subject) and subject.startswith("fix evil") and "\\u001b" in subject, repr(subject)


# ---- the map of probes to tests ---------------------------------------------------------------------------------
def test_every_test_the_probe_table_names_exists():
    """docs/benchmarks.md's table of issue 36's probes names tests as ``tests/FILE.py::NAME``: each is a test
    function of that file (a renamed or removed test fails here, not silently in the table)."""
    import ast
    import re

    doc = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    table = doc[doc.index("## Issue 36's probes and their tests"):]
    named = re.findall(r"`(tests/[\w/]+\.py)::(\w+)`", table)
    assert len(named) >= 30, named
    missing = []
    for path, name in named:
        tree = ast.parse((ROOT / path).read_text(encoding="utf-8"))
        if name not in {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}:
            missing.append(f"{path}::{name}")
    assert not missing, missing


# ---- make test leaves no fleetbench-* entry in TMPDIR ---------------------------------------------------------------
LEAVES = """
import os, tempfile

def test_that_passes_but_leaves_a_directory():
    os.mkdir(os.path.join(tempfile.gettempdir(), "fleetbench-left-behind"))
"""


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["one-process", "two-xdist-workers"])
def test_a_test_session_that_leaves_a_fleetbench_entry_in_its_tmpdir_fails_naming_it(tmp_path, workers):
    """Issue 36's acceptance: `make test` leaves no `fleetbench-*` entry in TMPDIR.  tests/conftest.py gives the
    session a TMPDIR of its own and fails the session, naming them, when entries are left in it (then removes it):
    here a session whose one test passes but leaves one, in one process and on two workers as make test runs."""
    outer = tmp_path / "outer"
    outer.mkdir()
    (tmp_path / "test_leaves.py").write_text(LEAVES)
    env = nested_pytest_env(PYTHONPATH=str(ROOT), TMPDIR=str(outer))
    env.pop("FLEETBENCH_KEEP_TEST_TMP", None)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-p", "no:cacheprovider",
                           *workers, "test_leaves.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert "1 passed" in proc.stdout, proc.stdout + proc.stderr
    assert proc.returncode == 1 and "fleetbench-left-behind" in proc.stderr, (proc.returncode, proc.stderr)
    assert os.listdir(outer) == [], os.listdir(outer)  # the session's TMPDIR removed with what was left in it
