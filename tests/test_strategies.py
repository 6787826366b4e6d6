"""Strategies of your own (suite/strategies/user.py, issue 45): a DDP communication hook or a gradient synchronizer
from ``module:function``, checked with the check it declares; torch's own hooks as the registry's cases.

The truth: the exact single-process reference of the check (suite/check/reference.py) for exact strategies, and for
a bounded-error one the exact average of every rank's gradient on the same parameters, computed on the rank from
every shard (suite/check/harness.py); the numbers asserted here are hand-chosen bounds, never the code's own."""
from __future__ import annotations

import math

import pytest

from suite.check.harness import LOSSY_HINT, check_on_rank, summarize
from suite.config import StrategyConfig
from suite.runtime import RankError, RankFailure
from suite.strategies.user import StrategyError, load_strategy, strategy_info
from suite.workload import WorkloadSpec

MINE = "tests.scripts.my_strategies"
HOOKS = "suite.strategies.torch_hooks"


def _check(pool, model: str, strategy: str, data_parallel: str = "ddp", steps: int = 3, timeout: float = 240.0,
           **knobs):
    cfg = StrategyConfig(data_parallel=data_parallel, strategy=strategy, **knobs)
    answers = pool.run(check_on_rank, dict(workload_spec=WorkloadSpec(model, size="tiny"), config=cfg.to_dict(),
                                           steps=steps), timeout=timeout)
    return summarize(cfg, answers)


@pytest.mark.parametrize("model", ["mlp", "resnet", "transformer"])
def test_torchs_fp16_compress_and_powersgd_pass_their_declared_checks_at_world_2(pool2, model):
    fp16 = _check(pool2, model, f"{HOOKS}:fp16_compress")
    assert fp16.kind == "bounded error" and fp16.passed, fp16.message
    assert 0 < fp16.param_error <= 5e-3 and fp16.ranks_identical  # lossy, a little: the check measured it
    for rank in (1, 4):
        ps = _check(pool2, model, f"{HOOKS}:powersgd_r{rank}")
        assert ps.kind == "convergence" and ps.passed and ps.steps == 8, ps.message
        assert ps.loss_error <= 0.05 and ps.ranks_identical


@pytest.mark.parametrize("hook", ["fp16_compress", "powersgd_r1"])
def test_torchs_hooks_pass_their_declared_checks_at_world_4(pool4, hook):
    got = _check(pool4, "mlp", f"{HOOKS}:{hook}")
    assert got.passed and got.kind in ("bounded error", "convergence"), got.message


@pytest.mark.heavy  # every model, both hooks, at world 4: a few minutes on 2 cores
@pytest.mark.parametrize("model", ["resnet", "transformer"])
def test_torchs_hooks_on_every_small_model_at_world_4(pool4, model):
    for hook in ("fp16_compress", "powersgd_r1", "powersgd_r4"):
        got = _check(pool4, model, f"{HOOKS}:{hook}")
        assert got.passed, (hook, got.message)


def test_your_own_hook_and_synchronizer_are_checked_exactly_and_pass(pool2):
    for model in ("mlp", "resnet"):
        hook = _check(pool2, model, f"{MINE}:mean_hook")
        assert hook.kind == "exact" and hook.passed and hook.param_error <= 1e-5, hook.message
        sync = _check(pool2, model, f"{MINE}:per_tensor_sync", data_parallel="suite")
        assert sync.kind == "exact" and sync.passed and sync.param_error <= 1e-5, sync.message


def test_ddp_at_its_best_setting_is_exact(pool2):
    cfg = StrategyConfig(data_parallel="ddp", ddp_gradient_as_bucket_view=True, ddp_static_graph=True)
    answers = pool2.run(check_on_rank, dict(workload_spec=WorkloadSpec("resnet", size="tiny"),
                                            config=cfg.to_dict(), steps=3))
    got = summarize(cfg, answers)
    assert got.passed and got.kind == "exact", got.message


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


def test_a_hook_that_raises_on_one_rank_or_never_completes_fails_within_its_bound(pool2):
    with pytest.raises((RankError, RankFailure)) as info:
        _check(pool2, "mlp", f"{MINE}:raises_on_rank_1", timeout=60)
    assert "deliberate failure on rank 1" in str(info.value)
    with pytest.raises(RankFailure) as info:
        _check(pool2, "mlp", f"{MINE}:never_completes", timeout=20)
    assert "within" in str(info.value) or "stuck" in str(info.value) or "did not answer" in str(info.value), info.value
    assert _check(pool2, "mlp", f"{MINE}:mean_hook").passed  # the pool is whole again for the next case
