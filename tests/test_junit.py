"""JUnit XML from `run`, `doctor`, `ab` and `nightly` (``suite/report/junit.py``): each file validates against
Jenkins' junit-10.xsd and is read back here with the standard library, never with the code that wrote it.

``tests/data/junit-10.xsd`` is jenkinsci/xunit-plugin's
``src/main/resources/org/jenkinsci/plugins/xunit/types/model/xsd/junit-10.xsd`` (commit 031e285e, MIT), the schema
pytest's own tests validate ``--junitxml`` with (pytest's copy, ``testing/example_scripts/junit-10.xsd``, names the
error element ``errors``; Jenkins' names it ``error``, as every CI reader does)."""
from __future__ import annotations

import math
import os
import time

import pytest

import suite.runtime
from suite.cli.main import main
from tests.clitools import cases, outcome, valid

FAST = ["--no-check", "--no-utilization", "--size", "tiny", "--device", "cpu", "--timeout", "60"]


class NanOverlapPool:
    """Stands for the rank pool of `fleetbench run --no-check`: synthetic timings that take 0.1 s, the overlap case's
    loss nan at its second step (a failure, ``CaseRunner.record``), every other variant fine."""

    def __init__(self, nproc, **kw):
        self.nproc = nproc

    def run(self, fn, kwargs=None, timeout=None):
        from suite.runner import free_memory_on_rank
        from tests.fakes import fake_answers as _answers

        if fn is free_memory_on_rank:
            return [2**40] * self.nproc
        time.sleep(0.1)  # the interleaved timing of plain and overlap: each case's share is 0.05 s
        answers = _answers([v["name"] for v in kwargs["variants"]], ranks=self.nproc)
        for a in answers:
            if "overlap" in a.variants:
                a.variants["overlap"].losses = [1.0, math.nan]
        return answers

    def close(self):
        pass


def test_run_writes_a_failing_and_a_skipped_case_with_their_messages(monkeypatch, tmp_path, capsys):
    """The acceptance line: `fleetbench run --junit r.xml` with one failing case (a non-finite loss) and one
    skipped one (hierarchical needs a world size its nodes split): valid XML holding both with their messages."""
    monkeypatch.setattr(suite.runtime, "RankPool", NanOverlapPool)
    xml = tmp_path / "r.xml"
    code = main(["run", "--case", "mlp/plain,mlp/overlap,mlp/hier*", "--nproc", "3", "--results",
                 str(tmp_path / "runs.jsonl"), "--junit", str(xml), *FAST])
    capsys.readouterr()
    assert code == 1  # a failed case
    root = valid(xml)
    got = cases(root)
    assert set(got) == {"mlp/plain@3", "mlp/overlap@3", "mlp/hierarchical@3"}, got
    kind, msg = outcome(got["mlp/overlap@3"])
    assert kind == "failure" and "non-finite loss at step 2" in msg, (kind, msg)
    kind, msg = outcome(got["mlp/hierarchical@3"])
    assert kind == "skipped" and "does not split world size 3" in msg, (kind, msg)
    kind, _ = outcome(got["mlp/plain@3"])
    assert kind == "passed" and "no correctness verdict" in got["mlp/plain@3"].findtext("system-out")
    suite_el = root.find("testsuite")
    assert (suite_el.get("tests"), suite_el.get("failures"), suite_el.get("errors"), suite_el.get("skipped")) == \
        ("3", "1", "0", "1")
    assert all(tc.get("classname") == "fleetbench.run.mlp" for tc in got.values())
    assert float(got["mlp/overlap@3"].get("time")) >= 0.05  # its share of the interleaved timing


@pytest.mark.parametrize("make", [
    lambda p, res: p.mkdir(),
    lambda p, res: os.symlink(res, p),
    lambda p, res: None,  # the results file itself
])
def test_odd_junit_paths_are_refused_before_any_rank_starts(no_ranks, tmp_path, capsys, make):
    results = tmp_path / "runs.jsonl"
    path = tmp_path / "j.xml"
    make(path, results)
    target = results if not os.path.lexists(path) else path
    code = main(["run", "--case", "mlp/plain", "--results", str(results), "--junit", str(target), *FAST])
    err = capsys.readouterr().err
    assert code == 2 and "--junit" in err and str(target) in err, err
    assert not results.exists()  # nothing written


def test_doctor_items_pass_fail_and_not_applicable(monkeypatch, tmp_path, capsys):
    from suite import doctor

    items = [doctor.Item("allreduce on each communicator (fp32, exact)", doctor.PASS, "exact", 0.5),
             doctor.Item("step clocks", doctor.FAIL, "events 3 ms off the host clock", 1.25),
             doctor.Item("NVML", doctor.NA, "no GPU on this machine", 0.0)]
    monkeypatch.setattr(doctor, "run_doctor", lambda *a, **k: doctor.Report(
        "cpu/gloo", 4, {"torch": "t", "wheel_line": "torch t, CPU wheel", "cuda": None, "nccl": None, "python": "3",
                        "commit": "c"}, items, 1.75))
    xml = tmp_path / "doctor.xml"
    assert main(["doctor", "--nproc", "2", "--junit", str(xml)]) == 1
    capsys.readouterr()
    got = cases(valid(xml))
    assert outcome(got["allreduce on each communicator (fp32, exact)"]) == ("passed", "")
    assert outcome(got["step clocks"]) == ("failure", "events 3 ms off the host clock")
    assert got["step clocks"].get("time") == "1.250"
    assert outcome(got["NVML"]) == ("skipped", "not applicable here: no GPU on this machine")


def test_ab_comparisons_failure_error_inconclusive_and_same(monkeypatch, tmp_path, capsys):
    from suite.ab import trials
    from suite.ab.trials import AbReport, CaseOutcome, NotCompared
    from suite.cli import ab as ab_cli

    report = AbReport({"commit": "b" * 40}, {"commit": "h" * 40}, {}, cases=[
        CaseOutcome("mlp/plain", 2, verdict="slower", failures=["mlp/plain@2: slower: HEAD/BASE 1.10"],
                    summary="slower", seconds=3.0),
        CaseOutcome("mlp/overlap", 2, verdict="inconclusive", summary="HEAD/BASE 1.004 [0.98, 1.03] (12 blocks)"),
        CaseOutcome("mlp/fused", 2, verdict="error", status="error", error="BASE: rank 1 died"),
        CaseOutcome("mlp/amp", 2, verdict="same", summary="same within ±2%")],
        only=[NotCompared("mlp/new", "on HEAD only")])
    monkeypatch.setattr(trials, "run_ab", lambda *a, **k: report)
    monkeypatch.setattr(ab_cli, "identical", lambda repo, base, head: None)  # git: this checkout may not be clean
    xml = tmp_path / "ab.xml"
    code = main(["ab", "HEAD~1", "HEAD", "--case", "mlp/*", "--size", "tiny", "--nproc", "2", "--json",
                 "--junit", str(xml)])
    capsys.readouterr()
    assert code == 1
    got = cases(valid(xml))
    assert outcome(got["mlp/plain@2"]) == ("failure", "mlp/plain@2: slower: HEAD/BASE 1.10")
    assert outcome(got["mlp/overlap@2"]) == ("skipped", "inconclusive: HEAD/BASE 1.004 [0.98, 1.03] (12 blocks)")
    assert outcome(got["mlp/fused@2"]) == ("error", "BASE: rank 1 died")
    assert outcome(got["mlp/amp@2"]) == ("passed", "")
    assert outcome(got["mlp/new"]) == ("skipped", "not compared: on HEAD only")


def test_ab_on_identical_revisions_writes_one_passed_case_and_times_nothing(monkeypatch, tmp_path, capsys):
    from suite.ab import trials
    from suite.cli import ab

    monkeypatch.setattr(trials, "run_ab", lambda *a, **k: pytest.fail("identical revisions were timed"))
    monkeypatch.setattr(ab, "identical", lambda repo, base, head: {"identical": "the same commit"})
    xml = tmp_path / "ab.xml"
    assert main(["ab", "HEAD", "HEAD", "--case", "mlp/plain", "--size", "tiny", "--junit", str(xml)]) == 0
    assert "identical" in capsys.readouterr().out
    got = cases(valid(xml))
    assert list(got) == ["HEAD vs HEAD"] and outcome(got["HEAD vs HEAD"]) == ("passed", "")
    assert "identical" in got["HEAD vs HEAD"].findtext("system-out")


def test_text_xml_cannot_hold_is_replaced_and_long_messages_are_kept_whole_in_the_body(tmp_path):
    from suite.report.junit import MAX_MESSAGE, Suite, TestCase, write_junit

    long = "rank 1: \x1b[31mRuntimeError\x1b[0m \x00 boom " + "x" * 3000
    path = tmp_path / "j.xml"
    write_junit(str(path), [Suite("s", (TestCase("a", "c", "error", long, math.nan),))])
    tc = cases(valid(path))["a"]
    el = tc.find("error")
    assert len(el.get("message")) == MAX_MESSAGE and "\ufffd[31mRuntimeError" in el.get("message")
    assert el.text.endswith("x" * 3000) and "\x1b" not in el.text
    assert tc.get("time") == "0.000"  # nan is no duration
