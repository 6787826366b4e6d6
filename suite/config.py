"""StrategyConfig: the one place where fleetbench's knobs are defined.

Field names follow Paddle Fleet's ``DistributedStrategy`` (and its BuildStrategy /
ExecutionStrategy / amp_configs / localsgd_configs) where Paddle has the knob; the
few that are fleetbench's own are marked "ours".  Every optimization is off by
default: the default config is plain data parallel (one allreduce per parameter
gradient after backward, each waited on at once, averaged).

Each field carries its type (``Literal[...]`` for a choice), its range and a one-line help
next to it (:func:`knob`), read and checked by ``suite/validate.py`` (the one validation of the knobs, the run
specification and the records).

A config is validated on construction: every error names the field, the value and
what is allowed.  The part that depends on the world size (the hierarchical split)
is checked by :meth:`StrategyConfig.check_world` as soon as the world size is known.

Paddle 2.x spelling is read as is (the tables of ``suite/paddle_names.py``): a ``DistributedStrategy``
written as TOML (``amp = true``, ``[localsgd_configs]``, ``[build_strategy]`` …) or as ``--set`` (dotted:
``build_strategy.fuse_bn_act_ops=true``) maps onto these fields; a Paddle field that
fleetbench does not implement (:data:`PADDLE_UNIMPLEMENTED`) is refused by name.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import tomllib
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Literal

from .paddle_names import (
    BESIDE_STRATEGY,
    PADDLE_FIELDS,
    PADDLE_SWITCHES,
    PADDLE_TABLES,
    PADDLE_UNIMPLEMENTED,
    TABLE_ALIASES,
)
from .validate import FieldSpec, Invalid, check_fields, field_specs
from .validate import spec as field_with_spec

__all__ = ["StrategyConfig", "ConfigError", "PRESETS", "PADDLE_FIELDS", "PADDLE_UNIMPLEMENTED", "toml_fields",
           "check_overrides", "knob", "FieldSpec", "field_specs", "to_toml", "WORKLOAD", "workload_sets",
           "baseline_sets", "parse_set", "set_field", "set_text", "refuse_unused_fields",
           "away_from_defaults"]


MIN_THREAD_CAP = 16  # num_threads allowed per rank on a machine of fewer than 4 CPUs (check_world)
THREADS_PER_CPU = 4  # num_threads at most this many per CPU (figures host times 2 x cores)


class ConfigError(ValueError):
    """A config value out of range, of the wrong type, unknown, or a bad combination."""


def knob(default: Any, help: str, *, ge: float | None = None, gt: float | None = None,
         le: float | None = None, allow_inf: bool = False, only: str | None = None, workload: bool = False) -> Any:
    """A StrategyConfig field: its default, one line of help and its numeric range (:func:`suite.validate.spec`).

    ``ge``/``gt`` are the lower bound (inclusive/exclusive), ``le`` the inclusive upper one;
    ``allow_inf`` lets a float field be ``inf`` (otherwise refused as out of range); ``only``: the
    one command that reads the knob (:meth:`StrategyConfig.refuse_unused`: others refuse it set);
    ``workload``: a condition of the training every case shares, the baseline too (the optimizer, threads,
    precision, a straggler), not a strategy (:data:`WORKLOAD`; ``--set`` of any other knob leaves the baseline
    plain data parallel).
    """
    return field_with_spec(default, help, ge=ge, gt=gt, le=le, allow_inf=allow_inf, only=only, workload=workload)


READER = "figures reader"  # the command that reads the reader knobs


@dataclass(frozen=True)
class StrategyConfig:
    # ---- data parallelism (ours) -------------------------------------------------
    data_parallel: Literal["suite", "ddp", "none"] = knob(
        "suite", "gradient communication: suite = this project's; ddp = torch DDP baseline; none = no communication")
    find_unused_parameters: bool = knob(
        False, "as DDP's: parameters that get no gradient in a step are reduced as zeros", workload=True)
    ddp_gradient_as_bucket_view: bool = knob(
        False, "ours: torch DDP's gradient_as_bucket_view (each gradient a view into its bucket, no copies; DDP's "
        "default False); data_parallel = ddp")
    ddp_static_graph: bool = knob(
        False, "ours: torch DDP's static_graph (the same graph every step: DDP plans its buckets from the first "
        "iteration and skips the search for unused parameters); data_parallel = ddp")
    strategy: str = knob(
        "", "ours: your own strategy as module:function, a DDP communication hook (data_parallel = ddp) or a gradient "
        "synchronizer (data_parallel = suite): suite/strategies/user.py; '' none")

    # ---- communication overlap (Paddle: nccl_comm_num, sync_nccl_allreduce) -----
    nccl_comm_num: int = knob(1, "communicators the gradient allreduces are spread over", ge=1, le=16)
    sync_nccl_allreduce: bool = knob(True, "each allreduce waited on as it is launched (True: no overlap)")

    # ---- topology (Paddle: use_hierarchical_allreduce) ---------------------------
    use_hierarchical_allreduce: bool = knob(
        False, "allreduce in three steps: reduce within a node, allreduce across nodes, broadcast within")
    hierarchical_allreduce_inter_nranks: int | None = knob(
        None, "ranks per node; None = LOCAL_WORLD_SIZE under torchrun", ge=1)

    # ---- allreduce fusion / bucketing --------------------------------------------
    fuse_all_reduce_ops: bool = knob(False, "gradients allreduced in fused buckets, not one allreduce per parameter")
    fuse_grad_size_in_MB: float = knob(
        32.0, "MiB per fused allreduce (Paddle proto default 32); inf = no byte cap", gt=0.0, allow_inf=True)
    fuse_grad_size_in_layers: int = knob(
        50, "max layers per fused allreduce (Paddle's _fuse_grad_size_in_TFLOPS, a layer count)", ge=1)
    grad_comm_dtype: Literal["fp32", "bf16", "fp16"] = knob(
        "fp32", "ours: dtype gradients travel in (master weights stay fp32)")
    first_bucket_MB: float | None = knob(
        None, "ours: DDP's first-bucket rule, the first bucket launched (the last layers') closes at this many MiB "
        "(DDP: 1); None = every bucket up to fuse_grad_size_in_MB, as in Paddle", gt=0.0)
    gradient_as_bucket_view: bool = knob(
        True, "ours (DDP's name): each gradient is a view into its bucket, no copies; False = own tensors copied "
        "into the bucket and back (DDP's default)")

    # ---- compute fusion (Paddle BuildStrategy) -----------------------------------
    fuse_bn_act_ops: bool = knob(False, "BatchNorm + activation fused")
    fuse_elewise_add_act_ops: bool = knob(False, "elementwise add + activation fused")
    fuse_relu_depthwise_conv: bool = knob(False, "ReLU + depthwise convolution fused")
    fuse_broadcast_ops: bool = knob(False, "the broadcasts of rank 0's buffers fused into one")
    fuse_all_optimizer_ops: bool = knob(False, "one fused optimizer update over all parameters")
    fusion_backend: Literal["eager", "compile"] = knob(
        "eager", "ours: how the fused functions run: eager, or compile (torch.compile)")

    # ---- Local SGD (Paddle localsgd_configs / adaptive_localsgd_configs) ---------
    use_local_sgd: bool = knob(False, "Local SGD: local steps, parameters averaged every k steps")
    local_sgd_steps: int = knob(1, "k: parameters averaged after every k-th local step", ge=1)
    local_sgd_is_warm_steps: int = knob(1, "W: steps 1..W are synchronous data parallel", ge=0)
    use_adaptive_local_sgd: bool = knob(False, "Local SGD with Paddle's adaptive k; implies use_local_sgd")
    init_k_steps: int = knob(1, "adaptive Local SGD's first k", ge=1, le=16)

    # ---- mixed precision (Paddle amp_configs) ------------------------------------
    amp: Literal["off", "bf16", "fp16"] = knob("off", "mixed precision: off | bf16 | fp16 (fp16: with loss scaling)")
    use_dynamic_loss_scaling: bool | None = knob(
        None, "None: on for fp16 (Paddle's default), off for bf16")
    init_loss_scaling: float | None = knob(
        None, "None: 32768 where loss scaling is on; set it for static scaling", gt=0.0)
    incr_every_n_steps: int = knob(1000, "loss scale raised after this many steps with finite gradients", ge=1)
    decr_every_n_nan_or_inf: int = knob(2, "loss scale lowered after this many steps with inf/nan gradients", ge=1)
    incr_ratio: float = knob(2.0, "factor the loss scale is raised by", gt=1.0)
    decr_ratio: float = knob(0.8, "factor the loss scale is lowered by", gt=0.0, le=1.0)

    # ---- host side (Paddle ExecutionStrategy / fetch) ----------------------------
    fetch_frequency: int = knob(1, "losses fetched to the host every N steps", ge=1)
    num_threads: int | None = knob(
        None, "intra-op threads per rank; None = cores / local ranks (at least 1)", ge=1, le=1024, workload=True)

    # ---- optimizer (torch.optim meanings) ----------------------------------------
    optimizer: Literal["sgd", "momentum", "adam"] = knob("sgd", "the optimizer (torch.optim's)", workload=True)
    lr: float = knob(0.01, "learning rate", gt=0.0, workload=True)
    momentum: float = knob(0.9, "momentum, used by optimizer = momentum", ge=0.0, le=1.0, workload=True)
    weight_decay: float = knob(0.0, "weight decay", ge=0.0, workload=True)

    # ---- reader (Paddle DataLoader options; ours where Paddle has none) ----------
    # Read only by `fleetbench figures reader` (run's cases take synthetic batches already on the
    # device): any other command refuses them set (refuse_unused) instead of recording them unused.
    use_double_buffer: bool = knob(False, "the next batch copied to the device while this one runs", only=READER)
    reader_return_uint8: bool = knob(False, "images travel as uint8, converted to float on the device", only=READER)
    use_infinite_reader: bool = knob(False, "one endless reader instead of one per epoch", only=READER)
    reader_num_workers: int = knob(0, "DataLoader worker processes (reader_backend = torch)", ge=0, le=64,
                                   only=READER)
    reader_backend: Literal["torch", "dali"] = knob("torch", "the reader: torch DataLoader or DALI", only=READER)

    # ---- benchmark conditions (ours) ---------------------------------------------
    straggler_ms: float = knob(0.0, "ours: a seeded random rank is delayed this long each step (CPU: a sleep; "
                                        "CUDA: a spin kernel on its compute stream); at most a minute", ge=0.0,
                               le=60_000.0, workload=True)

    # ---- precision (ours; torch.backends switches) --------------------------------
    # Every default is PyTorch's own, so a run measures what a plain PyTorch program runs unless a
    # knob says otherwise (PyTorch >= 1.12: fp32 matmuls exact, convolutions allowed TF32; no cuDNN
    # autotuning, no deterministic-only algorithms).  Applied on every rank before every timed step
    # (suite.engine.apply_precision); correctness checks always run with TF32 off and deterministic cuDNN
    # whatever these say; records carry the values torch reports on the ranks (describe["precision"]).
    # No effect on CPU.
    matmul_allow_tf32: bool = knob(
        False, "TF32 in fp32 matmuls (torch.backends.cuda.matmul.allow_tf32; PyTorch's default off); one "
        "cuBLAS setting with float32_matmul_precision: True means at least 'high'", workload=True)
    cudnn_allow_tf32: bool = knob(
        True, "TF32 in cuDNN convolutions (torch.backends.cudnn.allow_tf32; PyTorch's default on)", workload=True)
    float32_matmul_precision: Literal["highest", "high", "medium"] = knob(
        "highest", "torch.set_float32_matmul_precision (PyTorch's default 'highest': no TF32, no bf16 passes)",
        workload=True)
    cudnn_benchmark: bool = knob(False, "cuDNN autotuning per input shape (torch.backends.cudnn.benchmark; "
                                 "PyTorch's default off)", workload=True)
    cudnn_deterministic: bool = knob(False, "deterministic cuDNN algorithms only (torch.backends.cudnn.deterministic;"
                                     " PyTorch's default off)", workload=True)

    def __post_init__(self) -> None:
        _check_fields(self)
        _check_combinations(self)

    # ---- construction -------------------------------------------------------------
    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> StrategyConfig:
        """Fields by our names, their aliases, or Paddle's (nested tables or dotted keys)."""
        return cls(**_canonical_keys(values))

    @classmethod
    def from_toml(cls, path: str) -> StrategyConfig:
        return cls.from_dict(toml_fields(path))

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> StrategyConfig:
        if name not in PRESETS:
            raise ConfigError(f"preset {name!r} is unknown; allowed: {', '.join(sorted(PRESETS))}")
        return cls.from_dict({**PRESETS[name], **overrides})

    def replace(self, **changes: Any) -> StrategyConfig:
        return dataclasses.replace(self, **_canonical_keys(changes))

    def with_overrides(self, assignments: list[str]) -> StrategyConfig:
        """Apply ``key=value`` strings (the CLI's ``--set``), parsed by the field's type.

        Keys are our field names, their aliases, or Paddle's (dotted for a table:
        ``build_strategy.fuse_bn_act_ops=true``, ``localsgd_configs.k_steps=4``).
        """
        changes: dict[str, Any] = {}
        for item in assignments:
            if "=" not in item:
                raise ConfigError(f"--set {item!r}: expected key=value, e.g. --set nccl_comm_num=2")
            key, raw = item.split("=", 1)
            key, raw = key.strip(), raw.strip()
            changes.update(_canonical_keys({key: _parse_set_value(key, raw)}))  # the last --set of a field wins
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def refuse_unused(self, command: str) -> None:
        """A knob set away from its default that ``command`` does not read is an error naming the one that does."""
        refuse_unused_fields({f.name: getattr(self, f.name) for f in fields(self)}, command)

    def diff(self, other: StrategyConfig | None = None) -> dict[str, Any]:
        """Fields that differ from ``other`` (default: the all-off default config)."""
        base = other or StrategyConfig()
        return {k: v for k, v in self.to_dict().items() if getattr(base, k) != v}

    def __str__(self) -> str:
        changed = self.diff()
        if not changed:
            return "StrategyConfig(plain data parallel: every optimization off)"
        return "StrategyConfig(" + ", ".join(f"{k}={v!r}" for k, v in changed.items()) + ")"

    def describe(self) -> str:
        """Every field, one a line; changed ones marked."""
        default = StrategyConfig()
        lines = []
        for f in fields(self):
            v = getattr(self, f.name)
            mark = "*" if v != getattr(default, f.name) else " "
            lines.append(f"{mark} {f.name:36s} {v!r}")
        return "\n".join(lines)

    # ---- derived values -----------------------------------------------------------
    @property
    def local_sgd_enabled(self) -> bool:
        return self.use_local_sgd or self.use_adaptive_local_sgd

    @property
    def loss_scaling_enabled(self) -> bool:
        if self.amp == "off":
            return False
        return self.amp == "fp16" or bool(self.use_dynamic_loss_scaling) or self.init_loss_scaling is not None

    @property
    def dynamic_loss_scaling(self) -> bool:
        if not self.loss_scaling_enabled:
            return False
        if self.use_dynamic_loss_scaling is None:
            return self.amp == "fp16"
        return self.use_dynamic_loss_scaling

    @property
    def effective_init_loss_scaling(self) -> float:
        return 32768.0 if self.init_loss_scaling is None else float(self.init_loss_scaling)

    @property
    def compute_fusion_enabled(self) -> bool:
        return self.fuse_bn_act_ops or self.fuse_elewise_add_act_ops or self.fuse_relu_depthwise_conv

    def resolve_inter_nranks(self, world_size: int, local_world_size: int | None = None) -> int:
        if self.hierarchical_allreduce_inter_nranks is not None:
            return self.hierarchical_allreduce_inter_nranks
        if local_world_size is not None:
            return local_world_size
        raise ConfigError(
            "hierarchical_allreduce_inter_nranks=None: set it to the ranks per (emulated) node, "
            f"a divisor of the world size {world_size}; it defaults to LOCAL_WORLD_SIZE only under torchrun"
        )

    def check_world(self, world_size: int, local_world_size: int | None = None, torchrun: bool = False) -> None:
        """Checks that need the world size and the machine; called before any rank is started (or any step is
        run): what a rank here can run (``num_threads`` at most this machine's CPUs, or 16 where it has fewer)."""
        if not isinstance(world_size, int) or world_size < 1:
            raise ConfigError(f"world size {world_size!r}: must be a whole number >= 1")
        why = machine_problem("num_threads", self.num_threads)
        if why:
            raise ConfigError(why)
        if self.use_hierarchical_allreduce:
            inter = self.resolve_inter_nranks(world_size, local_world_size if torchrun else None)
            if inter > world_size or world_size % inter != 0:
                raise ConfigError(
                    f"hierarchical_allreduce_inter_nranks={inter} does not split world size {world_size} "
                    f"into whole nodes: allowed values are the divisors of {world_size} "
                    f"({', '.join(str(d) for d in _divisors(world_size))})"
                )
            given = self.hierarchical_allreduce_inter_nranks
            if torchrun and local_world_size and given not in (None, local_world_size):
                warnings.warn(
                    f"hierarchical_allreduce_inter_nranks={self.hierarchical_allreduce_inter_nranks} differs from "
                    f"torchrun's LOCAL_WORLD_SIZE={local_world_size}: nodes will be emulated as blocks of "
                    f"{self.hierarchical_allreduce_inter_nranks} ranks, not the real machines",
                    stacklevel=2,
                )


# ---- field specs: type, choices, range, help, read from the class (suite/validate.py) ------------

_SPECS: dict[str, FieldSpec] = field_specs(StrategyConfig)
_FIELDS = {f.name: f for f in fields(StrategyConfig)}

# The workload's knobs (``knob(workload=True)``): every case takes them from --config and --set, the baseline too;
# every other knob is a strategy's, and the baseline (plain data parallel) stays without it unless asked.
WORKLOAD = frozenset(name for name, f in _FIELDS.items() if f.metadata.get("workload"))


def field_names() -> list[str]:
    return list(_FIELDS)


def field_table() -> str:
    """Every field: default, what it accepts, help (``fleetbench config --list``)."""
    lines = [f"  {'field':36s} {'default':9s} {'accepts':34s} help"]
    for spec in _SPECS.values():
        every = " [every case, the baseline too]" if spec.name in WORKLOAD else ""
        lines.append(f"  {spec.name:36s} {spec.default!r:9s} {spec.allowed():34s} {spec.help}{every}")
    return "\n".join(lines)


def parse_set(item: str) -> dict[str, Any]:
    """What a ``--set KEY=VALUE`` item sets, by our field names (nothing for a Paddle field that asks for nothing);
    the item is assumed checked (:func:`check_overrides`)."""
    key, raw = (part.strip() for part in item.split("=", 1))
    return _canonical_keys({key: _parse_set_value(key, raw)})


def set_field(item: str) -> str:
    """The field a checked ``--set`` item sets, by our name ('' for a Paddle field that asks for nothing)."""
    return next(iter(parse_set(item)), "")


def set_text(value: Any) -> str:
    """A field's value as a ``--set`` writes it (read back by :func:`parse_value`): true, 8, 0.5, inf, none, adam."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "none"
    if isinstance(value, float):
        return f"{value:g}" if float(f"{value:g}") == value else repr(value)
    return str(value)


def refuse_unused_fields(values: Mapping[str, Any], command: str) -> None:
    """A knob of ``values`` (our names) set away from its default that ``command`` does not read (``knob(only=...)``)
    is an error naming the command that does; ``--set`` items: ``refuse_unused_fields(parse_set(item), ...)``."""
    for name, value in values.items():
        f = _FIELDS[name]
        only = f.metadata.get("only")
        if only and only != command and value != f.default:
            raise ConfigError(f"{name}={value!r}: `fleetbench {command}` does not use this knob (it would be "
                              f"recorded and ignored); `fleetbench {only}` is the command that reads it")


def away_from_defaults(config: Mapping[str, Any]) -> list[str]:
    """A recorded config's knobs away from their defaults, as ``--set`` items (``lr=0.05``; a key no knob has any
    more is left out): what a baseline ran with beyond plain data parallel, said beside its speedup."""
    return [f"{k}={set_text(v)}" for k, v in config.items() if k in _FIELDS and v != _FIELDS[k].default]


def workload_sets(assignments: list[str] | tuple[str, ...]) -> list[str]:
    """The ``--set`` items of workload knobs (:data:`WORKLOAD`)."""
    return [item for item in assignments if set_field(item) in WORKLOAD]


def baseline_sets(config: str | None, assignments: list[str] | tuple[str, ...], everything: bool = False
                  ) -> tuple[str, ...]:
    """What the baseline takes of a selection's ``--config`` file and ``--set`` items, as ``--set`` items in their
    order (the file's first): their workload knobs (:data:`WORKLOAD`), so plain data parallel stays plain; every
    knob with ``everything`` (``--set-baseline``)."""
    fields_ = toml_fields(config) if config else {}
    items = [f"{k}={set_text(v)}" for k, v in fields_.items() if everything or k in WORKLOAD]
    return tuple(items + (list(assignments) if everything else workload_sets(assignments)))


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


# ---- Paddle 2.x spelling (its tables: suite/paddle_names.py) -------------------------------

def _is_unimplemented(key: str) -> bool:
    """A Paddle field fleetbench does not implement, or a field of such a table (``dgc_configs.sparsity``)."""
    return key in PADDLE_UNIMPLEMENTED or ("." in key and key.split(".", 1)[0] in PADDLE_UNIMPLEMENTED)


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b  # False is not 0, 1 is not True


def _table_alias(key: str) -> str:
    """``exec_strategy.x`` is ``execution_strategy.x`` (TABLE_ALIASES); any other key is itself."""
    table, dot, field = key.partition(".")
    return f"{TABLE_ALIASES.get(table, table)}.{field}" if dot else key


def _flatten(values: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """Paddle's tables ([build_strategy], amp_configs = {...}) as dotted keys."""
    out = []
    for key, value in values.items():
        if key in PADDLE_TABLES:
            if not isinstance(value, Mapping):
                raise ConfigError(f"{key}={value!r}: Paddle's {key} is a table of fields, e.g. [{key}]")
            for sub, v in value.items():
                if isinstance(v, Mapping):
                    raise ConfigError(f"{key}.{sub}={v!r}: expected a value, not a table")
                out.append((f"{key}.{sub}", v))
        else:
            out.append((key, value))
    return out


def _unknown_field_message(key: str) -> str:
    import difflib

    names = list(_FIELDS) + list(PADDLE_FIELDS)
    close = difflib.get_close_matches(key, names, n=3)
    hint = f"; did you mean {', '.join(close)}?" if close else "; see `fleetbench config --list` for all fields"
    table = _table_alias(key).split(".", 1)[0]
    if "." in key and table in PADDLE_TABLES:
        known = sorted(k.split(".", 1)[1] for k in [*PADDLE_FIELDS, *PADDLE_UNIMPLEMENTED] if k.startswith(table + "."))
        return f"unknown field {key!r} of Paddle's {key.split('.', 1)[0]}; its fields are {', '.join(known)}"
    return f"unknown strategy field {key!r}{hint}"


def _canonical_keys(values: Mapping[str, Any]) -> dict[str, Any]:
    """Our field names for every key (ours, an alias, or Paddle's), values converted where Paddle's differ."""
    out: dict[str, Any] = {}
    source: dict[str, str] = {}
    for given, value in _flatten(values):
        key = _table_alias(given)
        if _is_unimplemented(key):
            what, nothing = PADDLE_UNIMPLEMENTED.get(key) or (PADDLE_UNIMPLEMENTED[key.split(".", 1)[0]][0], ())
            if any(_same(value, v) for v in nothing):
                continue  # asks for nothing
            allowed = f"; allowed only {' or '.join(map(repr, nothing))}, which asks for nothing" if nothing else ""
            raise ConfigError(f"Paddle field {key}={value!r} ({what}) is not implemented by fleetbench{allowed}")
        canon = PADDLE_FIELDS.get(key, key)
        if canon not in _FIELDS:
            raise ConfigError(_unknown_field_message(given))
        if key in PADDLE_SWITCHES and isinstance(value, bool):
            value = PADDLE_SWITCHES[key][0 if value else 1]
        elif key in PADDLE_SWITCHES and key != canon:  # under our own name (amp), our values pass
            raise ConfigError(f"{key}={value!r}: expected a boolean (true/false), as in Paddle")
        if canon in out:
            if canon == "local_sgd_is_warm_steps" and source[canon] != canon and _same(out[canon], value):
                continue  # localsgd_configs.begin_step and adaptive_localsgd_configs.begin_step agree
            first = source[canon]
            how = f"as {first!r} and as {given!r}" if first != given else f"as {given!r}"
            raise ConfigError(f"field {canon!r} given twice ({how})")
        out[canon] = value
        source[canon] = given
    return out


def _paddle_tables(path: str, data: dict) -> dict:
    """A config file's keys as one table: ``[strategy]`` with Paddle's ``[build_strategy]`` and
    ``[exec_strategy]`` (``BuildStrategy``, ``ExecutionStrategy``) beside it read too; any other top-level
    key beside ``[strategy]`` refused by name (it would be ignored)."""
    if "strategy" in data:
        if not isinstance(data["strategy"], dict):
            raise ConfigError(f"config file {path!r}: 'strategy' must be a table ([strategy]), not "
                              f"{type(data['strategy']).__name__}")
        extra = {k: v for k, v in data.items() if k != "strategy"}
        bad = [k for k in extra if k not in BESIDE_STRATEGY]
        if bad:
            raise ConfigError(f"config file {path!r}: top-level key(s) {', '.join(map(repr, bad))} beside [strategy] "
                              f"would be ignored; allowed beside it: [build_strategy] and [exec_strategy] (Paddle's "
                              f"BuildStrategy, ExecutionStrategy); strategy fields go inside [strategy]")
        twice = sorted(set(extra) & set(data["strategy"]))
        if twice:
            raise ConfigError(f"config file {path!r}: [{twice[0]}] given both inside and beside [strategy]")
        data = {**data["strategy"], **extra}
    for alias, name in TABLE_ALIASES.items():
        if alias in data and name in data:
            raise ConfigError(f"config file {path!r}: both [{alias}] and [{name}]; give one")
    return {TABLE_ALIASES.get(k, k): v for k, v in data.items()}


def toml_fields(path: str) -> dict[str, Any]:
    """The fields a TOML file sets explicitly, by our names (a ``[strategy]`` table or the top level).

    Every key is validated (an unknown or unimplemented one is a clear error) and the result is a
    valid config's fields: ``fleetbench run --config`` applies exactly these on top of each case, so a
    field the file sets to its default still overrides a case that sets it otherwise.
    """
    import os
    import stat

    try:
        # Non-blocking open: a FIFO or a device is refused by its type, never read.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
        with os.fdopen(fd, "rb") as fh:
            st = os.fstat(fd)
            if stat.S_ISDIR(st.st_mode):
                raise IsADirectoryError
            if not stat.S_ISREG(st.st_mode):
                raise ConfigError(f"config file {path!r} is not a regular file (a FIFO, device or socket); "
                                  f"expected a TOML file")
            if st.st_size > 2**20:
                raise ConfigError(f"config file {path!r} is {st.st_size} bytes; a strategy config is at most 1 MiB")
            os.set_blocking(fd, True)
            data = tomllib.load(fh)
    except ConfigError:
        raise
    except FileNotFoundError:
        raise ConfigError(f"config file {path!r} does not exist") from None
    except IsADirectoryError:
        raise ConfigError(f"config file {path!r} is a directory; expected a TOML file") from None
    except PermissionError:
        raise ConfigError(f"config file {path!r} cannot be read (permission denied)") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file {path!r} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path!r} is not valid TOML: {exc}") from None
    except RecursionError:
        raise ConfigError(f"config file {path!r} nests tables or arrays too deeply to read") from None
    except ValueError as exc:  # an integer of more digits than Python converts
        raise ConfigError(f"config file {path!r}: {str(exc).split(';')[0]} (an integer this long is no "
                          f"strategy value)") from None
    data = _paddle_tables(path, data)
    try:
        fields_ = _canonical_keys(data)
        StrategyConfig(**fields_)  # the combination must be valid on its own
    except ConfigError as exc:
        raise ConfigError(f"config file {path!r}: {exc}") from None
    return fields_


# ---- parsing --set values ------------------------------------------------------------------

def parse_value(name: str, raw: str) -> Any:
    """Parse a ``--set`` string as the field's type."""
    spec = _SPECS[name]
    typ = spec.type
    low = raw.lower()
    if spec.optional and low in ("none", "null", ""):
        return None
    if typ is bool:
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"{name}={raw!r}: expected a boolean (true/false)")
    if typ is int:
        try:
            return int(raw)
        except ValueError:
            raise ConfigError(f"{name}={raw!r}: expected a whole number") from None
    if typ is float:
        try:
            return float(raw)
        except ValueError:
            raise ConfigError(f"{name}={raw!r}: expected a number") from None
    return raw


def _parse_set_value(key: str, raw: str) -> Any:
    """A ``--set`` value for any accepted key: by our field's type, Paddle's switches as booleans."""
    given, key = key, _table_alias(key)
    if key in PADDLE_SWITCHES and raw.lower() in ("true", "false"):
        return raw.lower() == "true"  # Paddle's switches (amp = true: fp16)
    if key in PADDLE_SWITCHES or _is_unimplemented(key):
        try:  # a TOML value: true, 4, [], {} ...; anything else stays a string
            return tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            return raw
    canon = PADDLE_FIELDS.get(key, key)
    if canon not in _FIELDS:
        raise ConfigError(_unknown_field_message(given))
    return parse_value(canon, raw)


# ---- validation ------------------------------------------------------------------------------

def _checked(name: str, value: Any) -> Any:
    """``value`` of field ``name`` as the config keeps it (an int for a float field as a float), else a ConfigError
    naming the field, the value and what is allowed (:meth:`suite.validate.FieldSpec.check`)."""
    try:
        return _SPECS[name].check(value)
    except Invalid as exc:
        raise ConfigError(str(exc)) from None


def _check_fields(cfg: StrategyConfig) -> None:
    try:
        check_fields(cfg)
    except Invalid as exc:
        raise ConfigError(str(exc)) from None


def machine_problem(name: str, value: Any) -> str | None:
    """Why a knob's value cannot run on this machine (None when it can): ``num_threads`` at most
    :data:`THREADS_PER_CPU` per CPU of this machine, and :data:`MIN_THREAD_CAP` anywhere (the knob's own range
    holds for any machine)."""
    if name == "num_threads" and isinstance(value, int) and not isinstance(value, bool):
        cpus = os.cpu_count() or 1
        cap = max(MIN_THREAD_CAP, THREADS_PER_CPU * cpus)
        if value > cap:
            return (f"num_threads={value}: more intra-op threads per rank than a rank here runs: at most "
                    f"max({MIN_THREAD_CAP}, {THREADS_PER_CPU} x CPUs) = {cap} (this machine has {cpus} CPU(s))")
    return None


def check_overrides(assignments: list[str]) -> None:
    """Each ``--set`` item on its own, as it applies to every case: ``key=value``, a known field, a value of the
    field's type and range; else a ConfigError naming ``--set`` and the item.  (Whether the fields combine with a
    case's own is that case's to say: :meth:`StrategyConfig.with_overrides`.)"""
    for item in assignments:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected key=value, e.g. --set nccl_comm_num=2")
        key, raw = (part.strip() for part in item.split("=", 1))
        try:
            for name, value in _canonical_keys({key: _parse_set_value(key, raw)}).items():
                _checked(name, value)
                if why := machine_problem(name, value):
                    raise ConfigError(why)
        except ConfigError as exc:
            raise ConfigError(f"--set {item!r}: {exc}") from None


def _check_combinations(cfg: StrategyConfig) -> None:
    if cfg.use_adaptive_local_sgd and not cfg.use_local_sgd:
        object.__setattr__(cfg, "use_local_sgd", True)  # adaptive implies Local SGD, as in Paddle
    suite_only = [
        ("use_hierarchical_allreduce", cfg.use_hierarchical_allreduce),
        ("fuse_all_reduce_ops", cfg.fuse_all_reduce_ops),
        ("nccl_comm_num", cfg.nccl_comm_num > 1),
        ("sync_nccl_allreduce", not cfg.sync_nccl_allreduce),
        ("use_local_sgd", cfg.use_local_sgd),
        ("grad_comm_dtype", cfg.grad_comm_dtype != "fp32"),
        ("first_bucket_MB", cfg.first_bucket_MB is not None),
        ("gradient_as_bucket_view", not cfg.gradient_as_bucket_view),
    ]
    for name, on in suite_only:
        if on and cfg.data_parallel != "suite":
            raise ConfigError(
                f"{name}={getattr(cfg, name)!r} needs data_parallel='suite' (this project's gradient "
                f"communication), but data_parallel={cfg.data_parallel!r}"
            )
    for name in ("ddp_gradient_as_bucket_view", "ddp_static_graph"):
        if getattr(cfg, name) and cfg.data_parallel != "ddp":
            raise ConfigError(f"{name}=True is torch DDP's setting, but data_parallel={cfg.data_parallel!r}; set "
                              f"data_parallel=ddp")
    if cfg.strategy and (":" not in cfg.strategy or len(cfg.strategy) > 300 or not all(
            p.isidentifier() for p in cfg.strategy.replace(":", ".").split("."))):
        raise ConfigError(f"strategy={cfg.strategy[:300]!r}: expected module:function (your own module's function "
                          f"returning a DDPHook or a Synchronizer: suite/strategies/user.py), or '' for none")
    if cfg.strategy and cfg.data_parallel == "none":
        raise ConfigError(f"strategy={cfg.strategy!r} communicates gradients, but data_parallel='none'")
    if cfg.first_bucket_MB is not None and not cfg.fuse_all_reduce_ops:
        raise ConfigError(
            f"first_bucket_MB={cfg.first_bucket_MB!r} caps the first fused bucket, but fuse_all_reduce_ops=False "
            "(one gradient per bucket); set fuse_all_reduce_ops=true or leave first_bucket_MB unset")
    if cfg.use_hierarchical_allreduce and cfg.hierarchical_allreduce_inter_nranks == 1:
        raise ConfigError(
            "hierarchical_allreduce_inter_nranks=1: a node of one rank makes the hierarchy a flat allreduce; "
            "allowed: a divisor of the world size >= 2"
        )
    if cfg.use_local_sgd and cfg.optimizer == "adam":
        raise ConfigError(
            "optimizer='adam' with use_local_sgd=True: Local SGD supports optimizer 'sgd' and 'momentum' "
            "(as in Paddle), because Adam's local moments make averaged parameters meaningless"
        )
    if cfg.amp == "off":
        for name in ("use_dynamic_loss_scaling", "init_loss_scaling"):
            if getattr(cfg, name) is not None:
                raise ConfigError(f"{name}={getattr(cfg, name)!r} needs amp='bf16' or 'fp16', but amp='off'")
    if cfg.amp == "fp16" and cfg.use_dynamic_loss_scaling is False and cfg.init_loss_scaling is None:
        pass  # static scaling at 32768, Paddle's static default
    if cfg.nccl_comm_num > 1 and cfg.sync_nccl_allreduce:
        warnings.warn(
            f"nccl_comm_num={cfg.nccl_comm_num} with sync_nccl_allreduce=True: each allreduce is waited on as "
            "it is launched, so the extra communicators cannot overlap (Paddle warns the same); "
            "set sync_nccl_allreduce=False",
            stacklevel=3,
        )
    if cfg.reader_backend == "dali" and cfg.reader_num_workers:
        raise ConfigError("reader_num_workers applies to reader_backend='torch'; DALI runs its own pipeline")


# ---- TOML out ------------------------------------------------------------------------------

def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return ("inf" if value > 0 else "-inf") if math.isinf(value) else repr(value)
    if isinstance(value, int):
        return str(value)
    return json.dumps(value)  # a TOML basic string


def to_toml(cfg: StrategyConfig, title: str = "") -> str:
    """Every field of ``cfg`` as a TOML document ``--config`` reads back to ``cfg``, each with its help.

    Fields that are None (unset: see their help) are written commented out; TOML has no null.
    """
    default = StrategyConfig()
    lines = [f"# {title}" if title else "# fleetbench strategy", "# '# changed' marks a field that differs from "
             "the all-off default.", "", "[strategy]"]
    for name, spec in _SPECS.items():
        value = getattr(cfg, name)
        lines.append(f"# {spec.help} [{spec.allowed()}]")
        changed = "  # changed" if value != getattr(default, name) else ""
        if value is None:
            if changed:
                raise ConfigError(f"{name}=None differs from its default and TOML has no null: cannot write it")
            lines.append(f"# {name} =   (left out: None)")
        else:
            lines.append(f"{name} = {_toml_value(value)}{changed}")
    return "\n".join(lines) + "\n"


# Paddle's recommended settings as named presets (overrides on the all-off default), and DDP's own configuration.
PRESETS: dict[str, dict[str, Any]] = {
    # Paddle's proto defaults for allreduce fusion: 32 MB buckets, at most 50 layers each.
    "paddle_proto_fusion": {"fuse_all_reduce_ops": True, "fuse_grad_size_in_MB": 32.0, "fuse_grad_size_in_layers": 50},
    # The op-fusion docs' example: 16 MB, 50 layers, every compute fusion on.
    "paddle_docs_fusion": {
        "fuse_all_reduce_ops": True,
        "fuse_grad_size_in_MB": 16.0,
        "fuse_grad_size_in_layers": 50,
        "fuse_bn_act_ops": True,
        "fuse_elewise_add_act_ops": True,
        "fuse_relu_depthwise_conv": True,
        "fuse_broadcast_ops": True,
        "fuse_all_optimizer_ops": True,
    },
    # The overlap docs: one communicator on one node, overlap on.
    "paddle_single_node": {"nccl_comm_num": 1, "sync_nccl_allreduce": False, "fuse_all_reduce_ops": True},
    # The best-practices page across nodes: 2 communicators, num_threads = nccl_comm_num + 1, hierarchical allreduce.
    "paddle_multi_node": {
        "nccl_comm_num": 2,
        "sync_nccl_allreduce": False,
        "num_threads": 3,
        "fuse_all_reduce_ops": True,
        "use_hierarchical_allreduce": True,
    },
    # Best practices' Local SGD advice: k of 2 to 4 after a warm-up.
    "paddle_local_sgd": {"use_local_sgd": True, "local_sgd_steps": 4, "local_sgd_is_warm_steps": 1,
                         "optimizer": "momentum"},
    # Paddle's AMP defaults: fp16 with dynamic loss scaling.
    "paddle_amp": {"amp": "fp16"},
    # Not Paddle's: torch DDP's own configuration on fleetbench's engine (what `figures engine_cost` times against
    # DDP): 25 MiB buckets with DDP's 1 MiB first bucket, overlapped on one communicator, gradients as bucket views,
    # buffers broadcast over flat buckets (DDP coalesces its own).
    "ddp_configuration": {"fuse_all_reduce_ops": True, "fuse_grad_size_in_MB": 25.0, "first_bucket_MB": 1.0,
                          "sync_nccl_allreduce": False, "nccl_comm_num": 1, "fuse_broadcast_ops": True},
}
