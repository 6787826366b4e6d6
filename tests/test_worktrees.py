"""`ab`'s worktrees (suite/ab/worktrees.py): a dirty checkout refused, an `ab` killed -9 leaves its worktrees to
the next command, which removes them, and commit subjects reach the terminal escaped."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.clitools import ROOT, git
from tests.clitools import cli as _cli
from tests.clitools import one_error as _one_error


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


HOSTILE = "evil\x1b[31mred\x1b[0m\u202eright\x07"


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


def test_ab_refuses_a_checked_out_revision_with_uncommitted_changes(tmp_path, capsys, monkeypatch):
    import suite.ab.trials

    monkeypatch.setattr(suite.ab.trials, "TrialServer", lambda *a, **k: pytest.fail("a server was started"))
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "f.py").write_text("x = 1\n")
    git(repo, "add", "f.py")
    git(repo, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "-m", "one")
    (repo / "f.py").write_text("x = 2\n")  # the change ab would silently not measure
    code, _, err = _cli(["ab", "HEAD", "HEAD", "--repo", repo, "--case", "mlp/plain"], capsys)
    _one_error(code, err, "uncommitted changes", "f.py", "commit them")
    assert git(repo, "worktree", "list").count("\n") == 0 and not list(tmp_path.glob("fleetbench-*"))
