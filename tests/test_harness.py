"""The correctness harness passes plain data parallel and DDP, and catches broken averaging."""
from __future__ import annotations

import pytest
import torch

from suite import StrategyConfig
from suite.check.errors import finite_le, max_finite, rel_error
from suite.check.harness import run_check, summarize
from suite.workload import WorkloadSpec


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("model", ["resnet", "mlp", "transformer"])
@pytest.mark.parametrize("dp", ["suite", "ddp"])
def test_plain_and_ddp_match_the_reference(pools, world, model, dp):
    res = run_check(pools(world), WorkloadSpec(model, per_rank_batch=8), StrategyConfig(data_parallel=dp), steps=3)
    assert res.verdict == "pass", res.message
    assert finite_le(res.param_error, 1e-5) and finite_le(res.loss_error, 1e-5)
    assert res.ranks_identical and res.steps == 3
    # The check really trained: parameters moved away from the initial ones (else equality is trivial).
    assert len(res.per_step) == 3


# --- sabotage: each runs inside the ranks, breaks the averaging, then runs the harness there ------------

def _check_with(patch: str, model: str = "mlp") -> dict:
    from suite.check import harness
    from suite.comm import grad_sync

    original_avg = grad_sync.GradSync._allreduce_average
    original_finish = grad_sync.PlainGradSync.finish_step

    def no_divide(self, tensor, group, async_op=False):
        from suite.comm import collectives as C

        C.all_reduce(tensor, group=group)  # sums, forgets to divide by the world size

    def skip_one(self):
        for _, p in self.named_params[1:]:  # the first parameter is never reduced
            self._allreduce_average(p.grad, self.group)

    try:
        if patch == "no_divide":
            grad_sync.GradSync._allreduce_average = no_divide
        elif patch == "skip_one":
            grad_sync.PlainGradSync.finish_step = skip_one
        return harness.check_on_rank(WorkloadSpec(model, per_rank_batch=8), {}, steps=3)
    finally:
        grad_sync.GradSync._allreduce_average = original_avg
        grad_sync.PlainGradSync.finish_step = original_finish


@pytest.mark.parametrize("patch", ["no_divide", "skip_one"])
def test_harness_catches_broken_averaging(pool2, patch):
    answers = pool2.run(_check_with, {"patch": patch})
    res = summarize(StrategyConfig(), answers)
    assert res.verdict == "fail", f"sabotage {patch} went unnoticed: {res}"
    assert not finite_le(res.param_error, 1e-5)
    # The pool is healthy afterwards and the unbroken strategy still passes.
    assert run_check(pool2, WorkloadSpec("mlp", per_rank_batch=8), StrategyConfig()).verdict == "pass"


def test_error_measure_fails_on_nan_and_inf():
    a = torch.ones(3)
    assert rel_error(a, a) == 0.0
    assert rel_error(torch.tensor([1.0, float("nan"), 1.0]), a) == float("inf")
    assert rel_error(torch.tensor([1.0, float("inf"), 1.0]), a) == float("inf")
    assert abs(rel_error(torch.tensor([1.0, 1.5]), torch.tensor([1.0, 2.0])) - 0.25) < 1e-12
    # Near zero the floor (1e-2) applies: a 1e-9 difference on values of 1e-5 is not a 1e-4 error.
    tiny = torch.tensor([1e-5], dtype=torch.float64)
    assert abs(rel_error(tiny + 1e-9, tiny) - 1e-7) < 1e-12
    assert max_finite([0.0, float("nan")]) == float("inf")  # max(0.0, nan) would say 0.0
    assert not finite_le(float("nan"), 1.0) and not finite_le(float("inf"), 1.0) and finite_le(0.5, 1.0)


def test_batchnorm_models_are_checked_in_float64_when_the_config_is_fp32():
    import torch

    from suite.check.harness import check_precision

    assert check_precision(StrategyConfig(), has_batchnorm=True) == torch.float64
    assert check_precision(StrategyConfig(), has_batchnorm=False) == torch.float32
    assert check_precision(StrategyConfig(amp="bf16"), has_batchnorm=True) == torch.float32
    assert check_precision(StrategyConfig(grad_comm_dtype="bf16"), has_batchnorm=True) == torch.float32


@pytest.mark.parametrize("variant", ["overlap", "compute_fusion", "adaptive_local_sgd"])
def test_resnet_at_world_4_matches_its_reference_to_float64_rounding(pool4, variant):
    """In float32 these miss 1e-5 at a BatchNorm bias on summation-order noise (adaptive Local SGD: 1.3e-5);
    in float64 the engine and the reference agree to ~1e-15, far inside the unchanged 1e-5."""
    from suite.cases import get_case

    cfg = StrategyConfig.from_dict(get_case(f"resnet/{variant}").config)
    res = run_check(pool4, WorkloadSpec("resnet", per_rank_batch=8), cfg, steps=3)
    assert res.verdict == "pass" and res.precision == "float64", res.message
    assert res.param_error < 1e-12 and res.buffer_error < 1e-12, (res.param_error, res.buffer_error)


def test_the_parameter_digest_sees_every_bit_and_copies_no_parameter_to_the_host(monkeypatch):
    """The check's "ranks identical" digest: equal parameters give equal digests; one flipped bit anywhere (the
    first word, inside a later chunk of 2**20 words, the last word) changes it, in fp32, fp64 and bf16; the only
    host copy is of the sums (two per chunk), never of a parameter."""
    from suite.check import harness

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(1100, 1000), torch.nn.Linear(1000, 3))  # 1.1 M words: two chunks
    base = harness.param_digest(net)
    assert harness.param_digest(net) == base
    big = net[0].weight
    for index in (0, 2**20 + 5, big.numel() - 1):
        for bit in (0, 17, 31):
            with torch.no_grad():
                words = big.view(-1).view(torch.int32)
                words[index] ^= 1 << bit if bit < 31 else -(2**31)
                assert harness.param_digest(net) != base, (index, bit)
                words[index] ^= 1 << bit if bit < 31 else -(2**31)
    assert harness.param_digest(net) == base
    for dtype in (torch.float64, torch.bfloat16):
        other = torch.nn.Linear(5, 3).to(dtype)
        d = harness.param_digest(other)
        with torch.no_grad():
            other.bias.view(-1).view(torch.int16)[-1] ^= 1
        assert harness.param_digest(other) != d, dtype
    copied = []
    real_cpu = torch.Tensor.cpu

    def cpu(self, *a, **k):
        copied.append(self.numel())
        return real_cpu(self, *a, **k)

    monkeypatch.setattr(torch.Tensor, "cpu", cpu)
    harness.param_digest(net)
    # 5 chunks (the big weight's two, one each of the other three tensors) x (sum, weighted sum): one copy of 10
    assert copied == [2 * 5], copied
