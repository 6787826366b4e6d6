"""The training step: every enabled strategy composed into one step, readable top to bottom.

    engine = suite.build_engine(model, loss_fn, config)      # inside an initialised process group
    loss = engine.train_step(inputs, targets)                 # a tensor; no host sync unless a strategy needs one

Construction (in this order):
  1. compute fusion rewrites the model (``fuse_bn_act_ops`` …),
  2. parameters and buffers are broadcast from rank 0, so ranks may start different
     (one broadcast per tensor, or flat buckets with ``fuse_broadcast_ops``),
  3. gradient communication is chosen (``data_parallel``: suite's strategies, torch DDP, none),
  4. the optimizer (torch.optim, or the fused flat one with ``fuse_all_optimizer_ops``),
  5. mixed precision (autocast and loss scaling) and Local SGD's schedule.

Per-rank randomness: with ``rng_seed`` (the workload gives its seed), each step sets this rank's
generators from (seed, rank, step) before the forward (``suite.runtime.rng``), so dropout masks differ
between ranks and steps yet the check's reference replays them exactly; without it torch's generators
are left alone.

Precision (TF32, ``float32_matmul_precision``, cuDNN autotuning and determinism) is process-wide
state in torch: :func:`apply_precision` sets it from the config at construction and again at the
start of every step, so engines with different settings can run interleaved in one process;
``describe()["precision"]`` holds what torch reports after setting it.  The correctness check runs
its engine on :func:`strict_fp32` of the config (TF32 off, deterministic cuDNN).

Before its first collective the engine checks that every rank built the same model
(``suite.comm.agree.verify_structure``: names, shapes, dtypes; all ranks stop with one message naming what
differs).  Inputs are a tensor, or a tuple/list (positional arguments) or dict (keyword arguments) of them
(:func:`call_model`), as torch DDP's ``forward(*inputs, **kwargs)`` takes them.  With ``find_unused_parameters``
the parameters the step's autograd graph does not reach are found between forward and backward and handed to the
gradient sync (``GradSync.mark_unused``), as DDP's ``prepare_for_backward`` does; ``verify_gradients`` (the
check's engines) also has every rank compare them before backward (``suite.comm.agree.agree_on_used``), so ranks
that take different branches stop together with the fix instead of one waiting in a collective for the other.
Gradients are zeroed in place between steps (``zero_grad(set_to_none=False)``): a parameter no rank has ever given
a gradient keeps ``grad`` None, and the optimizer skips it, as in torch DDP and in one process.

Each phase of a step is a ``record_function`` range, so a torch.profiler trace (``fleetbench run --trace-steps``)
shows fleetbench's names over the CPU ops, kernels and NCCL calls: "forward", "backward", "wait" (the gradient
communication still outstanding after backward: ``GradSync.finish_step``), "optimizer" (never any communication
wait), and the broadcast of buffers and Local SGD's averaging where they run; the gradient synchronizers add
"bucket N ready", "bucket N allreduce issue" and "bucket N wait".  One range per phase and per bucket, never per
parameter: each costs a dispatcher call even when no profiler listens.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.profiler import record_function

from .comm.agree import agree_on_used, used_parameters, verify_structure
from .comm.broadcast import broadcast_module, broadcast_tensors, module_state
from .comm.factory import build_grad_sync
from .comm.grad_sync import GradSync, trainable_params
from .compute.fusion import apply_compute_fusion
from .config import StrategyConfig
from .runtime.rng import seed_step
from .strategies.amp import Amp
from .strategies.local_sgd import LocalSGD
from .strategies.optim import build_optimizer
from .strategies.user import DDPHook, StrategyError, Synchronizer, load_strategy

__all__ = ["Engine", "build_engine", "apply_precision", "precision_in_effect", "strict_fp32",
           "PRECISION_KEYS", "call_model"]


class Engine:
    def __init__(self, model: torch.nn.Module, loss_fn: Callable, config: StrategyConfig | None = None,
                 group=None, rng_seed: int | None = None, verify_gradients: bool = False):
        if not dist.is_initialized():
            raise RuntimeError(
                "build_engine needs an initialised process group: call torch.distributed.init_process_group "
                "(or run under `fleetbench run` / torchrun) first"
            )
        self.config = config = config or StrategyConfig()
        self.group = group
        self.world_size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        local_ws = _local_world_size()
        config.check_world(self.world_size, local_ws, torchrun=local_ws is not None)
        self.loss_fn = loss_fn
        self.rng_seed = rng_seed
        self.device = device = next(iter(model.parameters())).device
        apply_precision(config)
        self.precision = precision_in_effect(device.type)  # what torch reports, for the records
        self.verify_gradients = verify_gradients
        # the first collective: every rank built the same model (else all stop with one message naming the difference)
        verify_structure(model, group, device)
        self._trainable = trainable_params(model)  # what the used-parameter search and agreement speak of

        # 1. compute fusion: a pass over the user's model.
        self.fusion_report: dict = {}
        if config.compute_fusion_enabled:
            model, self.fusion_report = apply_compute_fusion(model, config)

        # 2. everyone starts from rank 0's parameters and buffers.
        bucket_mb = config.fuse_grad_size_in_MB if config.fuse_broadcast_ops else math.inf
        self.init_broadcasts = broadcast_module(model, group, fused=config.fuse_broadcast_ops, bucket_mb=bucket_mb)
        # the buffers broadcast before every forward, listed once (as DDP lists its modules' buffers at construction)
        self._buffers = [b for b in module_state(model, buffers_only=True) if b.numel()]
        self._src = 0 if group is None else dist.get_global_rank(group, 0)

        # 3. gradient communication; where it takes them (the buckets), the gradients come out of backward already
        #    divided by the world size: the loss gradient seeding backward is 1/world (Paddle's gradient_scale
        #    "avg"), so no pass over the gradients divides them (exact: bit for bit the division at 2 and 4 ranks).
        #    A user's strategy (``strategy``: suite/strategies/user.py) is a gradient synchronizer built here, or a
        #    communication hook registered on DDP below.
        self.strategy = load_strategy(config.strategy) if config.strategy else None
        self.grad_sync: GradSync | None
        if isinstance(self.strategy, Synchronizer):
            self.grad_sync = self.strategy.build(model, group, config)
            if not isinstance(self.grad_sync, GradSync):
                raise StrategyError(f"--strategy {config.strategy!r}: build() returned "
                                    f"{type(self.grad_sync).__name__}; expected a suite.comm.grad_sync.GradSync")
        else:
            self.grad_sync = build_grad_sync(model, config, group)
        folded = self.grad_sync is not None and self.world_size > 1 and self.grad_sync.fold_average_into_backward()
        self._seed = 1.0 / self.world_size if folded else None
        if config.data_parallel == "ddp":
            from torch.nn.parallel import DistributedDataParallel as DDP

            ids = [device.index] if device.type == "cuda" else None
            more = self.strategy.ddp_kwargs if isinstance(self.strategy, DDPHook) else {}
            ddp = DDP(model, device_ids=ids, process_group=group, find_unused_parameters=config.find_unused_parameters,
                      gradient_as_bucket_view=config.ddp_gradient_as_bucket_view, static_graph=config.ddp_static_graph,
                      **_ddp_buffer_sync(), **more)
            if isinstance(self.strategy, DDPHook):  # state per rank (PowerSGD's holds the group)
                hook = self.strategy
                ddp.register_comm_hook(hook.make_state(group) if hook.make_state else hook.state, hook.hook)
            self.model: torch.nn.Module = ddp
        else:
            if isinstance(self.strategy, DDPHook):
                raise StrategyError(f"--strategy {config.strategy!r} is a DDP communication hook: it runs on torch's "
                                    f"DDP (data_parallel=ddp), not data_parallel={config.data_parallel!r}")
            self.model = model
        self.module = model  # the unwrapped module

        # 4. optimizer, 5. mixed precision and Local SGD.
        self.optimizer = build_optimizer(model, config, self.grad_sync)
        self.amp = Amp(config, group, device.type)
        self.local_sgd = None
        if config.local_sgd_enabled:
            self.local_sgd = LocalSGD(config, self.grad_sync, [p for p in model.parameters() if p.requires_grad])
        self.steps = 0

    def describe(self) -> dict:
        info: dict[str, Any] = {"data_parallel": self.config.data_parallel, "init_broadcasts": self.init_broadcasts,
                                "precision": dict(self.precision)}
        if self.strategy is not None:
            info["own_strategy"] = {"ref": self.config.strategy, "kind": self.strategy.kind,
                                "check": self.strategy.check.kind, "description": self.strategy.description}
        if self.grad_sync is not None:
            info.update(self.grad_sync.describe())
        if self.fusion_report:
            info["compute_fusion"] = self.fusion_report
        if self.local_sgd is not None:
            info["local_sgd"] = self.local_sgd.describe()
        if hasattr(self.optimizer, "describe"):  # the fused optimizer: groups, where its gradients live
            info["optimizer"] = self.optimizer.describe()
        if self.amp.enabled:
            info["amp"] = self.amp.state()
        return info

    def train_step(self, inputs: torch.Tensor, targets: torch.Tensor,
                   after_sync: Callable[[Engine], None] | None = None) -> torch.Tensor:
        """One step; ``after_sync(engine)`` is called once every gradient is averaged over the group, before the
        optimizer (the correctness check compares the averaged gradients there: suite.check.harness)."""
        if _batch_size(inputs) == 0:  # a shape, read on the host: no device sync
            raise ValueError(
                f"rank {self.rank}: empty batch at step {self.steps + 1} (inputs of shape "
                f"{tuple(getattr(inputs, 'shape', ()))}); every rank must train on at least one sample, "
                "or its loss is nan and its gradients poison the average: shard the global batch evenly"
            )
        self.steps += 1
        cfg = self.config
        apply_precision(cfg)  # process-wide in torch: another engine may have run in between
        communicate = self.local_sgd.communicate_grads(self.steps) if self.local_sgd else True

        # DDP's rule for buffers (BatchNorm statistics): rank 0's are broadcast before each forward.
        if cfg.data_parallel == "suite" and self._buffers and communicate:
            with record_function("broadcast buffers"), torch.no_grad():
                broadcast_tensors(self._buffers, self._src, self.group, fused=cfg.fuse_broadcast_ops)

        if self.grad_sync is not None:
            self.grad_sync.begin_step(communicate)
        if self.rng_seed is not None:  # this rank's dropout masks for this step, replayable by the reference
            seed_step(self.rng_seed, self.rank, self.steps, self.device)
        with record_function("forward"), self.amp.autocast():
            outputs = call_model(self.model, inputs)
            loss = self.loss_fn(outputs, targets)
        with record_function("backward"):  # overlap: buckets are issued from inside it, as they become ready
            scaled = self.amp.scale_loss(loss)
            marks = communicate and self.grad_sync is not None and self.grad_sync.wants_used()
            if marks or (self.verify_gradients and communicate):
                self._before_backward(scaled, marks)
            if self._seed is not None and communicate:  # averaged in backward (Local SGD's local steps: whole)
                scaled.backward(torch.full_like(scaled, self._seed))
            else:
                scaled.backward()
        if self.grad_sync is not None:
            with record_function("wait"):
                self.grad_sync.finish_step()  # every gradient averaged over the group
        if after_sync is not None:
            after_sync(self)

        # The one host decision AMP must make; ranks agree on it (a collective) whenever gradients were
        # communicated: outside "optimizer", which holds no communication.
        skip = self.amp.unscale_and_check(self.optimizer, agree=communicate)
        with record_function("optimizer"):
            if not skip:
                self.optimizer.step()
            self.amp.update(skip)
            # gradients to zero: bucket by bucket where they are the buckets' views (one fill per bucket)
            if self.grad_sync is None or not self.grad_sync.zero_grad():
                self.optimizer.zero_grad(set_to_none=False)

        if self.local_sgd is not None:
            with record_function("local sgd"):
                self.local_sgd.after_step(self.steps, loss.detach())
        return loss.detach()

    def _before_backward(self, scaled: torch.Tensor, marks: bool) -> None:
        """The parameters this step's graph reaches (DDP's ``search_unused_parameters``): compared across ranks
        (``verify_gradients``) and handed to the gradient sync, which marks the others ready (``marks``)."""
        with record_function("find unused parameters"):
            params = self.grad_sync.params if self.grad_sync is not None else [p for _, p in self._trainable]
            used = used_parameters(scaled, params)
            if self.verify_gradients:
                names = {id(p): n for n, p in self._trainable}
                agree_on_used(used, [names[id(p)] for p in params], self.group, self.device,
                              find_unused=self.config.find_unused_parameters)
            if marks:
                self.grad_sync.mark_unused(used)  # type: ignore[union-attr]


def call_model(model: Callable, inputs: Any) -> Any:
    """``model`` on a batch's inputs: a tuple or list is its positional arguments, a dict its keyword arguments,
    anything else (a tensor) its one argument; as torch DDP's ``forward(*inputs, **kwargs)`` passes them on."""
    if isinstance(inputs, dict):
        return model(**inputs)
    if isinstance(inputs, (tuple, list)):
        return model(*inputs)
    return model(inputs)


PRECISION_KEYS = ("matmul_allow_tf32", "cudnn_allow_tf32", "float32_matmul_precision", "cudnn_benchmark",
                  "cudnn_deterministic")


def apply_precision(config: StrategyConfig) -> None:
    """Set torch's precision switches from ``config``'s knobs (:data:`PRECISION_KEYS`).

    ``matmul_allow_tf32`` and ``float32_matmul_precision`` are one cuBLAS setting in torch
    (``allow_tf32 = True`` is precision "high"): True raises "highest" to "high".  Only
    ``set_float32_matmul_precision`` is called for it; torch 2.13 refuses to read the precision back
    once its legacy and new APIs were mixed in one process.

    Each switch is set only where it differs from what torch holds, and the cuDNN ones through
    ``torch.backends.cudnn.set_flags`` (the setter torch's own ``cudnn.flags()`` context uses): importing
    torch's test utilities (``torch.testing._internal.common_utils``, as models taken from torch's test
    suite do) calls ``torch.backends.disable_global_flags()``, after which assigning ``cudnn.benchmark``
    raises "not allowed to set torch.backends.cudnn flags after disable_global_flags".
    """
    cudnn = torch.backends.cudnn
    precision = config.float32_matmul_precision
    if precision == "highest" and config.matmul_allow_tf32:
        precision = "high"
    if torch.get_float32_matmul_precision() != precision:
        torch.set_float32_matmul_precision(precision)
    want = {"_allow_tf32": config.cudnn_allow_tf32, "_benchmark": config.cudnn_benchmark,
            "_deterministic": config.cudnn_deterministic}
    held = {"_allow_tf32": cudnn.allow_tf32, "_benchmark": cudnn.benchmark, "_deterministic": cudnn.deterministic}
    differ = {k: v for k, v in want.items() if bool(held[k]) != v}
    if differ:
        cudnn.set_flags(**differ, _fp32_precision=None)  # None: leave the new precision API alone


def precision_in_effect(device_type: str) -> dict:
    """What torch reports for :data:`PRECISION_KEYS`, and ``cudnn_version`` (None unless on CUDA)."""
    cudnn = torch.backends.cudnn
    return {"matmul_allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
            "cudnn_allow_tf32": bool(cudnn.allow_tf32),
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
            "cudnn_benchmark": bool(cudnn.benchmark), "cudnn_deterministic": bool(cudnn.deterministic),
            "cudnn_version": cudnn.version() if device_type == "cuda" else None}


def strict_fp32(config: StrategyConfig) -> StrategyConfig:
    """``config`` with TF32 off everywhere and cuDNN's deterministic algorithms only (no autotuning): what
    correctness checks run (their tolerances are fp32's; a run-to-run difference in a convolution's weight gradient
    is cuDNN's algorithm, not the strategy)."""
    return config.replace(matmul_allow_tf32=False, cudnn_allow_tf32=False, float32_matmul_precision="highest",
                          cudnn_benchmark=False, cudnn_deterministic=True)


def _batch_size(inputs) -> int | None:
    """The leading dimension of a tensor (or of the first tensor in a tuple/list/dict), None if unknown."""
    if isinstance(inputs, torch.Tensor):
        return inputs.shape[0] if inputs.dim() else None
    if isinstance(inputs, (list, tuple)) and inputs:
        return _batch_size(inputs[0])
    if isinstance(inputs, dict) and inputs:
        return _batch_size(next(iter(inputs.values())))
    return None


def _ddp_buffer_sync() -> dict:
    """DDP's rank-0 buffer broadcast before each forward, under its name in this torch version."""
    import inspect

    from torch.nn.parallel import DistributedDataParallel as DDP

    if "forward_sync_buffers" in inspect.signature(DDP.__init__).parameters:
        return {"forward_sync_buffers": True}
    return {"broadcast_buffers": True}


def _local_world_size() -> int | None:
    import os

    v = os.environ.get("LOCAL_WORLD_SIZE")
    return int(v) if v and "TORCHELASTIC_RUN_ID" in os.environ else None


def build_engine(model: torch.nn.Module, loss_fn: Callable, config: StrategyConfig | None = None,
                 group=None, rng_seed: int | None = None, verify_gradients: bool = False) -> Engine:
    """Compose the strategies ``config`` enables around ``model``; see :class:`Engine`."""
    return Engine(model, loss_fn, config, group, rng_seed, verify_gradients)
