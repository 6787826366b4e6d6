"""pytest-benchmark conventions of ``bench_cases/``: ``case`` and ``world`` as plain parameters (nothing
UNSERIALIZABLE in the saved JSON), one short group per model and world size (``mlp@2``), a round that is one
training step (the ranks' own window over its steps, no round trip) said in ``extra_info`` and after the
tables, ``fleetbench run``'s default windows and steps, ``fleetbench compare`` reading both the per-step
files and the older per-round ones, a ``smoke`` selection that is small and distinct from ``default``, and
pytest's own ``--junitxml`` of a benchmark session."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from suite.cases import SMOKE, select_cases
from suite.cli.main import build_parser
from suite.results.load import load_side, windows
from suite.results.records import ResultsFileError
from tests.clitools import nested_pytest_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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
    from tests.test_junit import cases, outcome, valid

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
