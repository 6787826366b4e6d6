"""Results records: schema, atomic appends, and clear errors for corrupt files."""
from __future__ import annotations

import json

import pytest

from suite.results.records import SCHEMA_VERSION, CaseRecord, ResultsFileError, append_record, read_records


def _rec(name="mlp/plain", sps=100.0):
    return CaseRecord(name, "mlp", 2, {"data_parallel": "suite"}, "run1", verdict="pass",
                      metrics={"samples_per_s": sps, "ci": [float("inf"), float("nan")]})


def test_round_trip_and_schema(tmp_path):
    path = str(tmp_path / "r.jsonl")
    append_record(path, _rec("a"))
    append_record(path, _rec("b", 50.0))
    recs = read_records(path)
    assert [r.case for r in recs] == ["a", "b"]
    assert recs[1].samples_per_s == 50.0
    assert recs[0].schema_version == SCHEMA_VERSION
    assert recs[0].metrics["ci"] == ["inf", "nan"]  # JSON has no inf/nan: stored as strings


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
    assert rec.structure["allreduce_ops_before_fusion"] == 10 and rec.structure["allreduce_ops"] == 1
    assert rec.structure["buckets"] == [{"params": 10, "bytes": 4096, "comm": 0}]
    assert rec.structure["comm_calls_per_step"] == {"comm0/all_reduce": 1.0}
    assert path.read_bytes() == before  # never rewritten


def test_new_records_carry_size_backend_device_and_structure(tmp_path):
    path = str(tmp_path / "r.jsonl")
    append_record(path, CaseRecord("mlp/plain", "mlp", 2, {}, "r", size="cpu", backend="gloo", device="cpu",
                                   structure={"allreduce_ops": 10}, fallback="timed alone: rank 1 died"))
    (rec,) = read_records(path)
    assert rec.schema_version == SCHEMA_VERSION == 2
    assert (rec.size, rec.backend, rec.device, rec.structure, rec.fallback) == (
        "cpu", "gloo", "cpu", {"allreduce_ops": 10}, "timed alone: rank 1 died")


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
