"""Paddle 2.x's spellings of fleetbench's knobs: tables only, applied by ``suite/config.py`` (where knobs are defined).

Names as in Paddle 2.x's DistributedStrategy (paddle/fluid/framework/distributed_strategy.proto and
python/paddle/distributed/fleet/base/distributed_strategy.py); a table's fields as "table.field".  Top-level Paddle
names that equal ours (nccl_comm_num, sync_nccl_allreduce, use_hierarchical_allreduce,
hierarchical_allreduce_inter_nranks, fuse_all_reduce_ops, fuse_grad_size_in_MB, find_unused_parameters) need no
entry; amp has one because its value changes.  docs/config.md names every key here (tests/test_config.py).
"""
from __future__ import annotations

__all__ = ["PADDLE_FIELDS", "PADDLE_SWITCHES", "PADDLE_UNIMPLEMENTED", "PADDLE_TABLES", "TABLE_ALIASES",
           "BESIDE_STRATEGY"]

# Paddle name -> our field, the value read as the field's type (PADDLE_SWITCHES: converted).
PADDLE_FIELDS: dict[str, str] = {
    # Paddle's name; despite it, the value is a layer count (max layers per fused allreduce).
    "_fuse_grad_size_in_TFLOPS": "fuse_grad_size_in_layers",
    "fuse_grad_size_in_TFLOPS": "fuse_grad_size_in_layers",
    "amp": "amp",
    "amp_configs.init_loss_scaling": "init_loss_scaling",
    "amp_configs.incr_every_n_steps": "incr_every_n_steps",
    "amp_configs.decr_every_n_nan_or_inf": "decr_every_n_nan_or_inf",
    "amp_configs.incr_ratio": "incr_ratio",
    "amp_configs.decr_ratio": "decr_ratio",
    "amp_configs.use_dynamic_loss_scaling": "use_dynamic_loss_scaling",
    "localsgd": "use_local_sgd",
    "localsgd_configs.k_steps": "local_sgd_steps",
    # begin_step = W exactly.  Paddle's LocalSGDOptimizer.minimize_impl
    # (python/paddle/distributed/fleet/meta_optimizers/localsgd_optimizer.py, PaddlePaddle/Paddle
    # commit f8704b39, lines 116-208) counts steps from 1 (`step = autoincreased_step_counter(begin=1)`),
    # starts `last_step = begin_step`, and ends with
    #     paddle.static.nn.cond(step > begin_step, begin_localsgd, communicate)
    # with `begin_localsgd` = cond(step - last_step == k_steps, communicate) and `communicate` setting
    # last_step = step: every step 1..begin_step is synchronised, then steps begin_step + k,
    # begin_step + 2k, ... -- our steps 1..W synchronous and averagings at W+k, W+2k, ... with W = begin_step.
    # AdaptiveLocalSGDOptimizer ends with the same `cond(step > begin_step, begin_localsgd, communicate)`.
    # tests/test_config.py replays that control flow against suite.strategies.local_sgd.averaging_steps.
    # Both begin_steps may be given when they agree (suite.config._canonical_keys).
    "localsgd_configs.begin_step": "local_sgd_is_warm_steps",
    "adaptive_localsgd": "use_adaptive_local_sgd",
    "adaptive_localsgd_configs.init_k_steps": "init_k_steps",
    "adaptive_localsgd_configs.begin_step": "local_sgd_is_warm_steps",
    "fp16_allreduce": "grad_comm_dtype",
    "build_strategy.fuse_bn_act_ops": "fuse_bn_act_ops",
    "build_strategy.fuse_elewise_add_act_ops": "fuse_elewise_add_act_ops",
    "build_strategy.fuse_relu_depthwise_conv": "fuse_relu_depthwise_conv",
    "build_strategy.fuse_broadcast_ops": "fuse_broadcast_ops",
    "build_strategy.fuse_all_optimizer_ops": "fuse_all_optimizer_ops",
    "execution_strategy.num_threads": "num_threads",
}

# Paddle's booleans that select one of our values: (ours for true, ours for false); any other value is refused,
# except under a name that is also our field's (amp = "bf16").  Paddle's amp = true is fp16 with dynamic loss
# scaling (amp_configs.use_dynamic_loss_scaling defaults to True in Paddle; our None means the same for fp16).
PADDLE_SWITCHES: dict[str, tuple[str, str]] = {"amp": ("fp16", "off"), "fp16_allreduce": ("fp16", "fp32")}

# Paddle 2.x fields fleetbench does not implement: what each is, and the values that ask for nothing (accepted and
# ignored: a switch left off, an empty table or list).  Any other value is refused by name.
_OFF: tuple = (False,)
_EMPTY: tuple = ({}, [])
_EXECUTOR = "the static-graph executor"
_SWITCHED = {  # a switch and its `<switch>_configs` table
    "recompute": "activation recomputation", "dgc": "deep gradient compression",
    "gradient_merge": "gradient accumulation over steps", "lars": "the LARS optimizer", "lamb": "the LAMB optimizer",
    "pipeline": "pipeline parallelism", "sharding": "sharded optimizer states", "tensor_parallel": "tensor parallelism",
    "a_sync": "parameter-server asynchronous training", "qat": "quantization-aware training",
}
PADDLE_UNIMPLEMENTED: dict[str, tuple[str, tuple]] = {
    **{name: (what, _OFF) for name, what in _SWITCHED.items()},
    **{f"{name}_configs": (what, _EMPTY) for name, what in _SWITCHED.items()},
    "fuse_grad_merge": ("fused gradient accumulation", _OFF),
    "hybrid_configs": ("hybrid data/model/pipeline/sharding parallelism", _EMPTY),
    "adam_d2sum": ("the parameter server's Adam", _OFF),
    "downpour_table_param": ("parameter-server tables", _EMPTY),
    "fs_client_param": ("parameter-server file system", _EMPTY),
    "trainer_desc_configs": ("parameter-server trainer dumps", _EMPTY),
    "heter_ccl_mode": ("heterogeneous collectives", _OFF),
    "elastic": ("elastic training", _OFF),
    "auto": ("automatic parallelism", _OFF),
    "semi_auto": ("semi-automatic parallelism", _OFF),
    "auto_search": ("automatic strategy search", _OFF),
    "sync_batch_norm": ("synchronised BatchNorm", _OFF),
    "asp": ("automatic structured sparsity", _OFF),
    "without_graph_optimization": ("static-graph optimization passes", _OFF),
    "calc_comm_same_stream": ("communication on the compute stream", _OFF),
    "cudnn_exhaustive_search": ("cuDNN algorithm search", _OFF),
    "cudnn_batchnorm_spatial_persistent": ("cuDNN BatchNorm mode", _OFF),
    "conv_workspace_size_limit": ("cuDNN workspace limit", ()),
    "last_comm_group_size_MB": ("the size of dygraph's last gradient bucket", ()),
    "fuse_grad_size_in_num": ("gradient fusion by count", ()),
    "gradient_scale_configs": ("gradient scaling across devices (fleetbench averages)", _EMPTY),
    **{f"amp_configs.{name}": ("custom AMP op lists", _EMPTY)
       for name in ("custom_white_list", "custom_black_list", "custom_black_varnames")},
    "amp_configs.use_pure_fp16": ("pure fp16 (fp16 parameters)", _OFF),
    "amp_configs.use_pure_bf16": ("pure bf16 (bf16 parameters)", _OFF),
    "amp_configs.use_fp16_guard": ("fp16_guard (applies to pure fp16 only)", (True, False)),
    "amp_configs.use_optimizer_fp16": ("fp16 optimizer states", _OFF),
    **{f"build_strategy.{name}": (_EXECUTOR, _OFF) for name in (
        "enable_sequential_execution", "enable_inplace", "cache_runtime_context", "enable_addto", "fix_op_run_order")},
    "build_strategy.enable_backward_optimizer_op_deps": (_EXECUTOR, (True, False)),
    "build_strategy.fuse_bn_add_act_ops": ("BatchNorm + add + activation fusion", _OFF),
    "build_strategy.enable_auto_fusion": ("automatic op fusion", _OFF),
    "build_strategy.allow_cuda_graph_capture": ("CUDA graphs", _OFF),
    "build_strategy.reduce_strategy": ("reduce instead of allreduce (0 = allreduce, what fleetbench does)", (0,)),
    "execution_strategy.num_iteration_per_drop_scope": ("the static-graph executor's scopes", ()),
    "execution_strategy.num_iteration_per_run": (_EXECUTOR, (1,)),
    "execution_strategy.use_thread_barrier": (_EXECUTOR, _OFF),
}

# Paddle's tables: their fields are read as "table.field".
PADDLE_TABLES = {k.split(".", 1)[0] for k in [*PADDLE_FIELDS, *PADDLE_UNIMPLEMENTED] if "." in k}
# A config file's other names of a table: [exec_strategy], as Paddle's examples call DistributedStrategy's.
TABLE_ALIASES = {"exec_strategy": "execution_strategy"}
# The tables a config file may give beside its [strategy] (Paddle's BuildStrategy and ExecutionStrategy).
BESIDE_STRATEGY = ("build_strategy", "exec_strategy", "execution_strategy")
