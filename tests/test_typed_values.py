"""Typed values end to end (issue 34): what ranks answer is typed, and a case's ``Metrics`` and its one check summary
(``CheckSummary``) travel from the rank to the record without a round trip through dicts; the runner, `ab` and the
report receive them as types."""
from __future__ import annotations

import json
import math

import pytest

from suite.check import harness
from suite.measure.summary import Timed, summarize
from suite.measure.timing import RankTiming, VariantTiming
from suite.results import records
from suite.results.records import CaseRecord, CheckSummary, Describe, Metrics, append_record
from tests.test_runner import FakeLauncher, _answers, _rc, _runner

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
    answers = _answers(["plain", "none"])
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
    run = _runner(FakeLauncher())
    run.opts = type(run.opts)(**{**vars(run.opts), "check": True})
    (recs,) = list(run.run([_rc("mlp/plain"), _rc("mlp/overlap")]))
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
    from tests.test_ab import _ab_spec, _FakeServer

    record = json.loads(CaseRecord("mlp/plain", "mlp", 2, {}, "r", verdict="pass", check=CHECK,
                                   metrics=Metrics(samples_per_s=100.0, step_time_s={"median": 0.1}),
                                   structure={"allreduce_ops": 4}).to_json())

    class Server(_FakeServer):
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
    out = compare_case(base, head, "mlp/plain", 2, _ab_spec(seq=SeqOptions(rotate=3, min_pairs=3, budget_s=60,
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
