"""Revisions materialised as git worktrees in a temporary directory, removed afterwards whatever happens.

    with Worktrees(repo) as wt:
        base = wt.add(wt.resolve("main~3"), "base")     # a detached worktree of that commit
        ...                                             # removed (and pruned) on exit, error or not

A revision that does not resolve to a commit, or whose tree has no trial server
(:data:`suite.ab.protocol.MARKER_PATH`), is refused before anything starts
(:class:`RevisionError`, exit status 2).
"""
from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import tempfile

from ..results.records import plain
from ..runtime.pool import owned_tempdir, remove_stale
from .protocol import MARKER_PATH, PROTOCOL, VERSION

__all__ = ["Worktrees", "RevisionError", "git", "repo_root", "first_parent_range"]


class RevisionError(ValueError):
    """A revision that cannot be used (unknown, or older than the trial protocol)."""


def git(repo: str, *args: str, check: bool = True, timeout: float = 120.0) -> str:
    out = subprocess.run(["git", "-C", repo, *args], capture_output=True, text=True, timeout=timeout)
    if check and out.returncode != 0:
        raise RevisionError(f"git {' '.join(args)}: {(out.stderr or out.stdout).strip()}")
    return out.stdout.strip()


def repo_root(path: str) -> str:
    try:
        return git(path, "rev-parse", "--show-toplevel")
    except (RevisionError, FileNotFoundError) as exc:
        raise RevisionError(f"{path}: not inside a git repository ({exc}); pass --repo") from None


def first_parent_range(repo: str, good: str, bad: str) -> list[str]:
    """The commits after ``good`` up to ``bad`` on ``bad``'s first-parent line, oldest first."""
    if subprocess.run(["git", "-C", repo, "merge-base", "--is-ancestor", good, bad],
                      capture_output=True).returncode != 0:
        raise RevisionError(f"{good[:10]} is not an ancestor of {bad[:10]}: nothing to bisect")
    out = git(repo, "rev-list", "--first-parent", "--reverse", f"{good}..{bad}")
    return [c for c in out.splitlines() if c]


class Worktrees:
    def __init__(self, repo: str, tmp_parent: str | None = None):
        self.repo = repo_root(repo)
        self.tmp_parent = tmp_parent
        self.dir: str | None = None
        self._owner: int | None = None  # the locked owner file of self.dir (see suite.runtime.pool.owned_tempdir)
        self.paths: list[str] = []

    def resolve(self, rev: str) -> str:
        """The full commit hash of ``rev``; a RevisionError naming it otherwise."""
        out = subprocess.run(["git", "-C", self.repo, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"],
                             capture_output=True, text=True)
        if out.returncode != 0 or not out.stdout.strip():
            raise RevisionError(f"revision {rev!r} is not a commit of {self.repo}")
        return out.stdout.strip()

    def check_protocol(self, commit: str, label: str) -> None:
        ok = subprocess.run(["git", "-C", self.repo, "cat-file", "-e", f"{commit}:{MARKER_PATH}"],
                            capture_output=True).returncode == 0
        if not ok:
            raise RevisionError(
                f"{label} {commit[:10]} is older than the trial protocol ({PROTOCOL} version {VERSION}; its tree has "
                f"no {MARKER_PATH}): `fleetbench ab` and `bisect` compare revisions that have `fleetbench "
                f"trial-server`; pick revisions at or after the commit that added it")

    def subject(self, commit: str) -> str:
        """The commit's subject line as shown to a terminal: control characters (ANSI escapes) and bidirectional
        overrides written as ``\\uXXXX`` (a commit message is anyone's text), at most 200 characters."""
        return plain(git(self.repo, "log", "-1", "--format=%s", commit, check=False)[:200])

    def check_clean(self, revisions: dict) -> None:
        """Refuse a revision that names the commit checked out in the repository while its working tree has
        uncommitted changes to tracked files: they would silently not be compared."""
        head = git(self.repo, "rev-parse", "--verify", "--quiet", "HEAD", check=False)
        dirty = git(self.repo, "status", "--porcelain", "--untracked-files=no", check=False).splitlines()
        for label, (rev, commit) in revisions.items():
            if dirty and commit == head:
                raise RevisionError(
                    f"{label} {rev!r} is the commit checked out in {self.repo}, whose working tree has uncommitted "
                    f"changes to {len(dirty)} tracked file(s) (e.g. {dirty[0].split(maxsplit=1)[-1]}); `ab` compares "
                    f"commits, so "
                    f"those changes would not be measured: commit them (or stash them) first")

    def add(self, commit: str, label: str) -> str:
        if self.dir is None:
            remove_stale("fleetbench-", self.tmp_parent)  # leftovers of runs whose owner died (killed -9)
            subprocess.run(["git", "-C", self.repo, "worktree", "prune"], capture_output=True)
            self.dir, self._owner = owned_tempdir("fleetbench-ab-") if self.tmp_parent is None else \
                (tempfile.mkdtemp(prefix="fleetbench-ab-", dir=self.tmp_parent), None)
            atexit.register(self.remove)
        path = os.path.join(self.dir, f"{label}-{commit[:10]}-{len(self.paths)}")
        git(self.repo, "worktree", "add", "--detach", "--quiet", path, commit)
        self.paths.append(path)
        return path

    def drop(self, path: str) -> None:
        """Remove one worktree now (bisection drops each candidate after its comparison)."""
        subprocess.run(["git", "-C", self.repo, "worktree", "remove", "--force", path], capture_output=True)
        shutil.rmtree(path, ignore_errors=True)
        if path in self.paths:
            self.paths.remove(path)

    def remove(self) -> None:
        for path in list(self.paths):
            self.drop(path)
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None
        if self._owner is not None:
            os.close(self._owner)
            self._owner = None
        subprocess.run(["git", "-C", self.repo, "worktree", "prune"], capture_output=True)

    def __enter__(self) -> Worktrees:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()
