"""What the hostile-input tests share: a command called in process, its one-line refusal, a bound on a call."""
from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator


def cli(argv, capsys) -> tuple[int, str, str]:
    """``fleetbench ARGV`` in this process: its exit code, stdout and stderr (SIGTERM's handler put back: ab and
    doctor turn SIGTERM into Ctrl-C for their process)."""
    from suite.cli.main import main

    term = signal.getsignal(signal.SIGTERM)
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    finally:
        signal.signal(signal.SIGTERM, term)
    out, err = capsys.readouterr()
    return code, out, err


def one_error(code, err, *words) -> None:
    """Exit 2 with one line on stderr, no traceback, naming every one of ``words``."""
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, (code, err)
    for w in words:
        assert w in err, (w, err)


class Blocked(Exception):
    """A call that blocked past its bound (:func:`bounded_by`)."""


@contextlib.contextmanager
def bounded_by(seconds: int) -> Iterator[None]:
    """An in-process call that must not block: a SIGALRM after ``seconds`` turns a hang into a failure."""
    def ring(*_):
        raise Blocked(f"blocked for {seconds} s")

    old = signal.signal(signal.SIGALRM, ring)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def alive(pid: int) -> bool:
    """Whether ``pid`` is a process that still runs (not gone, not a zombie)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except (OSError, IndexError):
        return False


def scan_suite(find, except_path: str) -> list[str]:
    """``path:line`` of every place in suite/ (but ``except_path``, relative to the checkout) where ``find(tree)``
    (an ast.Module -> line numbers) finds something: the one-loop rules' scan."""
    import ast
    import os

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    found = []
    for folder, _, files in os.walk(os.path.join(root, "suite")):
        for f in files:
            path = os.path.join(folder, f)
            if f.endswith(".py") and os.path.relpath(path, root) != except_path:
                with open(path, encoding="utf-8") as fh:
                    tree = ast.parse(fh.read())
                found += [f"{os.path.relpath(path, root)}:{line}" for line in find(tree)]
    return found


def nested_pytest_env(**more: str) -> dict[str, str]:
    """The environment for a pytest session started from a test: none of this session's FLEETBENCH_BENCH_*
    selection, nor pytest-xdist's worker variables (make test runs on two workers, and pytest-benchmark disables
    itself where PYTEST_XDIST_WORKER is set); the checkout first on PYTHONPATH."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("FLEETBENCH_BENCH_", "PYTEST_XDIST_")) and k != "PYTEST_CURRENT_TEST"}
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return {**env, **more}
