"""The run specification's options are made from its fields' metadata, once (``suite/spec_options.py``), and a spec
is built from any of them by one builder, ``spec_options.spec_from``, with one error type; every bound of every
option is a field's metadata (``suite/validate.py``), said in one style.

- one table: each option of the spec on run, ab, bisect, nightly (argparse), pytest (``--fleetbench-*``) and asv
  (``FLEETBENCH_BENCH_*``) is the metadata's, declared nowhere else (at run time: the parsers' arguments and
  pytest's options; over the source: no literal of a generated name);
- one builder: no function of suite/ or bench_cases/ but the builder's turns options into a spec part (a
  structural test), and each entry point (run, ab, nightly, pytest, asv, ``run --resume`` of a schema-4 record)
  calls it (the builder patched, its calls seen);
- one validation: a bad number of any command's options is one error, exit 2, ``--OPTION VALUE: must be ...``.
"""
from __future__ import annotations

import argparse
import ast
import json
import os

import pytest

import suite.runtime
from suite import spec_options
from suite.cli.main import build_parser, main
from suite.run_spec import SURFACES, SeqOptions, SpecError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILDER = os.path.join(ROOT, "suite", "spec_options.py")
METADATA = os.path.join(ROOT, "suite", "run_spec.py")  # the one table: each field's option, in its metadata
PARTS = ("RunSpec", "Selection", "RunOptions", "AbOptions", "SeqOptions")


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _sources(*tops: str):
    for top in tops:
        for root, _, files in os.walk(os.path.join(ROOT, top)):
            for f in sorted(files):
                if f.endswith(".py"):
                    path = os.path.join(root, f)
                    yield path, ast.parse(open(path, encoding="utf-8").read())


# ---- one table ---------------------------------------------------------------------------------------------------
SPEC_FLAGS = {o.flag for o in spec_options.TABLE.values() if o.flag.startswith("--")}


def hand_declared(parser: argparse.ArgumentParser) -> list[str]:
    """The arguments of a spec-building command that carry a spec field's name but were not made from the
    metadata (``suite/cli/options.py``'s ``add_spec`` marks each it makes)."""
    return [f"{'/'.join(a.option_strings)}" for a in parser._actions
            if set(a.option_strings) & SPEC_FLAGS and not hasattr(a, "spec_option")]


@pytest.mark.parametrize("surface", spec_options.COMMANDS)
def test_every_spec_option_of_a_command_is_made_from_the_metadata(surface):
    parser = _subparsers(build_parser())[surface]
    assert hand_declared(parser) == []
    made = {a.spec_option: a for a in parser._actions if hasattr(a, "spec_option")}
    for o in spec_options.options(surface):  # each option the metadata gives this command is there, as made
        action = made.pop(o.key)
        assert action.option_strings == [o.named(surface)] and action.dest == o.dest(surface)
        assert action.default is None and action.choices == o.field.choices and action.help
    assert set(made) <= {("spec", "file")}  # and nothing else but the spec file instead of them


def test_a_spec_option_declared_by_hand_is_found():
    """The check can fail: ``--warmup`` added to a command by hand (nightly has no warm-up option) is named."""
    parser = _subparsers(build_parser())["nightly"]
    parser.add_argument("--warmup", type=int)
    assert hand_declared(parser) == ["--warmup"]


def test_pytests_options_are_the_metadatas():
    from bench_cases import conftest

    declared: dict[str, dict] = {}

    class Parser:
        def getgroup(self, name):
            return self

        def addoption(self, name, **kw):
            declared[name] = kw

    conftest.pytest_addoption(Parser())
    expected = {o.named("pytest"): o.kwargs("pytest", conftest.HELP.get(o.name))
                for o in spec_options.options("pytest")}
    assert declared.pop("--fleetbench-spec")["dest"] == "fleetbench_spec"
    assert declared == expected
    assert {"--fleetbench-case", "--fleetbench-world", "--fleetbench-no-check", "--fleetbench-timeout"} <= set(expected)


def _literals(tree: ast.AST) -> list[tuple[int, str]]:
    """The string constants of a module that are not docstrings."""
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    return [(n.lineno, n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs]


def names_written_out(sources) -> list[str]:
    """``path:line name`` for each harness name of a spec option (``--fleetbench-steps``,
    ``FLEETBENCH_BENCH_STEPS``) written out in code: made by the table, it is spelled nowhere else."""
    generated = {o.named(s) for s in ("pytest", "asv") for o in spec_options.options(s)}
    return [f"{os.path.relpath(path, ROOT)}:{line} {text}" for path, tree in sources
            if path not in (BUILDER, METADATA) for line, text in _literals(tree) if text in generated]


def test_no_harness_name_of_a_spec_option_is_written_out():
    assert names_written_out(_sources("suite", "bench_cases")) == []
    bad = ast.parse("NAME = 'FLEETBENCH_BENCH_STEPS'\ndef f(g):\n    g.addoption('--fleetbench-warmup')\n")
    assert names_written_out([(os.path.join(ROOT, "bench_cases", "x.py"), bad)]) == \
        ["bench_cases/x.py:1 FLEETBENCH_BENCH_STEPS"]  # --fleetbench-warmup is no option: found by the pytest test


def test_a_new_field_is_an_option_everywhere_its_part_is(monkeypatch):
    """What the next option (say ``--label TEXT``) takes: one field with its metadata, and run, ab,
    bisect, nightly, pytest and asv all have it, each by its own name, built by the one builder."""
    import dataclasses

    from suite.cli.options import add_spec, given
    from suite.run_spec import Selection
    from suite.validate import spec

    @dataclasses.dataclass(frozen=True)
    class WithLabel(Selection):
        label: str | None = spec(None, "a label of the run")

    monkeypatch.setitem(spec_options.PARTS, "selection", WithLabel)
    monkeypatch.setattr(spec_options, "TABLE", spec_options._table())
    got = {s: [o.named(s) for o in spec_options.options(s) if o.name == "label"] for s in SURFACES}
    assert got == {"run": ["--label"], "ab": ["--label"], "bisect": ["--label"],
                   "nightly": ["--label"], "pytest": ["--fleetbench-label"], "asv": ["FLEETBENCH_BENCH_LABEL"]}
    for surface in ("run", "ab"):  # the command line, parsed and built
        parser = argparse.ArgumentParser()
        add_spec(parser, surface, file="")
        args = parser.parse_args(["--label", "m:f", "--case", "mlp/plain"])
        spec = spec_options.spec_from(given(args, surface))
        assert spec.selection.label == "m:f" and spec.selection.cases == ("mlp/plain",)
    env = spec_options.spec_from(spec_options.given_env({"FLEETBENCH_BENCH_LABEL": " m:f "}))
    assert env.selection.label == "m:f" and env.selection.tags == ()


def test_option_names_are_unique_on_each_surface(monkeypatch):
    import dataclasses

    from suite.run_spec import RunOptions
    from suite.validate import spec

    @dataclasses.dataclass(frozen=True)
    class Clash(RunOptions):
        warm: int = spec(0, "", option="--warmup")

    monkeypatch.setitem(spec_options.PARTS, "run", Clash)
    with pytest.raises(TypeError, match="share a named"):
        spec_options._table()


# ---- one builder -------------------------------------------------------------------------------------------------
def _reads_options(node: ast.AST) -> bool:
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and n.id in ("args", "environ"):
            return True
        if isinstance(n, ast.Attribute) and n.attr in ("getoption", "environ"):
            return True
    return False


def _builds_a_spec(node: ast.AST) -> bool:
    for n in ast.walk(node):
        if isinstance(n, ast.Call):
            f = n.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            if name in PARTS or name == "from_json":
                return True
    return False


def second_builders(sources) -> list[str]:
    """``path:line function`` for each function outside the builder that turns options (a command's ``args``,
    pytest's ``getoption``, the environment) into a part of a spec, or that reads a spec file itself."""
    out = []
    for path, tree in sources:
        if path == BUILDER:
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                reads_file = any(isinstance(n, ast.Attribute) and n.attr == "from_json" for n in ast.walk(node))
                if reads_file or (_reads_options(node) and _builds_a_spec(node)):
                    out.append(f"{os.path.relpath(path, ROOT)}:{node.lineno} {node.name}")
    return out


def test_one_builder_turns_options_into_a_spec():
    assert second_builders(_sources("suite", "bench_cases")) == []


@pytest.mark.parametrize("code", [
    "def spec(args):\n    return RunOptions(steps=args.steps)\n",
    "def spec(config):\n    return Selection(cases=config.getoption('fleetbench_case'))\n",
    "def spec(environ):\n    return RunSpec(Selection(tags=(environ['T'],)))\n",
    "def spec(text):\n    return RunSpec.from_json(text)\n",
])
def test_the_structural_rule_finds_a_second_builder(code):
    found = second_builders([(os.path.join(ROOT, "bench_cases", "x.py"), ast.parse(code))])
    assert found == ["bench_cases/x.py:1 spec"]


@pytest.fixture
def seen(monkeypatch):
    """The one builder, patched to note each call's place (and whether it resumed a run)."""
    calls: list[tuple[str, bool]] = []
    real = spec_options.spec_from

    def spy(given, resumed=None):
        calls.append((given.surface, resumed is not None))
        return real(given, resumed)

    monkeypatch.setattr(spec_options, "spec_from", spy)
    return calls


@pytest.fixture
def fake_ranks(monkeypatch):
    from tests.fakes import FakeRankPool

    monkeypatch.setattr(suite.runtime, "RankPool", FakeRankPool)
    monkeypatch.setattr(FakeRankPool, "made", [])
    return FakeRankPool


def test_run_and_its_resume_go_through_the_one_builder(seen, fake_ranks, tmp_path, capsys):
    results = tmp_path / "runs.jsonl"
    assert main(["run", "--case", "mlp/plain,mlp/overlap", "--size", "tiny", "--no-check", "--no-utilization",
                 "--rounds", "2", "--steps", "2", "--results", str(results)]) == 0
    assert seen == [("run", False)]
    first = results.read_text().splitlines()[0]
    assert json.loads(first)["schema_version"] == 4
    results.write_text(first + "\n")  # cut back to its first record: a run killed after it
    seen.clear()
    assert main(["run", "--resume", str(results), "--no-utilization"]) == 0
    assert seen == [("run", True)]  # the record's spec, through the same builder
    assert "resuming run" in capsys.readouterr().out


def test_ab_and_bisect_and_nightly_go_through_the_one_builder(seen, tmp_path):
    from suite.cli import ab, nightly

    ab.options(build_parser().parse_args(["ab", "A", "B", "--case", "mlp/plain", "--nproc", "2"]))
    ab.options(build_parser().parse_args(["bisect", "A", "B", "--case", "mlp/plain", "--nproc", "2"]))
    args = build_parser().parse_args(["nightly", "--plan", "--device", "cpu", "--case", "mlp/plain", "--worlds", "2",
                                      "--out", str(tmp_path / "n"), "--machine", "m"])
    nightly.plan_of(args, nightly.chosen(args))
    assert seen == [("ab", False), ("bisect", False), ("nightly", False)]


def test_pytest_and_asv_go_through_the_one_builder(seen, monkeypatch):
    import importlib

    from bench_cases import _matrix, conftest

    class Config:
        stash: dict = {}

        def getoption(self, name, default=None):
            return {"fleetbench_case": ["mlp/plain"], "fleetbench_steps": 3}.get(name, default)

    assert conftest.spec_of(Config()).run.steps == 3
    assert _matrix.env_spec({"FLEETBENCH_BENCH_CASES": "mlp/plain"}).selection.cases == ("mlp/plain",)
    for k in [k for k in os.environ if k.startswith("FLEETBENCH_BENCH_")]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("FLEETBENCH_BENCH_CASES", "mlp/plain")
    monkeypatch.setenv("FLEETBENCH_BENCH_STEPS", "3")
    from bench_cases import asv_cases

    try:
        assert importlib.reload(asv_cases).STEPS == 3  # asv's discovery imports the benchmarks
    finally:
        monkeypatch.undo()
        importlib.reload(asv_cases)
    assert seen[:3] == [("pytest", False), ("asv", False), ("asv", False)]


def test_a_spec_file_and_an_option_beside_it_are_one_refusal_everywhere(tmp_path):
    spec = tmp_path / "spec.json"
    spec.write_text("{}")
    for surface, name in (("run", "--steps"), ("pytest", "--fleetbench-steps"), ("asv", "FLEETBENCH_BENCH_STEPS")):
        given = spec_options.Given(surface, {("run", "steps"): 3}, "{}" if surface == "asv" else str(spec))
        with pytest.raises(SpecError, match=f"states the selection and options; {name} given too: give one or the "
                                            f"other"):
            spec_options.spec_from(given)
    # ab's run options given beside its spec file replace the file's; its selection may not be given beside it
    ab = spec_options.spec_from(spec_options.Given("ab", {("run", "steps"): 3}, str(spec)))
    assert ab.run.steps == 3 and ab.ab is not None
    with pytest.raises(SpecError, match="states the selection; --case given too"):
        spec_options.spec_from(spec_options.Given("ab", {("selection", "cases"): ["mlp/plain"]}, str(spec)))


@pytest.mark.parametrize("surface,value,words", [
    ("run", 0, "--steps 0: must be >= 1 and <= 1000000"),
    ("pytest", 0, "--fleetbench-steps 0: must be >= 1 and <= 1000000"),
    ("asv", 0, "FLEETBENCH_BENCH_STEPS 0: must be >= 1 and <= 1000000"),
])
def test_a_refusal_names_the_option_as_its_place_spells_it(surface, value, words):
    with pytest.raises(SpecError) as info:
        spec_options.spec_from(spec_options.Given(surface, {("run", "steps"): value}))
    assert str(info.value) == words
    with pytest.raises(SpecError, match="FLEETBENCH_BENCH_WORLDS='x': must be a whole number >= 1"):
        spec_options.given_env({"FLEETBENCH_BENCH_WORLDS": "2,x"})


# ---- one validation ----------------------------------------------------------------------------------------------
def test_the_statistics_bounds_are_their_fields_metadata():
    for kw, words in [(dict(delta=0.0), "--delta 0.0: must be a finite number > 0 and < 1"),
                      (dict(confidence=1.0), "--confidence 1.0: must be a finite number > 0.5 and < 1"),
                      (dict(rotate=1), "--rotate 1: must be >= 2"),
                      (dict(budget_s=float("inf")), "--budget inf: must be a finite number of seconds > 0"),
                      (dict(trim=0.5), "--trim 0.5: must be a finite number >= 0 and < 0.5")]:
        with pytest.raises(SpecError) as info:
            SeqOptions(**kw)
        assert str(info.value).startswith(words), str(info.value)
    with pytest.raises(SpecError, match="--delta 0.1 is above --threshold 0.05"):  # a combination: its own words
        SeqOptions(delta=0.1)


class NoRanks:
    def __init__(self, *a, **k):
        raise AssertionError("a rank pool was started despite bad input")


@pytest.mark.parametrize("argv,words", [
    (["run", "--steps", "0"], "--steps 0: must be >= 1 and <= 1000000"),
    (["ab", "A", "B", "--case", "mlp/plain", "--delta", "0"], "--delta 0.0: must be a finite number > 0 and < 1"),
    (["bisect", "A", "B", "--case", "mlp/plain", "--retries", "-1"], "--retries -1: must be >= 0"),
    (["nightly", "--plan", "--persist", "0"], "--persist 0: must be >= 1 and <= 10000"),
    (["nightly", "--plan", "--limit", "0"], "--limit 0.0: must be a finite number of minutes > 0 and <= 525600"),
    (["nightly", "--plan", "--gate-budget", "-1"], "--gate-budget -1.0: must be a finite number of minutes > 0"),
    (["nightly", "--plan", "--rounds", "0"], "--rounds 0: must be >= 1 and <= 100000"),
    (["doctor", "--hang-timeout", "0"], "--hang-timeout 0.0: must be a finite number of seconds > 0 and <= 86400"),
    (["comm", "--timeout", "0.5"], "--timeout 0.5: must be a finite number of seconds >= 1 and <= 604800"),
    (["comm", "-n", "0"], "--iters 0: must be >= 1 and <= 1000000"),
    (["comm", "-w", "-1"], "--warmup -1: must be >= 0 and <= 1000000"),
    (["comm", "-f", "1"], "--step-factor 1: must be >= 2"),
    (["figures", "host", "--rounds", "0"], "--rounds 0: must be >= 1 and <= 100000"),
    (["figures", "host", "--timeout", "nan"], "--timeout nan: must be a finite number of seconds > 0"),
    (["comm", "--rounds", "0"], "--rounds 0: must be >= 1 and <= 100000"),
])
def test_every_commands_bad_number_is_one_error_in_one_style(monkeypatch, capsys, argv, words):
    monkeypatch.setattr(suite.runtime, "RankPool", NoRanks)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and f"fleetbench {argv[0]}: error: {words}" in err, err


def test_no_command_restates_a_bound_beside_the_metadata():
    """``require_number`` is gone: a bound is a field's metadata, and commands have nothing else to state it with."""
    from suite.cli import checks

    assert not hasattr(checks, "require_number") and not hasattr(checks, "require_seconds")
    calls = [f"{os.path.relpath(p, ROOT)}:{n.lineno}" for p, tree in _sources("suite", "bench_cases")
             for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id in ("require_number", "require_seconds")]
    assert calls == []
