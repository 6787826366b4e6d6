"""StrategyConfig: defaults, parsing, and clear errors for bad input (field, value, what is allowed)."""
from __future__ import annotations

import math
import os
import warnings
from typing import Literal

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


# ---- field types read with typing.get_type_hints: any spelling works -------------------------

def test_x_or_none_spelling_of_a_field_type():
    import dataclasses as dc

    from suite.config import field_specs

    # StrategyConfig itself spells its optional fields `int | None` (a string, under
    # `from __future__ import annotations`): constructing it and --set both work.
    assert StrategyConfig.__dataclass_fields__["num_threads"].type == "int | None"
    assert StrategyConfig().num_threads is None
    assert StrategyConfig().with_overrides(["num_threads=4"]).num_threads == 4
    assert StrategyConfig(num_threads=4).with_overrides(["num_threads=none"]).num_threads is None
    with pytest.raises(ConfigError, match="num_threads='many': expected a whole number"):
        StrategyConfig().with_overrides(["num_threads=many"])

    @dc.dataclass
    class Spellings:
        a: int | None = None
        b: float | None = None
        c: Literal["x", "y"] | None = None
        d: bool = False

    specs = field_specs(Spellings)
    assert [(s.type, s.optional, s.choices) for s in specs.values()] == [
        (int, True, None), (float, True, None), (str, True, ("x", "y")), (bool, False, None)]


def test_choices_and_ranges_sit_next_to_their_fields():
    import suite.config as config

    assert not hasattr(config, "CHOICES") and not hasattr(config, "RANGES")
    specs = config.field_specs(StrategyConfig)
    assert specs["amp"].choices == ("off", "bf16", "fp16")
    assert (specs["nccl_comm_num"].ge, specs["nccl_comm_num"].le) == (1, 16)
    assert all(s.help for s in specs.values()), [n for n, s in specs.items() if not s.help]


# ---- Paddle 2.x spelling -------------------------------------------------------------------

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
PADDLE_TOML = os.path.join(DATA, "paddle_strategy.toml")


def test_a_full_paddle_strategy_toml_loads_as_is():
    expected = StrategyConfig(
        amp="fp16", init_loss_scaling=1024.0, incr_every_n_steps=500, decr_every_n_nan_or_inf=3, incr_ratio=4.0,
        decr_ratio=0.5, use_dynamic_loss_scaling=True,
        use_local_sgd=True, local_sgd_steps=4, local_sgd_is_warm_steps=3, use_adaptive_local_sgd=False,
        init_k_steps=2,
        grad_comm_dtype="fp16", fuse_all_reduce_ops=True, fuse_grad_size_in_MB=16.0, fuse_grad_size_in_layers=20,
        nccl_comm_num=2, sync_nccl_allreduce=False, use_hierarchical_allreduce=True,
        hierarchical_allreduce_inter_nranks=2, find_unused_parameters=True,
        fuse_bn_act_ops=True, fuse_elewise_add_act_ops=True, fuse_relu_depthwise_conv=True, fuse_broadcast_ops=True,
        fuse_all_optimizer_ops=True, num_threads=3,
    )
    assert StrategyConfig.from_toml(PADDLE_TOML) == expected
    # the same strategy under a [strategy] table
    with open(PADDLE_TOML) as fh:
        text = fh.read()
    import tomllib

    nested = tomllib.loads(text)
    assert StrategyConfig.from_dict(nested) == expected


# Every Paddle name we map: (Paddle key, value in TOML, the same as --set, context, our field, expected).
AMP_ON = {"amp": True}
MAPPINGS = [
    ("amp", True, "true", {}, "amp", "fp16"),
    ("amp", False, "false", {}, "amp", "off"),
    ("amp", "bf16", "bf16", {}, "amp", "bf16"),
    ("amp_configs.init_loss_scaling", 128.0, "128", AMP_ON, "init_loss_scaling", 128.0),
    ("amp_configs.incr_every_n_steps", 10, "10", {}, "incr_every_n_steps", 10),
    ("amp_configs.decr_every_n_nan_or_inf", 5, "5", {}, "decr_every_n_nan_or_inf", 5),
    ("amp_configs.incr_ratio", 3.0, "3.0", {}, "incr_ratio", 3.0),
    ("amp_configs.decr_ratio", 0.25, "0.25", {}, "decr_ratio", 0.25),
    ("amp_configs.use_dynamic_loss_scaling", False, "false", AMP_ON, "use_dynamic_loss_scaling", False),
    ("localsgd", True, "true", {}, "use_local_sgd", True),
    ("localsgd_configs.k_steps", 4, "4", {}, "local_sgd_steps", 4),
    ("localsgd_configs.begin_step", 7, "7", {}, "local_sgd_is_warm_steps", 7),
    ("adaptive_localsgd", True, "true", {}, "use_adaptive_local_sgd", True),
    ("adaptive_localsgd_configs.init_k_steps", 3, "3", {}, "init_k_steps", 3),
    ("adaptive_localsgd_configs.begin_step", 5, "5", {}, "local_sgd_is_warm_steps", 5),
    ("fp16_allreduce", True, "true", {}, "grad_comm_dtype", "fp16"),
    ("fp16_allreduce", False, "false", {}, "grad_comm_dtype", "fp32"),
    ("fuse_all_reduce_ops", True, "true", {}, "fuse_all_reduce_ops", True),
    ("fuse_grad_size_in_MB", 16, "16", {}, "fuse_grad_size_in_MB", 16.0),
    ("fuse_grad_size_in_TFLOPS", 20, "20", {}, "fuse_grad_size_in_layers", 20),
    ("_fuse_grad_size_in_TFLOPS", 20, "20", {}, "fuse_grad_size_in_layers", 20),
    ("nccl_comm_num", 2, "2", {"sync_nccl_allreduce": False}, "nccl_comm_num", 2),
    ("sync_nccl_allreduce", False, "false", {}, "sync_nccl_allreduce", False),
    ("use_hierarchical_allreduce", True, "true", {}, "use_hierarchical_allreduce", True),
    ("hierarchical_allreduce_inter_nranks", 4, "4", {}, "hierarchical_allreduce_inter_nranks", 4),
    ("find_unused_parameters", True, "true", {}, "find_unused_parameters", True),
    ("build_strategy.fuse_bn_act_ops", True, "true", {}, "fuse_bn_act_ops", True),
    ("build_strategy.fuse_elewise_add_act_ops", True, "true", {}, "fuse_elewise_add_act_ops", True),
    ("build_strategy.fuse_relu_depthwise_conv", True, "true", {}, "fuse_relu_depthwise_conv", True),
    ("build_strategy.fuse_broadcast_ops", True, "true", {}, "fuse_broadcast_ops", True),
    ("build_strategy.fuse_all_optimizer_ops", True, "true", {}, "fuse_all_optimizer_ops", True),
    ("execution_strategy.num_threads", 6, "6", {}, "num_threads", 6),
]


def _nested(key, value):
    """A dotted Paddle key as TOML would give it: {"build_strategy": {"fuse_bn_act_ops": True}}."""
    if "." in key:
        table, sub = key.split(".", 1)
        return {table: {sub: value}}
    return {key: value}


def test_every_paddle_mapping_is_tested():
    from suite.config import PADDLE_FIELDS

    assert {m[0] for m in MAPPINGS} >= set(PADDLE_FIELDS)


@pytest.mark.parametrize("key,value,raw,context,field,expected", MAPPINGS,
                         ids=[f"{m[0]}={m[2]}" for m in MAPPINGS])
def test_paddle_name_maps_to_our_field(key, value, raw, context, field, expected):
    from_toml = StrategyConfig.from_dict({**_nested(key, value), **context})
    from_set = StrategyConfig.from_dict(context).with_overrides([f"{key}={raw}"])
    for cfg in (from_toml, from_set):
        got = getattr(cfg, field)
        assert got == expected and type(got) is type(expected), (cfg, field, got)
        assert set(cfg.diff(StrategyConfig.from_dict(context))) <= {field, "use_local_sgd"}  # nothing else moves


def test_paddle_amp_true_is_fp16_with_dynamic_loss_scaling():
    for cfg in (StrategyConfig.from_dict({"amp": True}), StrategyConfig().with_overrides(["amp=true"])):
        assert cfg.amp == "fp16" and cfg.loss_scaling_enabled and cfg.dynamic_loss_scaling
        assert cfg.effective_init_loss_scaling == 32768.0  # Paddle's init_loss_scaling default
    static = StrategyConfig.from_dict({"amp": True, "amp_configs": {"use_dynamic_loss_scaling": False}})
    assert static.loss_scaling_enabled and not static.dynamic_loss_scaling
    assert StrategyConfig.from_dict({"amp": False}) == StrategyConfig()
    assert StrategyConfig.from_dict({"amp": "bf16"}).amp == "bf16"


class _NoComm:
    """Stands in for the gradient communication: LocalSGD only calls average_tensors on it."""

    def average_tensors(self, tensors):
        pass


def _paddle_localsgd_program(begin_step, k, steps, adaptive=False):
    """The steps after which Paddle's (Adaptive)LocalSGDOptimizer averages, its program replayed.

    From localsgd_optimizer.py (PaddlePaddle/Paddle f8704b39): the step counter starts at 1;
    cond(step > begin_step, begin_localsgd, communicate); begin_localsgd = cond(step - last_step
    == k_steps, communicate); communicate sets last_step = step (adaptive: and the next k, here
    with constant loss and lr: ceil(sqrt(init_k)) clamped to [1, 16]).  last_step starts at
    begin_step (fixed k) or 0 (adaptive).
    """
    last_step = 0 if adaptive else begin_step
    init_k = k
    out = []
    for step in range(1, steps + 1):
        if step > begin_step:
            if step - last_step == k:
                out.append(step)
                last_step = step
                if adaptive:
                    k = min(16, max(1, math.ceil(math.sqrt(init_k))))
        else:
            out.append(step)  # communicate() during warm-up: synchronous
            last_step = step
    return out


def _our_schedule(cfg, steps):
    """The steps on which our Local SGD synchronises (gradients averaged) or averages parameters."""
    import torch

    from suite.strategies.local_sgd import LocalSGD

    local = LocalSGD(cfg, _NoComm(), [])
    out = []
    for step in range(1, steps + 1):
        synchronous = local.communicate_grads(step)
        averaged = local.after_step(step, torch.tensor(1.0))
        if synchronous or averaged:
            out.append(step)
    return out


@pytest.mark.parametrize("begin_step", [0, 1, 3])
@pytest.mark.parametrize("k", [1, 2, 4])
def test_paddle_begin_step_is_our_warm_steps(begin_step, k):
    fixed = StrategyConfig().with_overrides(["localsgd=true", f"localsgd_configs.k_steps={k}",
                                             f"localsgd_configs.begin_step={begin_step}"])
    assert fixed.local_sgd_is_warm_steps == begin_step
    assert _our_schedule(fixed, 24) == _paddle_localsgd_program(begin_step, k, 24)
    adaptive = StrategyConfig.from_dict({"adaptive_localsgd": True, "adaptive_localsgd_configs": {
        "init_k_steps": k, "begin_step": begin_step}})
    assert adaptive.local_sgd_is_warm_steps == begin_step
    assert _our_schedule(adaptive, 24) == _paddle_localsgd_program(begin_step, k, 24, adaptive=True)


def test_the_two_begin_steps_must_agree():
    both = {"localsgd_configs": {"begin_step": 2}, "adaptive_localsgd_configs": {"begin_step": 2}}
    assert StrategyConfig.from_dict(both).local_sgd_is_warm_steps == 2
    both["adaptive_localsgd_configs"]["begin_step"] = 3
    with pytest.raises(ConfigError, match="local_sgd_is_warm_steps' given twice.*localsgd_configs.begin_step"):
        StrategyConfig.from_dict(both)
    with pytest.raises(ConfigError, match="given twice"):
        StrategyConfig.from_dict({"local_sgd_is_warm_steps": 1, "localsgd_configs": {"begin_step": 1}})


# Paddle fields we do not implement: refused by name (as TOML and as --set), unless set to "nothing".
UNIMPLEMENTED = [
    ({"recompute": True}, "recompute=true", "recompute"),
    ({"sharding": True, "sharding_configs": {"sharding_degree": 2}}, "sharding=true", "sharding"),
    ({"pipeline": True}, "pipeline=true", "pipeline"),
    ({"dgc": True}, "dgc=true", "dgc"),
    ({"lars": True}, "lars=true", "lars"),
    ({"lamb": True}, "lamb=true", "lamb"),
    ({"gradient_merge": True}, "gradient_merge=true", "gradient_merge"),
    ({"gradient_merge_configs": {"k_steps": 4}}, "gradient_merge_configs.k_steps=4", "gradient_merge_configs"),
    ({"a_sync": True}, "a_sync=true", "a_sync"),
    ({"amp": True, "amp_configs": {"use_pure_fp16": True}}, "amp_configs.use_pure_fp16=true",
     "amp_configs.use_pure_fp16"),
    ({"build_strategy": {"enable_inplace": True}}, "build_strategy.enable_inplace=true",
     "build_strategy.enable_inplace"),
    ({"execution_strategy": {"num_iteration_per_drop_scope": 10}},
     "execution_strategy.num_iteration_per_drop_scope=10", "execution_strategy.num_iteration_per_drop_scope"),
]


@pytest.mark.parametrize("values,assignment,name", UNIMPLEMENTED, ids=[u[1] for u in UNIMPLEMENTED])
def test_unimplemented_paddle_field_is_refused_by_name(values, assignment, name):
    for build in (lambda: StrategyConfig.from_dict(values), lambda: StrategyConfig().with_overrides([assignment])):
        with pytest.raises(ConfigError) as info:
            build()
        message = str(info.value)
        assert f"Paddle field {name}" in message and "not implemented by fleetbench" in message, message


def test_unimplemented_paddle_fields_left_off_ask_for_nothing():
    off = {"recompute": False, "dgc": False, "sharding": False, "pipeline": False, "gradient_merge_configs": {},
           "amp_configs": {"custom_white_list": [], "use_pure_fp16": False},
           "build_strategy": {"enable_inplace": False, "reduce_strategy": 0}}
    assert StrategyConfig.from_dict(off) == StrategyConfig()
    assert StrategyConfig().with_overrides(["recompute=false", "build_strategy.reduce_strategy=0"]) == StrategyConfig()
    with pytest.raises(ConfigError, match="reduce_strategy=1 .*not implemented by fleetbench; allowed only 0"):
        StrategyConfig.from_dict({"build_strategy": {"reduce_strategy": 1}})


def test_unknown_field_of_a_paddle_table_names_the_table():
    with pytest.raises(ConfigError, match="unknown field 'build_strategy.fuse_everything' of Paddle's "
                                          "build_strategy; its fields are .*fuse_bn_act_ops"):
        StrategyConfig().with_overrides(["build_strategy.fuse_everything=true"])
    with pytest.raises(ConfigError, match="Paddle's build_strategy is a table"):
        StrategyConfig.from_dict({"build_strategy": True})


def test_docs_name_every_paddle_field():
    from suite.config import PADDLE_FIELDS, PADDLE_UNIMPLEMENTED

    with open(os.path.join(os.path.dirname(DATA), os.pardir, "docs", "config.md")) as fh:
        doc = fh.read()
    missing = [k for k in [*PADDLE_FIELDS, *PADDLE_UNIMPLEMENTED] if f"`{k}`" not in doc]
    assert not missing, f"docs/config.md does not name {missing}"


# ---- the CLI: TOML out and back, --list, a Paddle TOML through `fleetbench run` -----------------

@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_as_toml_reads_back_to_the_same_config(name, capsys, tmp_path):
    from suite.cli.main import main

    assert main(["config", "--preset", name, "--format", "toml"]) == 0
    path = tmp_path / f"{name}.toml"
    path.write_text(capsys.readouterr().out)
    assert StrategyConfig.from_toml(str(path)) == StrategyConfig.preset(name)
    assert main(["config", "--config", str(path)]) == 0
    assert capsys.readouterr().out.strip() == StrategyConfig.preset(name).describe().strip()


def test_toml_out_keeps_inf_floats_and_strings(tmp_path):
    from suite.config import to_toml

    cfg = StrategyConfig(fuse_all_reduce_ops=True, fuse_grad_size_in_MB=float("inf"), amp="fp16",
                         init_loss_scaling=0.5, lr=1e-05, grad_comm_dtype="bf16")
    path = tmp_path / "c.toml"
    path.write_text(to_toml(cfg))
    assert StrategyConfig.from_toml(str(path)) == cfg


def test_config_list_shows_every_field_with_default_and_help(capsys):
    from suite.cli.main import main
    from suite.config import field_names

    assert main(["config", "--list"]) == 0
    out = capsys.readouterr().out
    for name in field_names():
        assert f"  {name} " in out, name
    assert "'off' | 'bf16' | 'fp16'" in out and "int >= 1, <= 16" in out


class _NoRanks:
    def __init__(self, *a, **k):
        raise AssertionError("a rank pool was started")


def test_paddle_toml_runs_through_fleetbench_run(monkeypatch, capsys, tmp_path):
    import suite.runtime
    from suite.cli.main import main

    monkeypatch.setattr(suite.runtime, "RankPool", _NoRanks)
    # validation happens before any rank starts, so --list proves the Paddle file loads for the case
    assert main(["run", "--config", PADDLE_TOML, "--case", "mlp/plain", "--list"]) == 0
    assert "mlp/plain" in capsys.readouterr().out
    bad = tmp_path / "recompute.toml"
    bad.write_text(open(PADDLE_TOML).read().replace("recompute = false", "recompute = true"))
    assert main(["run", "--config", str(bad), "--case", "mlp/plain", "--list"]) == 2
    assert "Paddle field recompute=True (activation recomputation) is not implemented by fleetbench" in \
        capsys.readouterr().err


def test_run_config_applies_fields_set_to_their_default(tmp_path, monkeypatch, capsys):
    """A --config file that sets a field to its default still overrides a case that sets it otherwise."""
    from suite.run_spec import Selection
    from suite.selection import resolve

    path = tmp_path / "s.toml"
    path.write_text("[strategy]\nfuse_broadcast_ops = false\n")  # a knob the case's name does not assert
    (rc,) = resolve(Selection(cases=("mlp/fusion",), size="cpu", device="cpu", config=str(path)), 2).at[2]
    assert rc.config.fuse_broadcast_ops is False  # the case itself sets it True
    # one its name asserts is refused instead (tests/test_ddp_verdicts.py): fused_optimizer without the fused optimizer
    path.write_text("[strategy]\nfuse_all_optimizer_ops = false\n")
    with pytest.raises(ConfigError, match=r"contradicts the case's name: mlp/fused_optimizer runs "
                                          r"fuse_all_optimizer_ops=True"):
        resolve(Selection(cases=("mlp/fused_optimizer",), size="cpu", device="cpu", config=str(path)), 2)


@pytest.mark.parametrize("content,words", [
    (b"amp = \xff\xfe\n", "is not UTF-8 text"),
    (None, "is a directory"),
    (b"amp = [\n", "is not valid TOML"),
])
def test_bad_config_files_are_one_clear_error(tmp_path, content, words):
    from suite.config import toml_fields

    path = tmp_path / "c.toml"
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    with pytest.raises(ConfigError, match=words):
        toml_fields(str(path))


# ---- knobs bounded, Paddle's TOML tables, hostile config files -----------------------------------------------------
@pytest.mark.parametrize("given,words", [(["--set", "straggler_ms=1e300"], ["straggler_ms=1e+300", "<= 60000"]),
                                         (["--set", "num_threads=1024"], ["num_threads=1024", "CPU"])])
def test_knob_values_are_bounded_by_what_a_rank_can_run(capsys, no_ranks, monkeypatch, given, words):
    from tests.clitools import cli as _cli
    from tests.clitools import one_error as _one_error
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    code, _, err = _cli(["run", "--case", "mlp/plain", "--size", "tiny", *given], capsys)
    _one_error(code, err, *words)


def test_paddle_build_and_exec_strategy_tables_beside_strategy_are_read(tmp_path):
    from suite.config import toml_fields

    path = tmp_path / "c.toml"
    path.write_text("[strategy]\nfuse_all_reduce_ops = true\n\n[build_strategy]\nfuse_bn_act_ops = true\n\n"
                    "[exec_strategy]\nnum_threads = 2\n")
    assert toml_fields(str(path)) == {"fuse_all_reduce_ops": True, "fuse_bn_act_ops": True, "num_threads": 2}


@pytest.mark.parametrize("text,words", [
    ("[strategy]\namp = true\n\n[build_strategy]\nfuse_bn_act_opz = true\n", ["fuse_bn_act_opz"]),
    ("[strategy]\namp = true\n\n[build_stratgy]\nfuse_bn_act_ops = true\n", ["'build_stratgy'", "ignored"]),
    ("stray = 1\n[strategy]\namp = true\n", ["'stray'", "beside [strategy]"]),
    ("[strategy]\namp = true\n\n[build_strategy]\nenable_inplace = true\n", ["enable_inplace", "not implemented"]),
])
def test_unknown_tables_and_keys_in_a_paddle_toml_are_refused_by_name(tmp_path, capsys, no_ranks, text, words):
    from tests.clitools import RUN
    from tests.clitools import cli as _cli
    from tests.clitools import one_error as _one_error
    path = tmp_path / "c.toml"
    path.write_text(text)
    code, _, err = _cli(RUN + ["--config", path], capsys)
    _one_error(code, err, *words)


def test_set_takes_exec_strategy_as_a_file_does_and_names_both_spellings_when_given_twice():
    from suite.config import ConfigError, StrategyConfig

    base = StrategyConfig()
    assert base.num_threads != 4
    assert base.with_overrides(["exec_strategy.num_threads=4"]).num_threads == 4
    assert base.with_overrides(["execution_strategy.num_threads=4"]).num_threads == 4
    with pytest.raises(ConfigError, match="exec_strategy.nope"):
        base.with_overrides(["exec_strategy.nope=1"])
    with pytest.raises(ConfigError, match="'exec_strategy.num_threads' and as 'num_threads'"):
        StrategyConfig.from_dict({"exec_strategy.num_threads": 2, "num_threads": 2})


@pytest.mark.parametrize("content,word", [(None, "FIFO"), ("/dev/zero", "not a regular file"),
                                          ("x = " + "9" * 5000, "digits"), ("x = " + "[" * 100_000, "deeply")])
def test_hostile_config_files_are_one_error_without_blocking(tmp_path, capsys, no_ranks, bounded, content, word):
    from pathlib import Path

    from tests.clitools import RUN
    from tests.clitools import cli as _cli
    from tests.clitools import one_error as _one_error
    path = tmp_path / "c.toml"
    if content is None:
        os.mkfifo(path)
    elif content.startswith("/dev/"):
        path = Path(content)
    else:
        path.write_text(content + "\n")
    code, _, err = _cli(RUN + ["--config", path], capsys)
    _one_error(code, err, word)
