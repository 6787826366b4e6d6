"""argparse's ``Namespace`` stays in ``suite/cli/`` and is never changed after parsing: each command builds its run
specification (``suite/run_spec.py``) or its typed options from it.  Checked twice: over the source (no ``args.``
outside suite/cli, no ``setattr(args`` / ``vars(args)`` anywhere, no assignment to ``args`` or to one of its
attributes in a command) and at run time (a recording ``Namespace`` passed through every command's ``main``, the
heavy work stubbed: no attribute read from a file outside suite/cli, no write after parsing)."""
from __future__ import annotations

import argparse
import ast
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLI = os.path.join(ROOT, "suite", "cli") + os.sep


def _sources(*tops: str):
    for top in tops:
        for root, _, files in os.walk(os.path.join(ROOT, top)):
            for f in files:
                if f.endswith(".py"):
                    path = os.path.join(root, f)
                    yield path, ast.parse(open(path, encoding="utf-8").read())


def _is_args(node) -> bool:
    return isinstance(node, ast.Name) and node.id == "args"


def _parses(node) -> bool:
    """``args = parser.parse_args(...)``: the parsing itself, the one assignment a command makes."""
    value = getattr(node, "value", None)
    return isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and \
        value.func.attr in ("parse_args", "parse_known_args")


MUTATORS = {"append", "extend", "insert", "remove", "pop", "clear", "update", "add", "discard", "setdefault",
            "sort", "reverse"}


def namespace_problems(path: str, tree: ast.AST) -> list[str]:
    """``path:line what`` for each use of ``args`` this file may not make (see the module docstring)."""
    where = os.path.relpath(path, ROOT)
    in_cli = path.startswith(CLI)
    bad = []
    for node in ast.walk(tree):
        line = f"{where}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Attribute) and _is_args(node.value) and not in_cli:
            bad.append(f"{line} args.{node.attr} outside suite/cli")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("setattr", "vars",
                                                                                               "delattr") \
                and node.args and _is_args(node.args[0]):
            bad.append(f"{line} {node.func.id}(args, ...)")
        targets = []
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
        for t in targets:
            for sub in ast.walk(t):
                if (isinstance(sub, ast.Attribute) and _is_args(sub.value)) or (
                        isinstance(sub, ast.Subscript) and isinstance(sub.value, ast.Attribute)
                        and _is_args(sub.value.value)):
                    bad.append(f"{line} assigns to args.{getattr(sub, 'attr', '')}")
                elif _is_args(sub) and in_cli and not isinstance(node, ast.Delete) and not _parses(node):
                    bad.append(f"{line} assigns to args")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS \
                and isinstance(node.func.value, ast.Attribute) and _is_args(node.func.value.value):
            bad.append(f"{line} args.{node.func.value.attr}.{node.func.attr}(...) changes a parsed value")
    return bad


def test_no_namespace_outside_the_cli_and_none_changed_after_parsing():
    bad = [p for path, tree in _sources("suite", "bench_cases") for p in namespace_problems(path, tree)]
    assert bad == []


@pytest.mark.parametrize("code,what", [
    ("def f(args):\n    return args.steps\n", "args.steps outside suite/cli"),
    ("def f(args):\n    setattr(args, 'x', 1)\n", "setattr(args, ...)"),
    ("def f(args):\n    vars(args).update(x=1)\n", "vars(args, ...)"),
    ("def f(args):\n    args.nproc = 4\n", "assigns to args.nproc"),
    ("def f(args):\n    args.set.append('a=1')\n", "args.set.append(...) changes a parsed value"),
])
def test_the_source_rule_catches_each_way_of_touching_args(code, what):
    outside = os.path.join(ROOT, "suite", "cluster", "launch.py")
    assert any(what in p for p in namespace_problems(outside, ast.parse(code))), what
    inside = os.path.join(CLI, "run.py")  # a command reads its args; it changes them nowhere
    flagged = namespace_problems(inside, ast.parse(code))
    assert flagged == [] if what.endswith("outside suite/cli") else any(what in p for p in flagged), flagged
    assert namespace_problems(inside, ast.parse("def f(args):\n    args = g(args)\n")), "a command rebinding args"


# ---- at run time: a recording Namespace through every command's main --------------------------------------------
class Recording(argparse.Namespace):
    """Notes, once parsing is over (``freeze``), every attribute read with the file that read it, and every
    write."""

    def freeze(self) -> None:
        object.__setattr__(self, "_frozen", True)
        object.__setattr__(self, "_log", [])

    def __getattribute__(self, name: str):
        if not name.startswith("_") and name != "freeze" and object.__getattribute__(self, "__dict__").get(
                "_frozen"):
            frame = sys._getframe(1)
            object.__getattribute__(self, "_log").append(("read", name, frame.f_code.co_filename, frame.f_lineno))
        return object.__getattribute__(self, name)

    def __setattr__(self, name: str, value) -> None:
        if self.__dict__.get("_frozen"):
            frame = sys._getframe(1)
            self.__dict__["_log"].append(("write", name, frame.f_code.co_filename, frame.f_lineno))
        object.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        frame = sys._getframe(1)
        self.__dict__["_log"].append(("write", name, frame.f_code.co_filename, frame.f_lineno))
        object.__delattr__(self, name)


def _peek(ns):
    return ns.steps


def _pool_class():
    from tests.fakes import FakeRankPool

    class Pool(FakeRankPool):
        """run's fake rank pool (synthetic timings), also a context manager answering [] to other calls (comm)."""

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def run(self, fn, kwargs=None, timeout=None):
            return [] if "sizes" in (kwargs or {}) else super().run(fn, kwargs, timeout)

    return Pool


@pytest.fixture
def stubbed(monkeypatch, tmp_path):
    """Each command's heavy work stood in for, at the boundary its values cross out of suite/cli."""
    import types

    import suite.runtime
    from suite import doctor
    from suite.ab import bisect, trials
    from suite.cli import ab, gpu_check, nightly, trial_server
    from suite.figures import host
    from suite.measure import collectives as microbench
    from tests.fakes import FakeRankPool

    monkeypatch.setattr(FakeRankPool, "made", [])
    monkeypatch.setattr(suite.runtime, "RankPool", _pool_class())
    report = trials.AbReport({"commit": "b"}, {"commit": "h"}, {})
    monkeypatch.setattr(trials, "run_ab", lambda repo, base, head, opts, say: report)
    monkeypatch.setattr(ab, "identical", lambda repo, base, head: None)  # git: this checkout may not be clean
    monkeypatch.setattr(bisect, "run_bisect", lambda *a, **kw: bisect.BisectReport("mlp/plain", "g", "b", []))
    monkeypatch.setattr(doctor, "run_doctor", lambda *a, **kw: doctor.Report("cpu", 2, {}))
    monkeypatch.setattr(nightly.Night, "call", lambda self, cmd, stdout=None, env=None: 0)
    monkeypatch.setattr(gpu_check, "Check", lambda opts: types.SimpleNamespace(run=lambda: 0, out=str(tmp_path),
                                                                               fatal=None))
    monkeypatch.setattr(trial_server, "serve", lambda *a, **kw: 0)
    monkeypatch.setattr(microbench, "merge", lambda answers: [])
    monkeypatch.setattr(microbench, "format_table", lambda rows, nproc: "")
    monkeypatch.setattr(host, "measure", lambda opts, pool: {})
    monkeypatch.setattr(host, "render", lambda raw, opts: "")
    return tmp_path


def _argvs(tmp: str) -> dict[str, list[list[str]]]:
    """Per command, the command lines run (each through its whole main, the heavy work stubbed)."""
    results, empty = os.path.join(tmp, "runs.jsonl"), os.path.join(tmp, "e")
    os.makedirs(empty, exist_ok=True)
    good = os.path.join(tmp, "good")
    open(good, "w").write("HEAD\n")
    run = ["run", "--case", "mlp/plain", "--size", "tiny", "--no-check", "--rounds", "2", "--steps", "2",
           "--set", "fetch_frequency=2", "--results", results]
    return {
        "run": [run, ["run", "--list", "--tag", "smoke"], ["run", "--resume", results, "--no-utilization"]],
        "report": [["report", results, "--out", os.path.join(tmp, "report")]],
        "compare": [["compare", results, results]],
        "ab": [["ab", "HEAD~1", "HEAD", "--case", "mlp/plain", "--nproc", "2", "--json"]],
        "bisect": [["bisect", "HEAD~1", "HEAD", "--case", "mlp/plain", "--nproc", "2", "--json"]],
        "nightly": [["nightly", "--plan", "--device", "cpu", "--case", "mlp/plain", "--worlds", "2", "--out",
                     os.path.join(tmp, "n"), "--machine", "m"],
                    ["nightly", "--device", "cpu", "--case", "mlp/plain", "--worlds", "2", "--out",
                     os.path.join(tmp, "n2"), "--machine", "m", "--last-good", good]],
        "doctor": [["doctor", "--nproc", "2", "--json"]],
        "comm": [["comm", "--nproc", "2", "-b", "1K", "-e", "2K"]],
        "figures": [["figures", "host"]],
        "config": [["config", "--preset", "paddle_amp"]],
        "cluster": [["cluster", "status"]],
        "history": [["history", "--results", empty, "--machine", "m"]],
        "machine-name": [["machine-name"]],
        "asv-offline": [["asv-offline", empty]],
        "gpu-check": [["gpu-check", "--device", "cpu", "--out", os.path.join(tmp, "g")]],
        "trial-server": [["trial-server", "--nproc", "2"]],
    }


def test_every_commands_main_reads_args_only_in_the_cli_and_never_changes_them(stubbed, capsys):
    from suite.cli.main import COMMANDS, build_parser
    from suite.config import ConfigError

    argvs = _argvs(str(stubbed))
    assert set(COMMANDS) <= set(argvs), f"a command without a command line here: {set(COMMANDS) - set(argvs)}"
    outside, writes, ran = [], [], []
    for name, lines in argvs.items():
        for argv in lines:
            args = build_parser().parse_args(argv, namespace=Recording())
            func = args.func  # as suite/cli/main.py calls it
            args.freeze()
            try:
                code = func(args)
            except (ConfigError, SystemExit) as exc:  # main turns these into one line; the reads before count
                code = f"{type(exc).__name__}: {exc}"
            ran.append((argv[:2], code))
            log = args.__dict__["_log"]
            assert any(kind == "read" for kind, *_ in log) or name == "machine-name", (argv, "main read nothing")
            outside += [f"{argv[0]}: {attr} read at {file}:{line}" for kind, attr, file, line in log
                        if kind == "read" and not file.startswith(CLI)]
            writes += [f"{argv[0]}: {attr} written at {file}:{line}" for kind, attr, file, line in log
                       if kind == "write"]
    capsys.readouterr()
    assert outside == [] and writes == [], (outside, writes)
    # the commands ran through (not refused early): the run and its resume, ab, bisect, the nights, the rest
    codes = dict((" ".join(a), c) for a, c in ran)
    assert codes["run --case"] == 0 and codes["run --resume"] == 0 and codes["ab HEAD~1"] == 0, ran
    assert codes["bisect HEAD~1"] == 3 and codes["nightly --plan"] == 0, ran


def test_the_recording_namespace_sees_a_read_outside_the_cli_and_a_late_write(stubbed):
    """The runtime check can fail: a function outside suite/cli reading the Namespace, and a command writing to it
    after parsing (what `run --resume` and `--cluster` did), are both in the log."""
    from suite.cli.main import build_parser

    args = build_parser().parse_args(["run", "--steps", "3"], namespace=Recording())
    args.freeze()
    assert _peek(args) == 3  # a function of a file outside suite/cli (this one)
    args.nproc = 4
    log = args.__dict__["_log"]
    assert [(k, a) for k, a, f, _ in log if k == "read" and not f.startswith(CLI)] == [("read", "steps")]
    assert [(k, a) for k, a, *_ in log if k == "write"] == [("write", "nproc")]
