"""StrategyConfig: defaults, parsing, and clear errors for bad input (field, value, what is allowed)."""
from __future__ import annotations

import math
import warnings

import pytest

from suite.config import PRESETS, ConfigError, StrategyConfig


def test_defaults_are_plain_data_parallel():
    cfg = StrategyConfig()
    assert cfg.data_parallel == "suite"
    off = ["fuse_all_reduce_ops", "use_hierarchical_allreduce", "fuse_bn_act_ops", "fuse_elewise_add_act_ops",
           "fuse_relu_depthwise_conv", "fuse_broadcast_ops", "fuse_all_optimizer_ops", "use_local_sgd",
           "use_adaptive_local_sgd", "use_double_buffer", "reader_return_uint8", "use_infinite_reader"]
    assert [f for f in off if getattr(cfg, f)] == []
    assert cfg.sync_nccl_allreduce is True and cfg.nccl_comm_num == 1 and cfg.amp == "off"
    assert str(cfg).startswith("StrategyConfig(plain data parallel")


def test_fp16_gets_paddle_amp_defaults():
    cfg = StrategyConfig(amp="fp16")
    assert cfg.loss_scaling_enabled and cfg.dynamic_loss_scaling
    assert cfg.effective_init_loss_scaling == 32768.0
    assert (cfg.incr_every_n_steps, cfg.decr_every_n_nan_or_inf, cfg.incr_ratio, cfg.decr_ratio) == (1000, 2, 2.0, 0.8)
    static = StrategyConfig(amp="fp16", use_dynamic_loss_scaling=False, init_loss_scaling=1024.0)
    assert static.loss_scaling_enabled and not static.dynamic_loss_scaling
    assert not StrategyConfig(amp="bf16").loss_scaling_enabled


def test_paddle_alias_for_layer_count():
    cfg = StrategyConfig.from_dict({"_fuse_grad_size_in_TFLOPS": 20})
    assert cfg.fuse_grad_size_in_layers == 20
    assert StrategyConfig().with_overrides(["_fuse_grad_size_in_TFLOPS=7"]).fuse_grad_size_in_layers == 7


def test_set_parses_by_field_type():
    cfg = StrategyConfig().with_overrides(["nccl_comm_num=2", "sync_nccl_allreduce=false", "fuse_grad_size_in_MB=inf",
                                          "amp=bf16", "num_threads=none"])
    assert cfg.nccl_comm_num == 2 and cfg.sync_nccl_allreduce is False and math.isinf(cfg.fuse_grad_size_in_MB)
    assert cfg.amp == "bf16" and cfg.num_threads is None


def test_toml_round_trip(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text('[strategy]\nfuse_all_reduce_ops = true\nfuse_grad_size_in_MB = 16\nnccl_comm_num = 2\n'
                    'sync_nccl_allreduce = false\n')
    cfg = StrategyConfig.from_toml(str(path))
    assert cfg.fuse_grad_size_in_MB == 16.0 and isinstance(cfg.fuse_grad_size_in_MB, float)
    assert cfg.diff() == {"fuse_all_reduce_ops": True, "fuse_grad_size_in_MB": 16.0, "nccl_comm_num": 2,
                          "sync_nccl_allreduce": False}


def test_presets_validate_and_apply():
    for name in PRESETS:
        StrategyConfig.preset(name)
    assert StrategyConfig.preset("paddle_multi_node").nccl_comm_num == 2
    with pytest.raises(ConfigError, match="preset 'nope' is unknown; allowed"):
        StrategyConfig.preset("nope")


def test_extra_communicators_with_sync_warn_as_paddle_does():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        StrategyConfig(nccl_comm_num=2)
    assert any("sync_nccl_allreduce=True" in str(w.message) for w in caught)


def test_adaptive_implies_local_sgd():
    assert StrategyConfig(use_adaptive_local_sgd=True).use_local_sgd


# Each bad input: (how to build it, the words the error must contain: field, value, what is allowed).
BAD = [
    (lambda: StrategyConfig(nccl_comm_num=0), ["nccl_comm_num=0", ">= 1"]),
    (lambda: StrategyConfig(fuse_grad_size_in_MB=-1.0), ["fuse_grad_size_in_MB=-1.0", "> 0.0"]),
    (lambda: StrategyConfig(fuse_grad_size_in_layers=0), ["fuse_grad_size_in_layers=0", ">= 1"]),
    (lambda: StrategyConfig(amp="fp8"), ["amp='fp8'", "'off', 'bf16', 'fp16'"]),
    (lambda: StrategyConfig(data_parallel="horovod"), ["data_parallel='horovod'", "'suite', 'ddp', 'none'"]),
    (lambda: StrategyConfig(sync_nccl_allreduce="yes"), ["sync_nccl_allreduce='yes'", "expected bool"]),
    (lambda: StrategyConfig(nccl_comm_num=2.5), ["nccl_comm_num=2.5", "expected int"]),
    (lambda: StrategyConfig(decr_ratio=1.5), ["decr_ratio=1.5", "<= 1.0"]),
    (lambda: StrategyConfig(lr=float("nan")), ["lr=nan"]),
    (lambda: StrategyConfig(use_local_sgd=True, optimizer="adam"), ["optimizer='adam'", "'sgd' and 'momentum'"]),
    (lambda: StrategyConfig(use_hierarchical_allreduce=True, data_parallel="ddp"),
     ["use_hierarchical_allreduce=True", "data_parallel='suite'"]),
    (lambda: StrategyConfig(init_loss_scaling=128.0), ["init_loss_scaling=128.0", "amp='bf16' or 'fp16'"]),
    (lambda: StrategyConfig.from_dict({"nccl_comm_nums": 2}), ["nccl_comm_nums", "did you mean nccl_comm_num"]),
    (lambda: StrategyConfig().with_overrides(["nccl_comm_num"]), ["key=value"]),
    (lambda: StrategyConfig().with_overrides(["fetch_frequency=often"]), ["fetch_frequency='often'", "whole number"]),
    (lambda: StrategyConfig(use_hierarchical_allreduce=True, hierarchical_allreduce_inter_nranks=3).check_world(4),
     ["hierarchical_allreduce_inter_nranks=3", "world size 4", "1, 2, 4"]),
    (lambda: StrategyConfig(use_hierarchical_allreduce=True).check_world(4),
     ["hierarchical_allreduce_inter_nranks=None", "torchrun"]),
]


@pytest.mark.parametrize("build,words", BAD, ids=[w[0] for _, w in BAD])
def test_bad_input_gives_one_clear_error(build, words):
    with pytest.raises(ConfigError) as info:
        build()
    message = str(info.value)
    missing = [w for w in words if w not in message]
    assert not missing, f"error {message!r} lacks {missing}"


def test_bad_toml_names_the_file(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("nccl_comm_num = = 2\n")
    with pytest.raises(ConfigError, match="bad.toml.*not valid TOML"):
        StrategyConfig.from_toml(str(path))
    with pytest.raises(ConfigError, match="does not exist"):
        StrategyConfig.from_toml(str(tmp_path / "missing.toml"))
