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


def interruptible() -> None:
    """A ``preexec_fn``: the command starts with SIGINT at its default and unblocked, as from a terminal, whatever
    this process inherited (a shell's background job, ``make test &``, ignores SIGINT, and every process started
    from it, Python included, keeps it ignored: a test of Ctrl-C would see none)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


@contextlib.contextmanager
def ctrl_c_raises() -> Iterator[None]:
    """Within the block, SIGINT raises KeyboardInterrupt in this process (Python's own handler, unblocked in this
    thread) whatever it inherited; as it was after."""
    handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    mask = signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        signal.signal(signal.SIGINT, handler if handler is not None else signal.SIG_DFL)


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


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HERE = os.path.join(ROOT, "tests")

# `fleetbench run` of one case on CPU, the stem hostile-input tests add to
RUN = ["run", "--case", "mlp/plain", "--size", "tiny", "--device", "cpu"]
# a case name that is markup, a table cell's end and a link's start all at once
HOSTILE_CASE = "mlp/<script>alert(1)</script>|x"


def gone_within(pids, seconds: float) -> list[int]:
    """The pids still alive after waiting up to ``seconds`` for them to end (a bounded wait, not a timing)."""
    import time

    deadline = time.monotonic() + seconds
    while any(map(alive, pids)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


def tagged(token: str) -> list[int]:
    """Live processes whose environment carries ``token`` (every process a run started inherits it)."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as fh:
                if token.encode() in fh.read() and alive(int(pid)):
                    out.append(int(pid))
        except OSError:
            continue
    return out


def unescaped_pipes(line: str) -> int:
    """How many cells a Markdown table line's ``|`` make (an escaped ``\\|`` is text)."""
    n, i = 0, 0
    while i < len(line):
        if line[i] == "\\":
            i += 2
            continue
        n += line[i] == "|"
        i += 1
    return n


def torchrun(args: list[str], timeout: float = 240):
    """``python -m torch.distributed.run --standalone --nproc_per_node 2 ARGS`` from the checkout, its output kept."""
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1",
               GLOO_SOCKET_IFNAME=os.environ.get("GLOO_SOCKET_IFNAME", "lo"))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", *args]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


# ---- JUnit XML read back with the standard library (tests/data/junit-10.xsd: tests/test_junit.py says whose) ----
XSD = os.path.join(HERE, "data", "junit-10.xsd")


def valid(path):
    """The file's root (an ElementTree element), after checking it against the schema (the schema's own complaint on
    failure)."""
    import xml.etree.ElementTree as ET

    import lxml.etree

    schema = lxml.etree.XMLSchema(lxml.etree.parse(XSD))
    doc = lxml.etree.parse(str(path))
    assert schema.validate(doc), f"{path} does not validate against junit-10.xsd: {schema.error_log}"
    return ET.parse(path).getroot()


def cases(root) -> dict:
    """Each ``testcase`` element of a JUnit root, by its name."""
    return {tc.get("name"): tc for tc in root.iter("testcase")}


def outcome(tc) -> tuple[str, str]:
    """("passed", "") or (the child's tag, its message)."""
    for tag in ("failure", "error", "skipped"):
        el = tc.find(tag)
        if el is not None:
            return tag, el.get("message") or ""
    return "passed", ""


# ---- git: a repository of this project's tree for `ab`, `bisect` and the nightly ---------------------------------
SLOW_PATCH = '''

# --- fleetbench's tests (tests/clitools.py): a training step about 10% slower (busy work proportional to the step;
# FLEETBENCH_TEST_SLOWDOWN sets another fraction, for trying the tests by hand) ---
import os as _slow_os
import time as _slow_time

_SLOWDOWN = float(_slow_os.environ.get("FLEETBENCH_TEST_SLOWDOWN", "0.10"))

_real_train_step = Engine.train_step


def _slow_train_step(self, inputs, targets):
    t0 = _slow_time.perf_counter()
    out = _real_train_step(self, inputs, targets)
    end = _slow_time.perf_counter() + _SLOWDOWN * (_slow_time.perf_counter() - t0)
    while _slow_time.perf_counter() < end:
        pass
    return out


Engine.train_step = _slow_train_step
'''


def git(repo, *args):
    """``git -C REPO ARGS``'s output, stripped (its failure an assertion naming the command)."""
    import subprocess

    out = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, f"git {args}: {out.stderr}"
    return out.stdout.strip()


def commit(repo, message):
    """Everything in ``repo`` committed; the commit's hash."""
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD")


def copy_tree(root) -> None:
    """This project's current tree (tracked and untracked-but-not-ignored files) as a fresh git repository at
    ``root`` with nothing committed yet."""
    import shutil
    import subprocess

    files = subprocess.run(["git", "-C", ROOT, "ls-files", "-co", "--exclude-standard", "-z"], capture_output=True,
                           check=True).stdout.decode().split("\0")
    for f in filter(None, files):
        src = os.path.join(ROOT, f)
        if os.path.isfile(src):
            os.makedirs(os.path.dirname(root / f), exist_ok=True)
            shutil.copy2(src, root / f)
    git(ROOT, "--version")
    subprocess.run(["git", "init", "-q", "-b", "main", str(root)], check=True)
    git(root, "config", "user.email", "ab@test")
    git(root, "config", "user.name", "ab test")
