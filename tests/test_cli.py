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
    from tests.fakes import FakeLauncher
    from tests.fakes import resolved as _rc

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
    # what each phase waits on, and the bound on that wait (issue 46.7): the call's own timeout
    assert timing.waits == ("2 rank(s): 2 warm-up step(s) per variant, then 3 round(s) x 2 variant(s) x 4 step(s)"
                            ) and timing.bound_s == runner._timing_timeout("mlp", 2) > 0, timing
    assert [p.waits for p in events if p.event == "check"] == ["nothing (--no-check)"] * 3
    checking = CaseRunner(FakeLauncher(), 2, RunOptions(check_steps=3, timeout=77.0), metadata={"torch": "test"})
    assert checking._check_waits(_rc("mlp/overlap")) == {
        "waits": "2 rank(s): 3 step(s) each, then the single-process reference's 3 step(s) over every rank's shard",
        "bound_s": 77.0}
    events.clear()  # a trace (the fake ranks cannot trace: its error is recorded, the events come all the same)
    runner = CaseRunner(FakeLauncher(), 2, RunOptions(check=False, utilization=False, trace_steps=2, timeout=50.0),
                        metadata={"torch": "test"}, on_progress=events.append)
    (rec,) = [r for batch in runner.run([_rc("mlp/plain")]) for r in batch]
    traced = [(p.event, p.waits, p.bound_s) for p in events if p.event.startswith("trac")]
    assert traced == [("trace", "2 rank(s): 2 traced step(s) each under torch.profiler, then their traces", 50.0),
                      ("traced", "", 0.0)], traced
    assert rec.metrics.trace_error, rec.metrics
    # a failed interleaved timing is reported, then each case timed alone
    events.clear()
    runner = CaseRunner(FakeLauncher(fail_interleaved=True), 2, RunOptions(check=False, utilization=False),
                        metadata={"torch": "test"}, on_progress=events.append)
    list(runner.run([_rc("mlp/plain"), _rc("mlp/overlap"), _rc("mlp/fusion")]))
    timed = [(p.variants, bool(p.detail)) for p in events if p.event == "timed"]
    assert timed == [(("plain", "overlap", "fusion"), True), (("plain",), False), (("plain", "overlap"), False),
                     (("plain", "fusion"), False)], timed
    assert "rank(s) [1] died" in [p for p in events if p.event == "timed"][0].detail


def test_without_a_terminal_each_phase_says_what_it_waits_on_and_a_long_one_says_it_is_still_waiting(capsys):
    """Issue 46.7 (a CPU resnet50 case: 95 s in its check, 137 s in its timing, and nothing said meanwhile): one line
    as each phase starts, with what it waits on and the bound on the wait, and a "still ..." line every heartbeat
    while it runs; none once it has ended."""
    import time

    from suite.cli.run import RunDisplay
    from suite.runner import Progress

    display = RunDisplay(live=False, heartbeat_s=0.05)
    check = Progress("check", "resnet50", case="resnet50/ddp", done=0, total=2, bound_s=612.0,
                     waits="2 rank(s): 3 step(s) each, then the single-process reference's 3 step(s)")
    display.event(check)
    out, deadline = "", time.monotonic() + 30  # a heartbeat thread on a loaded machine: wait for its line, bounded
    while "still checking" not in out and time.monotonic() < deadline:
        time.sleep(0.05)
        out += capsys.readouterr().out
    display.event(Progress("checked", "resnet50", case="resnet50/ddp", done=1, total=2, seconds=95.0))
    after = capsys.readouterr().out
    time.sleep(0.3)  # the phase ended: no more heartbeats
    assert "still" not in capsys.readouterr().out
    timing = Progress("timing", "resnet50", done=1, total=1, variants=("plain", "ddp"), rounds=6, steps=5,
                      waits="2 rank(s): 2 warm-up step(s) per variant, then 6 round(s) x 2 variant(s) x 5 step(s)",
                      bound_s=900.0)
    display.event(timing)
    display.event(Progress("trace", "resnet50", case="resnet50/ddp", steps=2, bound_s=601.0,
                           waits="2 rank(s): 2 traced step(s) each under torch.profiler, then their traces"))
    display.stop()
    lines = (out + after + capsys.readouterr().out).splitlines()
    assert lines[0] == ("      checking resnet50/ddp: waiting on 2 rank(s): 3 step(s) each, then the "
                        "single-process reference's 3 step(s) (at most 612 s)"), lines
    still = [ln for ln in lines if ln.startswith("      still checking resnet50/ddp after ")]
    assert still and still[0].endswith("s (waiting on 2 rank(s): 3 step(s) each, then the single-process "
                                       "reference's 3 step(s); at most 612 s)"), lines
    assert ("      timing resnet50, one group: 2 variant(s) interleaved (plain, ddp), 6 round(s) x 5 step(s): "
            "waiting on 2 rank(s): 2 warm-up step(s) per variant, then 6 round(s) x 2 variant(s) x 5 step(s) "
            "(at most 900 s)") in lines, lines
    assert ("      tracing resnet50/ddp (2 step(s)): waiting on 2 rank(s): 2 traced step(s) each under "
            "torch.profiler, then their traces (at most 601 s)") in lines, lines
    assert display._beat is None  # stopped with the display


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


def test_a_fake_timing_whose_rounds_disagree_is_not_resolved_and_a_busy_window_marks_its_row(monkeypatch, capsys):
    """Issue 46.2: mlp/overlap's rounds are 2x but one (0.5x): its interval alone sits above 1, its rounds
    disagree, so the table does not call it resolved and the record says why; mlp/fusion, 2x in every round, is
    resolved.  mlp's windows were busy (others took 40% of the CPU): its rows are marked, with the reason under
    the table; resnet's were quiet: no mark."""
    from suite.cli.run import print_table
    from suite.measure.timing import RankTiming
    from suite.run_spec import RunOptions
    from suite.runner import CaseRunner, free_memory_on_rank
    from tests.fakes import resolved as _rc

    monkeypatch.setattr(os, "getloadavg", lambda: (0.5, 0.5, 0.5))  # this machine's own load is not the test's
    windows = {"plain": [1.0] * 6, "overlap": [0.5, 0.48, 0.52, 2.0, 0.5, 0.49],
               "fusion": [0.5, 0.49, 0.51, 0.5, 0.48, 0.52]}

    class Launcher:
        nproc = 2
        calls = 0

        def run(self, fn, kwargs=None, timeout=None):
            if fn is free_memory_on_rank:
                return [2**40, 2**40]
            Launcher.calls += 1
            busy = Launcher.calls == 1  # the first model's windows (mlp) were busy, resnet's quiet
            machine = {"cpu_s": 0.5, "host_busy_s": 5.0 if busy else 1.05, "host_total_s": 10.0, "host": "h"}
            return [RankTiming.from_dict({"rank": rank, "variants": {v["name"]: {
                "windows": windows[v["name"]], "step_times": [w / 2 for w in windows[v["name"]] for _ in (0, 1)],
                "losses": [1.0, 0.9], "threads": 1, "comm_calls_per_step": {}, "comm_bytes_per_step": {},
                "host_syncs": 0, "describe": {}, "machine": machine} for v in kwargs["variants"]}})
                for rank in range(2)]

    runner = CaseRunner(Launcher(), 2, RunOptions(check=False, utilization=False, rounds=6, steps=2),
                        metadata={"torch": "test"})
    records = [r for batch in runner.run([_rc("mlp/plain"), _rc("mlp/overlap"), _rc("mlp/fusion"),
                                          _rc("resnet/plain"), _rc("resnet/fusion")]) for r in batch]
    by = {r.case: r for r in records}
    overlap, fusion = by["mlp/overlap"].metrics, by["mlp/fusion"].metrics
    assert overlap.speedup_ci[0] > 1, overlap.speedup_ci  # the interval alone would say resolved
    assert overlap.speedup_consistent is False and overlap.speedup_disagreement.startswith(
        "rounds disagree: round 4 (0.50) on the other side of 1"), overlap.speedup_disagreement
    assert fusion.speedup_consistent is True and fusion.speedup_disagreement is None
    assert by["mlp/plain"].metrics.speedup_consistent is None  # the baseline against itself: nothing judged
    print_table(records)
    out = capsys.readouterr().out
    rows = {ln.split()[1]: ln for ln in out.splitlines() if "mlp/" in ln or "resnet/" in ln}
    assert "not resolved (rounds disagree)" in rows["mlp/overlap"], out
    assert "not resolved" not in rows["mlp/fusion"] and "2.00 [" in rows["mlp/fusion"], out
    for case in ("mlp/plain", "mlp/overlap", "mlp/fusion"):
        assert "busy [1]" in rows[case], (case, out)
    for case in ("resnet/plain", "resnet/fusion"):
        assert "busy" not in rows[case], (case, out)
    notes = [ln for ln in out.splitlines() if ln.startswith("[1] ")]
    assert notes == ["[1] machine busy: timings unreliable (other processes took 40% of the CPU during the windows "
                     "(over 10%))"], out


def test_set_leaves_the_baseline_plain_and_vary_times_each_value_interleaved_with_it(capsys, tmp_path):
    """--set of a strategy knob reaches every case but plain (said above and under the table); a workload knob
    reaches plain too; --vary's values are cases of their own, timed in plain's group round by round."""
    path = tmp_path / "runs.jsonl"
    code = main(["run", "--nproc", "2", "--case", "mlp/plain", "--case", "mlp/overlap", "--set", "nccl_comm_num=2",
                 "--set", "lr=0.05", "--vary", "fuse_grad_size_in_MB=0.01,0.05", "--size", "tiny", "--rounds", "2",
                 "--steps", "1", "--warmup", "1", "--no-utilization", "--results", str(path)])
    out = capsys.readouterr().out
    assert code == 0, out
    said = "knobs applied to every case but the baseline: nccl_comm_num=2; plain stays plain data parallel"
    assert out.count(said) == 2, out  # before the run and under the table
    assert out.count("knobs applied to every case, the baseline (plain) too: lr=0.05 (workload knobs)") == 2
    assert ("3 variant(s) interleaved (plain, overlap+fuse_grad_size_in_MB:0.01, overlap+fuse_grad_size_in_MB:0.05)"
            in out), out
    by = {r["case"]: r for r in map(json.loads, path.read_text().splitlines())}
    small, large = "mlp/overlap+fuse_grad_size_in_MB:0.01", "mlp/overlap+fuse_grad_size_in_MB:0.05"
    assert set(by) == {"mlp/plain", small, large}
    plain = by["mlp/plain"]
    assert (plain["config"]["nccl_comm_num"], plain["config"]["fuse_all_reduce_ops"], plain["config"]["lr"]) == (
        1, False, 0.05)
    # plain's engine: one allreduce per gradient (the MLP has 10) on the one world communicator, no bucket
    assert plain["metrics"]["comm_calls_per_step"] == {"world/all_reduce": 10.0}, plain["metrics"]
    assert not plain["describe"].get("buckets")
    assert "1 (the baseline; lr=0.05)" in out  # the table says what reached it
    for name, mb in ((small, 0.01), (large, 0.05)):
        r = by[name]
        assert r["verdict"] == "pass", r
        assert (r["config"]["fuse_grad_size_in_MB"], r["config"]["nccl_comm_num"], r["config"]["lr"]) == (mb, 2, 0.05)
        assert set(r["metrics"]["comm_calls_per_step"]) == {"comm0/all_reduce", "comm1/all_reduce"}
        assert r["fallback"] is None and len(r["metrics"]["window_s"]) == 2  # in the group, both rounds
        assert r["spec"]["selection"]["varies"] == ["fuse_grad_size_in_MB=0.01,0.05"]
    assert by[small]["describe"]["allreduce_ops"] > by[large]["describe"]["allreduce_ops"]  # the knob took effect


# ---- every command's bad input: one line, exit 2, before any rank --------------------------------------------------
RUN = ["run", "--case", "mlp/plain", "--size", "tiny", "--device", "cpu"]


def _bad_inputs(tmp) -> list:
    """(argv, words) for every bad numeric option and unusable file of comm, cluster, compare."""
    from suite.results.records import append_record
    from tests.fakes import report_record

    good = tmp / "good.jsonl"
    append_record(str(good), report_record("mlp/plain"))
    binary = tmp / "binary.json"
    binary.write_bytes(b"\xff\xfe\x00{not text")
    folder = tmp / "folder.json"
    folder.mkdir()
    C = ["compare", str(good), str(good)]
    cases = [
        (["comm", "--timeout", "-5"], ["--timeout -5", ">= 1"]),  # one bound (it was > 0 and >= 1, checked twice)
        (["comm", "--timeout", "nan"], ["--timeout nan", "finite"]),
        (["comm", "--timeout", "inf"], ["--timeout inf", "finite"]),
        (["comm", "--timeout", "0"], ["--timeout 0", ">= 1"]),
        (["comm", "-b", "64G"], ["--min-bytes 64G", "--max-bytes 16M"]),
        (["comm", "-b", "1024G", "-e", "1024G"], ["--max-bytes 1024G", "memory is available", "largest message"]),
        (["comm", "-e", "1024G"], ["--max-bytes 1024G", "memory is available"]),
        (["comm", "-e", "9" * 400 + "G"], ["--max-bytes 999", "too large"]),
        (["comm", "-b", "0.1"], ["--min-bytes 0.1", "at least 1 byte"]),
        (["comm", "-b", "nan"], ["--min-bytes nan", "expected a number of bytes"]),
        (["comm", "--nproc", "100000"], ["--nproc 100000", "local ranks on this machine"]),
        (["comm", "--nproc", "1"], ["--nproc 1", "at least 2"]),
        (["comm", "--inter-nranks", "0"], ["--inter-nranks 0", ">= 1"]),
        (["comm", "--inter-nranks", "-2"], ["--inter-nranks -2", ">= 1"]),
        (["comm", "-f", "1"], ["--step-factor 1", ">= 2"]),
        (["comm", "-n", "0"], ["--iters 0", ">= 1"]),
        (["comm", "-w", "-1"], ["--warmup -1", ">= 0"]),
        (["comm", "--cluster", "0x2:inter=1gbit"], ["--cluster '0x2:inter=1gbit'", "nodes=0"]),
        (["cluster", "up", "0x2:inter=1gbit"], ["'0x2:inter=1gbit'", "nodes=0"]),
        (["cluster", "up", "2x0:inter=1gbit"], ["'2x0:inter=1gbit'", "ranks per node=0"]),
        (["cluster", "up", "2x2:inter=nanmbit"], ["inter='nanmbit'"]),
        (["cluster", "up", "2x2:inter=-1gbit"], ["inter='-1gbit'"]),
        (["cluster", "up", "99x99:inter=1gbit"], ["'99x99:inter=1gbit'", "at most"]),
        (C + ["--threshold", "nan"], ["--threshold nan"]),
        (C + ["--threshold", "-1"], ["--threshold -1"]),
        (C + ["--threshold", "inf"], ["--threshold inf"]),
        (C + ["--alpha", "0"], ["--alpha 0"]),
        (C + ["--alpha", "nan"], ["--alpha nan"]),
        (C + ["--markdown", str(folder)], ["--markdown", "is a directory"]),
        (["compare", str(folder), str(good)], [str(folder), "directory"]),
        (["compare", str(good), str(binary)], [str(binary), "not a text file"]),
    ]
    return cases


def test_every_bad_number_or_file_is_one_line_exit_2_before_any_rank(tmp_path, monkeypatch, capsys):
    import suite.cluster.emulate
    import suite.runtime
    from suite.cli.main import main

    class NoRanks:
        def __init__(self, *a, **k):
            raise AssertionError("a rank pool was started despite bad input")

    monkeypatch.setattr(suite.runtime, "RankPool", NoRanks)
    # No cluster may come up: and a bad value must be named even where none could be emulated.
    monkeypatch.setattr(suite.cluster.emulate, "unavailable_reason", lambda: "not here (test)")
    problems = []
    for argv, words in _bad_inputs(tmp_path):
        shown = " ".join(a if len(a) < 60 else a[:20] + "…" for a in argv)
        try:
            code = main(argv)
        except BaseException as exc:  # noqa: BLE001 - a traceback is what this test looks for
            capsys.readouterr()
            problems.append(f"{shown}: raised {type(exc).__name__}: {str(exc)[:120]}")
            continue
        err = capsys.readouterr().err
        lines = [ln for ln in err.splitlines() if ln.strip()]
        if code != 2 or len(lines) != 1 or "Traceback" in err or not all(w in err for w in words):
            problems.append(f"{shown}: exit {code}, stderr {err[:300]!r}; expected one line with {words}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("argv,words", [
    (RUN + ["--nproc", "100000"], ["--nproc 100000", "local ranks"]),
    (RUN + ["--pg-timeout", "1e300"], ["--pg-timeout", "a week"]),
    (RUN + ["--steps", "10000000000"], ["--steps"]),
    (["ab", "HEAD", "HEAD", "--nproc", "1000"], ["--nproc 1000"]),
    (["ab", "HEAD", "HEAD", "--batch", "-3"], ["--batch -3"]),
    (["ab", "HEAD", "HEAD", "--timeout", "nan"], ["--timeout nan"]),
    (["ab", "HEAD", "HEAD", "--timeout", "0"], ["--timeout 0"]),
    (["ab", "HEAD", "HEAD", "--seed", "-1"], ["--seed -1"]),
    (["ab", "HEAD", "HEAD", "--python", "/nonexistent"], ["--python", "/nonexistent"]),
    (["doctor", "--nproc", "100000"], ["--nproc 100000"]),
    (["doctor", "--hang-timeout", "nan"], ["--hang-timeout nan"]),
    (["doctor", "--hang-timeout", "-5"], ["--hang-timeout -5"]),
    (["figures", "host", "--rounds", "0"], ["--rounds 0"]),
])
def test_options_out_of_range_are_one_error_before_anything_starts(capsys, no_ranks, monkeypatch, argv, words):
    import suite.ab.trials
    import suite.doctor
    from tests.clitools import cli as _cli
    from tests.clitools import one_error as _one_error

    def nothing(*a, **k):
        raise AssertionError("started despite bad input")

    monkeypatch.setattr(suite.ab.trials, "run_ab", nothing)
    monkeypatch.setattr(suite.doctor, "run_doctor", nothing)
    code, _, err = _cli(argv, capsys)
    _one_error(code, err, *words)


def test_refusals_do_not_echo_huge_input(capsys, no_ranks):
    from tests.clitools import cli as _cli
    huge = "x" * 500_000
    for argv in (["run", "--case", huge, "--list"], ["run", "--set", f"lr={huge}", "--list"],
                 ["run", "--steps", huge]):
        code, _, err = _cli(argv, capsys)
        assert code == 2 and len(err) < 3000 and "characters left out" in err, (argv[:2], len(err))


def test_run_list_into_a_closed_pipe_is_quiet(monkeypatch, capsys, no_ranks):
    """The probe: `fleetbench run --list | head -3` ended in a BrokenPipeError traceback (here the reader is gone
    before the first line)."""
    import sys

    from suite.cli.main import main

    r, w = os.pipe()
    os.close(r)
    out = os.fdopen(w, "w")
    monkeypatch.setattr(sys, "stdout", out)
    try:
        code = main(["run", "--list", "--tag", "nightly-gpu"])
    finally:
        monkeypatch.undo()
        out.close()
    assert code == 141
    assert capsys.readouterr().err == ""
