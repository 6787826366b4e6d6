"""Results records: schema, atomic appends, and clear errors for corrupt files."""
from __future__ import annotations

import json
import math

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
