"""Results records: schema, atomic appends, and clear errors for corrupt files."""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from suite.results.records import (
    SCHEMA_VERSION,
    CaseRecord,
    Metrics,
    Precision,
    ResultsFileError,
    Stat,
    Structure,
    append_record,
    read_records,
)
from tests.clitools import RUN
from tests.clitools import cli as _cli
from tests.clitools import one_error as _one_error
from tests.fakes import fake_record, write_records


def _rec(name="mlp/plain", sps=100.0):
    return CaseRecord(name, "mlp", 2, {"data_parallel": "suite"}, "run1", verdict="pass",
                      metrics={"samples_per_s": sps, "speedup_ci": [float("inf"), float("nan")]})


def test_round_trip_and_schema(tmp_path):
    path = str(tmp_path / "r.jsonl")
    append_record(path, _rec("a"))
    append_record(path, _rec("b", 50.0))
    recs = read_records(path)
    assert [r.case for r in recs] == ["a", "b"]
    assert recs[1].samples_per_s == 50.0
    assert recs[0].schema_version == SCHEMA_VERSION == 4
    with open(path) as fh:
        assert json.loads(fh.readline())["metrics"]["speedup_ci"] == ["inf", "nan"]  # JSON has no inf/nan
    lo, hi = recs[0].metrics.speedup_ci  # read back as numbers
    assert isinstance(recs[0].metrics, Metrics) and math.isinf(lo) and lo > 0 and math.isnan(hi)


@pytest.mark.parametrize("bad,words", [
    ("{not json\n", ["r.jsonl:2", "not valid JSON"]),
    ('{"kind": "fleetbench.case", "schema_version": 99}\n', ["r.jsonl:2", "schema_version=99"]),
    ('{"kind": "other"}\n', ["r.jsonl:2", "not a fleetbench case record"]),
    ('{"kind": "fleetbench.case", "schema_version": 1, "case": "x"}\n', ["r.jsonl:2", "lacks"]),
    ('{"kind": "fleetbench.case", "schema_version": 1, "ca', ["r.jsonl:2", "truncated"]),
])
def test_corrupt_file_names_file_and_line(tmp_path, bad, words):
    path = tmp_path / "r.jsonl"
    append_record(str(path), _rec())
    with open(path, "a") as fh:
        fh.write(bad)
    before = path.read_bytes()
    with pytest.raises(ResultsFileError) as info:
        read_records(str(path))
    assert all(w in str(info.value) for w in words), str(info.value)
    assert path.read_bytes() == before  # reading never rewrites


def test_append_after_a_torn_line_starts_a_new_line(tmp_path):
    path = tmp_path / "r.jsonl"
    append_record(str(path), _rec("a"))
    with open(path, "a") as fh:
        fh.write('{"kind": "fleetbench.case"')  # a writer killed mid-line
    append_record(str(path), _rec("b"))
    lines = path.read_text().splitlines()
    assert json.loads(lines[-1])["case"] == "b"
    assert len(lines) == 3


V1_LINE = {
    "kind": "fleetbench.case", "schema_version": 1, "case": "mlp/fusion", "model": "mlp", "world_size": 2,
    "config": {"fuse_all_reduce_ops": True}, "run_id": "old", "status": "ok", "verdict": "pass",
    "metrics": {"samples_per_s": 10.0, "comm_calls_per_step": {"comm0/all_reduce": 1.0},
                "comm_bytes_per_step": {"comm0/all_reduce": 4096.0}},
    "describe": {"strategy": "bucketed", "allreduce_ops_before_fusion": 10, "allreduce_ops": 1,
                 "buckets": [{"params": 10, "layers": 5, "bytes": 4096, "comm": 0}]},
    "metadata": {"backend": "gloo", "gpu": {"available": False}},
}


def test_schema_1_records_are_read_and_upgraded_in_memory(tmp_path):
    path = tmp_path / "last-good.jsonl"
    path.write_text(json.dumps(V1_LINE) + "\n")
    before = path.read_bytes()
    (rec,) = read_records(str(path))
    assert rec.schema_version == 1 and rec.size is None
    assert (rec.backend, rec.device) == ("gloo", "cpu")
    assert rec.structure.allreduce_ops_before_fusion == 10 and rec.structure.allreduce_ops == 1
    assert rec.structure.buckets == [{"params": 10, "bytes": 4096, "comm": 0}]
    assert rec.structure.comm_calls_per_step == {"comm0/all_reduce": 1.0}
    assert path.read_bytes() == before  # never rewritten


def test_new_records_carry_size_backend_device_and_structure(tmp_path):
    path = str(tmp_path / "r.jsonl")
    append_record(path, CaseRecord("mlp/plain", "mlp", 2, {}, "r", size="cpu", backend="gloo", device="cpu",
                                   structure={"allreduce_ops": 10}, fallback="timed alone: rank 1 died"))
    (rec,) = read_records(path)
    assert rec.schema_version == SCHEMA_VERSION
    assert (rec.size, rec.backend, rec.device, rec.structure, rec.fallback) == (
        "cpu", "gloo", "cpu", Structure(allreduce_ops=10), "timed alone: rank 1 died")


WRONG_TYPES = [
    ("metrics", 5, "field 'metrics' is 5; expected an object"),
    ("metadata", "x", "field 'metadata' is 'x'; expected an object"),
    ("error", 5, "field 'error' is 5; expected null or a string"),
    ("world_size", "two", "field 'world_size' is 'two'; expected a whole number >= 1"),
    ("world_size", True, "field 'world_size' is true"),
    ("verdict", "great", "field 'verdict' is 'great'; expected one of pass"),
    ("size", "huge", "field 'size' is 'huge'"),
    ("metrics", {"step_times_s": ["a"]}, "field 'metrics.step_times_s'"),
    ("metrics", {"samples_per_s": [1]}, "field 'metrics.samples_per_s'"),
    ("metrics", {"trace_file": 3}, "field 'metrics.trace_file'"),
    ("metrics", {"samples_per_second": 1.0}, "field 'metrics.samples_per_second' is not a metric of schema 4; "
                                             "allowed: samples_per_s,"),
    ("metrics", {"peak_memory_bytes": 1.5}, "field 'metrics.peak_memory_bytes' is 1.5; expected a whole number"),
    ("metrics", {"footprint_bytes": "1 GB"}, "field 'metrics.footprint_bytes' is '1 GB'; expected a whole number"),
    ("metrics", {"speedup_ci": [1.0]}, "field 'metrics.speedup_ci' is [1.0]; expected a list of two numbers"),
    ("describe", {"precision": {"cudnn_version": "8.9"}}, "field 'describe.precision.cudnn_version' is '8.9'"),
    ("describe", {"precision": {"tf32": True}}, "field 'describe.precision.tf32' is not a name of schema 4"),
    ("structure", {"allreduce_ops": "ten"}, "field 'structure.allreduce_ops' is 'ten'; expected a whole number"),
    ("check", {"verdict": "pass", "param_error": [1]}, "field 'check.param_error' is [1]; expected a number"),
    ("check", {"message": "no verdict"}, "check: "),
    ("status", "pending", "field 'status' is 'pending'; expected one of ok, error, skipped, not_run"),
]


@pytest.mark.parametrize("field,value,words", WRONG_TYPES, ids=[f"{f}={v!r}" for f, v, _ in WRONG_TYPES])
def test_wrong_typed_fields_name_file_line_and_field(tmp_path, field, value, words):
    path = tmp_path / "r.jsonl"
    append_record(str(path), _rec())
    bad = json.loads(_rec().to_json())
    bad[field] = value
    with open(path, "a") as fh:
        fh.write(json.dumps(bad) + "\n")
    with pytest.raises(ResultsFileError) as info:
        read_records(str(path))
    assert f"{path}:2" in str(info.value) and words in str(info.value), str(info.value)


def test_non_utf8_directories_and_overlong_lines_are_clear_errors(tmp_path, monkeypatch):
    from suite.results import records

    path = tmp_path / "r.jsonl"
    path.write_bytes(b'{"kind": "fleetbench.case", "case": "\xff\xfe"}\n')
    with pytest.raises(ResultsFileError, match=r"r.jsonl:1: not UTF-8"):
        read_records(str(path))
    with pytest.raises(ResultsFileError, match="is a directory"):
        read_records(str(tmp_path))
    monkeypatch.setattr(records, "MAX_LINE_BYTES", 1000)
    path.write_text(_rec().to_json()[:-1] + ' ' * 2000 + '}\n')
    with pytest.raises(ResultsFileError, match=r"r.jsonl:1: the line is longer than"):
        read_records(str(path))


V2_LINE = {  # a schema-2 record as `fleetbench run` wrote it before schema 3
    "kind": "fleetbench.case", "schema_version": 2, "case": "mlp/overlap", "model": "mlp", "world_size": 2,
    "config": {"overlap": True}, "run_id": "r2", "status": "ok", "verdict": "pass", "size": "cpu",
    "backend": "gloo", "device": "cpu", "fallback": None, "error": None, "tags": ["default"], "metadata": {},
    "timestamp": "2026-11-20T10:00:00+00:00",
    "check": {"verdict": "pass", "reference": "DataParallelReference", "param_error": "inf", "losses": [2.5, 2.25]},
    "metrics": {"samples_per_s": 812.5, "samples_per_s_ci": [800.0, 830.0], "speedup": "nan",
                "speedup_ci": ["nan", "nan"], "window_s": [0.1, 0.11], "steps_per_window": 5,
                "step_time_s": {"n": 20, "median": 0.02}, "peak_memory_bytes": 123456789, "nonfinite_loss": None,
                "comm_calls_per_step": {"world/all_reduce": 2.0}, "an_old_metric": 1},
    "describe": {"strategy": "bucketed", "overlap": True, "buckets": [{"params": 4, "bytes": 64, "comm": 0}]},
    "structure": {"strategy": "bucketed", "allreduce_ops": 2, "an_old_fact": 3},
}


def test_schema_2_records_are_read_typed(tmp_path):
    path = tmp_path / "old.jsonl"
    path.write_text(json.dumps(V2_LINE) + "\n")
    before = path.read_bytes()
    (rec,) = read_records(str(path))
    assert rec.schema_version == 2 and (rec.size, rec.backend, rec.device) == ("cpu", "gloo", "cpu")
    m = rec.metrics
    assert (m.samples_per_s, m.samples_per_s_ci, m.steps_per_window) == (812.5, [800.0, 830.0], 5)
    assert isinstance(m.peak_memory_bytes, int) and m.peak_memory_bytes == 123456789
    assert math.isnan(m.speedup) and all(math.isnan(x) for x in m.speedup_ci)  # numbers, not strings
    assert m.step_time_s == Stat(n=20, median=0.02) and isinstance(m.step_time_s.n, int)  # the rest absent: None
    assert m.footprint_bytes is None and m.nonfinite_loss is None and "an_old_metric" not in m.to_dict()
    assert rec.describe.precision is None and rec.describe.engine["buckets"] == [{"params": 4, "bytes": 64, "comm": 0}]
    assert rec.structure.allreduce_ops == 2 and "an_old_fact" not in rec.structure.to_dict()
    assert rec.check.reference == "DataParallelReference" and math.isinf(rec.check.param_error)
    assert path.read_bytes() == before  # never rewritten


def test_schema_3_carries_precision_footprint_and_not_run(tmp_path):
    path = str(tmp_path / "r.jsonl")
    precision = {"matmul_allow_tf32": False, "cudnn_allow_tf32": True, "float32_matmul_precision": "highest",
                 "cudnn_benchmark": False, "cudnn_deterministic": False, "cudnn_version": 90100}
    append_record(path, CaseRecord("resnet/plain", "resnet", 2, {}, "r", metrics={"footprint_bytes": 4096,
                                                                                  "peak_memory_bytes": 512},
                                   describe={"strategy": "plain", "precision": precision}))
    append_record(path, CaseRecord("resnet/amp_bf16", "resnet", 2, {}, "r", status="not_run", verdict="not_run",
                                   error="the job's time ran out before this case"))
    append_record(path, CaseRecord("resnet/fusion", "resnet", 2, {}, "r", status="skipped", verdict="skipped",
                                   error="backend cpu (oneDNN) has no fused kernel for this op"))
    ran, not_run, skipped = read_records(path)
    assert ran.describe.precision == Precision(**precision) and ran.describe.engine["strategy"] == "plain"
    assert (ran.metrics.footprint_bytes, ran.metrics.peak_memory_bytes) == (4096, 512)
    assert json.loads(ran.to_json())["describe"]["precision"] == precision  # flat beside the engine's keys
    assert (not_run.status, not_run.error) == ("not_run", "the job's time ran out before this case")
    assert skipped.status == "skipped" and "oneDNN" in skipped.error
    assert not_run.metrics.empty and "metrics" in json.loads(not_run.to_json())  # an empty object, not absent


def test_a_record_built_in_code_is_validated_too():
    with pytest.raises(ResultsFileError, match="record mlp/plain: field 'metrics.ips' is not a metric"):
        CaseRecord("mlp/plain", "mlp", 2, {}, "r", metrics={"ips": 3.0})
    with pytest.raises(TypeError):
        Metrics(ips=3.0)  # type: ignore[call-arg]


def test_the_check_answers_the_summary_the_record_keeps_and_it_survives_the_file():
    """One type for the check: the harness answers a CheckSummary, the record keeps it as it is, and it reads back
    equal from the JSON line (inf as "inf")."""
    import dataclasses

    from suite.check import harness
    from suite.config import StrategyConfig
    from suite.results.records import CheckSummary

    assert not hasattr(harness, "CheckResult")
    res = harness.run_check(None, None, StrategyConfig(data_parallel="none"))  # answered without any rank
    assert isinstance(res, CheckSummary) and res.verdict == "n/a" and not res.passed
    res = CheckSummary("pass", reference="SyncReference", param_error=1e-7, loss_error=float("inf"), steps=3)
    rec = CaseRecord("mlp/plain", "mlp", 2, {}, "r", check=res)
    assert rec.check is res and res.passed
    back = CaseRecord.from_dict(json.loads(rec.to_json()), "x")
    assert dataclasses.asdict(back.check) == dataclasses.asdict(res)


def test_the_record_shown_in_the_docs_is_a_valid_schema_4_record():
    import os

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "benchmarks.md")
    text = open(path, encoding="utf-8").read()
    block = text.split("**The record (schema 4).**")[1].split("```json\n")[1].split("```")[0]
    rec = CaseRecord.from_dict(json.loads(block), path)
    assert rec.schema_version == SCHEMA_VERSION and rec.describe.precision.cudnn_allow_tf32 is True
    assert rec.metrics.footprint_bytes == 65536 and rec.structure.allreduce_ops == 2
    assert rec.spec is not None and rec.spec.selection.worlds == (2,) and rec.spec.run.rounds == 6


# ---- appends all or nothing, inputs read with limits ---------------------------------------------------------------
def test_append_record_does_not_follow_a_symlink(tmp_path):
    from suite.results.records import append_record

    outside = tmp_path / "outside.jsonl"
    os.symlink(outside, tmp_path / "runs.jsonl")
    with pytest.raises(OSError):
        append_record(str(tmp_path / "runs.jsonl"), fake_record())
    assert not outside.exists()


def test_a_short_write_leaves_the_results_file_whole(tmp_path, monkeypatch):
    from suite.outputs import ShortWrite
    from suite.results.records import append_record, read_records

    path = tmp_path / "runs.jsonl"
    append_record(str(path), fake_record(case="mlp/first"))
    before = path.read_bytes()
    real = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: real(fd, data[: len(data) // 2]))
    with pytest.raises(ShortWrite):
        append_record(str(path), fake_record(case="mlp/second"))
    monkeypatch.setattr(os, "write", real)
    assert path.read_bytes() == before
    assert [r.case for r in read_records(str(path))] == ["mlp/first"]


def _inputs(tmp: Path) -> dict:
    fifo = tmp / "fifo"
    os.mkfifo(fifo)
    deep = tmp / "deep.jsonl"
    deep.write_text("[" * 100_000 + "\n")
    nested = tmp / "nested.jsonl"  # valid JSON and within Python's recursion limit, but no record nests so
    nested.write_text(json.dumps(json.loads(fake_record().to_json()) | {"describe": json.loads("[" * 200 + "]" * 200)})
                      + "\n")
    digits = tmp / "digits.jsonl"
    digits.write_text(fake_record().to_json().replace('"world_size": 2', '"world_size": ' + "9" * 5000) + "\n")
    wide = tmp / "wide.jsonl"
    wide.write_text(fake_record().to_json().replace('"world_size": 2', '"world_size": ' + "9" * 400) + "\n")
    many = tmp / "many.jsonl"
    many.write_text(fake_record(window_s=[0.1] * 200_000).to_json() + "\n")
    return {"fifo": (fifo, "FIFO"), "zero": ("/dev/zero", "device"), "deep": (deep, "nested deeper"),
            "nested": (nested, "nested deeper"), "digits": (digits, "digits"), "wide": (wide, "world_size"),
            "many": (many, "window_s")}


@pytest.mark.parametrize("command", ["report", "compare", "resume"])
def test_hostile_results_files_are_one_error_without_blocking(tmp_path, capsys, no_ranks, bounded, command):
    good = write_records(tmp_path / "good.jsonl", fake_record())
    for name, (path, word) in _inputs(tmp_path).items():
        if command != "compare" and name == "many":
            continue  # only compare reads the samples
        argv = {"report": ["report", path, "--out", tmp_path / "out"], "compare": ["compare", good, path],
                "resume": RUN + ["--resume", path]}[command]
        code, _, err = _cli(argv, capsys)
        _one_error(code, err, word)
