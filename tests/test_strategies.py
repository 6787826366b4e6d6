"""Strategies of your own (suite/strategies/user.py, issue 45): a DDP communication hook or a gradient synchronizer
from ``module:function``, checked with the check it declares (torch's own hooks: tests/test_torch_hooks.py).

The truth: the exact single-process reference of the check (suite/check/reference.py) for exact strategies, and for
a bounded-error one the exact average of every rank's gradient on the same parameters, computed on the rank from
every shard (suite/check/harness.py); the numbers asserted here are hand-chosen bounds, never the code's own."""
from __future__ import annotations

import math
import os

import pytest

from suite.check.harness import LOSSY_HINT, check_on_rank, summarize
from suite.config import StrategyConfig
from suite.runtime import RankError, RankFailure
from suite.strategies.user import StrategyError, load_strategy, strategy_info
from suite.workload import WorkloadSpec
from tests.fakes import strategy_check as _check

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MINE = "tests.scripts.my_strategies"


def test_your_own_hook_and_synchronizer_are_checked_exactly_and_pass(pool2):
    for model in ("mlp", "resnet"):
        hook = _check(pool2, model, f"{MINE}:mean_hook")
        assert hook.kind == "exact" and hook.passed and hook.param_error <= 1e-5, hook.message
        sync = _check(pool2, model, f"{MINE}:per_tensor_sync", data_parallel="suite")
        assert sync.kind == "exact" and sync.passed and sync.param_error <= 1e-5, sync.message


@pytest.mark.parametrize("fn", ["drops_a_bucket", "sums_instead_of_averaging"])
def test_a_sabotaged_hook_fails_naming_the_tensor_and_the_step(pool2, fn):
    got = _check(pool2, "mlp", f"{MINE}:{fn}")
    assert got.verdict == "fail" and got.kind == "exact", got
    assert "parameter error" in got.message and "(worst at '" in got.message and ", step " in got.message
    assert got.param_error_at and not math.isnan(got.param_error)


def test_a_lossy_hook_declared_exact_fails_and_says_how_to_declare_it(pool2):
    got = _check(pool2, "mlp", f"{MINE}:fp16_claimed_exact")
    assert got.verdict == "fail" and got.kind == "exact"
    assert LOSSY_HINT in got.message and "BoundedError(rel=...)" in got.message
    declared = _check(pool2, "mlp", f"{MINE}:fp16_hook")  # the same hook with its bound declared
    assert declared.passed and declared.kind == "bounded error", declared.message


def test_a_bounded_error_check_fails_a_hook_over_its_bound(pool2, monkeypatch):
    """The bound is the strategy's: the averaged gradients of torch's fp16 hook, held to 1e-9, are over it."""
    cfg = StrategyConfig(data_parallel="ddp", strategy=f"{MINE}:fp16_hook")
    answers = pool2.run(check_on_rank, dict(workload_spec=WorkloadSpec("mlp", size="tiny"), config=cfg.to_dict(),
                                            steps=3))
    for a in answers:
        a["bound"] = 1e-9
    got = summarize(cfg, answers)
    assert got.verdict == "fail" and "averaged gradient error" in got.message and "> 1e-09 declared" in got.message
    assert "(worst at '" in got.message and ", step " in got.message


@pytest.mark.parametrize("fn,words", [
    ("returns_a_string", "the function returned str; expected a suite.strategies.user.DDPHook or Synchronizer"),
    ("hook_not_callable", "its hook is str, not callable"),
    ("not_a_function", "'not_a_function' is int, not a Python function of your own"),
])
def test_bad_strategy_input_is_one_clear_error(fn, words):
    with pytest.raises(StrategyError) as info:
        load_strategy(f"{MINE}:{fn}")
    assert words in str(info.value) and f"--strategy '{MINE}:{fn}'" in str(info.value)


def test_a_strategy_function_that_hangs_is_stopped_at_its_bound_in_a_child():
    with pytest.raises(StrategyError, match="did not return within 3 s; it was stopped"):
        strategy_info(f"{MINE}:sleeps_forever", timeout=3.0)
    with pytest.raises(StrategyError, match="'os' is Python's standard library"):
        strategy_info("os:getcwd")  # refused before anything is imported


def test_a_hook_that_raises_on_one_rank_fails_and_the_pool_goes_on(pool2):
    with pytest.raises((RankError, RankFailure)) as info:
        _check(pool2, "mlp", f"{MINE}:raises_on_rank_1", timeout=60)
    assert "deliberate failure on rank 1" in str(info.value)
    assert _check(pool2, "mlp", f"{MINE}:mean_hook").passed  # the pool is whole again for the next case


@pytest.mark.heavy  # the pool's ranks restarted after the bound: make test keeps the bound of a stuck rank
def test_a_hook_that_never_completes_fails_within_its_bound(pool2):  # (tests/test_runtime.py, the stuck rank)
    with pytest.raises(RankFailure) as info:
        _check(pool2, "mlp", f"{MINE}:never_completes", timeout=8)  # the bound is what is tested, not its size
    assert "within" in str(info.value) or "stuck" in str(info.value) or "did not answer" in str(info.value), info.value
    assert _check(pool2, "mlp", f"{MINE}:mean_hook").passed  # the pool is whole again for the next case


def _user_run(tmp_path, nproc: int):
    """`fleetbench run` in a directory outside the repository holding two modules of a user's: one with a DDP hook,
    one with a gradient synchronizer, beside a model factory of theirs; a registry model and their model."""
    import shutil
    import subprocess
    import sys

    root = ROOT
    work = tmp_path / "mine"
    work.mkdir()
    source = open(os.path.join(root, "tests", "scripts", "my_strategies.py")).read()
    (work / "team_hooks.py").write_text(source)
    (work / "team_syncs.py").write_text(source)
    shutil.copy(os.path.join(root, "tests", "scripts", "my_models.py"), work / "my_models.py")
    results, junit = work / "runs.jsonl", work / "junit.xml"
    env = dict(os.environ, PYTHONPATH=root)
    proc = subprocess.run(
        [sys.executable, "-m", "suite.cli.main", "run", "--model", "mlp", "--model", "my_models:make_spec",
         "--strategy", "team_hooks:mean_hook", "--strategy", "team_syncs:per_tensor_sync", "--nproc", str(nproc),
         "--size", "tiny", "--rounds", "2", "--steps", "2", "--warmup", "1", "--no-utilization", "--results",
         str(results), "--junit", str(junit)], cwd=work, env=env, capture_output=True, text=True, timeout=900)
    return proc, work, results, junit


def _the_users_run_is_a_run_like_any(tmp_path, nproc: int) -> None:
    import json
    import subprocess
    import sys
    import xml.etree.ElementTree as ET

    proc, work, results, junit = _user_run(tmp_path, nproc)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    recs = {r["case"]: r for r in map(json.loads, results.read_text().splitlines())}
    want = {f"{m}/{v}" for m in ("mlp", "my_models.make_spec")
            for v in ("plain", "team_hooks.mean_hook", "team_syncs.per_tensor_sync")}
    assert set(recs) == want, set(recs)
    for name in want - {"mlp/plain", "my_models.make_spec/plain"}:
        r = recs[name]
        assert r["status"] == "ok" and r["verdict"] == "pass" and r["check"]["kind"] == "exact", r
        assert r["metrics"]["speedup"] > 0 and r["world_size"] == nproc, r["metrics"]
        assert r["describe"]["own_strategy"]["ref"] in ("team_hooks:mean_hook", "team_syncs:per_tensor_sync")
    assert recs["mlp/team_hooks.mean_hook"]["config"]["data_parallel"] == "ddp"
    assert recs["mlp/team_syncs.per_tensor_sync"]["config"]["data_parallel"] == "suite"
    assert "mlp/team_hooks.mean_hook" in proc.stdout and "speedup" in proc.stdout
    cases = {c.get("name") for c in ET.parse(junit).getroot().iter("testcase")}
    assert {f"{n}@{nproc}" for n in want} <= cases, cases  # a JUnit test case per case x world size
    report = subprocess.run([sys.executable, "-m", "suite.cli.main", "report", str(results), "--out",
                             str(work / "report")], cwd=work, capture_output=True, text=True, timeout=300,
                            env=dict(os.environ, PYTHONPATH=ROOT))
    assert report.returncode == 0, report.stderr[-2000:]
    import re

    text = re.sub(r"<[^>]+>", "", (work / "report" / "index.html").read_text())  # as shown: names break at "/"
    assert "mlp/team_hooks.mean_hook" in text and "my_models.make_spec/team_syncs.per_tensor_sync" in text


def test_your_own_strategies_outside_the_repository_run_every_case_of_your_model_and_the_registrys_at_world_2(
        tmp_path):
    _the_users_run_is_a_run_like_any(tmp_path, 2)


@pytest.mark.heavy  # the same at world 4: two more minutes on 2 cores
def test_your_own_strategies_outside_the_repository_at_world_4(tmp_path):
    _the_users_run_is_a_run_like_any(tmp_path, 4)


@pytest.mark.heavy  # a whole run as a subprocess, two of its cases bounded by --timeout: about two minutes
def test_a_run_with_a_hook_that_raises_and_one_that_never_completes_fails_those_cases_and_goes_on(tmp_path):
    import json
    import subprocess
    import sys

    results = tmp_path / "runs.jsonl"
    proc = subprocess.run(
        [sys.executable, "-m", "suite.cli.main", "run", "--model", "mlp", "--strategy", f"{MINE}:raises_on_rank_1",
         "--strategy", f"{MINE}:never_completes", "--strategy", f"{MINE}:mean_hook", "--nproc", "2", "--size", "tiny",
         "--rounds", "2", "--steps", "2", "--timeout", "30", "--no-utilization", "--results", str(results)],
        cwd=ROOT, capture_output=True, text=True, timeout=900)
    recs = {r["case"]: r for r in map(json.loads, results.read_text().splitlines())}
    assert recs["mlp/my_strategies.raises_on_rank_1"]["status"] == "error"
    assert "deliberate failure on rank 1" in recs["mlp/my_strategies.raises_on_rank_1"]["error"]
    assert recs["mlp/my_strategies.never_completes"]["status"] == "error", recs["mlp/my_strategies.never_completes"]
    assert recs["mlp/my_strategies.mean_hook"]["verdict"] == "pass" and proc.returncode == 1, proc.stderr[-2000:]
