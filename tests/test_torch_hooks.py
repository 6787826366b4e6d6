"""torch's own DDP communication hooks as fleetbench strategies (suite/strategies/torch_hooks.py: the registry's
``ddp_*`` cases), each checked with the check it declares, and DDP at its best setting, exact.

The truth: the exact single-process reference of the check (suite/check/reference.py) for exact strategies, and for
a bounded-error one the exact average of every rank's gradient on the same parameters (suite/check/harness.py); the
numbers asserted here are hand-chosen bounds, never the code's own."""
from __future__ import annotations

import pytest

from suite.check.harness import check_on_rank, summarize
from suite.config import StrategyConfig
from suite.workload import WorkloadSpec
from tests.fakes import strategy_check as _check

HOOKS = "suite.strategies.torch_hooks"


@pytest.mark.parametrize("model", ["mlp", "resnet", "transformer"])
def test_torchs_fp16_and_bf16_compress_and_powersgd_pass_their_declared_checks_at_world_2(pool2, model):
    fp16 = _check(pool2, model, f"{HOOKS}:fp16_compress")
    assert fp16.kind == "bounded error" and fp16.passed, fp16.message
    assert 0 < fp16.param_error <= 5e-3 and fp16.ranks_identical  # lossy, a little: the check measured it
    bf16 = _check(pool2, model, f"{HOOKS}:bf16_compress")  # on gloo through its wrapper (torch_hooks.py)
    assert bf16.kind == "bounded error" and bf16.passed, bf16.message
    assert fp16.param_error < bf16.param_error <= 2e-2 and bf16.ranks_identical  # 8 bits against fp16's 11
    for rank in (1, 4):
        ps = _check(pool2, model, f"{HOOKS}:powersgd_r{rank}")
        assert ps.kind == "convergence" and ps.passed and ps.steps == 8, ps.message
        assert ps.loss_error <= 0.05 and ps.ranks_identical


@pytest.mark.parametrize("hook", ["powersgd_r1", pytest.param("fp16_compress", marks=pytest.mark.heavy),
                                  pytest.param("bf16_compress", marks=pytest.mark.heavy)])
def test_torchs_hooks_pass_their_declared_checks_at_world_4(pool4, hook):
    got = _check(pool4, "mlp", f"{HOOKS}:{hook}")
    assert got.passed and got.kind in ("bounded error", "convergence"), got.message


@pytest.mark.heavy  # every model, both hooks, at world 4: a few minutes on 2 cores
@pytest.mark.parametrize("model", ["resnet", "transformer"])
def test_torchs_hooks_on_every_small_model_at_world_4(pool4, model):
    for hook in ("fp16_compress", "bf16_compress", "powersgd_r1", "powersgd_r4"):
        got = _check(pool4, model, f"{HOOKS}:{hook}")
        assert got.passed, (hook, got.message)


def test_ddp_at_its_best_setting_is_exact(pool2):
    cfg = StrategyConfig(data_parallel="ddp", ddp_gradient_as_bucket_view=True, ddp_static_graph=True)
    answers = pool2.run(check_on_rank, dict(workload_spec=WorkloadSpec("resnet", size="tiny"),
                                            config=cfg.to_dict(), steps=3))
    got = summarize(cfg, answers)
    assert got.passed and got.kind == "exact", got.message
