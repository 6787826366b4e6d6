"""Bucket assignment (pure, no ranks) and the set-up errors of the communication knobs."""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from suite.comm.buckets import fusion_log_line, param_owners, plan, plan_buckets
from suite.comm.grad_sync import trainable_params
from suite.config import ConfigError, StrategyConfig


def _net():
    # registration order: a.weight, a.bias, b.weight, b.bias, c.weight (no bias); 4 bytes per element
    return nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 2, bias=False))


def _plan(net, **kw):
    named = trainable_params(net)
    names = [n for n, _ in named]
    return [[names[i] for i in pl.members] for pl in plan_buckets(named, param_owners(net), **kw)]


def test_reverse_order_and_layer_cap_keeps_weight_and_bias_together():
    assert _plan(_net(), fuse=True, cap_layers=1) == [["2.weight"], ["1.bias", "1.weight"], ["0.bias", "0.weight"]]
    assert _plan(_net(), fuse=True, cap_layers=2) == [["2.weight", "1.bias", "1.weight"], ["0.bias", "0.weight"]]


def test_byte_caps():
    one_each = [["2.weight"], ["1.bias"], ["1.weight"], ["0.bias"], ["0.weight"]]
    assert _plan(_net(), fuse=True, cap_mb=1e-6) == one_each  # tiny cap: one parameter per bucket
    assert _plan(_net(), fuse=False) == one_each  # fusion off
    assert _plan(_net(), fuse=True, cap_mb=math.inf) == [["2.weight", "1.bias", "1.weight", "0.bias", "0.weight"]]
    # 2.weight is 32 B, 1.bias 16 B: a 40 B cap closes after the parameter that crosses it
    assert _plan(_net(), fuse=True, cap_mb=40 / 2**20) == [["2.weight", "1.bias"], ["1.weight"],
                                                            ["0.bias", "0.weight"]]


def test_frozen_skipped_and_dtypes_split():
    net = _net()
    net[1].requires_grad_(False)
    assert _plan(net, fuse=True) == [["2.weight", "0.bias", "0.weight"]]
    net = _net()
    net[2].to(torch.float64)
    assert _plan(net, fuse=True) == [["2.weight"], ["1.bias", "1.weight", "0.bias", "0.weight"]]


def test_the_planner_is_torch_free_tuples():
    """(bytes, layer, kind) in registration order: walked in reverse, the crossing gradient stays in, a new layer
    beyond the cap or another kind opens a bucket."""
    grads = [(10, "a", "f32"), (10, "a", "f32"), (30, "b", "f32"), (5, "c", "f64"), (5, "d", "f64")]
    members = [pl.members for pl in plan(grads, True, cap_mb=35 / 2**20)]
    assert members == [[4, 3], [2, 1], [0]]  # kinds split; 30 + 10 crosses 35 B and stays in
    assert [pl.nbytes for pl in plan(grads, True, cap_mb=35 / 2**20)] == [10, 40, 10]
    assert [pl.members for pl in plan(grads[:3], True, cap_layers=1)] == [[2], [1, 0]]
    assert [pl.layers for pl in plan(grads[:3], True)] == [["b", "a"]]
    assert [pl.members for pl in plan(grads, False)] == [[4], [3], [2], [1], [0]]


def test_log_line_is_paddles():
    assert fusion_log_line(161, 5) == (
        "Find all_reduce operators: 161. To make the speed faster, some all_reduce ops are fused during "
        "training, after fusion, the number of all_reduce ops is 5.")


def test_hierarchical_world_errors():
    cfg = StrategyConfig(use_hierarchical_allreduce=True, hierarchical_allreduce_inter_nranks=3)
    with pytest.raises(ConfigError, match="hierarchical_allreduce_inter_nranks=3.*world size 4"):
        cfg.check_world(4)
    with pytest.raises(ConfigError, match="hierarchical_allreduce_inter_nranks=None"):
        StrategyConfig(use_hierarchical_allreduce=True).check_world(4)
    with pytest.warns(UserWarning, match="LOCAL_WORLD_SIZE=4"):
        StrategyConfig(use_hierarchical_allreduce=True, hierarchical_allreduce_inter_nranks=2).check_world(
            4, local_world_size=4, torchrun=True)
