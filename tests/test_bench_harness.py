"""How the benchmark harnesses meet their users (``bench_cases/``): a bad option or variable is one error naming
it; the setup (size, steps, rounds, warm-up, overrides) is part of what a result is compared on (pytest-benchmark
warns across setups, asv's version changes with it, and stays asv's own hash for the default setup); pytest-benchmark's
own round options are taken or named as ignored, and the saved options say what ran; the note after the tables only
with tables; a bounded timeout where bench_cases/ is the rootdir; ``make asv-smoke`` under a machine name of its own.

Nothing here asserts on a time: the real runs are one tiny case, for their files and lines."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.clitools import nested_pytest_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))



def _pytest_bench(tmp_path, *args: str, cwd: str = ROOT, timeout: float = 300) -> subprocess.CompletedProcess:
    """pytest over bench_cases/, its benchmark storage (made even by --collect-only) under ``tmp_path``."""
    if not any(a.startswith("--benchmark-storage") for a in args):
        args = (*args, "--benchmark-storage", f"file://{tmp_path / 'storage'}")
    return subprocess.run([sys.executable, "-m", "pytest", os.path.join(ROOT, "bench_cases"), *args], cwd=cwd,
                          env=nested_pytest_env(), capture_output=True, text=True, timeout=timeout)


# ---- one error naming the option or variable -------------------------------------------------------------------

# each a pytest process (~3 s): the first in make test, the others in make test-slow
@pytest.mark.parametrize("args, message", [
    (["--fleetbench-case", "mlp/nope"], "ERROR: --fleetbench-case 'mlp/nope' matches no case"),
    pytest.param(["--fleetbench-world", "0"], "ERROR: --fleetbench-world 0: must be a whole number >= 1",
                 marks=pytest.mark.heavy),
    pytest.param(["--fleetbench-rounds", "0"], "ERROR: --fleetbench-rounds 0: must be >= 1",
                 marks=pytest.mark.heavy),  # the spec's range, its name
    pytest.param(["--fleetbench-set", "bogus"], "--fleetbench-set 'bogus': expected key=value, e.g. --fleetbench-set ",
                 marks=pytest.mark.heavy),
    pytest.param(["--fleetbench-tag", "nope"], "ERROR: --fleetbench-tag 'nope' is unknown; allowed: default, smoke",
                 marks=pytest.mark.heavy),
])
def test_a_bad_pytest_option_is_one_usage_error_naming_it(args, message, tmp_path):
    proc = _pytest_bench(tmp_path, "--collect-only", "-q", *args, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 4, out  # pytest's usage error
    assert message in out, out
    assert "Traceback" not in out and "pluggy" not in out and "collecting" not in out, out
    assert " --case " not in out and " --set " not in out, out  # never fleetbench run's names
    assert len([line for line in out.splitlines() if line.strip()]) <= 2, out


# each an interpreter importing the benchmarks (~3 s): the first in make test, the others in make test-slow
@pytest.mark.parametrize("var, value, message", [
    ("FLEETBENCH_BENCH_CASES", "mlp/nope", "ConfigError: FLEETBENCH_BENCH_CASES 'mlp/nope' matches no case"),
    pytest.param("FLEETBENCH_BENCH_STEPS", "abc",
                 "ConfigError: FLEETBENCH_BENCH_STEPS='abc': must be a whole number >= 1", marks=pytest.mark.heavy),
    pytest.param("FLEETBENCH_BENCH_WORLDS", "2,x",
                 "ConfigError: FLEETBENCH_BENCH_WORLDS='x': must be a whole number >= 1", marks=pytest.mark.heavy),
    pytest.param("FLEETBENCH_BENCH_SIZE", "huge", "ConfigError: FLEETBENCH_BENCH_SIZE 'huge': allowed values are",
                 marks=pytest.mark.heavy),
])
def test_a_bad_asv_variable_is_one_error_naming_it(var, value, message):
    """What asv's discovery runs into when it imports the benchmarks (asv adds its own wrapper around it)."""
    proc = subprocess.run([sys.executable, "-c", "import bench_cases.asv_cases"], cwd=ROOT,
                          env=nested_pytest_env(**{var: value}), capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines()[-1].startswith(f"suite.config.{message}"), proc.stderr
    assert "--case" not in proc.stderr.splitlines()[-1]


# ---- the setup in the benchmark's identity ---------------------------------------------------------------------

_VERSIONS = r"""
import importlib, json, os, sys
import bench_cases.asv_cases as a
from asv_runner.discovery import disc_benchmarks

mine = a.StepTime.version
del a.StepTime.version  # asv's own version of the benchmark: the hash of its code
[bench] = list(disc_benchmarks(os.path.join(sys.argv[1], "bench_cases")))
out = {"asv": bench.version}
for name, env in json.loads(sys.argv[2]).items():
    for k in [k for k in os.environ if k.startswith("FLEETBENCH_BENCH_")]:
        del os.environ[k]
    os.environ.update(env)
    out[name] = [importlib.reload(a).StepTime.version, a.StepTime.params]
out["default"][0] == mine or sys.exit("the version differs between an import and a reload")
print(json.dumps(out))
"""


def test_asv_version_is_asvs_own_for_the_default_setup_and_changes_with_the_setup_not_the_selection():
    from suite.models import default_size
    from suite.run_spec import RunOptions
    from suite.selection import choose_platform

    size, run = default_size(choose_platform(None)[0]), RunOptions()
    envs = {"default": {}, "explicit defaults": {"FLEETBENCH_BENCH_SIZE": size,
                                                 "FLEETBENCH_BENCH_ROUNDS": str(run.rounds),
                                                 "FLEETBENCH_BENCH_STEPS": str(run.steps),
                                                 "FLEETBENCH_BENCH_PROCESSES": "2"},
            "the spec": {"FLEETBENCH_BENCH_SPEC": json.dumps({"selection": {"size": size}})},
            "selection": {"FLEETBENCH_BENCH_CASES": "mlp/plain", "FLEETBENCH_BENCH_WORLDS": "1"},
            "rounds": {"FLEETBENCH_BENCH_ROUNDS": "3"}, "steps": {"FLEETBENCH_BENCH_STEPS": "3"},
            "size": {"FLEETBENCH_BENCH_SIZE": "tiny"}, "processes": {"FLEETBENCH_BENCH_PROCESSES": "1"},
            "sets": {"FLEETBENCH_BENCH_SET": "nccl_comm_num=2"}}
    proc = subprocess.run([sys.executable, "-c", _VERSIONS, ROOT, json.dumps(envs)], cwd=ROOT, env=nested_pytest_env(),
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    v = json.loads(proc.stdout.strip().splitlines()[-1])
    own = v["asv"]
    # the default setup keeps asv's own version (the history stays); so does the same setup spelled out, as sugar
    # or as a spec
    assert v["default"][0] == own and v["explicit defaults"][0] == own and v["the spec"][0] == own, v
    # another selection is other params, the same series
    assert v["selection"][0] == own and v["selection"][1] == [["mlp/plain"], [1]], v
    # another setup is another version, saying what differs
    for name in ("rounds", "steps", "size", "processes", "sets"):
        assert v[name][0] != own and v[name][0].startswith(own + "+") and f"+{name}=" in v[name][0], (name, v)
    assert len({v[name][0] for name in ("rounds", "steps", "size", "processes", "sets")}) == 5, v


def _saved_run(path, setup: dict | None) -> str:
    fleetbench = {"torch": "x"} if setup is None else {"torch": "x", "setup": setup}
    stats = {"min": 0.1, "max": 0.2, "mean": 0.15, "stddev": 0.05, "rounds": 2, "median": 0.15, "iqr": 0.05,
             "q1": 0.1, "q3": 0.2, "iqr_outliers": 0, "stddev_outliers": 0, "outliers": "0;0", "ld15iqr": 0.1,
             "hd15iqr": 0.2, "ops": 6.7, "total": 0.3, "iterations": 1, "data": [0.1, 0.2]}
    path.write_text(json.dumps({
        "machine_info": {"fleetbench": fleetbench}, "commit_info": {}, "datetime": "2026-01-02T03:04:05",
        "version": "5.3.1", "benchmarks": [{
            "group": "mlp@2", "name": "test_step[mlp/plain@2]", "fullname": "test_cases.py::test_step[mlp/plain@2]",
            "params": {"case": "mlp/plain", "world": 2}, "param": "mlp/plain@2", "extra_info": {}, "options": {},
            "stats": stats}]}))
    return str(path)


@pytest.mark.heavy  # a real pytest-benchmark session in a subprocess: make test-slow
def test_benchmark_compare_warns_when_the_compared_runs_setup_differs(tmp_path):
    """pytest-benchmark loads the compared run when pytest is configured: --collect-only is enough to see it."""
    from bench_cases._matrix import setup_of
    from suite.run_spec import RunOptions, Selection
    from suite.selection import resolve

    args = ["--collect-only", "-q", "--fleetbench-case", "mlp/plain", "--fleetbench-size", "tiny",
            "--fleetbench-steps", "2", "--fleetbench-rounds", "3", "--benchmark-storage", "file://st"]
    rc = resolve(Selection(cases=("mlp/plain",), size="tiny"))
    same = setup_of(rc, RunOptions(steps=2, rounds=3))
    other = dict(same, steps=5, sets=["nccl_comm_num=2"])
    (tmp_path / "runs").mkdir()
    for name, setup, expect in [
        ("other.json", other, "had another setup (sets: ['nccl_comm_num=2'] -> []; steps: 5 -> 2)"),
        ("none.json", None, "records no setup"),
    ]:
        proc = _pytest_bench(tmp_path, *args, "--benchmark-compare", _saved_run(tmp_path / "runs" / name, setup),
                             cwd=str(tmp_path), timeout=120)
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, out
        assert "PytestBenchmarkWarning: fleetbench: the compared run (2026-01-02T03:04:05)" in out, out
        assert expect in out, out
    proc = _pytest_bench(tmp_path, *args, "--benchmark-compare", _saved_run(tmp_path / "runs" / "same.json", same),
                         cwd=str(tmp_path), timeout=120)
    assert proc.returncode == 0 and "fleetbench: the compared run" not in proc.stdout + proc.stderr, proc.stderr


@pytest.mark.heavy  # a real pytest-benchmark session in a subprocess: make test-slow
def test_a_tiny_run_records_its_setup_takes_min_rounds_and_names_the_options_it_ignores(tmp_path):
    out = tmp_path / "bench.json"
    proc = _pytest_bench(tmp_path, "--benchmark-only", "--fleetbench-case", "mlp/plain", "--fleetbench-size", "tiny",
                         "--fleetbench-steps", "1", "--fleetbench-no-check", "--benchmark-min-rounds=3",
                         "--benchmark-warmup=on", "--benchmark-timer=time.process_time", "--benchmark-json", str(out))
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-3000:]
    # --benchmark-min-rounds is the number of rounds; the other two are named, once, as ignored
    warnings = [line for line in log.splitlines() if line.startswith("fleetbench: warning: ignored here")]
    assert len(warnings) == 1, log
    assert "--benchmark-timer=time.process_time" in warnings[0] and "--benchmark-warmup=True" in warnings[0]
    assert "--benchmark-min-rounds" not in warnings[0]
    assert "each benchmark's rounds: 3 timed windows of 1 steps" in log, log
    doc = json.loads(out.read_text())
    (bench,) = doc["benchmarks"]
    assert len(bench["stats"]["data"]) == 3
    # the saved options say what ran
    assert bench["options"]["min_rounds"] == 3 and bench["options"]["warmup"] is False
    assert bench["options"]["timer"] == "rank_clock"
    assert isinstance(bench["extra_info"]["threads_per_rank"], int) and bench["extra_info"]["threads_per_rank"] >= 1
    meta = doc["machine_info"]["fleetbench"]
    assert meta["backend"] == "gloo" and meta["worlds"] == [2]
    assert "world_size" not in meta and "threads_per_rank" not in meta  # each benchmark's, in extra_info
    assert meta["setup"] == {"device": "cpu", "backend": "gloo", "size": "tiny", "steps": 1, "rounds": 3,
                             "warmup": 2, "sets": [], "config": None}


def test_min_rounds_and_fleetbench_rounds_that_disagree_are_a_usage_error(tmp_path):
    proc = _pytest_bench(tmp_path, "--collect-only", "-q", "--benchmark-min-rounds=3", "--fleetbench-rounds", "7",
                         timeout=120)
    assert proc.returncode == 4 and "--benchmark-min-rounds=3 and --fleetbench-rounds 7" in proc.stderr, proc.stderr


def test_the_saved_options_state_the_rounds_that_ran():
    """The benchmark marker each item gets: its rounds (--fleetbench-rounds, not pytest-benchmark's min_rounds
    default of 5) and no warm-up, placed first so pytest-benchmark reads it, the test's timer kept."""
    from bench_cases import conftest

    class Item:
        fixturenames = ("benchmark",)

        def __init__(self):
            self.marks = [pytest.mark.benchmark(timer="rank_clock").mark]

        def get_closest_marker(self, name):
            return self.marks[0]

        def add_marker(self, mark, append=True):
            self.marks.insert(len(self.marks) if append else 0, mark.mark)

    class Config:
        stash = pytest.Stash()

    Config.stash[conftest._ROUNDS] = 2
    item = Item()
    conftest.pytest_collection_modifyitems(Config(), [item])
    assert item.get_closest_marker("benchmark").kwargs == {"timer": "rank_clock", "min_rounds": 2, "warmup": False}


@pytest.mark.heavy  # a real pytest-benchmark session in a subprocess: make test-slow
def test_no_note_about_tables_when_benchmarks_are_disabled(tmp_path):
    proc = _pytest_bench(tmp_path, "--benchmark-disable", "--fleetbench-case", "mlp/plain", "--fleetbench-size",
                         "tiny", "--fleetbench-steps", "1", "--fleetbench-rounds", "1", "--fleetbench-no-check")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "1 passed" in proc.stdout
    assert "what the tables above measure" not in proc.stdout, proc.stdout


def test_benchmarks_have_a_bounded_timeout_of_their_own(tmp_path):
    """bench_cases/pytest.ini makes bench_cases/ the rootdir: pyproject.toml's timeout does not reach it."""
    proc = _pytest_bench(tmp_path, "--collect-only", "--fleetbench-case", "mlp/plain", timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "rootdir: " + os.path.join(ROOT, "bench_cases") in proc.stdout, proc.stdout
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("timeout: ")), None)
    assert line is not None, proc.stdout
    assert 0 < float(line.split()[1].rstrip("s")) <= 4 * 3600


# ---- make asv-smoke -------------------------------------------------------------------------------------------

def test_asv_smoke_records_under_a_machine_name_of_its_own():
    """asv keeps one result per commit and machine, rewritten whole by each run: make asv-smoke's one case under
    the nightly's machine name would replace the nightly's cases for that commit."""
    from suite.measure.metadata import machine_name

    proc = subprocess.run(["make", "-n", "asv-smoke", f"PY={sys.executable}"], cwd=ROOT, env=nested_pytest_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    runs = [ln for ln in proc.stdout.replace("\\\n", " ").splitlines() if "asv run" in ln]
    assert len(runs) == 1, proc.stdout
    nightly = machine_name()  # `fleetbench nightly`'s default --machine
    assert f"--machine {nightly}-smoke " in runs[0] + " ", runs[0]
    assert f"--machine {nightly} " not in runs[0] + " ", runs[0]
