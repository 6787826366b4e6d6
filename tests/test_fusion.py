"""Compute fusion: each fused op equals its unfused pair (forward, input and parameter gradients,
BatchNorm statistics) within 1e-5 and keeps fewer bytes for backward; the pass finds and fuses
every pattern of the reference ResNet and of models written here, and keeps state_dict keys.

Single process: no rank pool needed.
"""
from __future__ import annotations

import copy
import logging

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from suite.check.errors import finite_le, rel_error, worst_error
from suite.compute.fused_ops import AddReLU, BatchNormReLU, Kernels, ReLUDepthwiseConv
from suite.compute.fusion import apply_compute_fusion, fuse_model
from suite.compute.saved_bytes import measure_saved
from suite.config import StrategyConfig
from suite.models import get_model

TOL = 1e-5


def _grads(model: nn.Module) -> dict:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _run(model: nn.Module, x: torch.Tensor, loss=lambda y: (y * y).mean() + y.sum() * 1e-3):
    x = x.clone().requires_grad_(True)
    y = model(x)
    loss(y).backward()
    return y.detach(), x.grad.clone()


def _compare(fused: nn.Module, plain: nn.Module, x: torch.Tensor, steps: int = 2) -> dict:
    """Forward output, input gradient, parameter gradients and buffers after ``steps`` forwards."""
    worst = {}
    for _ in range(steps):
        for m in (fused, plain):
            m.zero_grad(set_to_none=True)
        yf, gf = _run(fused, x)
        yp, gp = _run(plain, x)
        worst["output"] = max(worst.get("output", 0), rel_error(yf, yp))
        worst["input_grad"] = max(worst.get("input_grad", 0), rel_error(gf, gp))
        gfused, gplain = _grads(fused), _grads(plain)
        assert sorted(gfused) == sorted(gplain) and gplain, (sorted(gfused), sorted(gplain))
        pg, _ = worst_error(gfused, gplain)
        worst["param_grad"] = max(worst.get("param_grad", 0), pg)
        bf, _ = worst_error(dict(fused.named_buffers()), dict(plain.named_buffers()))
        worst["buffers"] = max(worst.get("buffers", 0), bf)
        x = x * 1.5 + 0.1  # another batch
    return worst


# ---------------------------------------------------------------------------------------
# Each fused op against its unfused pair, in isolation: values and saved bytes
# ---------------------------------------------------------------------------------------
def _bn_pair(train: bool):
    torch.manual_seed(1)
    bn = nn.BatchNorm2d(6)
    with torch.no_grad():
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-0.5, 0.5)
        bn.running_mean.uniform_(-0.2, 0.2)
        bn.running_var.uniform_(0.5, 2.0)
    plain = nn.Sequential(bn, nn.ReLU()).train(train)
    fused_bn = copy.deepcopy(bn)
    return nn.Sequential(BatchNormReLU(fused_bn), nn.Identity()).train(train), plain, torch.randn(4, 6, 5, 5)


class _AddReLUPair(nn.Module):
    def __init__(self, fused: bool):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.fused = AddReLU() if fused else None

    def forward(self, x):
        a = self.lin(x)  # the add's operands: a parameterised branch and the skip
        return self.fused(a, x) if self.fused is not None else torch.relu(a + x)


def _add_pair(train: bool):
    torch.manual_seed(2)
    plain = _AddReLUPair(False)
    fused = _AddReLUPair(True)
    fused.load_state_dict(plain.state_dict())
    return fused, plain, torch.randn(16, 8)


def _dw_pair(train: bool):
    torch.manual_seed(3)
    conv = nn.Conv2d(6, 12, 3, padding=1, stride=2, groups=6, bias=True)
    plain = nn.Sequential(nn.ReLU(), conv)
    return nn.Sequential(nn.Identity(), ReLUDepthwiseConv(copy.deepcopy(conv))), plain, torch.randn(2, 6, 7, 7)


OPS = {"bn_relu_train": (_bn_pair, True), "bn_relu_eval": (_bn_pair, False), "add_relu": (_add_pair, True),
       "relu_depthwise_conv": (_dw_pair, True)}


@pytest.mark.parametrize("op", list(OPS))
def test_fused_op_equals_unfused_pair(op):
    make, train = OPS[op]
    fused, plain, x = make(train)
    worst = _compare(fused, plain, x)
    for what, err in worst.items():
        assert finite_le(err, TOL), f"{op}: {what} differs from the unfused pair by {err:.3g} > {TOL}"


def _saved(model: nn.Module, x: torch.Tensor):
    x = x.clone().requires_grad_(True)
    _, sb = measure_saved(lambda: model(x), exclude=list(model.parameters()))
    return sb


@pytest.mark.parametrize("op", list(OPS))
def test_fused_op_saves_fewer_bytes(op):
    make, train = OPS[op]
    fused, plain, x = make(train)
    f, p = _saved(fused, x), _saved(plain, x)
    act = x.numel() * x.element_size()
    # The unfused pair keeps at least one full activation; the fused op strictly less than the pair.
    assert p.saved >= act, f"{op}: the unfused pair saved only {p.saved} bytes (< one activation, {act})"
    assert f.saved < p.saved, f"{op}: fused saves {f.saved} bytes, the unfused pair {p.saved}: not fewer"
    assert f.unique <= p.unique, f"{op}: fused keeps {f.unique} distinct bytes, the pair {p.unique}"


# ---------------------------------------------------------------------------------------
# The pass on the reference ResNet
# ---------------------------------------------------------------------------------------
# SmallResNet(width 16, blocks 2): stem conv-BN-ReLU, then [BasicBlock, DepthwiseBlock] x 2.
# BN->ReLU: stem 1 + BasicBlock.bn1 x2 + DepthwiseBlock.bn x2 = 5 (BasicBlock.bn2 feeds the add).
# add->ReLU: one per BasicBlock = 2.  ReLU->depthwise conv: one per DepthwiseBlock = 2.
RESNET_COUNTS = {"bn_act": 5, "elewise_add_act": 2, "relu_depthwise_conv": 2}
SINGLE = {"bn_act": dict(bn_act=True, elewise_add_act=False, relu_depthwise_conv=False),
          "elewise_add_act": dict(bn_act=False, elewise_add_act=True, relu_depthwise_conv=False),
          "relu_depthwise_conv": dict(bn_act=False, elewise_add_act=False, relu_depthwise_conv=True),
          "all": dict(bn_act=True, elewise_add_act=True, relu_depthwise_conv=True)}


@pytest.mark.parametrize("which", list(SINGLE))
def test_resnet_fused_equals_unfused(which):
    spec = get_model("resnet")
    plain = spec.make(0)
    fused, report = fuse_model(spec.make(0), **SINGLE[which])
    for pattern, n in RESNET_COUNTS.items():
        on = SINGLE[which][pattern]
        assert report[pattern]["found"] == n, (pattern, report[pattern])
        assert report[pattern]["fused"] == (n if on else 0), (pattern, report[pattern])
    assert list(fused.state_dict()) == list(plain.state_dict()) or \
        sorted(fused.state_dict()) == sorted(plain.state_dict())
    assert sorted(n for n, _ in fused.named_parameters()) == sorted(n for n, _ in plain.named_parameters())
    x = torch.randn(4, 3, 16, 16)
    worst = _compare(fused, plain, x)
    for what, err in worst.items():
        assert finite_le(err, TOL), f"{which}: {what} differs by {err:.3g} > {TOL}"
    loss_fused = spec.loss_fn(fused(x), torch.arange(4))
    loss_plain = spec.loss_fn(plain(x), torch.arange(4))
    assert finite_le(rel_error(loss_fused, loss_plain), TOL)


def test_resnet_fused_keeps_fewer_bytes():
    spec = get_model("resnet")
    plain = spec.make(0)
    fused, _ = fuse_model(spec.make(0))
    x = torch.randn(4, 3, 16, 16)
    f, p = _saved(fused, x), _saved(plain, x)
    assert f.saved < p.saved, (f, p)


def test_apply_compute_fusion_logs_counts(caplog):
    cfg = StrategyConfig(fuse_bn_act_ops=True, fuse_elewise_add_act_ops=True, fuse_relu_depthwise_conv=True)
    with caplog.at_level(logging.INFO, logger="suite.compute.fusion"):
        _, report = apply_compute_fusion(get_model("resnet").make(0), cfg)
    text = caplog.text
    assert "fuse_bn_act_ops: ---  detected 5 subgraphs, fused 5" in text, text
    assert "fuse_elewise_add_act_ops: ---  detected 2 subgraphs, fused 2" in text, text
    assert "fuse_relu_depthwise_conv: ---  detected 2 subgraphs, fused 2" in text, text
    assert report["backend"]["requested"] == "eager"


# ---------------------------------------------------------------------------------------
# Models written here: functional ops, shared modules, untraceable control flow
# ---------------------------------------------------------------------------------------
class FunctionalNet(nn.Module):
    """F.relu / torch.relu / Tensor.relu, ``+`` and torch.add residuals, BatchNorm1d, a depthwise
    conv with bias, and two patterns that must NOT be fused (an intermediate used twice)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1, bias=False)  # a bias before BN has a zero gradient
        self.bn = nn.BatchNorm2d(8)
        self.dw = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.bn2 = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 12, bias=False)
        self.bn1d = nn.BatchNorm1d(12)
        self.head = nn.Linear(12, 5)
        self.unused = nn.Linear(3, 3)  # never called: its parameters must survive the rewrite

    def forward(self, x):
        h = F.relu(self.bn(self.conv(x)))              # BN -> F.relu           (fused)
        h = self.dw(torch.relu(h))                     # torch.relu -> dwconv   (fused)
        r = self.bn2(h)
        h = (r + h).relu()                             # add -> Tensor.relu     (fused)
        k = h + 1.0                                    # add of a constant: not a residual pattern
        h = torch.relu(torch.add(h, k))                # torch.add -> torch.relu (fused)
        z = self.bn1d(self.fc(h.mean((2, 3))))
        out = torch.relu(z) + z                        # BN output used twice: found, not fused
        return self.head(out)


def test_model_defined_here_fuses_and_matches():
    torch.manual_seed(0)
    plain = FunctionalNet()
    fused, report = fuse_model(copy.deepcopy(plain))
    assert report["method"] == ["fx:<root>"]
    assert (report["bn_act"]["found"], report["bn_act"]["fused"]) == (2, 1), report["bn_act"]
    assert "other users" in report["bn_act"]["skipped"][0]
    assert (report["elewise_add_act"]["found"], report["elewise_add_act"]["fused"]) == (2, 2)
    assert (report["relu_depthwise_conv"]["found"], report["relu_depthwise_conv"]["fused"]) == (1, 1)
    assert sorted(fused.state_dict()) == sorted(plain.state_dict())
    assert "unused.weight" in dict(fused.named_parameters())
    worst = _compare(fused, plain, torch.randn(6, 3, 8, 8))
    for what, err in worst.items():
        assert finite_le(err, TOL), f"{what} differs by {err:.3g} > {TOL}"


class Untraceable(nn.Module):
    """fx cannot trace data-dependent control flow: the pass falls back to the children."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 6, 1, bias=False), nn.BatchNorm2d(6), nn.ReLU(),
                                  nn.Conv2d(6, 6, 3, padding=1, groups=6))
        self.block = FunctionalNet()
        self.alt = nn.Sequential(nn.Conv2d(3, 3, 1, bias=False), nn.BatchNorm2d(3), nn.ReLU())

    def forward(self, x):
        h = self.stem(x)
        if h.sum() > 0:  # data-dependent: untraceable
            h = h * 2
        return self.block(h[:, :3]) + self.alt(x).mean()


def test_untraceable_model_falls_back_to_children():
    torch.manual_seed(0)
    plain = Untraceable()
    fused, report = fuse_model(copy.deepcopy(plain))
    assert "fx:stem" in report["method"] and "fx:block" in report["method"], report["method"]
    # stem: BN->ReLU and ReLU->dwconv compete for the ReLU: BN->ReLU wins (one fused op per ReLU)
    assert report["bn_act"]["fused"] == 1 + 1 + 1, report["bn_act"]  # stem, block, alt
    assert isinstance(fused.stem.get_submodule("1"), BatchNormReLU)  # the traced stem is a GraphModule
    assert sorted(fused.state_dict()) == sorted(plain.state_dict())
    # One step: this nesting (BN over a 3-channel slice) is ill-conditioned enough that fp32
    # rounding alone reaches ~1e-5 on the small BN-weight gradients by the second step.
    worst = _compare(fused, plain, torch.randn(4, 3, 8, 8), steps=1)
    for what, err in worst.items():
        assert finite_le(err, TOL), f"{what} differs by {err:.3g} > {TOL}"


def test_sequential_rewrite_when_a_child_is_untraceable():
    class Odd(nn.Module):
        def forward(self, x):
            return x * 2 if x.sum() > 0 else x

    torch.manual_seed(0)
    plain = nn.Sequential(nn.Conv2d(3, 4, 1, bias=False), nn.BatchNorm2d(4), nn.ReLU(),
                          nn.Conv2d(4, 4, 3, padding=1, groups=4), Odd(), nn.ReLU(),
                          nn.Conv2d(4, 8, 3, padding=1, groups=4))
    fused, report = fuse_model(copy.deepcopy(plain))
    assert "sequential:<root>" in report["method"], report["method"]
    assert isinstance(fused[1], BatchNormReLU) and isinstance(fused[2], nn.Identity)
    assert isinstance(fused[6], ReLUDepthwiseConv) and isinstance(fused[5], nn.Identity)
    assert (report["relu_depthwise_conv"]["found"], report["relu_depthwise_conv"]["fused"]) == (1, 1)
    assert sorted(fused.state_dict()) == sorted(plain.state_dict())
    worst = _compare(fused, plain, torch.randn(2, 3, 6, 6))
    for what, err in worst.items():
        assert finite_le(err, TOL), f"{what} differs by {err:.3g} > {TOL}"


def test_fused_resnet_under_bf16_autocast_stays_close():
    """Under autocast the fused ops round differently from torch's bf16 kernels; they stay within bf16 noise."""
    spec = get_model("resnet")
    plain = spec.make(0)
    fused, _ = fuse_model(spec.make(0))
    x = torch.randn(4, 3, 16, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        yf, yp = fused(x), plain(x)
    assert yf.dtype == yp.dtype == torch.bfloat16
    assert finite_le(rel_error(yf.float(), yp.float()), 5e-2)


@pytest.mark.heavy  # torch.compile's first compile, ~20 s: make test-slow
def test_compile_backend_runs_and_matches():
    """The one compiled case (torch.compile is slow here): a fused add+ReLU through the compiler."""
    class Res(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(6, 6)

        def forward(self, x):
            return torch.relu(self.lin(x) + x)

    torch.manual_seed(0)
    plain = Res()
    fused, report = fuse_model(copy.deepcopy(plain), bn_act=False, relu_depthwise_conv=False, backend="compile")
    assert report["elewise_add_act"]["fused"] == 1
    worst = _compare(fused, plain, torch.randn(4, 6), steps=1)
    info = report["backend"]
    print(f"fusion_backend=compile ran: {info['ran']}")
    assert info["ran"] == "compile", f"torch.compile did not run: {info}"
    for what, err in worst.items():
        assert finite_le(err, 1e-4), f"{what} differs by {err:.3g} (compile tolerance 1e-4)"


def test_kernels_rejects_unknown_backend():
    with pytest.raises(ValueError, match="fusion_backend='tvm'"):
        Kernels("tvm")
