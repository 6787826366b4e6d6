"""One answer per session (issue 33, item 4): a user's own ``pytest bench_cases`` times each model's cases as
``fleetbench run`` does, in one interleaved measurement per model with its baseline, and each benchmark reports
its own case's windows; asv, whose cases are timed apart, says so beside its table and names `run`'s interleaved
speedups as the ones to compare.

The pytest session runs without ranks (``tests/bench_fake_ranks.py``): the real rank-side timing call and its
interleaving loop over fake engines whose windows are known, so the test reads which windows each case got."""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

import pytest

from tests.bench_fake_ranks import window_s
from tests.clitools import nested_pytest_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROUNDS, STEPS = 4, 2


def _session(tmp_path, *args: str) -> tuple[dict, dict]:
    env = nested_pytest_env(FAKE_RANKS_LOG=str(tmp_path / "ranks.json"))
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, "-m", "pytest", "bench_cases", "-p", "tests.bench_fake_ranks",
                           "--benchmark-only", "--fleetbench-size", "tiny", "--fleetbench-steps", str(STEPS),
                           "--fleetbench-rounds", str(ROUNDS), "--fleetbench-no-check", "--benchmark-json", str(out),
                           "--benchmark-storage", f"file://{tmp_path / 'storage'}", *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return json.loads((tmp_path / "ranks.json").read_text()), json.loads(out.read_text())


def test_a_pytest_session_times_each_model_once_interleaved_and_each_benchmark_reports_its_own_windows(tmp_path):
    # mlp: plain and overlap kept, fusion selected but deselected by -k; resnet: compute_fusion without its baseline
    log, doc = _session(tmp_path, "--fleetbench-case", "mlp/plain", "--fleetbench-case", "mlp/overlap",
                        "--fleetbench-case", "mlp/fusion", "--fleetbench-case", "resnet/compute_fusion",
                        "-k", "not (mlp and fusion)")
    timings = [c for c in log["calls"] if c["fn"] != "free_memory_on_rank"]
    # one timing call per model, each with its selected cases and the baseline (always), nothing timed alone
    assert [c["fn"] for c in timings] == ["time_on_rank"] * 2, timings
    assert [c["variants"] for c in timings] == [["plain", "overlap"], ["plain", "compute_fusion"]], timings
    assert all((c["rounds"], c["steps"], c["world"]) == (ROUNDS, STEPS, 2) for c in timings), timings
    # on every rank, every round holds each variant once (the baseline in every round), the order rotated
    recorded = [w for w in log["windows"] if w["record"]]
    assert len(recorded) == 2 * 2 * 2 * ROUNDS
    at = 0
    for call in timings:
        n = len(call["variants"])
        for rank in range(2):
            turns = [(w["rank"], w["variant"]) for w in recorded[at:at + n * ROUNDS]]
            at += n * ROUNDS
            rounds = [[v for _, v in turns[r * n:(r + 1) * n]] for r in range(ROUNDS)]
            assert all(r_ == rank for r_, _ in turns), turns
            assert all(sorted(r) == sorted(call["variants"]) for r in rounds), rounds
            assert len({tuple(r) for r in rounds}) > 1, rounds  # rotated, not one fixed order

    benches = {b["params"]["case"]: b for b in doc["benchmarks"]}
    assert set(benches) == {"mlp/plain", "mlp/overlap", "resnet/compute_fusion"}
    for case, b in benches.items():
        variant = case.split("/")[1]
        e = b["extra_info"]
        mine = [[window_s(variant, i, rank, STEPS) for rank in range(2)] for i in range(ROUNDS)]
        assert e["rank_window_s"] == mine, case  # the very numbers the fake engines measured
        assert e["window_s"] == [max(w) for w in mine], case
        # pytest-benchmark's rounds are this case's windows (the slowest rank's, per step), in order
        assert b["stats"]["data"] == pytest.approx([max(w) / STEPS for w in mine], rel=1e-9), case
        assert b["stats"]["rounds"] == ROUNDS and b["group"] == f"{case.split('/')[0]}@2"
        assert b["params"] == {"case": case, "world": 2} and b["options"]["timer"] == "rank_clock"
        assert e["interleaved_with"] == (["plain", "overlap"] if case.startswith("mlp/") else ["plain", variant])
        # the speedup over the baseline of the same rounds, as fleetbench run pairs them
        base = [max(window_s("plain", i, r, STEPS) for r in range(2)) for i in range(ROUNDS)]
        ratios = [p / max(w) for p, w in zip(base, mine)]
        assert e["baseline"] == "plain" and e["speedup"] == pytest.approx(statistics.median(ratios)), case
    assert benches["mlp/overlap"]["extra_info"]["speedup"] > 1  # the fake overlap's steps are the shorter


def test_asv_says_beside_its_table_that_its_cases_are_timed_apart(monkeypatch, capsys):
    """asv runs each (case, world size) in processes of its own: the dashboard's name for the benchmark, its class's
    docstring and the note the first case's process prints (``asv run --show-stderr`` shows it under the table) say
    that the cases were timed apart and that `fleetbench run`'s interleaved speedups are the ones to compare."""
    import suite.runtime
    from bench_cases import asv_cases
    from suite.runner import CaseRunner
    from tests.bench_fake_ranks import FakeRankPool

    for text in (asv_cases.StepTime.time_step.pretty_name, asv_cases.StepTime.__doc__, asv_cases.TIMED_APART):
        assert "timed apart" in text and "fleetbench run" in text and "interleaved" in text, text
    assert "speedups" in asv_cases.TIMED_APART
    # the process timing the first runnable pair prints it once, before its first sample; the others do not
    monkeypatch.setattr(suite.runtime, "RankPool", FakeRankPool)
    monkeypatch.setattr(CaseRunner, "prepare", lambda self, rc: f"prepared {rc.case.name}")
    monkeypatch.setattr(asv_cases, "_LIVE", {})
    first = asv_cases._NOTE_PAIR
    others = [p for p, rc in asv_cases._PAIRS.items() if p != first and not rc.skip]
    assert first is not None and others, asv_cases._PAIRS
    bench = asv_cases.StepTime()
    assert bench._prepared(*others[0]) == f"prepared {others[0][0]}"
    assert capsys.readouterr().err == ""
    for _ in range(2):
        assert bench._prepared(*first) == f"prepared {first[0]}"
    assert capsys.readouterr().err == asv_cases.TIMED_APART + "\n"
