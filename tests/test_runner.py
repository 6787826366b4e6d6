"""The case runner: memory-bounded groups, a recorded fallback, non-finite losses, the selection rules,
and a user's model from outside suite/ through `fleetbench run --model module:function`."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import suite.runtime
from suite.cli.main import main
from suite.config import StrategyConfig
from suite.run_spec import RunFacts, RunOptions
from suite.runner import CaseRunner
from tests.fakes import RUNNER_META, FakeLauncher, fake_record
from tests.fakes import fake_runner as _runner
from tests.fakes import resolved as _rc

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
META = RUNNER_META


def test_groups_are_bounded_by_memory_and_each_holds_the_baseline():
    rcs = [_rc(n) for n in ("mlp/plain", "mlp/overlap", "mlp/fusion", "mlp/multicomm", "mlp/ddp")]
    roomy = _runner(FakeLauncher(), memory_budget=2**40).groups(rcs)
    assert roomy == [["plain", "overlap", "fusion", "multicomm", "ddp"]]
    # the MLP holds ~4.2 M parameters: 4 copies of fp32 per engine per rank, 2 ranks -> ~134 MB per engine
    tight = _runner(FakeLauncher(), memory_budget=3 * 135_000_000).groups(rcs)
    assert tight == [["plain", "overlap", "fusion"], ["plain", "multicomm", "ddp"]], tight


def test_groups_come_from_the_rank_with_the_least_free_memory():
    """Probed on every rank: one rank with room for 2 engines bounds the groups, however roomy the other."""
    rcs = [_rc(n) for n in ("mlp/plain", "mlp/overlap", "mlp/fusion", "mlp/ddp")]
    # ~67.5 MB per engine per rank; 0.6 x 230 MB = 138 MB holds two (the baseline and one variant)
    plan = _runner(FakeLauncher(free=(2**40, 230_000_000))).groups(rcs)
    assert plan == [["plain", "overlap"], ["plain", "fusion"], ["plain", "ddp"]], plan


def test_free_memory_is_the_gpus_under_cuda_and_a_share_of_the_host_on_cpu():
    from suite.runtime.device import Platform, host_available_memory
    from tests.fakes import FakeCuda, fake_cuda_platform

    api = FakeCuda()
    api.free_bytes = 5 * 2**30
    assert fake_cuda_platform(api).free_memory(local_ranks=8) == 5 * 2**30  # its own GPU, not shared
    host = host_available_memory()
    assert abs(Platform("cpu", "gloo").free_memory(local_ranks=4) - host // 4) < host // 8  # the RAM is shared


def test_a_failed_interleaved_timing_is_recorded_as_a_fallback():
    rcs = [_rc("mlp/plain"), _rc("mlp/overlap"), _rc("mlp/fusion")]
    launcher = FakeLauncher(fail_interleaved=True)
    records = _runner(launcher).run_model(rcs, lambda *a: None)
    assert launcher.calls[0] == ["plain", "overlap", "fusion"]
    by = {r.case: r for r in records}
    for name in ("mlp/overlap", "mlp/fusion"):
        assert by[name].status == "ok" and by[name].metrics.samples_per_s > 0
        assert "interleaved timing of 3 variants failed" in by[name].fallback
        assert "rank(s) [1] died" in by[name].fallback and "timed alone with the baseline" in by[name].fallback
    interleaved = _runner(FakeLauncher()).run_model(rcs, lambda *a: None)
    assert all(r.fallback is None for r in interleaved)


def test_utilization_of_every_node_reaches_the_record():
    """Under torchrun each node's local rank 0 samples its GPUs; the runner gathers them to rank 0 (the
    launcher's ``gather``), so node 1's GPUs are in the record, not only rank 0's node."""
    class TorchrunLike(FakeLauncher):
        def gather(self, value):
            node1 = {"sampled": True, "host": "node1", "gpus": [{"util_pct": {"median": 77.0}}], "samples": [1]}
            return [value, None, node1, None]  # ranks 0..3 on 2 nodes: local ranks 0 send, the others None

    runner = CaseRunner(TorchrunLike(), 2, RunOptions(check=False, utilization=True), metadata=META)
    (rec,) = runner.run_model([_rc("mlp/plain")], lambda *a: None)
    util = rec.metrics.utilization
    assert util is not None
    nodes = util["nodes"]
    assert [n["host"] for n in nodes] == [util["host"], "node1"], nodes
    assert nodes[1]["gpus"][0]["util_pct"]["median"] == 77.0 and "samples" not in nodes[1]


def test_a_non_finite_loss_fails_the_case_naming_the_step():
    rcs = [_rc("mlp/plain"), _rc("mlp/overlap")]
    records = _runner(FakeLauncher(losses=(1.0, float("nan"), 0.5))).run_model(rcs, lambda *a: None)
    for r in records:
        assert r.verdict == "fail" and "non-finite loss at step 2" in r.error, (r.verdict, r.error)


def test_records_carry_size_backend_device_and_structure():
    (rec,) = [r for r in _runner(FakeLauncher(), RunFacts(size="tiny", backend="gloo", device="cpu")).run_model(
        [_rc("mlp/plain")], lambda *a: None)]
    assert (rec.size, rec.backend, rec.device) == ("tiny", "gloo", "cpu")
    assert rec.structure.allreduce_ops == 10 and rec.structure.comm_calls_per_step == {"world/all_reduce": 10.0}


class NoRanks:
    def __init__(self, *a, **k):
        raise AssertionError("a rank pool was started despite bad input")


def test_odd_world_sizes_skip_tag_selected_cases_and_refuse_named_ones(monkeypatch, capsys):
    monkeypatch.setattr(suite.runtime, "RankPool", NoRanks)
    assert main(["run", "--nproc", "3", "--list"]) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith("mlp/hierarchical"))
    assert "[skip: hierarchical_allreduce_inter_nranks=2 does not split world size 3" in line
    assert main(["run", "--nproc", "3", "--case", "mlp/hierarchical", "--list"]) == 2
    err = capsys.readouterr().err
    assert "case mlp/hierarchical cannot run at world size 3" in err and err.count("error:") == 1


def test_model_alone_selects_its_cases_and_user_models_get_every_applicable_variant(monkeypatch, capsys):
    monkeypatch.setattr(suite.runtime, "RankPool", NoRanks)
    assert main(["run", "--model", "gpt2", "--list"]) == 0
    names = [ln.split()[0] for ln in capsys.readouterr().out.splitlines()]
    assert "gpt2/overlap" in names and "gpt2/plain" in names and not any("compute_fusion" in n for n in names)
    scripts = os.path.join(ROOT, "tests", "scripts")  # the user's own code: on PYTHONPATH (suite/models' rule)
    monkeypatch.setenv("PYTHONPATH", scripts + os.pathsep + os.environ.get("PYTHONPATH", ""))
    monkeypatch.syspath_prepend(scripts)
    assert main(["run", "--model", "my_models:make_spec", "--list"]) == 0
    names = [ln.split()[0] for ln in capsys.readouterr().out.splitlines()]
    assert {f"my_models.make_spec/{v}" for v in ("plain", "overlap", "local_sgd", "none")} <= set(names)
    assert not any(n.endswith(("/compute_fusion", "/fused_broadcast")) for n in names)  # no BatchNorm
    for ref, words in [("my_models:not_a_spec", "the factory returned dict; expected suite.models.ModelSpec"),
                       ("my_models:nothing", "module 'my_models' has no 'nothing'"),
                       ("no_such_module:make", "cannot import 'no_such_module'"),
                       ("gpt3", "model 'gpt3' is unknown")]:
        assert main(["run", "--model", ref, "--list"]) == 2
        err = capsys.readouterr().err
        assert words in err and err.count("error:") == 1, err
        assert "ModelError" not in err and err.count(f"{ref!r}") == 1, err  # said once, without the class name


@pytest.mark.heavy  # a whole run as a subprocess, ~10 s (test_user_models runs user models in process): make test-slow
def test_a_user_model_from_outside_suite_runs_with_check_and_timing(tmp_path):
    results = tmp_path / "runs.jsonl"
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.run(
        [sys.executable, "-m", "suite.cli.main", "run", "--model", "my_models:make_spec", "--case", "*/plain",
         "--case", "*/overlap", "--case", "*/none", "--size", "tiny", "--rounds", "2", "--steps", "2", "--warmup", "1",
         "--results", str(results), "--no-utilization", "--timeout", "240"],
        cwd=os.path.join(ROOT, "tests", "scripts"), env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    recs = {r["case"]: r for r in map(json.loads, results.read_text().splitlines())}
    assert set(recs) == {"my_models.make_spec/plain", "my_models.make_spec/overlap", "my_models.make_spec/none"}
    assert recs["my_models.make_spec/plain"]["verdict"] == "pass"
    assert recs["my_models.make_spec/overlap"]["verdict"] == "pass"
    for r in recs.values():
        assert r["model"] == "my_models:make_spec" and r["size"] == "tiny" and r["backend"] == "gloo"
        assert r["metrics"]["samples_per_s"] > 0
    assert recs["my_models.make_spec/plain"]["structure"]["allreduce_ops"] == 4  # fc1/fc2 weight and bias


def empty_batch_on_rank() -> str:
    import torch

    from suite.engine import build_engine
    from suite.models import get_model

    spec = get_model("mlp", "tiny")
    engine = build_engine(spec.make(0), spec.loss_fn, StrategyConfig())
    try:
        engine.train_step(torch.zeros(0, 3, 16, 16), torch.zeros(0, dtype=torch.long))
    except ValueError as exc:
        return str(exc)
    return "no error"


def test_an_empty_shard_is_a_clear_error_not_a_nan(pool2):
    for msg in pool2.run(empty_batch_on_rank):
        assert "empty batch at step 1" in msg and "shard the global batch evenly" in msg, msg


def test_runner_trace_is_not_written_through_a_planted_symlink(tmp_path, monkeypatch):
    from suite.run_spec import ResolvedCase, RunFacts, RunOptions
    from suite.runner import CaseRunner

    class Launcher:
        def run(self, *a, **k):
            return [{"events": [], "rank": 0}]

    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "results" / "traces").mkdir(parents=True)
    os.symlink(outside, tmp_path / "results" / "traces" / "run1")
    runner = CaseRunner(Launcher(), 2, RunOptions(trace_steps=1), run_id="run1",
                        facts=RunFacts(results_dir=str(tmp_path / "results")))
    rec = fake_record()
    from suite.cases import CASES
    from suite.config import StrategyConfig

    case = next(c for c in CASES if c.name == "mlp/plain")
    import suite.runner

    monkeypatch.setattr(suite.runner, "chrome_trace", lambda answers, title="": {"traceEvents": []})
    runner.trace(ResolvedCase(case, StrategyConfig.from_dict(case.config), None), rec)
    assert os.listdir(outside) == [] and rec.metrics.trace_file is None
    assert rec.metrics.trace_error is not None and "outside" in rec.metrics.trace_error


def test_the_per_call_timeout_scales_with_steps_variants_and_model_and_a_given_one_wins():
    """600 s for every call was too short for GPT-2 `full` with its 13 variants interleaved."""
    from suite.run_spec import RunFacts, RunOptions
    from suite.runner import CaseRunner

    def runner(**kw):
        return CaseRunner(None, 8, RunOptions(**kw), metadata={}, facts=RunFacts(size="full", device="cuda"))

    r = runner()
    one = r.call_timeout("gpt2", steps=1) - 600
    assert one > 0
    assert r.call_timeout("gpt2", steps=27, variants=13) - 600 == pytest.approx(27 * 13 * one)  # steps x variants
    assert r.call_timeout("gpt2", 27, 13) > 1800  # the default run (2 + 5 x 5 steps), every variant at once
    assert r.call_timeout("mlp", 1) - 600 < one  # a smaller model, a smaller allowance
    assert runner(timeout=42.0).call_timeout("gpt2", 27, 13) == 42.0  # --timeout given: exactly that
