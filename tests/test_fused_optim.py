"""Fused optimizers (fuse_all_optimizer_ops): parameters and state equal torch.optim's within 1e-6
after 20 steps, for SGD, Momentum and Adam, with and without weight decay; the state lives in
flat buffers; gradients come from the gradient buckets when the gradient communication has them.

Single process: no rank pool needed.
"""
from __future__ import annotations

import pytest
import torch
from torch import nn

from suite.check.errors import finite_le, worst_error
from suite.compute.fused_optim import FlatOptimizer, build_fused_optimizer
from suite.config import StrategyConfig
from suite.strategies.optim import torch_optimizer

TOL = 1e-6
STEPS = 20
STATE = {"sgd": [], "momentum": ["momentum_buffer"], "adam": ["exp_avg", "exp_avg_sq"]}


def _model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 4 * 4, 8),
                         nn.ReLU(), nn.Linear(8, 3))


def _train(model, opt, steps: int = STEPS):
    g = torch.Generator().manual_seed(123)
    for _ in range(steps):
        x = torch.randn(5, 3, 6, 6, generator=g)
        y = torch.randint(0, 3, (5,), generator=g)
        opt.zero_grad(set_to_none=False)
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()


def _param_state_bytes_ptr(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


@pytest.mark.parametrize("optimizer", ["sgd", "momentum", "adam"])
@pytest.mark.parametrize("weight_decay", [0.0, 0.05])
def test_fused_optimizer_equals_torch_optim(optimizer, weight_decay):
    cfg = StrategyConfig(optimizer=optimizer, weight_decay=weight_decay, lr=0.05, fuse_all_optimizer_ops=True)
    ref_model, fused_model = _model(), _model()
    ref_opt = torch_optimizer(ref_model.parameters(), cfg)
    fused_opt = build_fused_optimizer(fused_model, cfg, None)
    _train(ref_model, ref_opt)
    _train(fused_model, fused_opt)

    err, where = worst_error(dict(fused_model.named_parameters()), dict(ref_model.named_parameters()))
    assert finite_le(err, TOL), f"parameters differ by {err:.3g} at {where}"
    moved, _ = worst_error(dict(fused_model.named_parameters()), dict(_model().named_parameters()))
    assert moved > 1e-3, "the parameters did not move: the test would not see a wrong update"
    names = dict(ref_model.named_parameters())
    for name, p in fused_model.named_parameters():
        ref_state = ref_opt.state[names[name]]
        for key in STATE[optimizer]:
            e = worst_error({key: fused_opt.state[p][key]}, {key: ref_state[key]})[0]
            assert finite_le(e, TOL), f"{name}: state {key} differs by {e:.3g}"
        if optimizer == "adam":
            assert float(fused_opt.state[p]["step"]) == float(ref_state["step"]) == STEPS

    # the state and the parameters live in flat buffers: one per group, every view inside it
    flat_state = fused_opt.flat_state()
    assert sorted(flat_state) == sorted(STATE[optimizer])
    flats = fused_opt.flat_params()
    assert len(flats) == len(fused_opt.groups) == 1  # one dtype, one device: one group
    total = sum(p.numel() for p in fused_model.parameters())
    assert flats[0].numel() == total
    for key, bufs in flat_state.items():
        assert len(bufs) == 1 and bufs[0].numel() == total
        for p in fused_model.parameters():
            assert _param_state_bytes_ptr(fused_opt.state[p][key]) == _param_state_bytes_ptr(bufs[0])
    for p in fused_model.parameters():
        assert _param_state_bytes_ptr(p) == _param_state_bytes_ptr(flats[0]), "a parameter is not in the flat buffer"
        assert _param_state_bytes_ptr(p.grad) == _param_state_bytes_ptr(fused_opt.flat_grads()[0])
    assert fused_opt.describe()["optimizer_ops"] == 1
    assert fused_opt.describe()["optimizer_ops_before_fusion"] == len(list(fused_model.parameters()))


class _Bucket:
    """What the bucketed gradient communication offers: a flat buffer and the p.grad views into it."""

    def __init__(self, params, pad: int = 3):
        self.params = list(params)
        self.numel = sum(p.numel() for p in self.params)
        self.flat = torch.zeros(self.numel + pad)  # padded, as hierarchical buckets may be
        self.offsets, off = [], 0
        for p in self.params:
            self.offsets.append(off)
            p.grad = self.flat[off:off + p.numel()].view_as(p)
            off += p.numel()


class _BucketedSync:
    def __init__(self, model):
        ps = list(model.parameters())
        self.buckets = [_Bucket(ps[:3]), _Bucket(ps[3:])]


def test_fused_optimizer_reuses_gradient_buckets():
    cfg = StrategyConfig(optimizer="momentum", weight_decay=0.01, lr=0.05, fuse_all_optimizer_ops=True)
    ref_model, fused_model = _model(), _model()
    sync = _BucketedSync(fused_model)
    fused_opt = build_fused_optimizer(fused_model, cfg, sync)
    assert fused_opt.describe()["grads_from"] == "gradient buckets"
    assert [g.flat_grad for g in fused_opt.groups] == [b.flat for b in sync.buckets]
    ref_opt = torch_optimizer(ref_model.parameters(), cfg)
    _train(ref_model, ref_opt)
    _train(fused_model, fused_opt)
    err, where = worst_error(dict(fused_model.named_parameters()), dict(ref_model.named_parameters()))
    assert finite_le(err, TOL), f"parameters differ by {err:.3g} at {where}"
    for b in sync.buckets:  # gradients still live in the buckets
        for p, off in zip(b.params, b.offsets):
            assert p.grad.data_ptr() == b.flat[off:].data_ptr()


def test_buckets_that_do_not_cover_every_parameter_are_not_used():
    model = _model()
    sync = _BucketedSync(model)
    sync.buckets = sync.buckets[:1]
    opt = build_fused_optimizer(model, StrategyConfig(fuse_all_optimizer_ops=True), sync)
    assert opt.describe()["grads_from"] == "own flat buffers"


def test_zero_grad_and_replaced_gradients():
    model = _model()
    opt = FlatOptimizer(list(model.parameters()), "sgd", lr=0.1)
    ref = _model()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    x = torch.randn(2, 3, 6, 6)
    for m in (model, ref):
        m(x).sum().backward()
    flat = opt.flat_grads()[0]
    assert flat.abs().sum() > 0
    opt.zero_grad(set_to_none=False)
    assert flat.abs().sum() == 0 and all(p.grad is not None for p in model.parameters())
    # someone replaces a gradient (not a view any more) and drops another: the step still sees both
    for m in (model, ref):
        m.zero_grad(set_to_none=False)
        m(x).sum().backward()
    ps, rs = list(model.parameters()), list(ref.parameters())
    ps[0].grad = ps[0].grad.clone() * 3
    rs[0].grad = rs[0].grad.clone() * 3
    ps[1].grad = None
    rs[1].grad = torch.zeros_like(rs[1])
    opt.step()
    ref_opt.step()
    err, where = worst_error(dict(model.named_parameters()), dict(ref.named_parameters()))
    assert finite_le(err, TOL), f"{err:.3g} at {where}"
    assert ps[0].grad.data_ptr() == opt.flat_grads()[0].data_ptr()  # bound back into the buffer


def test_fused_optimizer_rejects_bad_input():
    with pytest.raises(ValueError, match="optimizer='lamb'"):
        FlatOptimizer(list(_model().parameters()), "lamb", lr=0.1)
    with pytest.raises(ValueError, match="no trainable parameters"):
        FlatOptimizer([p.requires_grad_(False) for p in _model().parameters()], "sgd", lr=0.1)
