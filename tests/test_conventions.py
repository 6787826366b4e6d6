"""The project's conventions, each a rule over the code or its outputs: one list of metric names; typed values
from the rank to the record; pytest-benchmark's conventions in bench_cases/; cases prove their names; the probe
table names tests that exist; a test session leaves no fleetbench-* entry in its TMPDIR.  (The layers and the
rank functions' rules are tests/test_architecture.py.)"""
from __future__ import annotations

import ast
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from suite.cases import CASES, RECORDED, REQUIRES, SMOKE, VARIANTS, select_cases
from suite.check import harness
from suite.cli.main import build_parser
from suite.comm.buckets import SIZED_BUCKETS, plan, sized_bucket_mb
from suite.config import ConfigError, StrategyConfig
from suite.measure import timing
from suite.measure.summary import Timed, summarize
from suite.measure.timing import CasePrepared, RankTiming, VariantTiming, prepare_case
from suite.model_registry import REGISTRY, SIZES
from suite.models import model_info
from suite.results import records
from suite.results.load import load_side, windows
from suite.results.records import (
    METRIC_NAMES,
    METRIC_UNITS,
    CaseRecord,
    CheckSummary,
    Describe,
    Metrics,
    ResultsFileError,
    append_record,
)
from suite.run_spec import ResolvedCase, RunFacts, RunOptions, Selection
from suite.runner import CaseRunner
from suite.selection import base_cases, resolve, resolve_at
from tests.clitools import nested_pytest_env
from tests.fakes import FakeLauncher, fake_answers, fake_runner, resolved

ROOT = Path(__file__).resolve().parent.parent


# ---- one list of metric names: the fields of suite.results.records.Metrics -----------------------------------------
def _answers(names: list[str], ranks: int = 2) -> list[RankTiming]:
    """What ``time_on_rank`` answers, made up (three rounds of two steps)."""
    out = []
    for rank in range(ranks):
        variants = {n: {"windows": [0.2 + 0.01 * i, 0.21, 0.22], "step_times": [0.1, 0.11] * 3,
                        "losses": [2.0, 1.9] * 3, "comm_calls_per_step": {"world/all_reduce": 2.0},
                        "comm_bytes_per_step": {"world/all_reduce": 4096.0}, "host_syncs": 0, "threads": 1,
                        "describe": {"strategy": n}, "peak_memory_bytes": 1000 + rank,
                        "peak_memory_kind": "process_rss"} for i, n in enumerate(names)}
        out.append(RankTiming.from_dict({"rank": rank, "variants": variants}))
    return out


class _Launcher:
    """Answers every rank function with made-up timing answers (no process is started)."""

    def __init__(self, names: list[str]):
        self.names = names

    def run(self, fn, kwargs, timeout=None):
        if fn is prepare_case:
            return [CasePrepared(r, {"strategy": "plain"}) for r in range(2)]
        return _answers(self.names)


def _rc(name: str) -> ResolvedCase:
    (case,) = [c for c in CASES if c.name == name]
    return ResolvedCase(case, StrategyConfig())


def test_every_metric_the_summary_and_the_runner_write_is_a_metric_name():
    names = ["plain", "none", "overlap"]
    runner = CaseRunner(_Launcher(names), 2, RunOptions(per_rank_batch=4, utilization=True), metadata={},
                        say=lambda _: None)
    measured = runner._time([_rc("mlp/overlap"), _rc("mlp/none")], names)  # summary, speedup, exposed, utilization
    prepared = runner.prepare(_rc("mlp/plain"))
    prepared.key = "plain"
    written = {n: t.metrics for n, t in measured.items()} | {"prepared": prepared.metrics().metrics}
    for name, metrics in written.items():
        assert isinstance(metrics, Metrics) and set(metrics.to_dict()) <= set(METRIC_NAMES), name
    for key in ("speedup", "exposed_comm_s", "busbw_GBps", "utilization"):
        assert key in written["overlap"].to_dict(), key
    assert written["prepared"].workload is not None
    rec = runner.record(_rc("mlp/overlap"), None, measured["overlap"])
    assert isinstance(rec.metrics, Metrics) and rec.metrics.comm_calls_per_step == {"world/all_reduce": 2.0}
    assert rec.describe.engine["strategy"] == "overlap"
    assert rec.structure.comm_calls_per_step == {"world/all_reduce": 2.0}


def test_the_registry_uses_the_one_list():
    assert RECORDED == METRIC_NAMES
    for case in CASES:
        assert set(case.records) <= set(METRIC_NAMES), (case.name, set(case.records) - set(METRIC_NAMES))


def _python_files():
    for top in ("suite", "bench_cases"):
        for root, _, files in os.walk(os.path.join(ROOT, top)):
            for f in files:
                if f.endswith(".py"):
                    yield os.path.join(root, f)


# modules that build or read records: a dict literal with metric names as keys there is a second schema
# (the ranks' answers, the ab protocol and pytest-benchmark's extra_info are other formats)
RECORD_SIDE = ("suite/measure/summary.py", "suite/runner.py", "suite/results/", "suite/report/", "suite/cli/")


def test_no_other_module_lists_metric_names():
    """A tuple, list or set literal naming three metrics or more is a second list of metric names (and so is
    a dict literal keyed by them, where records are built or read)."""
    found = []
    for path in _python_files():
        rel = os.path.relpath(path, ROOT)
        if rel == os.path.join("suite", "results", "records.py"):
            continue
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else \
                node.keys if isinstance(node, ast.Dict) and rel.startswith(RECORD_SIDE) else []
            names = [i.value for i in items if isinstance(i, ast.Constant) and i.value in METRIC_NAMES]
            if len(names) >= 3:
                found.append(f"{os.path.relpath(path, ROOT)}:{node.lineno}: {names}")
    assert not found, "metric names listed outside suite/results/records.py:\n" + "\n".join(found)
    assert set(METRIC_UNITS) <= set(METRIC_NAMES), set(METRIC_UNITS) - set(METRIC_NAMES)  # units of metrics only


READERS = ["suite/report", "suite/results/load.py", "suite/results/compare.py", "suite/cli/run.py",
           "bench_cases/test_cases.py"]


PART_API = ("empty", "to_dict", "from_dict")  # what a record's part has besides its fields (no mapping's get, items)


def _is_metrics(expr: ast.expr) -> bool:
    text = ast.unparse(expr)
    return text in ("m", "metrics") or text.endswith(".metrics")


def _is_str(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def test_the_report_compare_and_run_read_metrics_by_their_names():
    paths = [p for p in _python_files() if any(os.path.relpath(p, ROOT).startswith(r) for r in READERS)]
    assert len(paths) >= 5
    read, unknown = set(), []
    for path in paths:
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            key = None
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" \
                    and _is_metrics(node.func.value) and node.args and _is_str(node.args[0]):
                key = node.args[0].value
            elif isinstance(node, ast.Subscript) and _is_metrics(node.value) and _is_str(node.slice):
                key = node.slice.value
            elif isinstance(node, ast.Attribute) and _is_metrics(node.value) and not node.attr.startswith("_") \
                    and node.attr not in PART_API:
                key = node.attr
            if key is not None:
                read.add(key)
                if key not in METRIC_NAMES:
                    unknown.append(f"{os.path.relpath(path, ROOT)}:{node.lineno}: {key!r}")
    assert not unknown, "metrics read by a name Metrics does not have:\n" + "\n".join(unknown)
    assert {"samples_per_s", "speedup", "step_times_s", "window_s", "trace_file"} <= read


# ---- typed values from the rank to the record (no round trip through dicts) ----------------------------------------
CHECK = CheckSummary("pass", reference="DataParallelReference", param_error=1e-7, loss_error=2e-7, steps=3,
                     losses=[2.0, 1.9, 1.8])


@pytest.fixture
def no_round_trips(monkeypatch):
    """Metrics and CheckSummary never read from a dict or written to one (a round trip) while this holds."""
    def refuse(*args, **kwargs):
        raise AssertionError("a typed part went through a dict")

    for part in (Metrics, CheckSummary):
        monkeypatch.setattr(part, "from_dict", classmethod(refuse))
    monkeypatch.setattr(records._Part, "to_dict", refuse)


def test_the_ranks_answers_are_typed_and_the_summary_answers_metrics():
    answers = fake_answers(["plain", "none"])
    assert all(isinstance(a, RankTiming) and isinstance(a.variants["plain"], VariantTiming) for a in answers)
    out = summarize(answers, ["plain", "none"], 8, 2, 2, baseline="plain")
    assert all(isinstance(t, Timed) and isinstance(t.metrics, Metrics) and isinstance(t.describe, Describe)
               for t in out.values())
    assert out["plain"].metrics.speedup == 1.0 and out["plain"].describe.engine["allreduce_ops"] == 10
    assert RankTiming.from_dict(json.loads(json.dumps(answers[0].to_dict()))) == answers[0]  # figures' raw data


def test_the_runner_records_the_summarys_metrics_and_the_harnesss_check_as_they_are(monkeypatch, no_round_trips):
    from suite import runner as R

    made: dict = {}

    def summary(*args, **kwargs):
        out = summarize(*args, **kwargs)
        made.update(out)
        return out

    monkeypatch.setattr(R, "summarize", summary)
    monkeypatch.setattr(R, "run_check", lambda *a, **k: CHECK)
    run = fake_runner(FakeLauncher())
    run.opts = type(run.opts)(**{**vars(run.opts), "check": True})
    (recs,) = list(run.run([resolved("mlp/plain"), resolved("mlp/overlap")]))
    for rec in recs:
        assert rec.check is CHECK and rec.verdict == "pass"
        assert isinstance(rec.metrics, Metrics) and rec.describe is made[rec.case.split("/")[1]].describe
        assert rec.metrics.samples_per_s == made[rec.case.split("/")[1]].metrics.samples_per_s
        assert rec.metrics.cpu_cores is not None  # the machine's state added to the same typed value
    assert records.Structure is type(recs[0].structure) and recs[0].structure.strategy == "plain"


def test_the_check_harness_answers_the_records_check_summary():
    from suite.config import StrategyConfig

    assert not hasattr(harness, "CheckResult")
    answers = [{"rank": r, "reference": "DataParallelReference", "precision": "float32", "per_step": [
        {"step": 1, "loss": 2.0, "ref_loss": 2.0, "loss_error": 0.0, "param_error": 0.0, "param_error_at": "w",
         "buffer_error": 0.0, "digest": "d", "expect_identical": True}]} for r in range(2)]
    res = harness.summarize(StrategyConfig(), answers)
    assert type(res) is CheckSummary and res.passed and res.losses == [2.0]


def test_ab_reads_each_record_once_into_its_types(monkeypatch):
    from suite.ab.stats import SeqOptions
    from suite.ab.trials import Side, compare_case
    from tests.fakes import FakeServer, ab_spec

    record = json.loads(CaseRecord("mlp/plain", "mlp", 2, {}, "r", verdict="pass", check=CHECK,
                                   metrics=Metrics(samples_per_s=100.0, step_time_s={"median": 0.1}),
                                   structure={"allreduce_ops": 4}).to_json())

    class Server(FakeServer):
        def request(self, op, **fields):
            if op == "structure":
                self.requests.append((op, fields))
                return {"record": record}
            return super().request(op, **fields)

    reads: list = []
    real = CaseRecord.from_dict.__func__

    def counted(cls, data, where=""):
        reads.append(where)
        return real(cls, data, where)

    monkeypatch.setattr(CaseRecord, "from_dict", classmethod(counted))
    base, head = (Side(label, label, label, "", "/nowhere", Server(speed)) for label, speed in
                  (("BASE", 0.100), ("HEAD", 0.125)))
    out = compare_case(base, head, "mlp/plain", 2, ab_spec(seq=SeqOptions(rotate=3, min_pairs=3, budget_s=60,
                                                                            restart=0)))
    assert out.verdict == "slower" and out.check == "pass -> pass" and out.structure_diff == [], out
    # each answer read once, where it arrives: one per preparation and side
    assert reads == [f"{s.label}'s record of mlp/plain" for s in (base, head)] + \
        [f"{s.label}'s record of mlp/plain" for _ in range(2) for s in (base, head)]
    for side in (base, head):
        rec = side.records["mlp/plain"]
        assert isinstance(rec, CaseRecord) and isinstance(rec.check, CheckSummary) and isinstance(rec.metrics, Metrics)
        assert math.isclose(rec.check.param_error, 1e-7) and rec.structure.allreduce_ops == 4


def test_the_report_receives_the_records_parts_as_types(monkeypatch, tmp_path, capsys):
    from suite.cli import report as cli_report
    from suite.cli.main import main

    results = tmp_path / "results.jsonl"
    append_record(str(results), CaseRecord("mlp/plain", "mlp", 2, {}, "r", verdict="pass", timestamp="t", check=CHECK,
                                           metrics=Metrics(samples_per_s=100.0)))
    got: list = []
    monkeypatch.setattr(cli_report, "build_report",
                        lambda recs, *a, **k: got.extend(recs) or {"problems": [], "plots": [], "traces": []})
    main(["report", str(results), "--out", str(tmp_path / "out")])
    capsys.readouterr()
    (rec,) = got
    assert isinstance(rec.metrics, Metrics) and rec.metrics.samples_per_s == 100.0
    assert isinstance(rec.check, CheckSummary) and rec.check.passed


# ---- pytest-benchmark's conventions in bench_cases/ ----------------------------------------------------------------
def _pytest_bench(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "bench_cases", *args], cwd=ROOT, env=nested_pytest_env(),
                          capture_output=True, text=True, timeout=timeout)


def test_smoke_is_a_handful_of_cases_distinct_from_default():
    smoke = [c.name for c in select_cases(tags=["smoke"])]
    default = [c.name for c in select_cases(tags=["default"])]
    assert sorted(smoke) == sorted(SMOKE) and len(smoke) <= 6
    assert set(smoke) < set(default)


@pytest.mark.heavy  # a pytest session as a subprocess, ~10 s: make test-slow
def test_the_default_bench_selection_is_the_smoke_cases_at_world_size_2():
    proc = _pytest_bench("--collect-only", "-q", timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ids = sorted(line.split("[", 1)[1].rstrip("]") for line in proc.stdout.splitlines() if "test_step[" in line)
    assert ids == sorted(f"{name}@2" for name in SMOKE), proc.stdout
    # a case named without --fleetbench-world runs at the one default world size
    proc = _pytest_bench("--collect-only", "-q", "--fleetbench-case", "mlp/plain", timeout=120)
    ids = [line.split("[", 1)[1].rstrip("]") for line in proc.stdout.splitlines() if "test_step[" in line]
    assert ids == ["mlp/plain@2"], proc.stdout
    # requested world sizes replace the default one; a case that cannot run at a size is collected (and skipped
    # with its reason when run)
    proc = _pytest_bench("--collect-only", "-q", "--fleetbench-case", "mlp/*", "--fleetbench-world", "1",
                         "--fleetbench-world", "4", timeout=120)
    ids = sorted(line.split("[", 1)[1].rstrip("]") for line in proc.stdout.splitlines() if "test_step[" in line)
    assert "mlp/plain@1" in ids and "mlp/plain@4" in ids and "mlp/hierarchical@4" in ids, proc.stdout
    assert "mlp/hierarchical@1" in ids and not any(i.endswith("@2") for i in ids), proc.stdout


@pytest.mark.heavy  # a real pytest-benchmark session, ~10 s: make test-slow
def test_saved_json_has_plain_params_short_groups_and_a_round_of_one_step(tmp_path):
    out = tmp_path / "bench.json"
    proc = _pytest_bench("--benchmark-only", "--fleetbench-case", "mlp/plain", "--fleetbench-case", "mlp/overlap",
                         "--fleetbench-world", "2", "--fleetbench-rounds", "2", "--fleetbench-steps", "2",
                         "--fleetbench-no-check", "--benchmark-json", str(out),
                         "--benchmark-storage", f"file://{tmp_path / 'storage'}", "--junitxml", str(tmp_path / "j.xml"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # pytest's own --junitxml keeps working for bench_cases: valid, one passed test per case
    from tests.clitools import cases, outcome, valid

    junit = cases(valid(tmp_path / "j.xml"))
    assert {n: outcome(tc) for n, tc in junit.items()} == {"test_step[mlp/plain@2]": ("passed", ""),
                                                           "test_step[mlp/overlap@2]": ("passed", "")}, junit
    text = out.read_text()
    assert "UNSERIALIZABLE" not in text
    saved = list((tmp_path / "storage").rglob("*.json"))
    assert saved and all("UNSERIALIZABLE" not in p.read_text() for p in saved)
    benches = {b["params"]["case"]: b for b in json.loads(text)["benchmarks"]}
    assert set(benches) == {"mlp/plain", "mlp/overlap"}
    for case, b in benches.items():
        assert b["params"] == {"case": case, "world": 2} and b["param"] == f"{case}@2"
        assert b["group"] == "mlp@2"
        e = b["extra_info"]
        assert e["case"] == case and e["world_size"] == 2 and e["steps_per_window"] == 2
        assert e["unit"] == "s per training step" and "steps_per_round" not in e
        assert "one training step" in e["round"] and "without the round trip" in e["round"]
        assert {"rank_window_s", "window_s", "step_times_s", "samples_per_s"} <= set(e["units"])
        # per window: every rank's window; the slowest is the window
        assert len(e["rank_window_s"]) == 2 and all(len(w) == 2 for w in e["rank_window_s"])
        assert e["window_s"] == [max(w) for w in e["rank_window_s"]]
        # each round pytest-benchmark timed is one step: the slowest rank's window over its 2 steps, nothing else
        assert b["stats"]["data"] == pytest.approx([w / 2 for w in e["window_s"]], rel=1e-9, abs=1e-12)
        assert all(math.isfinite(x) and x > 0 for x in b["stats"]["data"])
    # one short table per group, and the note after them
    assert "benchmark 'mlp@2'" in proc.stdout
    assert "fleetbench: what the tables above measure" in proc.stdout
    assert "is one training step" in proc.stdout
    # fleetbench compare reads the file: its windows are the rounds, per step
    side = load_side(str(out))
    for case, b in benches.items():
        assert windows(side.cases[f"{case}@2"]) == pytest.approx(b["stats"]["data"], rel=1e-9, abs=1e-12)


def _bench_file(path, extra: dict, data: list) -> str:
    path.write_text(json.dumps({"machine_info": {}, "benchmarks": [
        {"name": "test_step[mlp/plain@2]", "stats": {"data": data},
         "extra_info": {"case": "mlp/plain", "world_size": 2, "verdict": "pass", **extra}}]}))
    return str(path)


def test_compare_reads_per_step_files_and_the_older_per_round_ones(tmp_path):
    ranks = [0.50, 0.55, 0.60]  # the slowest rank's window of 5 steps, seconds
    per_step = [0.10, 0.11, 0.12]
    # now: a round is one step; window_s and steps_per_window beside it
    new = _bench_file(tmp_path / "new.json", {"steps_per_window": 5, "window_s": ranks}, per_step)
    # now, without window_s (another tool's or a trimmed file): the rounds are the per-step samples as they are
    new_bare = _bench_file(tmp_path / "new_bare.json", {"steps_per_window": 5}, per_step)
    # before: a round was a window of steps_per_round steps plus the round trip (0.2 s here); the ranks' own
    # windows in window_s, or only the rounds
    old = _bench_file(tmp_path / "old.json", {"steps_per_round": 5, "window_s": ranks, "round_trip_s": [0.2] * 3},
                      [w + 0.2 for w in ranks])
    old_bare = _bench_file(tmp_path / "old_bare.json", {"steps_per_round": 5}, ranks)
    for path in (new, new_bare, old, old_bare):
        assert windows(load_side(path).cases["mlp/plain@2"]) == pytest.approx(per_step), path
    bad = _bench_file(tmp_path / "bad.json", {"steps_per_window": 0}, per_step)
    with pytest.raises(ResultsFileError, match="extra_info.steps_per_window is 0"):
        load_side(bad)


def test_bench_windows_and_steps_default_to_fleetbench_runs():
    """The harnesses state no default of their own: pytest's options default to None and the spec (the one
    builder, ``spec_options.spec_from``) fills them in, as ``fleetbench run``'s do (tests/test_namespace.py changes
    one default and sees it in all of them)."""
    from bench_cases import asv_cases, conftest
    from suite import spec_options
    from suite.run_spec import RunOptions

    opts: dict = {}

    class Options:  # what conftest's pytest_addoption declares, name -> default
        def getgroup(self, name):
            return self

        def addoption(self, name, **kw):
            opts[name] = kw.get("default")

    conftest.pytest_addoption(Options())
    assert (opts["--fleetbench-rounds"], opts["--fleetbench-steps"], opts["--fleetbench-timeout"]) == (None,) * 3
    assert build_parser().parse_args(["run"]).steps is None  # run's too: the spec's default
    assert spec_options.spec_from(spec_options.Given("pytest", {})).run == RunOptions()
    if not any(k.startswith("FLEETBENCH_BENCH_") for k in os.environ):
        assert (asv_cases.ROUNDS, asv_cases.STEPS) == (RunOptions().rounds, RunOptions().steps)


# ---- cases prove their names ---------------------------------------------------------------------------------------
NAMED = {"fusion": ("fusion",), "overlap": ("overlap",), "multicomm": ("overlap", "communicators"),
         "hierarchical": ("nodes",), "compute_fusion": ("fused",)}


def _at(world: int, *cases: str, local_world: int | None = None, size: str = "cpu", sets: tuple = ()) -> dict:
    sel = Selection(cases=cases, size=size, sets=sets)
    return {rc.case.name: rc for rc in resolve_at(sel, base_cases(sel, size), world, local_world, size)}


def test_every_variant_named_for_a_communication_pattern_states_what_its_name_requires():
    declared = {v.name: v.requires for v in VARIANTS if v.requires}
    assert declared == NAMED
    assert {r for rs in declared.values() for r in rs} == set(REQUIRES)


@pytest.mark.parametrize("model", [m.name for m in REGISTRY])
def test_sized_buckets_give_2_to_16_buckets_at_every_size(model):
    """The rule (suite.comm.buckets.sized_bucket_mb): about a tenth of the gradient bytes, 2 to 16 buckets."""
    for size in SIZES:
        grads = model_info(model, size).gradients
        cap = sized_bucket_mb(grads)
        n = len(plan(grads, True, cap, 50))
        total_mb = sum(g[0] for g in grads) / 2**20
        assert SIZED_BUCKETS[0] <= n <= SIZED_BUCKETS[1], (model, size, cap, n)
        assert total_mb / 64 <= cap <= total_mb, (model, size, cap, total_mb)  # a share of the gradients


def test_default_run_overlaps_and_skips_one_node_hierarchical():
    """`fleetbench run`'s default selection at its default world (2) and size (cpu): every overlap and multicomm
    case plans 2 or more buckets on its communicators; */hierarchical is skipped, saying why."""
    resolved = resolve(Selection(), probe=False)
    assert resolved.worlds == (2,) and resolved.size == "cpu"
    seen = set()
    for rc, _ in resolved.matrix():
        if rc.case.variant in ("overlap", "multicomm"):
            seen.add(rc.case.variant)
            assert rc.skip is None and rc.plan.overlap and 2 <= rc.plan.buckets <= 16, (rc.case.name, rc.plan)
            assert rc.plan.communicators == (2 if rc.case.variant == "multicomm" else 1)
        if rc.case.variant == "hierarchical":
            seen.add("hierarchical")
            assert rc.skip and "at least 2 nodes of at least 2 ranks" in rc.skip and "1 node" in rc.skip, rc.skip
    assert seen == {"overlap", "multicomm", "hierarchical"}


def test_overlap_needs_two_buckets_and_a_set_bucket_size_still_wins():
    assert _at(2, "mlp/overlap")["mlp/overlap"].plan.buckets == 4  # 15.8 MB of gradients, cap 1.51 MiB
    rc = _at(2, "mlp/*", sets=("fuse_grad_size_in_MB=25",))["mlp/overlap"]
    assert rc.config.fuse_grad_size_in_MB == 25 and rc.plan.buckets == 1
    assert rc.skip.startswith("needs at least 2 buckets, the first launched before backward ends: "
                              "fuse_grad_size_in_MB=25 makes 1 bucket of the model's 15.8 MB"), rc.skip
    rc = _at(2, "mlp/*", sets=("sync_nccl_allreduce=true",))["mlp/overlap"]
    assert "sync_nccl_allreduce=True waits on each bucket" in rc.skip
    with pytest.raises(ConfigError, match="case mlp/overlap cannot run at world size 2: needs at least 2 buckets"):
        _at(2, "mlp/overlap", sets=("fuse_grad_size_in_MB=25",))  # named exactly: an error, before any rank


def test_multicomm_needs_buckets_on_two_communicators():
    assert _at(2, "mlp/multicomm")["mlp/multicomm"].skip is None
    rc = _at(2, "mlp/*", sets=("nccl_comm_num=1",))["mlp/multicomm"]
    assert rc.skip.startswith("needs buckets on at least 2 communicators: its 4 bucket(s) use 1"), rc.skip
    rc = _at(2, "mlp/*", sets=("fuse_grad_size_in_MB=100",))["mlp/multicomm"]  # one bucket: neither holds
    assert rc.skip.startswith("needs at least 2 buckets"), rc.skip


def test_hierarchical_needs_two_nodes_of_two_ranks_here_and_under_torchrun():
    assert "make 1 node," in _at(2, "mlp/*")["mlp/hierarchical"].skip
    four = _at(4, "mlp/hierarchical")["mlp/hierarchical"]
    assert four.skip is None and (four.plan.nodes, four.plan.ranks_per_node) == (2, 2)
    one_host = _at(4, "mlp/*", local_world=4)["mlp/hierarchical"]  # torchrun, one host of 4 ranks: one node
    assert "4 ranks in nodes of 4 make 1 node" in one_host.skip and "2 or more hosts" in one_host.skip
    two_hosts = _at(4, "mlp/hierarchical", local_world=2)["mlp/hierarchical"]
    assert two_hosts.skip is None and two_hosts.plan.nodes == 2


def test_fusion_needs_fewer_collectives_than_gradients():
    assert _at(2, "mlp/fusion")["mlp/fusion"].plan.buckets == 1
    unfused = ("fuse_all_reduce_ops=false", "sync_nccl_allreduce=false")  # buckets still, one tensor each
    rc = _at(2, "mlp/fus*", "mlp/overlap", sets=unfused)["mlp/fusion"]
    assert rc.skip == ("needs fewer collectives than gradients: 10 collective(s) for 10 gradient(s) "
                       "(fuse_all_reduce_ops=False)"), rc.skip
    rc = _at(2, "mlp/fus*", "mlp/plain", sets=("fuse_all_reduce_ops=false",))["mlp/fusion"]  # plain
    assert rc.skip == "needs fewer collectives than gradients, but its config does not bucket gradients"


def test_a_broken_precondition_is_caught_before_any_rank(monkeypatch, no_ranks):
    """Break the sizing on purpose (overlap back to a fixed 25 MB, as before this rule): the default mlp/overlap
    and mlp/multicomm are then skipped with the reason instead of being run under their names."""
    monkeypatch.setattr("suite.selection.sized_bucket_mb", lambda grads, layers=50: 25.0)
    rcs = _at(2, "mlp/*")
    for name in ("mlp/overlap", "mlp/multicomm"):
        assert rcs[name].skip and "makes 1 bucket" in rcs[name].skip, rcs[name].skip


def _record(rc, describe: dict):
    runner = CaseRunner(None, 2, RunOptions(check=False, utilization=False), metadata={}, reporter=False)
    return runner.record(rc, None, Timed(Metrics(), Describe.from_dict(describe)))


def test_an_engine_that_differs_from_its_plan_fails_the_case():
    rc = _at(2, "mlp/overlap")["mlp/overlap"]
    built = [{"params": 2, "layers": 1, "bytes": 1, "comm": 0}] * 4
    ok = _record(rc, {"strategy": "bucketed", "allreduce_ops": 4, "buckets": built, "launched_in_backward": 3})
    assert ok.verdict != "fail" and ok.structure.launched_in_backward == 3
    late = _record(rc, {"strategy": "bucketed", "allreduce_ops": 4, "buckets": built, "launched_in_backward": 0})
    assert late.verdict == "fail" and "no bucket was launched before backward ended" in late.error, late.error
    fewer = _record(rc, {"strategy": "bucketed", "allreduce_ops": 2, "buckets": built[:2], "launched_in_backward": 1})
    assert fewer.verdict == "fail" and "the plan has 4 bucket(s), the engine built 2" in fewer.error, fewer.error


def late_time_on_rank(**kwargs):
    """time_on_rank with buckets launched only once backward has returned: the hooks count gradients and launch
    nothing; finish_step launches every bucket."""
    from suite.comm import bucketed

    cls = bucketed.BucketedGradSync
    saved_launch, saved_note = cls._launch_ready, cls._note_launched_in_backward

    def launch(self):
        if not self._armed:  # finish_step has disarmed: backward is over
            saved_launch(self)

    def note_then_launch(self):
        saved_note(self)
        saved_launch(self)

    cls._launch_ready, cls._note_launched_in_backward = launch, note_then_launch
    try:
        return timing.time_on_rank(**kwargs)
    finally:
        cls._launch_ready, cls._note_launched_in_backward = saved_launch, saved_note


class _Late:
    """The pool, with its timing calls made through late_time_on_rank."""

    def __init__(self, pool):
        self.pool = pool

    def run(self, fn, kwargs=None, timeout=None):
        return self.pool.run(late_time_on_rank if fn is timing.time_on_rank else fn, kwargs, timeout=timeout)


@pytest.mark.parametrize("launch", ["as planned", "after backward"])
def test_the_ranks_launch_buckets_before_backward_ends_as_planned(pool2, launch):
    """mlp/overlap and mlp/multicomm on two ranks: 4 buckets each, at least one launched before backward ended
    in every step, as the plan said; with launches held until backward ended, the same cases fail."""
    rcs = list(_at(2, "mlp/plain", "mlp/overlap", "mlp/multicomm", size="tiny").values())
    launcher = pool2 if launch == "as planned" else _Late(pool2)
    runner = CaseRunner(launcher, 2, RunOptions(check=False, utilization=False, rounds=1, steps=2, warmup=1),
                        metadata={}, reporter=False, facts=RunFacts(size="tiny"))
    (records,) = list(runner.run(rcs))
    got = {r.case: r for r in records}
    for name in ("mlp/overlap", "mlp/multicomm"):
        rec = got[name]
        assert rec.describe.engine["allreduce_ops"] == 4 and len(rec.describe.engine["buckets"]) == 4
        if launch == "as planned":
            assert rec.verdict != "fail" and rec.describe.engine["launched_in_backward"] >= 1, (rec.verdict, rec.error)
        else:
            assert rec.describe.engine["launched_in_backward"] == 0
            assert rec.verdict == "fail" and "no bucket was launched before backward ended" in rec.error


@pytest.mark.heavy  # `fleetbench run` with its defaults, as a subprocess (about a minute): make test-slow
def test_fleetbench_run_with_its_defaults_overlaps_and_skips_one_node_hierarchical(tmp_path):
    import json
    import os
    import re
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    results = tmp_path / "runs.jsonl"
    proc = subprocess.run([sys.executable, "-m", "suite.cli.main", "run", "--rounds", "2", "--steps", "2",
                           "--warmup", "1", "--no-utilization", "--results", str(results)], cwd=root,
                          env={**os.environ, "PYTHONPATH": root}, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    recs = {r["case"]: r for r in map(json.loads, results.read_text().splitlines())}
    for name in ("resnet/overlap", "mlp/overlap", "mlp/multicomm"):
        rec = recs[name]
        assert rec["verdict"] == "pass" and len(rec["describe"]["buckets"]) >= 2, rec
        assert rec["describe"]["launched_in_backward"] >= 1 and rec["structure"]["launched_in_backward"] >= 1
        line = re.search(rf"{name} .*allreduce ops \d+ before fusion, (\d+) after, (\d+) launched before backward "
                         "ended", proc.stdout)
        assert line and int(line.group(1)) >= 2 and int(line.group(2)) >= 1, proc.stdout[-3000:]
    hier = recs["mlp/hierarchical"]
    assert hier["verdict"] == "skipped" and "at least 2 nodes of at least 2 ranks" in hier["error"], hier


# ---- the probe table names tests that exist; a session leaves nothing in its TMPDIR --------------------------------
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
