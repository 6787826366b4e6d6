"""Precision as configuration (issue 22.3): TF32, float32_matmul_precision and the cuDNN switches are
knobs with PyTorch's own defaults, applied by every engine before every step (so interleaved engines
each run their own), forced to strict fp32 in correctness checks, recorded as torch reports them on
every rank (ranks that disagree make the case an error), and part of a case's structure, so `compare`
and `ab` report a change as "structure changed"."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from suite.config import ConfigError, StrategyConfig
from suite.engine import PRECISION_KEYS, apply_precision, precision_in_effect
from suite.workload import WorkloadSpec, workload

ODD = dict(matmul_allow_tf32=True, cudnn_allow_tf32=False, cudnn_benchmark=True, cudnn_deterministic=True)


def test_the_defaults_are_what_a_fresh_pytorch_process_reports():
    code = ("import json, torch; b = torch.backends; print(json.dumps({'matmul_allow_tf32': b.cuda.matmul.allow_tf32, "
            "'cudnn_allow_tf32': b.cudnn.allow_tf32, 'float32_matmul_precision': torch.get_float32_matmul_precision(), "
            "'cudnn_benchmark': b.cudnn.benchmark, 'cudnn_deterministic': b.cudnn.deterministic}))")
    fresh = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                                      check=True).stdout)
    assert set(fresh) == set(PRECISION_KEYS)
    default = StrategyConfig()
    assert {k: getattr(default, k) for k in PRECISION_KEYS} == fresh
    assert fresh == {"matmul_allow_tf32": False, "cudnn_allow_tf32": True, "float32_matmul_precision": "highest",
                     "cudnn_benchmark": False, "cudnn_deterministic": False}  # what issue 22 states PyTorch does


def test_a_bad_precision_value_names_the_field_and_the_choices():
    with pytest.raises(ConfigError, match="float32_matmul_precision.*'low'.*highest"):
        StrategyConfig(float32_matmul_precision="low")  # type: ignore[arg-type]
    assert StrategyConfig().with_overrides(["cudnn_benchmark=true"]).cudnn_benchmark is True


def test_matmul_allow_tf32_is_one_setting_with_the_matmul_precision():
    try:
        apply_precision(StrategyConfig(matmul_allow_tf32=True))
        got = precision_in_effect("cpu")
        assert (got["matmul_allow_tf32"], got["float32_matmul_precision"]) == (True, "high")
        apply_precision(StrategyConfig(float32_matmul_precision="medium"))
        got = precision_in_effect("cpu")
        assert (got["matmul_allow_tf32"], got["float32_matmul_precision"]) == (True, "medium")
    finally:
        apply_precision(StrategyConfig())
    assert precision_in_effect("cpu")["float32_matmul_precision"] == "highest"


def interleaved_precision_on_rank() -> dict:
    """Two engines with different precision knobs, stepped in turn: what torch reports after each step."""
    wl = workload(WorkloadSpec("mlp", size="tiny", per_rank_batch=4))
    engines = {"default": wl.engine(StrategyConfig()), "odd": wl.engine(StrategyConfig(**ODD))}
    seen = []
    try:
        for name in ("default", "odd", "default", "odd"):
            engines[name].train_step(*wl.batch(0))
            seen.append((name, precision_in_effect("cpu")))
        return {"seen": seen, "describe": {n: e.describe()["precision"] for n, e in engines.items()}}
    finally:
        apply_precision(StrategyConfig())  # the pool's ranks are shared by other tests


def test_each_engine_applies_its_own_precision_before_every_step_and_describes_it(pool2):
    for answer in pool2.run(interleaved_precision_on_rank):
        for name, facts in answer["seen"]:
            want = StrategyConfig(**ODD) if name == "odd" else StrategyConfig()
            assert facts["cudnn_benchmark"] == want.cudnn_benchmark
            assert facts["cudnn_deterministic"] == want.cudnn_deterministic
            assert facts["cudnn_allow_tf32"] == want.cudnn_allow_tf32
            assert facts["matmul_allow_tf32"] == want.matmul_allow_tf32
        odd, default = answer["describe"]["odd"], answer["describe"]["default"]
        assert set(odd) == set(PRECISION_KEYS) | {"cudnn_version"}
        assert odd == {"matmul_allow_tf32": True, "cudnn_allow_tf32": False, "float32_matmul_precision": "high",
                       "cudnn_benchmark": True, "cudnn_deterministic": True, "cudnn_version": None}
        assert default == {"matmul_allow_tf32": False, "cudnn_allow_tf32": True, "float32_matmul_precision": "highest",
                           "cudnn_benchmark": False, "cudnn_deterministic": False, "cudnn_version": None}


def test_the_correctness_check_runs_tf32_off_and_deterministic_whatever_the_config_says(pool2):
    from suite.check.harness import check_on_rank

    cfg = dict(matmul_allow_tf32=True, float32_matmul_precision="medium", cudnn_benchmark=True)
    try:
        answers = pool2.run(check_on_rank, dict(workload_spec=WorkloadSpec("mlp", size="tiny", per_rank_batch=4),
                                                config=cfg, steps=1))
    finally:
        pool2.run(apply_precision, dict(config=StrategyConfig()))
    for a in answers:
        p = a["describe"]["precision"]
        strict = (p["matmul_allow_tf32"], p["cudnn_allow_tf32"], p["float32_matmul_precision"])
        assert strict == (False, False, "highest")
        # autotuning may pick another algorithm run to run; a check judges the strategy, not cuDNN's choice
        assert (p["cudnn_benchmark"], p["cudnn_deterministic"]) == (False, True)


def _answers(precisions: list) -> list:
    from suite.measure.timing import RankTiming

    return [RankTiming.from_dict({"rank": r, "variants": {"plain": {
        "windows": [0.5, 0.5], "step_times": [0.1] * 4, "losses": [1.0, 0.9], "threads": 1,
        "comm_calls_per_step": {}, "comm_bytes_per_step": {}, "host_syncs": 2,
        "describe": {"strategy": "plain", "precision": p}, "peak_memory_bytes": 1, "peak_memory_kind": "x"}}})
        for r, p in enumerate(precisions)]


def test_ranks_that_report_different_precision_make_the_case_an_error():
    from suite.measure.summary import summarize

    same = {"cudnn_benchmark": False, "cudnn_version": 90100}
    out = summarize(_answers([same, dict(same)]), ["plain"], 8, 2, 2)
    precision = out["plain"].describe.precision
    assert precision is not None and precision.to_dict() == same
    with pytest.raises(ValueError, match=r"plain: the ranks report different precision settings.*1: \{'cudnn_benchmark'"
                                         r": True"):
        summarize(_answers([same, dict(same, cudnn_benchmark=True)]), ["plain"], 8, 2, 2)


def test_a_precision_change_is_structure_changed_for_compare_and_ab(pool2, tmp_path, capsys):
    """Two real runs of mlp/plain that differ in one precision knob: their records carry the precision torch
    reported, `compare` exits 1 with "structure changed", and ab's case comparison says the same."""
    from suite.ab.stats import SeqOptions
    from suite.ab.trials import Side, compare_case
    from suite.cases import get_case
    from suite.cli.main import main
    from suite.results.records import append_record
    from suite.run_spec import AbOptions, ResolvedCase, RunFacts, RunOptions, RunSpec, Selection
    from suite.runner import CaseRunner

    case = get_case("mlp/plain")
    opts = RunOptions(per_rank_batch=4, steps=2, rounds=1, warmup=1, check=False, utilization=False)
    facts = RunFacts(size="tiny", backend="gloo", device="cpu")
    records = {}
    try:
        for side, extra in (("base", {}), ("head", {"cudnn_benchmark": True})):
            rc = ResolvedCase(case, StrategyConfig.from_dict({**case.config, **extra}))
            (rec,) = CaseRunner(pool2, 2, opts, metadata={"torch": "test", "gpu": {"available": False}},
                                reporter=False, facts=facts).run_model([rc], lambda *a: None)
            assert rec.status == "ok", rec.error
            assert rec.describe.precision is not None and rec.describe.precision.cudnn_benchmark is bool(extra)
            # the typed record keeps the set values; cudnn_version is None off CUDA, so absent here
            reported = set(rec.describe.precision.to_dict())
            assert set(PRECISION_KEYS) <= reported <= set(PRECISION_KEYS) | {"cudnn_version"}
            append_record(str(tmp_path / f"{side}.jsonl"), rec)
            records[side] = json.loads(rec.to_json())
    finally:
        pool2.run(apply_precision, dict(config=StrategyConfig()))
    assert main(["compare", str(tmp_path / "base.jsonl"), str(tmp_path / "head.jsonl")]) == 1
    err = capsys.readouterr().err
    assert "mlp/plain@2: structure changed" in err and "precision.cudnn_benchmark: False -> True" in err, err

    class Server:
        proc = type("Running", (), {"poll": staticmethod(lambda: None)})  # a live process: cases closed on it

        def __init__(self, record):
            self.record, self.n = record, 0

        def request(self, op, **fields):
            if op == "prepare":
                self.n += 1
                return {"key": f"k{self.n}"}
            if op == "trial":
                return {"step_s": 0.1, "losses": [1.0]}
            return {"record": self.record} if op == "structure" else {}

    base, head = (Side(label, label, label, "", "/nowhere", Server(records[label])) for label in ("base", "head"))
    spec = RunSpec(Selection(worlds=(2,)), ab=AbOptions(seq=SeqOptions(min_pairs=3, budget_s=5, restart=0)))
    out = compare_case(base, head, "mlp/plain", 2, spec)
    assert out.status.startswith("structure changed"), out
    assert "precision.cudnn_benchmark: False -> True" in out.structure_diff
