"""`fleetbench` from the command line: bad input is refused before any rank starts; a run prints a
table with a verdict and a throughput per case and appends records."""
from __future__ import annotations

import json
import os

import pytest

import suite.runtime
from suite.cli.main import main


class NoRanks:
    def __init__(self, *a, **k):
        raise AssertionError("a rank pool was started despite bad input")


BAD_ARGS = [
    (["run", "--nproc", "0"], "--nproc 0: must be a whole number >= 1"),
    (["run", "--case", "resnet/nope"], "--case 'resnet/nope' matches no case"),
    (["run", "--tag", "weekly"], "--tag 'weekly' is unknown; allowed: default"),
    (["run", "--set", "nccl_comm_num=-1"], "nccl_comm_num=-1: out of range"),
    (["run", "--set", "amp=fp8"], "amp='fp8': allowed values"),
    (["run", "--set", "colour=blue"], "unknown strategy field 'colour'"),
    (["run", "--nproc", "4", "--case", "mlp/hierarchical", "--set", "hierarchical_allreduce_inter_nranks=3"],
     "hierarchical_allreduce_inter_nranks=3 does not split world size 4"),
    (["run", "--steps", "0"], "--steps 0: must be >= 1"),
    (["run", "--config", "/nonexistent.toml"], "does not exist"),
    (["config", "--preset", "fastest"], "preset 'fastest' is unknown"),
    (["comm", "--cluster", "2x2"], "--cluster '2x2': the inter-node rate is missing"),
    (["comm", "--nproc", "1"], "--nproc 1: an allreduce needs at least 2 ranks"),
    (["run", "--cluster", "3xq:inter=1gbit"], "the shape '3xq' is not NxR"),
]


@pytest.mark.parametrize("argv,words", BAD_ARGS, ids=[" ".join(a) for a, _ in BAD_ARGS])
def test_bad_cli_input_is_one_clear_error_before_any_rank(monkeypatch, capsys, argv, words):
    monkeypatch.setattr(suite.runtime, "RankPool", NoRanks)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert words in err, err
    assert err.count("error:") == 1


def test_corrupt_results_file_is_refused_and_kept(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(suite.runtime, "RankPool", NoRanks)
    path = tmp_path / "runs.jsonl"
    path.write_text('{"kind": "fleetbench.case", "schema_version": 1, "case": "x", "model": "mlp", '
                    '"world_size": 2, "config": {}, "run_id": "r"}\n{broken\n')
    before = path.read_bytes()
    assert main(["run", "--case", "mlp/plain", "--results", str(path)]) == 2
    assert f"{path}:2" in capsys.readouterr().err
    assert path.read_bytes() == before


def test_list_shows_the_default_cases(capsys):
    assert main(["run", "--list"]) == 0
    out = capsys.readouterr().out
    for name in ("resnet/plain", "resnet/ddp", "resnet/none", "mlp/plain", "mlp/ddp", "mlp/none"):
        assert name in out


@pytest.mark.parametrize("nproc", [2, pytest.param(4, marks=pytest.mark.heavy)])  # 4 ranks: make test-slow
def test_run_prints_verdicts_and_throughput_and_appends_records(capsys, tmp_path, nproc):
    path = tmp_path / "runs.jsonl"
    code = main(["run", "--nproc", str(nproc), "--case", "mlp/plain", "--case", "mlp/ddp", "--case", "mlp/none",
                 "--rounds", "2", "--steps", "2", "--warmup", "1", "--results", str(path)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "speedup vs plain" in out and f"appended to {path}" in out
    # not a terminal: one plain line per step, the timing included
    assert "      timing mlp, one group: 3 variant(s) interleaved (plain, none, ddp), 2 round(s) x 2 step(s)" in out
    assert "timed mlp one group in " in out and ": 2/2 rounds done" in out
    recs = [json.loads(line) for line in path.read_text().splitlines()]
    by = {r["case"]: r for r in recs}
    assert set(by) == {"mlp/plain", "mlp/ddp", "mlp/none"}
    assert by["mlp/plain"]["verdict"] == "pass" and by["mlp/ddp"]["verdict"] == "pass"
    assert by["mlp/none"]["verdict"] == "n/a"
    for r in recs:
        assert r["world_size"] == nproc
        assert r["metrics"]["samples_per_s"] > 0
        assert len(r["metrics"]["throughput_per_round"]) == 2
        assert r["metadata"]["torch"] and r["metadata"]["world_size"] == nproc
    # Plain data parallel: one allreduce per parameter gradient per step (the MLP has 10 tensors).
    calls = by["mlp/plain"]["metrics"]["comm_calls_per_step"]
    assert calls.get("world/all_reduce") == 10.0, calls


def test_version_names_the_package_version_and_the_commit(capsys):
    import subprocess
    from importlib.metadata import version

    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out.strip()
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__)))).stdout.strip()
    assert out.startswith(f"fleetbench {version('fleetbench')}, commit {commit[:12]}"), out


def test_the_runner_reports_progress_per_check_and_per_timing_group():
    from suite.run_spec import RunOptions
    from suite.runner import CaseRunner
    from tests.test_runner import FakeLauncher, _rc

    events = []
    runner = CaseRunner(FakeLauncher(), 2, RunOptions(check=False, utilization=False, rounds=3, steps=4),
                        metadata={"torch": "test", "gpu": {"available": False}}, on_progress=events.append)
    rcs = [_rc("mlp/plain"), _rc("mlp/overlap"), _rc("resnet/plain")]
    list(runner.run(rcs))
    seen = [(p.event, p.model, p.case, p.done, p.total) for p in events]
    assert seen == [("check", "mlp", "mlp/plain", 0, 3), ("checked", "mlp", "mlp/plain", 1, 3),
                    ("check", "mlp", "mlp/overlap", 1, 3), ("checked", "mlp", "mlp/overlap", 2, 3),
                    ("timing", "mlp", "", 1, 1), ("timed", "mlp", "", 1, 1),
                    ("check", "resnet", "resnet/plain", 2, 3), ("checked", "resnet", "resnet/plain", 3, 3),
                    ("timing", "resnet", "", 1, 1), ("timed", "resnet", "", 1, 1)], seen
    timing = [p for p in events if p.event == "timing"][0]
    assert timing.variants == ("plain", "overlap") and (timing.rounds, timing.steps) == (3, 4)
    # a failed interleaved timing is reported, then each case timed alone
    events.clear()
    runner = CaseRunner(FakeLauncher(fail_interleaved=True), 2, RunOptions(check=False, utilization=False),
                        metadata={"torch": "test"}, on_progress=events.append)
    list(runner.run([_rc("mlp/plain"), _rc("mlp/overlap"), _rc("mlp/fusion")]))
    timed = [(p.variants, bool(p.detail)) for p in events if p.event == "timed"]
    assert timed == [(("plain", "overlap", "fusion"), True), (("plain",), False), (("plain", "overlap"), False),
                     (("plain", "fusion"), False)], timed
    assert "rank(s) [1] died" in [p for p in events if p.event == "timed"][0].detail


def test_the_runner_does_not_import_rich():
    import subprocess
    import sys

    code = "import sys, suite.runner; print('rich' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_progress_on_a_terminal_is_a_live_display_with_the_step_under_way():
    import io

    from rich.console import Console

    from suite.cli.run import RunDisplay
    from suite.runner import Progress

    buf = io.StringIO()
    display = RunDisplay(live=True, console=Console(file=buf, force_terminal=True, width=160))
    display.start(2)
    display.say("[1/2] mlp/plain check pass")
    display.event(Progress("check", "mlp", case="mlp/overlap", done=1, total=2))
    display._progress.refresh()
    display.event(Progress("timing", "mlp", done=1, total=2, variants=("plain", "overlap"), rounds=3, steps=5))
    display._progress.refresh()
    display.event(Progress("timed", "mlp", done=1, total=2, variants=("plain", "overlap"), rounds=3, steps=5,
                           seconds=2.5))
    display.stop()
    out = buf.getvalue()
    assert "\x1b[" in out  # drawn with terminal control sequences, not plain lines
    for words in ("[1/2] mlp/plain check pass", "checking mlp/overlap", "cases checked",
                  "timing mlp, group 1/2: 2 variant(s) interleaved (plain, overlap), 3 round(s) x 5 step(s)",
                  "timed mlp group 1/2 in 2.5s: 3/3 rounds done"):
        assert words in out, (words, out)


def test_the_run_table_says_not_resolved_where_the_speedup_interval_spans_one():
    from suite.cli.run import _speedup_cell

    assert _speedup_cell(0.94, [0.64, 1.86]) == "0.94 [0.64, 1.86] not resolved"
    assert _speedup_cell(1.30, [1.10, 1.50]) == "1.30 [1.10, 1.50]"
    assert _speedup_cell(0.80, [0.70, 0.90]) == "0.80 [0.70, 0.90]"
    assert _speedup_cell(None, [None, None]) == "-"
    assert _speedup_cell(1.0, [1.0, 1.0], baseline=True) == "1 (the baseline)"  # never "not resolved"
    # an interval from fewer than 6 rounds covers less than 95% (3 rounds: 75% at best): never "resolved"
    assert _speedup_cell(1.30, [1.10, 1.50], rounds=3) == "1.30 [1.10, 1.50] not resolved (3 rounds)"
    assert _speedup_cell(1.30, [1.10, 1.50], rounds=5) == "1.30 [1.10, 1.50] not resolved (5 rounds)"
    assert _speedup_cell(1.30, [1.10, 1.50], rounds=6) == "1.30 [1.10, 1.50]"


def test_the_run_table_calls_no_speedup_from_3_rounds_resolved(capsys):
    """Issue 38 ("Numbers"): `mlp/fetch_10` came out "resolved" slower at 3 rounds, an interval that covers the
    median 75% of the time at best; the table reads the rounds from the record's windows."""
    from suite.cli.run import print_table
    from suite.results.records import CaseRecord

    def rec(case, rounds):
        return CaseRecord(case, "mlp", 2, {}, "r", verdict="pass", metrics={
            "samples_per_s": 10.0, "speedup": 0.8, "speedup_ci": [0.7, 0.9], "window_s": [0.1] * rounds})

    print_table([rec("mlp/fetch_10", 3), rec("mlp/overlap", 7)])
    rows = {ln.split()[1]: ln for ln in capsys.readouterr().out.splitlines() if "mlp/" in ln}
    assert "0.80 [0.70, 0.90] not resolved (3 rounds)" in rows["mlp/fetch_10"], rows
    assert "0.80 [0.70, 0.90]" in rows["mlp/overlap"] and "not resolved" not in rows["mlp/overlap"], rows
