"""Typed records all the way to the readers (issue 44, item 3): the report, `compare` and `ab` read a record's parts
by their typed fields, never by a string; a field renamed or misspelt is a type error (mypy) and an AttributeError,
not a silent None; the record's JSON is the same bytes as before the parts were typed."""
from __future__ import annotations

import ast
import dataclasses
import json
import math
import os
import subprocess
import sys
import tomllib

import pytest

from suite.ab import protocol
from suite.results import records as R
from suite.results.records import CaseRecord, Metrics, NonfiniteLoss, Stat, read_records

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OLD_RECORDS = os.path.join(ROOT, "tests", "data", "records-schema4.jsonl")  # written before the parts were typed
PARTS = (R.Metrics, R.Stat, R.NonfiniteLoss, R.Describe, R.Precision, R.Structure, R.CheckSummary)


# ---- the JSON is what it was ----------------------------------------------------------------------------------
# Fields added since tests/data/records-schema4.jsonl was written, each with the value an older record reads as:
# a record read and written again carries them, at exactly these values, and is otherwise the same bytes.
ADDED_SINCE = {("check", "kind"): "exact", ("spec", "selection", "strategies"): [],
               ("spec", "selection", "set_baseline"): False, ("spec", "selection", "varies"): []}


def _without_added(text: str, rec) -> str:
    data = json.loads(text)
    for path, value in ADDED_SINCE.items():
        *parents, key = path
        part = data
        for p in parents:
            part = part.get(p) or {}
        if key in part:
            assert part.pop(key) == value, (rec.case, path)
    return json.dumps(data, sort_keys=True, allow_nan=False)


def test_records_written_before_the_parts_were_typed_read_typed_and_write_the_same_bytes():
    """tests/data/records-schema4.jsonl was written by `fleetbench run` (mlp/plain, none, overlap at world 2) and
    two records made beside it (a non-finite loss with a step summary of no values, an error) by the code before
    Stat and NonfiniteLoss: read and written again, every line is the same bytes."""
    with open(OLD_RECORDS, encoding="utf-8") as fh:
        lines = fh.read().splitlines()
    recs = read_records(OLD_RECORDS)
    assert len(recs) == len(lines) == 5
    for rec, line in zip(recs, lines):
        assert _without_added(rec.to_json(), rec) == line, rec.case
    none, plain, overlap, nonfinite, broken = recs
    assert [r.case for r in recs] == ["mlp/none", "mlp/plain", "mlp/overlap", "mlp/nonfinite", "mlp/broken"]
    st = plain.metrics.step_time_s
    assert isinstance(st, Stat) and st.n == 12 and st.median is not None and st.q25 is not None and st.q75 is not None
    assert st.q25 <= st.median <= st.q75 and st.iqr == pytest.approx(st.q75 - st.q25)
    assert isinstance(nonfinite.metrics.nonfinite_loss, NonfiniteLoss)
    assert (nonfinite.metrics.nonfinite_loss.rank, nonfinite.metrics.nonfinite_loss.step) == (1, 2)
    empty = nonfinite.metrics.step_time_s
    assert empty is not None and empty.n == 0 and empty.median is not None and math.isnan(empty.median)
    assert overlap.describe.engine["strategy"] == "bucketed" and overlap.describe.precision is not None
    assert none.metrics.speedup is not None and overlap.structure.allreduce_ops == 4
    assert broken.metrics.empty and broken.structure.empty and broken.check is None
    assert json.loads(lines[1])["metrics"]["step_time_s"] == plain.metrics.step_time_s.to_dict()


def test_a_metric_a_record_lacks_reads_as_none_and_a_summary_keeps_only_what_it_has():
    base = {"kind": "fleetbench.case", "schema_version": R.SCHEMA_VERSION, "case": "mlp/plain", "model": "mlp",
            "world_size": 2, "config": {}, "run_id": "r"}
    rec = CaseRecord.from_dict(dict(base, metrics={}), "line 1")
    assert rec.metrics.speedup is None and rec.metrics.step_time_s is None and rec.metrics.nonfinite_loss is None
    assert rec.metrics.empty and json.loads(rec.to_json())["metrics"] == {}
    rec = CaseRecord.from_dict(dict(base, metrics={"step_time_s": {"median": 0.1, "n": 3}}), "line 2")
    assert rec.metrics.step_time_s == Stat(n=3, median=0.1) and rec.metrics.step_time_s.iqr is None
    assert json.loads(rec.to_json())["metrics"] == {"step_time_s": {"median": 0.1, "n": 3}}  # no key added
    with pytest.raises(R.ResultsFileError, match=r"line 3: field 'metrics.step_time_s.p90' is not a statistic"):
        CaseRecord.from_dict(dict(base, metrics={"step_time_s": {"median": 0.1, "p90": 0.2}}), "line 3")
    with pytest.raises(R.ResultsFileError, match=r"line 4: field 'metrics.nonfinite_loss.step' is 'two'"):
        CaseRecord.from_dict(dict(base, metrics={"nonfinite_loss": {"rank": 0, "step": "two"}}), "line 4")


# ---- a part is not a mapping ----------------------------------------------------------------------------------
@pytest.mark.parametrize("part", PARTS, ids=lambda c: c.__name__)
def test_a_part_has_no_mapping_reads_a_name_it_lacks_is_an_error(part):
    obj = part("pass") if part is R.CheckSummary else part(0, 1) if part is R.NonfiniteLoss else part()
    for name in ("get", "keys", "items", "values", "__getitem__", "__iter__", "__contains__"):
        assert not hasattr(obj, name), (part.__name__, name)
    with pytest.raises(TypeError):
        obj["speedup"]  # the read itself is the test
    with pytest.raises(AttributeError):
        obj.speedupp  # noqa: B018 - the read itself is the test
    assert isinstance(obj.to_dict(), dict)


# ---- the readers' sources: attributes only ----------------------------------------------------------------------
# the readers of records: the report, compare (and the rest of results/), ab; run's table and the live harness
READERS = ("suite/report/", "suite/results/", "suite/ab/", "suite/cli/run.py", "suite/cli/compare.py",
           "bench_cases/test_cases.py")
# an attribute of these names, on anything, is a record's part (``rec.metrics``, ``t.metrics``, ``rec.describe``)
ROOTS = {"metrics": R.Metrics, "describe": R.Describe, "structure": R.Structure, "check": R.CheckSummary}
MAPPING_API = ("get", "keys", "items", "values")


def _allowed(part: type) -> set[str]:
    return {n for n in dir(part) if not n.startswith("_")} | {f.name for f in dataclasses.fields(part)}


def _field_part(part: type, name: str) -> type | None:
    """The part type a field of ``part`` holds (``Metrics.step_time_s``: Stat), or None (not a part)."""
    import typing

    hint = typing.get_type_hints(part).get(name)
    for arg in (typing.get_args(hint) or (hint,)):
        if isinstance(arg, type) and issubclass(arg, R._Part):
            return arg
    return None


class _Reads(ast.NodeVisitor):
    """Every read of a record part in one source: a part is an attribute named as ``ROOTS`` says, a field of a
    part that is itself a part (``.step_time_s``, ``.precision`` of a Describe, ``.nonfinite_loss``), or a name
    assigned one of those in the same function.  Reads of a part by a string or through a mapping's API, and
    attributes a part does not have, are problems."""

    def __init__(self, where: str):
        self.where, self.problems, self.names = where, [], [{}]

    def part(self, node: ast.expr) -> type | None:
        if isinstance(node, ast.Name):
            return next((s[node.id] for s in reversed(self.names) if node.id in s), None)
        if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or):  # ``rec.check or X``: the part, or X
            return self.part(node.values[0])
        if isinstance(node, ast.Attribute):
            base = self.part(node.value)
            if base is not None:
                return _field_part(base, node.attr)
            return ROOTS.get(node.attr)
        return None

    def bad(self, node: ast.AST, what: str) -> None:
        self.problems.append(f"{self.where}:{node.lineno}: {what}")

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.names.append({})
        self.generic_visit(node)
        self.names.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Assign(self, node: ast.Assign) -> None:
        self.generic_visit(node)
        for target in node.targets:
            pairs = [(target, node.value)]
            if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple) \
                    and len(target.elts) == len(node.value.elts):  # ``m, k = rec.metrics, ...``
                pairs = list(zip(target.elts, node.value.elts))
            for name, value in pairs:
                if isinstance(name, ast.Name):
                    part = self.part(value)
                    if part is not None:
                        self.names[-1][name.id] = part
                    else:
                        self.names[-1].pop(name.id, None)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        part = self.part(node.value)
        if part is not None and isinstance(node.slice, ast.Constant):
            self.bad(node, f"{part.__name__} read by a string: {ast.unparse(node)}")
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        part = self.part(node.value)
        if part is not None and node.attr in MAPPING_API:
            self.bad(node, f"{part.__name__} read as a mapping: {ast.unparse(node)}")
        elif part is not None and node.attr not in _allowed(part):
            self.bad(node, f"{part.__name__} has no field {node.attr!r}: {ast.unparse(node)}")
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        if isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr") and len(node.args) >= 2:
            part = self.part(node.args[0])
            name = node.args[1]
            if part is not None and isinstance(name, ast.Constant) and name.value not in _allowed(part):
                self.bad(node, f"{part.__name__} has no field {name.value!r}: {ast.unparse(node)}")
        self.generic_visit(node)

    def visit_Compare(self, node: ast.Compare) -> None:
        for op, right in zip(node.ops, node.comparators):
            part = self.part(right)
            if isinstance(op, (ast.In, ast.NotIn)) and part is not None:
                self.bad(node, f"{part.__name__} asked for a name as a mapping: {ast.unparse(node)}")
        self.generic_visit(node)


def _problems(source: str, where: str) -> list[str]:
    reads = _Reads(where)
    reads.visit(ast.parse(source))
    return reads.problems


def _sources() -> list[str]:
    out = []
    for top in ("suite", "bench_cases"):
        for root, _, files in os.walk(os.path.join(ROOT, top)):
            out += [os.path.join(root, f) for f in files if f.endswith(".py")
                    and os.path.relpath(os.path.join(root, f), ROOT).startswith(READERS)]
    return sorted(out)


def test_the_readers_read_record_parts_by_their_fields_only():
    """No ``.get("…")``, ``["…"]``, ``in``, mapping call or unknown attribute on a record part in the report, compare,
    ab, run's table or the live harness (a misspelt field would read None through a mapping, silently)."""
    paths = _sources()
    assert len(paths) >= 20 and any(p.endswith("page.py") for p in paths) and any(p.endswith("trials.py")
                                                                                   for p in paths)
    found = []
    for path in paths:
        with open(path, encoding="utf-8") as fh:
            found += _problems(fh.read(), os.path.relpath(path, ROOT))
    assert not found, "record parts read by a string, as a mapping or by a name they lack:\n" + "\n".join(found)


def test_the_source_check_finds_each_kind_of_string_read():
    """The check above can fail: each way of reading a part by a string is found, typed reads are not."""
    bad = '''
def f(rec, r):
    m = rec.metrics
    a = m.get("speedup")
    b = r.metrics["samples_per_s"]
    c = m.step_time_s["median"]
    d = (rec.check or {}).get("message")
    e = rec.describe["buckets"]
    g = rec.describe.precision["cudnn_benchmark"]
    h = "speedup" in r.metrics
    i = getattr(m, "speedupp")
    j = m.speedupp
    k = r.structure.items()
    n = rec.metrics.nonfinite_loss["step"]
'''
    found = _problems(bad, "bad.py")
    assert [p.split(":")[1] for p in found] == [str(n) for n in (4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14)], found
    good = '''
def f(rec, r, m):
    a = rec.metrics.speedup
    b = r.metrics.step_time_s.median if r.metrics.step_time_s is not None else None
    c = rec.describe.engine.get("buckets")  # the engine's own keys: a plain dict
    d = rec.check.precision if rec.check is not None else None  # CheckSummary.precision: a str
    e = rec.metadata.get("torch")
    f = rec.structure.to_dict()["allreduce_ops"]  # the JSON form
    m = {"speedup": 1}
    g = m["speedup"]  # a name rebound to a dict is no longer the part
'''
    assert _problems(good, "good.py") == []


# ---- mypy reads the readers -------------------------------------------------------------------------------------
def test_the_mypy_configuration_checks_every_reader():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as fh:
        mypy = tomllib.load(fh)["tool"]["mypy"]
    assert "suite" in mypy["files"]
    strict = [o for o in mypy.get("overrides", []) if o.get("check_untyped_defs") and o.get("disallow_untyped_defs")]
    covered = {m for o in strict for m in o["module"]}
    assert {"suite.report.*", "suite.results.*", "suite.ab.*"} <= covered, covered
    assert not any(o.get("ignore_errors") or o.get("follow_imports") == "skip" for o in mypy.get("overrides", [])
                   if set(o["module"]) & covered)


SNIPPETS = {  # what a reader might write: mypy must refuse each "bad" one and accept the "good" one
    "bad_name": "def f(r: CaseRecord) -> object:\n    return r.metrics.speedupp\n",
    "bad_get": "def f(r: CaseRecord) -> object:\n    return r.metrics.get('speedup')\n",
    "bad_stat": "def f(r: CaseRecord) -> object:\n    return r.metrics.step_time_s['median']\n",
    "bad_structure": "def f(r: CaseRecord) -> object:\n    return r.structure['allreduce_ops']\n",
    "bad_trial": "def f(a: TrialAnswer) -> object:\n    return a.get('step_s')\n",
    "good": ("def f(r: CaseRecord, a: TrialAnswer) -> object:\n"
             "    st = r.metrics.step_time_s\n"
             "    return (r.metrics.speedup, st.median if st is not None else None, r.structure.allreduce_ops,\n"
             "            r.describe.engine.get('buckets'), a.step_s, a.machine.others_cpu_s if a.machine else 0)\n"),
}


def test_mypy_refuses_a_record_field_read_by_a_name_it_does_not_have(tmp_path):
    head = "from suite.ab.protocol import TrialAnswer\nfrom suite.results.records import CaseRecord\n\n\n"
    for name, body in SNIPPETS.items():
        (tmp_path / f"{name}.py").write_text(head + body)
    proc = subprocess.run([sys.executable, "-m", "mypy", "--config-file", os.path.join(ROOT, "pyproject.toml"),
                           "--cache-dir", str(tmp_path / "cache"), "--follow-imports=silent",
                           *sorted(str(p) for p in tmp_path.glob("*.py"))],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    errors = {os.path.basename(line.split(":")[0])[:-3] for line in proc.stdout.splitlines() if ": error:" in line}
    assert errors == {n for n in SNIPPETS if n.startswith("bad")}, proc.stdout + proc.stderr


# ---- compare reads CaseRecords; ab's answers are typed -------------------------------------------------------------
def test_compare_reads_records_and_pytest_benchmark_files_into_case_records(tmp_path):
    from suite.results.load import load_side, samples, windows

    side = load_side(OLD_RECORDS)
    rec = side.cases["mlp/plain@2"]
    assert isinstance(rec, CaseRecord) and side.where["mlp/plain@2"] == f"{OLD_RECORDS}:2"
    k = rec.metrics.steps_per_window
    assert k and windows(rec) == [w / k for w in rec.metrics.window_s or []]
    assert samples(rec) == rec.metrics.step_times_s
    bench = tmp_path / "b.json"
    bench.write_text(json.dumps({"machine_info": {}, "benchmarks": [
        {"name": "test_step[mlp/plain@2]", "stats": {"data": [0.1, 0.2]},
         "extra_info": {"case": "mlp/plain", "world_size": 2, "verdict": "pass", "steps_per_window": 4,
                        "window_s": [0.4, 0.8], "structure": {"allreduce_ops": 10}, "samples_per_s": 80.0}}]}))
    got = load_side(str(bench)).cases["mlp/plain@2"]
    assert isinstance(got, CaseRecord) and got.structure.allreduce_ops == 10 and got.metrics.samples_per_s == 80.0
    assert windows(got) == [0.1, 0.2] and samples(got) == [0.1, 0.2] and got.verdict == "pass"


# the keys a version-2 trial server wrote before the answers were typed (what a client of any checkout reads)
OLD_KEYS = {"trial": {"window_s", "step_s", "step_times_s", "losses", "machine"},
            "prepare": {"key", "describe", "config"},  # "inject" went with the calibration (never read by a client)
            "select": {"case", "model", "variant", "config", "skip"}, "origin": {"rank", "suite"},
            "hello": {"protocol", "version", "suite", "python", "pid"}}


def test_the_trial_answers_are_typed_and_keep_their_keys_on_the_wire():
    trial = protocol.TrialAnswer(0.2, [0.4, 0.41], [0.2, 0.21], [2.0, math.nan], protocol.TrialMachine(0.1, 4.0))
    line = protocol.encode(trial.to_dict())
    back = protocol.TrialAnswer.from_dict(protocol.decode(line) | {"id": 3, "ok": True})
    assert back.step_s == 0.2 and back.machine == protocol.TrialMachine(0.1, 4.0) and math.isnan(back.losses[1])
    assert set(trial.to_dict()) == OLD_KEYS["trial"]
    assert set(protocol.Prepared("k").to_dict()) == OLD_KEYS["prepare"]
    assert protocol.Prepared.from_dict({"key": "k", "inject": 0.0}) == protocol.Prepared("k")  # an older server's
    assert set(protocol.SelectedCase("mlp/plain").to_dict()) == OLD_KEYS["select"]
    assert set(protocol.RankOrigin(0, "/x/suite/__init__.py").to_dict()) == OLD_KEYS["origin"]
    assert set(protocol.hello()) == OLD_KEYS["hello"]
    # an earlier server's answer (no machine state) reads; one without its time is refused by name
    old = protocol.TrialAnswer.from_dict({"window_s": [0.4], "step_s": 0.1, "step_times_s": [0.1], "losses": [1.0]})
    assert old.machine is None
    with pytest.raises(protocol.ProtocolError, match="HEAD's trial answer: field 'step_s' is missing"):
        protocol.TrialAnswer.from_dict({"losses": [1.0]}, "HEAD's trial answer")
    with pytest.raises(protocol.ProtocolError, match="field 'losses' is"):
        protocol.TrialAnswer.from_dict({"step_s": 0.1, "losses": [None]})


def test_ab_refuses_a_trial_answer_that_is_not_one():
    from suite.ab.client import TrialError
    from suite.ab.stats import SeqOptions
    from suite.ab.trials import Side, _prepare
    from tests.fakes import FakeServer as _FakeServer
    from tests.fakes import ab_spec as _ab_spec

    class Server(_FakeServer):
        def request(self, op, **fields):
            return {"losses": [1.0]} if op == "trial" else super().request(op, **fields)  # no step_s

    side = Side("HEAD", "h", "h", "", "/nowhere", Server(0.1))
    with pytest.raises(TrialError, match="HEAD: the trial mlp/plain answer: field 'step_s' is missing") as exc:
        _prepare(side, "mlp/plain", _ab_spec(SeqOptions()))
    assert exc.value.kind == "ProtocolError"


def test_the_runner_no_longer_imports_the_report():
    """The runner (layer 8) builds the timeline of a trace through suite.measure.timeline, not the report."""
    with open(os.path.join(ROOT, "suite", "runner.py"), encoding="utf-8") as fh:
        tree = ast.parse(fh.read())
    imported = {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not any(m.startswith("report") or m.startswith(".report") or "report" in m.split(".") for m in imported)
    assert "measure.timeline" in imported


def test_records_has_no_file_utilities_left():
    """The file utilities live in suite/outputs.py (the one way a file is written and an input opened)."""
    from suite import outputs

    for name in ("open_input", "loads_bounded", "json_problem", "name_problem", "write_atomic", "ShortWrite",
                 "NAME_CHARS", "MAX_DEPTH"):
        assert name not in R.__all__ and getattr(R, name, None) in (None, getattr(outputs, name)), name
    assert outputs.name_problem("run-1") is None and "is not a name" in str(outputs.name_problem("../x"))
    with pytest.raises(outputs.InputError, match="w: JSON nested deeper than 64 levels"):
        outputs.loads_bounded("[" * 70 + "]" * 70, "w")
    assert Metrics.__module__ == "suite.results.records"
