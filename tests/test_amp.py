"""AMP: Paddle's loss-scaling rule, bf16 losses close to fp32 on the reference models, and a
step with inf/nan on one rank skipped on every rank (found-inf reduced across ranks)."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from suite.check.errors import finite_le, rel_error
from suite.config import StrategyConfig
from suite.strategies.amp import Amp, LossScaler, check_amp_supported


# ---------------------------------------------------------------------------------------
# The rule, host side (expected values worked out by hand)
# ---------------------------------------------------------------------------------------
def test_paddle_defaults_and_rule():
    s = LossScaler(StrategyConfig(amp="fp16"))  # Paddle: dynamic on, 32768, 1000, 2, 2.0, 0.8
    assert (s.enabled, s.dynamic, s.scale) == (True, True, 32768.0)
    s.update(True)  # one bad step: scale unchanged
    assert (s.scale, s.good_steps, s.bad_steps, s.skipped_steps) == (32768.0, 0, 1, 1)
    s.update(True)  # two consecutive: shrunk by 0.8
    assert (s.scale, s.good_steps, s.bad_steps, s.skipped_steps) == (32768.0 * 0.8, 0, 0, 2)
    s.update(False)
    s.update(True)  # bad, good, bad: not consecutive, no shrink
    s.update(False)
    s.update(True)
    assert (s.scale, s.bad_steps, s.skipped_steps) == (32768.0 * 0.8, 1, 4)
    for _ in range(999):
        s.update(False)
    assert (s.scale, s.good_steps, s.bad_steps) == (32768.0 * 0.8, 999, 0)
    s.update(False)  # the 1000th good step in a row: grown by 2
    assert (s.scale, s.good_steps) == (32768.0 * 0.8 * 2, 0)


def test_scale_never_below_one_and_never_inf():
    s = LossScaler(StrategyConfig(amp="bf16", use_dynamic_loss_scaling=True, init_loss_scaling=1.5,
                                  decr_every_n_nan_or_inf=1, decr_ratio=0.5, incr_every_n_steps=1, incr_ratio=4.0))
    s.update(True)
    assert s.scale == 1.0
    s.update(True)
    assert s.scale == 1.0
    s.scale = 1e308
    s.update(False)  # 4e308 overflows: keep the old scale
    assert s.scale == 1e308


def test_static_scaling_keeps_scale_but_counts_skips():
    s = LossScaler(StrategyConfig(amp="fp16", use_dynamic_loss_scaling=False, init_loss_scaling=128.0))
    assert (s.enabled, s.dynamic) == (True, False)
    for bad in (True, True, True, False):
        s.update(bad)
    assert (s.scale, s.skipped_steps) == (128.0, 3)


def test_bf16_without_scaling_and_derived_properties():
    assert not StrategyConfig(amp="bf16").loss_scaling_enabled
    amp = Amp(StrategyConfig(amp="bf16"), None, "cpu")
    assert amp.scale_loss(torch.tensor(2.0)).item() == 2.0 and amp.unscale_and_check(None) is False
    with amp.autocast():
        out = torch.ones(2, 2) @ torch.ones(2, 2)
    assert out.dtype == torch.bfloat16


def test_fp16_autocast_on_this_cpu():
    """fp16 on CPU: this torch supports it (checked); a torch that does not must say so clearly."""
    try:
        check_amp_supported("fp16", "cpu")
    except ValueError as exc:
        assert "amp='fp16'" in str(exc) and "allowed here" in str(exc)
        pytest.fail(f"torch {torch.__version__} cannot autocast fp16 on CPU here: {exc}")
    amp = Amp(StrategyConfig(amp="fp16"), None, "cpu")
    with amp.autocast():
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float16
    assert amp.scale_loss(torch.tensor(1.0)).item() == 32768.0


def test_unsupported_device_is_a_clear_error():
    with pytest.raises(ValueError, match=r"amp='bf16' on device 'xpu'.*allowed here"):
        check_amp_supported("bf16", "xpu")


# ---------------------------------------------------------------------------------------
# bf16 against fp32 on the reference models (2 ranks, the engine end to end)
# ---------------------------------------------------------------------------------------
def losses_bf16_vs_fp32(model: str, steps: int = 20, per_rank_batch: int = 4) -> dict:
    from suite.data.synthetic import make_dataset, prepare, shard, step_indices
    from suite.engine import build_engine
    from suite.models import get_model
    from suite.runtime.context import current

    ctx = current()
    spec = get_model(model)
    data = make_dataset(spec, 256, 0)
    out = {}
    for name, cfg in (("fp32", StrategyConfig()), ("bf16", StrategyConfig(amp="bf16"))):
        engine = build_engine(spec.make(0), spec.loss_fn, cfg)
        losses = []
        for step in range(steps):
            idx = shard(step_indices(len(data), step, per_rank_batch * ctx.world_size, 0), ctx.rank, ctx.world_size)
            x, y = data.get(idx)
            losses.append(engine.train_step(prepare(data, x, ctx.platform.device), y).item())
        out[name] = losses
    return out


@pytest.mark.parametrize("model", ["resnet", "mlp", "transformer"])
def test_bf16_losses_follow_fp32(pool2, model):
    answers = pool2.run(losses_bf16_vs_fp32, dict(model=model))
    for rank, a in enumerate(answers):
        errs = [rel_error(torch.tensor(b), torch.tensor(f)) for b, f in zip(a["bf16"], a["fp32"])]
        assert len(errs) == 20
        worst = max(errs)
        assert all(finite_le(e, 5e-2) for e in errs), f"rank {rank}: bf16 loss off by {worst:.3g} (> 5e-2): {errs}"
        assert worst > 0, "bf16 losses equal fp32's exactly: autocast did not run"


# ---------------------------------------------------------------------------------------
# inf on one rank after communication: every rank skips
# ---------------------------------------------------------------------------------------
def steps_with_injected_inf(config: dict, steps: int, bad_steps: list, bad_rank: int = 1) -> list:
    from suite.comm import collectives as C
    from suite.engine import build_engine
    from suite.runtime.context import current

    ctx = current()
    torch.manual_seed(100 + ctx.rank)  # ranks start different: the broadcast makes them agree
    model = nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 3))
    engine = build_engine(model, nn.functional.cross_entropy, StrategyConfig.from_dict(config))
    sync = engine.grad_sync
    state = {"step": 0}
    if bad_steps:  # (DDP has no GradSync to wrap; it is only used here without injection)
        finish = sync.finish_step

        def finish_then_inject():
            finish()  # gradients communicated; now poison one rank's
            if state["step"] in bad_steps and ctx.rank == bad_rank:
                p = next(iter(model.parameters()))
                p.grad.view(-1)[0] = float("inf")

        sync.finish_step = finish_then_inject
    g = torch.Generator().manual_seed(7 + ctx.rank)
    out = []
    for step in range(1, steps + 1):
        state["step"] = step
        before = [p.detach().clone() for p in model.parameters()]
        C.STATS.reset()
        engine.train_step(torch.randn(4, 12, generator=g), torch.randint(0, 3, (4,), generator=g))
        unchanged = all(torch.equal(b, p) for b, p in zip(before, model.parameters()))
        out.append({"step": step, "unchanged": unchanged, **engine.amp.state(),
                    "max_allreduces": C.STATS.total("all_reduce"),
                    "finite": all(torch.isfinite(p).all().item() for p in model.parameters())})
    return out


def _check_sequence(answers, expected, bad_steps):
    for rank, rows in enumerate(answers):
        for row, (scale, good, bad, skipped) in zip(rows, expected):
            s = row["step"]
            assert row["finite"], f"rank {rank} step {s}: parameters hold inf/nan"
            assert row["unchanged"] == (s in bad_steps), \
                f"rank {rank} step {s}: parameters {'unchanged' if row['unchanged'] else 'changed'}"
            got = (row["scale"], row["good_steps"], row["bad_steps"], row["skipped_steps"])
            assert got == (scale, good, bad, skipped), f"rank {rank} step {s}: (scale, good, bad, skipped) {got}"


def test_inf_on_one_rank_skips_everywhere_dynamic(pool2):
    cfg = dict(amp="bf16", use_dynamic_loss_scaling=True, init_loss_scaling=1024.0, decr_every_n_nan_or_inf=2,
               decr_ratio=0.5, incr_every_n_steps=1000)
    bad = [2, 3, 5]
    answers = pool2.run(steps_with_injected_inf, dict(config=cfg, steps=6, bad_steps=bad))
    # (scale, good, bad, skipped) after each step, by Paddle's rule
    expected = [(1024.0, 1, 0, 0), (1024.0, 0, 1, 1), (512.0, 0, 0, 2), (512.0, 1, 0, 2), (512.0, 0, 1, 3),
                (512.0, 1, 0, 3)]
    _check_sequence(answers, expected, bad)
    # plain sync of 4 gradients + the found-inf MAX allreduce
    assert all(row["max_allreduces"] == 5 for a in answers for row in a)


def test_inf_on_one_rank_skips_everywhere_static_fp16_fused_optimizer(pool2):
    cfg = dict(amp="fp16", use_dynamic_loss_scaling=False, init_loss_scaling=256.0, fuse_all_optimizer_ops=True,
               optimizer="adam")
    bad = [2, 3]
    answers = pool2.run(steps_with_injected_inf, dict(config=cfg, steps=4, bad_steps=bad,
                                                                        bad_rank=0))
    expected = [(256.0, 0, 0, 0), (256.0, 0, 0, 1), (256.0, 0, 0, 2), (256.0, 0, 0, 2)]
    _check_sequence(answers, expected, bad)


def test_dynamic_scale_grows_after_incr_every_n_steps(pool2):
    cfg = dict(amp="bf16", use_dynamic_loss_scaling=True, init_loss_scaling=1024.0, incr_every_n_steps=3,
               incr_ratio=2.0, data_parallel="ddp")
    answers = pool2.run(steps_with_injected_inf, dict(config=cfg, steps=7, bad_steps=[]))
    expected = [(1024.0, 1, 0, 0), (1024.0, 2, 0, 0), (2048.0, 0, 0, 0), (2048.0, 1, 0, 0), (2048.0, 2, 0, 0),
                (4096.0, 0, 0, 0), (4096.0, 1, 0, 0)]
    _check_sequence(answers, expected, [])
