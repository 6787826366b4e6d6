"""A case's structure: extracted from what a run records, compared exactly."""
from __future__ import annotations

import pytest

from suite.results.structure import structure_diff, structure_of

DESCRIBE = {"strategy": "bucketed", "allreduce_ops_before_fusion": 161, "allreduce_ops": 6, "overlap": True,
            "nccl_comm_num": 2, "init_broadcasts": 320, "buckets": [{"params": 30, "layers": 10, "bytes": 2**20,
                                                                     "comm": 0}],
            "compute_fusion": {"bn_act": {"found": 33, "fused": 33, "skipped": []}},
            "optimizer": {"optimizer_ops_before_fusion": 161, "optimizer_ops": 2, "numel": 1}}
METRICS = {"comm_calls_per_step": {"comm1/all_reduce": 3.0, "comm0/all_reduce": 3.0},
           "comm_bytes_per_step": {"comm0/all_reduce": 1e6}, "samples_per_s": 12.5}
CHECK = {"losses": [2.5, 2.25, 2.0625]}


def facts(describe: dict, metrics: dict, check: dict, deterministic: bool = False) -> dict:
    """structure_of from a record's parts as plain values (a record reads them from its typed parts)."""
    return structure_of(describe, metrics.get("comm_calls_per_step"), metrics.get("comm_bytes_per_step"),
                        check.get("losses"), deterministic=deterministic)


def test_structure_holds_counts_buckets_collectives_and_bitwise_losses():
    s = facts(DESCRIBE, METRICS, CHECK, deterministic=True)
    assert s["allreduce_ops_before_fusion"] == 161 and s["allreduce_ops"] == 6
    assert s["buckets"] == [{"params": 30, "bytes": 2**20, "comm": 0}]
    assert s["fused_ops"] == {"bn_act": 33}
    assert s["optimizer_ops"] == {"optimizer_ops_before_fusion": 161, "optimizer_ops": 2}
    assert list(s["comm_calls_per_step"]) == ["comm0/all_reduce", "comm1/all_reduce"]
    assert s["loss_trajectory"] == [(2.5).hex(), (2.25).hex(), (2.0625).hex()]
    assert "samples_per_s" not in s  # timings are not structure
    assert "loss_trajectory" not in facts(DESCRIBE, METRICS, CHECK, deterministic=False)


def test_identical_structures_have_no_diff_and_every_change_is_named():
    a = facts(DESCRIBE, METRICS, CHECK, deterministic=True)
    assert structure_diff(a, dict(a)) == []
    fewer = dict(DESCRIBE, allreduce_ops=5, buckets=[{"params": 30, "bytes": 2**21, "comm": 0}])
    b = facts(fewer, METRICS, {"losses": [2.5, 2.25, 2.0625000000000004]}, deterministic=True)
    diff = structure_diff(a, b)
    assert "allreduce_ops: 6 -> 5" in diff
    assert any(d.startswith("buckets: 1 -> 1 (bytes [1048576] -> [2097152])") for d in diff), diff
    assert any(d.startswith("loss_trajectory: differs from step 3") for d in diff), diff
    c = facts(DESCRIBE, dict(METRICS, comm_calls_per_step={"comm0/all_reduce": 6.0}), CHECK)
    assert "comm_calls_per_step.comm1/all_reduce: 3.0 -> <absent>" in structure_diff(a, c)


def test_a_loss_trajectory_on_one_side_only_is_not_a_difference():
    a = facts(DESCRIBE, METRICS, CHECK, deterministic=True)
    b = facts(DESCRIBE, METRICS, CHECK, deterministic=False)
    assert structure_diff(a, b) == []


def test_a_fact_on_one_side_only_is_new_not_a_change():
    """A baseline from before a fact existed (e.g. precision, recorded from schema 3) must not fail the gate."""
    from suite.results.structure import structure_diff, structure_new

    base = {"allreduce_ops": 1, "buckets": [{"params": 2, "bytes": 8, "comm": 0}]}
    head = dict(base, precision={"matmul_allow_tf32": False})
    assert structure_diff(base, head) == []
    assert structure_new(base, head) == ["precision: new in HEAD"]
    assert structure_new(head, base) == ["precision: recorded by BASE only"]
    head["allreduce_ops"] = 2
    assert structure_diff(base, head) == ["allreduce_ops: 1 -> 2"]


def test_an_intended_structure_change_is_acknowledged_by_a_committed_file(tmp_path):
    from suite.results.structure import acknowledged, read_acks

    ack = tmp_path / "structure-changes.toml"
    assert read_acks(str(ack)) == []  # no file: nothing acknowledged
    ack.write_text('[[change]]\ncase = "mlp/*"\nfact = "buckets"\nwhy = "32 MB buckets"\n')
    acks = read_acks(str(ack))
    assert acknowledged("mlp/fusion", ["buckets: 6 -> 1 (bytes [1] -> [6])"], acks)
    assert not acknowledged("mlp/fusion", ["buckets: 6 -> 1", "allreduce_ops: 6 -> 1"], acks)  # one not named
    assert not acknowledged("resnet/fusion", ["buckets: 6 -> 1"], acks)  # another case
    assert not acknowledged("mlp/fusion", [], acks)
    ack.write_text('[[change]]\ncase = "mlp/*"\nfact = "buckets"\n')
    with pytest.raises(ValueError, match="exactly case, fact and why"):
        read_acks(str(ack))
    ack.write_text('oops = 1\n')
    with pytest.raises(ValueError, match=r"only \[\[change\]\] tables"):
        read_acks(str(ack))


def test_a_record_derives_its_structure_from_its_typed_parts():
    """CaseRecord.derived_structure reads the describe, the collectives per step and the check's losses from the
    record's typed parts: the same facts as structure_of over the same values."""
    from suite.results.records import CaseRecord, CheckSummary, Structure

    rec = CaseRecord("mlp/overlap", "mlp", 2, {}, "r", describe=DESCRIBE, metrics=METRICS,
                     check=CheckSummary("pass", losses=CHECK["losses"]))
    got = rec.derived_structure(deterministic=True)
    assert isinstance(got, Structure)
    assert got.to_dict() == facts(DESCRIBE, METRICS, CHECK, deterministic=True)
    assert got.allreduce_ops == 6 and got.comm_bytes_per_step == {"comm0/all_reduce": 1e6}
    assert got.loss_trajectory == [(2.5).hex(), (2.25).hex(), (2.0625).hex()]
    assert rec.derived_structure().loss_trajectory is None  # not deterministic: no trajectory
