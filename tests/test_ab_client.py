"""`ab`'s trial servers from the client's side (suite/ab/client.py): a server that cannot start leaves nothing,
one killed takes its ranks along, `ab` killed leaves no server, and what a revision daemonized is named."""
from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

import pytest

from tests.clitools import ROOT, git, gone_within, tagged
from tests.clitools import alive as _alive


def test_a_trial_server_that_cannot_start_leaves_no_log_or_process(tmp_path, monkeypatch):
    import tempfile

    from suite.ab.client import ProtocolMismatch, TrialServer

    root = tmp_path / "nothing"
    (root / "suite" / "cli").mkdir(parents=True)
    (root / "suite" / "__init__.py").write_text("")
    (root / "suite" / "cli" / "__init__.py").write_text("")
    (root / "suite" / "cli" / "main.py").write_text("import sys; sys.exit(\"invalid choice: 'trial-server'\")\n")
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    with pytest.raises(ProtocolMismatch):
        TrialServer(str(root), "BASE", start_timeout=60)
    assert os.listdir(tmp_path / "tmp") == []


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
        left = gone_within(ranks, 3.0)
        assert not left, f"the killed trial server's ranks {left} lived 3 s on"
    finally:
        for pid in ranks:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        srv.kill()


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


@pytest.mark.statistical
@pytest.mark.timeout(1200)
def test_ab_killed_by_sigterm_or_sigint_leaves_no_server_and_no_temp_entry_within_5s(tmp_path):
    import subprocess
    import sys
    import time

    repo = tmp_path / "repo"  # a clean clone: ab refuses a checkout with uncommitted changes
    subprocess.run(["git", "clone", "-q", "--shared", str(ROOT), str(repo)], check=True)
    for sig in (signal.SIGTERM, signal.SIGINT):
        tmp = tmp_path / sig.name
        tmp.mkdir()
        token = f"fleetbench-ab-kill-{os.getpid()}-{sig.name}"
        env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp), "FLEETBENCH_SWEEP": token}
        proc = subprocess.Popen([sys.executable, "-m", "suite.cli.main", "ab", "HEAD", "HEAD", "--repo", str(repo),
                                 "--case", "mlp/plain", "--size", "tiny", "--nproc", "2", "--steps", "2",
                                 "--budget", "600"], env=env, cwd=str(ROOT), stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and len(list(tmp.glob("fleetbench-store-*"))) < 2:
            time.sleep(0.2)  # both trial servers have started their rank pools
        assert len(list(tmp.glob("fleetbench-store-*"))) == 2, "the trial servers never started their ranks"
        time.sleep(2.0)
        proc.send_signal(sig)
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline and (proc.poll() is None or tagged(token) or os.listdir(tmp)):
            time.sleep(0.05)
        left, entries = tagged(token), sorted(os.listdir(tmp))
        for pid in left + ([proc.pid] if proc.poll() is None else []):
            os.kill(pid, signal.SIGKILL)
        assert proc.poll() is not None and not left and not entries, (sig.name, left, entries)
    git(repo, "worktree", "prune")
    assert "fleetbench-ab-" not in git(repo, "worktree", "list")
