"""The nightly measures once (issue 32 item 4): its `run` stage's records exported as pytest-benchmark JSON and asv
results (``suite/results/export.py``), read back by the tools' own readers: ``pytest-benchmark compare`` and
``asv publish`` (with its regression detection), not by this project's code.  The records here are made by hand:
the whole nightly on CPU is ``tests/test_nightly.py::test_nightly_cpu_pipeline_end_to_end`` (heavy)."""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

import pytest

from suite.outputs import OutputDir
from suite.results import export
from suite.results.records import CaseRecord

BIN = os.path.dirname(sys.executable)
WINDOWS = {("mlp/plain", 2): [0.30, 0.33, 0.36, 0.31, 0.32], ("mlp/overlap", 2): [0.27, 0.24, 0.30, 0.25, 0.26]}


def _records(scale: float = 1.0, run_id: str = "r1") -> list[CaseRecord]:
    recs = [CaseRecord(case=c, model="mlp", world_size=w, config={}, run_id=run_id, size="tiny", backend="gloo",
                       device="cpu", metrics={"window_s": [x * scale for x in win], "steps_per_window": 3,
                                              "samples_per_s": 100.0})
            for (c, w), win in WINDOWS.items()]
    recs.append(CaseRecord(case="mlp/fusion", model="mlp", world_size=2, config={}, run_id=run_id, status="error",
                           verdict="error", error="boom"))  # no timing: not exported
    return recs


def test_the_pytest_benchmark_json_is_read_by_pytest_benchmarks_own_compare(tmp_path):
    doc = export.pytest_benchmark_doc(_records(), "a" * 40)
    names = [b["name"] for b in doc["benchmarks"]]
    assert names == ["test_step[mlp/overlap@2]", "test_step[mlp/plain@2]"]  # the failed case is not a benchmark
    plain = doc["benchmarks"][1]
    assert plain["group"] == "mlp@2" and plain["params"] == {"case": "mlp/plain", "world": 2}
    assert plain["stats"]["data"] == pytest.approx([x / 3 for x in WINDOWS[("mlp/plain", 2)]])  # a round: one step
    assert plain["stats"]["rounds"] == 5 and plain["extra_info"]["unit"] == export.UNIT
    (tmp_path / "0001_night1.json").write_text(json.dumps(doc))
    (tmp_path / "0002_night2.json").write_text(json.dumps(export.pytest_benchmark_doc(_records(2.0), "b" * 40)))
    proc = subprocess.run([os.path.join(BIN, "py.test-benchmark"), "compare", "--columns", "min,median,rounds",
                           "--group-by", "group", str(tmp_path / "0001_night1.json"),
                           str(tmp_path / "0002_night2.json")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    assert "Failed to load" not in out + proc.stderr, out + proc.stderr
    assert out.count("test_step[mlp/plain@2]") == 2 and out.count("test_step[mlp/overlap@2]") == 2, out
    # its own statistics: the minimum of night 1's plain, one step, in ms as it prints it
    assert f"{min(WINDOWS[('mlp/plain', 2)]) / 3 * 1000:.4f}" in out, out


def _asv_project(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    commits = []
    for i in range(2):
        (repo / "f").write_text(str(i))
        subprocess.run([*git, "add", "f"], check=True)
        subprocess.run([*git, "commit", "-q", "-m", f"c{i}"], check=True)
        commits.append(subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True,
                                      check=True).stdout.strip())
    conf = {"version": 1, "project": "t", "project_url": "http://t", "repo": str(repo), "branches": ["main"],
            "environment_type": "existing", "results_dir": str(tmp_path / "results"),
            "html_dir": str(tmp_path / "html"), "env_dir": str(tmp_path / "env"), "benchmark_dir": str(tmp_path)}
    (tmp_path / "asv.conf.json").write_text(json.dumps(conf))
    bench = {"name": export.ASV_BENCHMARK, "type": "time", "unit": "seconds", "param_names": ["case", "world_size"],
             "params": [["'mlp/fusion'", "'mlp/overlap'", "'mlp/plain'"], ["2"]], "version": "abc123",
             "code": "", "number": 1, "repeat": 5, "rounds": 2, "min_run_count": 1, "sample_time": 0.01,
             "timeout": 1800.0, "warmup_time": 0.0}
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "benchmarks.json").write_text(json.dumps({export.ASV_BENCHMARK: bench, "version": 2}))
    return commits, bench


def test_the_asv_results_are_published_by_asv_and_read_by_its_regression_detection(tmp_path):
    commits, bench = _asv_project(tmp_path)
    machine = {"machine": "cpu-test", "arch": "x86_64", "cpu": "c", "num_cpu": "2", "os": "Linux", "ram": "1"}
    env = export.asv_env_name(sys.executable)
    for i, (commit, scale) in enumerate(zip(commits, (1.0, 3.0))):  # night 2 three times as slow
        doc = export.asv_results_doc(_records(scale), bench, machine, commit, 1_700_000_000_000 + i * 86_400_000,
                                     "3.11", env)
        with OutputDir(str(tmp_path / "results")) as rd:
            rel = export.write_asv(rd, doc, machine)
    from asv.environment import get_env_name
    from asv.results import Results, get_filename
    from asv.util import sanitize_filename

    assert env == sanitize_filename(get_env_name("existing", os.path.abspath(sys.executable).replace(os.sep, "_"),
                                                 {}, {}))
    assert rel == get_filename("cpu-test", commits[1], env)
    loaded = Results.load(str(tmp_path / "results" / rel), "cpu-test")  # asv's own reader
    values = loaded.get_result_value(export.ASV_BENCHMARK, bench["params"])
    samples = loaded.get_result_samples(export.ASV_BENCHMARK, bench["params"])
    assert values[0] is None and samples[0] is None  # mlp/fusion: failed tonight, no result
    assert samples[2] == pytest.approx([3 * x / 3 for x in WINDOWS[("mlp/plain", 2)]])
    assert values[2] == pytest.approx(statistics.median(samples[2]))
    assert loaded._benchmark_version[export.ASV_BENCHMARK] == "abc123"  # the discovered version: the series go on
    proc = subprocess.run([os.path.join(BIN, "asv"), "publish", "--config", str(tmp_path / "asv.conf.json")],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env=dict(os.environ, HOME=str(tmp_path)))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    graphs = [os.path.join(d, f) for d, _, fs in os.walk(tmp_path / "html" / "graphs") for f in fs
              if f == export.ASV_BENCHMARK + ".json"]
    assert graphs, proc.stdout[-2000:]
    points = json.load(open(next(g for g in graphs if "branch-main" in g)))
    plain = [p[1][2] for p in points]  # (revision, [values per case]) per commit: plain is the third
    assert plain[0] == pytest.approx(statistics.median(WINDOWS[("mlp/plain", 2)]) / 3, rel=1e-3)
    assert plain[1] == pytest.approx(3 * plain[0], rel=1e-3)
    regressions = json.load(open(tmp_path / "html" / "regressions.json"))
    flagged = json.dumps(regressions["regressions"])
    assert "mlp/plain" in flagged and "mlp/overlap" in flagged, regressions  # asv saw night 2 slower


def test_the_exported_setup_is_what_the_records_ran():
    """``machine_info["fleetbench"]["setup"]``: the fields a live pytest-benchmark session records (its compare warns
    when they differ), read from the records: the timed windows' steps and count, the spec's warm-up and overrides."""
    from suite.run_spec import RunOptions, RunSpec, Selection

    doc = export.pytest_benchmark_doc(_records(), "a" * 40)
    assert doc["machine_info"]["fleetbench"]["setup"] == {
        "device": "cpu", "backend": "gloo", "size": "tiny", "steps": 3, "rounds": 5, "warmup": None, "sets": [],
        "config": None}  # a record without its spec (before schema 4): no warm-up known
    spec = RunSpec(Selection(sets=("nccl_comm_num=2",)), RunOptions(warmup=1, steps=3))
    recs = _records()
    for rec in recs:
        rec.spec, rec.device = spec, "cuda NVIDIA H100 80GB HBM3"
    assert export.pytest_benchmark_doc(recs, "a" * 40)["machine_info"]["fleetbench"]["setup"] == {
        "device": "cuda", "backend": "gloo", "size": "tiny", "steps": 3, "rounds": 5, "warmup": 1,
        "sets": ["nccl_comm_num=2"], "config": None}


def _live_extra_info(rec: CaseRecord, rank_windows: list[list[float]]) -> dict:
    """``extra_info`` as the live harness fills it: its ``test_step`` run on ``rec`` through stand-ins for its fixtures
    (the selection, the rank pools with their one interleaved measurement, pytest-benchmark's ``benchmark``)."""
    from types import SimpleNamespace as NS

    from bench_cases import test_cases
    from bench_cases.conftest import Measured, Timed

    model, variant = rec.case.split("/")

    class Benchmark:
        group, enabled, extra_info = None, True, {}

        def pedantic(self, fn, rounds, iterations, warmup_rounds):
            for _ in range(rounds):
                fn()

    answers = [NS(rank=r, variants={variant: NS(windows=[w[r] for w in rank_windows])}) for r in range(2)]
    got = Measured({rec.case: rec}, {variant: (("plain", variant), answers)})
    pools = NS(runner=lambda world: NS(opts=NS(steps=rec.metrics.steps_per_window, size=rec.size)),
               measured=lambda case, world: got)
    selection = NS(find=lambda case, world: NS(case=NS(model=model, variant=variant, tags=rec.tags), skip=None))
    bench = Benchmark()
    bench.extra_info = {}
    test_cases.test_step(bench, selection, pools, Timed(), rec.case, rec.world_size)
    assert bench.group == f"{model}@{rec.world_size}"
    return bench.extra_info


def test_the_live_harness_and_the_export_give_a_record_the_same_extra_info():
    """One record, its ``extra_info`` through the nightly's export and through bench_cases' live ``test_step``: the
    same keys and values, but for what only the live harness knows (each rank's windows, the variants timed in the
    same rounds) and which harness measured it."""
    rank_windows = [[0.27, 0.30], [0.24, 0.21]]
    rec = CaseRecord(case="mlp/overlap", model="mlp", world_size=2, config={"fuse_grad_size_in_MB": 1.5},
                     run_id="r9", verdict="pass", tags=["smoke", "default"], size="tiny", backend="gloo",
                     device="cpu", check={"verdict": "pass", "message": "within tolerance"},
                     fallback="timed alone: the interleaved timing failed",
                     metrics={"window_s": [0.30, 0.24], "steps_per_window": 3, "samples_per_s": 100.0,
                              "speedup": 1.08, "baseline": "plain", "threads": 1,
                              "rank_median_step_s": [0.09, float("inf")]},
                     structure={"allreduce_ops": 4})
    (bench,) = export.pytest_benchmark_doc([rec], "a" * 40)["benchmarks"]
    exported = bench["extra_info"]
    live = _live_extra_info(rec, rank_windows)
    assert set(live) - set(exported) == {"rank_window_s", "interleaved_with"}, sorted(live)
    assert set(exported) <= set(live), sorted(set(exported) - set(live))
    differ = {k for k in exported if exported[k] != live[k]}
    assert differ == {"measured_by"}, {k: (exported[k], live[k]) for k in differ}
    assert exported["measured_by"].startswith("fleetbench run") and live["measured_by"].startswith("pytest-benchmark")
    # a few by hand: the record's, JSON-able (inf as a string), and the live harness's own
    assert (live["case"], live["model"], live["variant"], live["world_size"]) == ("mlp/overlap", "mlp", "overlap", 2)
    assert live["steps_per_window"] == 3 and live["window_s"] == [0.30, 0.24] and live["size"] == "tiny"
    assert live["config"] == {"fuse_grad_size_in_MB": 1.5} and live["tags"] == ["smoke", "default"]
    assert live["message"] == "within tolerance" and live["fallback"] == "timed alone: the interleaved timing failed"
    assert live["rank_median_step_s"] == [0.09, "inf"] and live["structure"] == {"allreduce_ops": 4}
    assert live["run_id"] == "r9" and live["speedup"] == 1.08 and live["baseline"] == "plain"
    assert live["rank_window_s"] == rank_windows and live["interleaved_with"] == ["plain", "overlap"]
    json.dumps(live, allow_nan=False)  # JSON as it is written: no NaN/Infinity tokens


def test_the_exported_setup_is_the_live_sessions_for_the_same_run():
    """The same run's setup through the live harnesses (``bench_cases/_matrix.setup_of``: what is asked) and through
    the export (the records: what ran): one dict, so pytest-benchmark's compare of the two does not warn."""
    from bench_cases._matrix import setup_of
    from suite.run_spec import RunOptions, RunSpec, Selection
    from suite.selection import resolve

    sel = Selection(cases=("mlp/plain", "mlp/overlap"), size="tiny", device="cpu",
                    sets=("nccl_comm_num=2", "sync_nccl_allreduce=false"))
    run = RunOptions(steps=3, rounds=5, warmup=1)
    live = setup_of(resolve(sel), run)
    recs = _records()
    for rec in recs:
        rec.spec = RunSpec(sel, run)
    exported = export.pytest_benchmark_doc(recs, "a" * 40)["machine_info"]["fleetbench"]["setup"]
    assert exported == live == {"device": "cpu", "backend": "gloo", "size": "tiny", "steps": 3, "rounds": 5,
                                "warmup": 1, "sets": ["nccl_comm_num=2", "sync_nccl_allreduce=false"],
                                "config": None}
