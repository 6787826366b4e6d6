"""`fleetbench` from the command line: bad input is refused before any rank starts; a run prints a
table with a verdict and a throughput per case and appends records."""
from __future__ import annotations

import json

import pytest

import suite.runtime
from suite.cli.main import main


class NoRanks:
    def __init__(self, *a, **k):
        raise AssertionError("a rank pool was started despite bad input")


BAD_ARGS = [
    (["run", "--nproc", "0"], "--nproc 0: must be >= 1"),
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


@pytest.mark.parametrize("nproc", [2, 4])
def test_run_prints_verdicts_and_throughput_and_appends_records(capsys, tmp_path, nproc):
    path = tmp_path / "runs.jsonl"
    code = main(["run", "--nproc", str(nproc), "--case", "mlp/plain", "--case", "mlp/ddp", "--case", "mlp/none",
                 "--rounds", "2", "--steps", "2", "--warmup", "1", "--results", str(path)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "speedup vs plain" in out and f"appended to {path}" in out
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
