"""StrategyConfig: the one place where fleetbench's knobs are defined.

Field names follow Paddle Fleet's ``DistributedStrategy`` (and its BuildStrategy /
ExecutionStrategy / amp_configs / localsgd_configs) where Paddle has the knob; the
few that are fleetbench's own are marked "ours".  Every optimization is off by
default: the default config is plain data parallel (one allreduce per parameter
gradient after backward, each waited on at once, averaged).

A config is validated on construction: every error names the field, the value and
what is allowed.  The part that depends on the world size (the hierarchical split)
is checked by :meth:`StrategyConfig.check_world` as soon as the world size is known.
"""
from __future__ import annotations

import dataclasses
import math
import tomllib
import warnings
from dataclasses import dataclass, fields
from typing import Any, Mapping, Optional

__all__ = ["StrategyConfig", "ConfigError", "PRESETS", "FIELD_ALIASES"]


class ConfigError(ValueError):
    """A config value out of range, of the wrong type, unknown, or a bad combination."""


# Paddle names accepted as aliases of ours.
FIELD_ALIASES = {
    # Paddle's name; despite it, the value is a layer count (max layers per fused allreduce).
    "_fuse_grad_size_in_TFLOPS": "fuse_grad_size_in_layers",
    "fuse_grad_size_in_TFLOPS": "fuse_grad_size_in_layers",
}

CHOICES = {
    "data_parallel": ("suite", "ddp", "none"),
    "amp": ("off", "bf16", "fp16"),
    "grad_comm_dtype": ("fp32", "bf16", "fp16"),
    "fusion_backend": ("eager", "compile"),
    "optimizer": ("sgd", "momentum", "adam"),
    "reader_backend": ("torch", "dali"),
}

# (low, high, low_inclusive) bounds of numeric fields; None = unbounded.
RANGES = {
    "nccl_comm_num": (1, 16, True),
    "hierarchical_allreduce_inter_nranks": (1, None, True),
    "fuse_grad_size_in_MB": (0.0, None, False),
    "fuse_grad_size_in_layers": (1, None, True),
    "local_sgd_steps": (1, None, True),
    "local_sgd_is_warm_steps": (0, None, True),
    "init_k_steps": (1, 16, True),
    "init_loss_scaling": (0.0, None, False),
    "incr_every_n_steps": (1, None, True),
    "decr_every_n_nan_or_inf": (1, None, True),
    "incr_ratio": (1.0, None, False),
    "decr_ratio": (0.0, 1.0, False),
    "fetch_frequency": (1, None, True),
    "num_threads": (1, 1024, True),
    "lr": (0.0, None, False),
    "momentum": (0.0, 1.0, True),
    "weight_decay": (0.0, None, True),
    "reader_num_workers": (0, 64, True),
    "straggler_ms": (0.0, None, True),
}


@dataclass(frozen=True)
class StrategyConfig:
    # ---- data parallelism (ours) -------------------------------------------------
    data_parallel: str = "suite"  # suite = this project's; ddp = torch DDP baseline; none = no gradient communication
    find_unused_parameters: bool = False  # as DDP's: parameters that get no gradient in a step are reduced as zeros

    # ---- communication overlap (Paddle: nccl_comm_num, sync_nccl_allreduce) -----
    nccl_comm_num: int = 1
    sync_nccl_allreduce: bool = True  # True: each allreduce waited on as launched (no overlap)

    # ---- topology (Paddle: use_hierarchical_allreduce) ---------------------------
    use_hierarchical_allreduce: bool = False
    hierarchical_allreduce_inter_nranks: Optional[int] = None  # ranks per node; None = LOCAL_WORLD_SIZE under torchrun

    # ---- allreduce fusion / bucketing --------------------------------------------
    fuse_all_reduce_ops: bool = False
    fuse_grad_size_in_MB: float = 32.0  # MiB per fused allreduce (Paddle proto default 32); inf = no byte cap
    fuse_grad_size_in_layers: int = 50  # max layers per fused allreduce (Paddle's _fuse_grad_size_in_TFLOPS)
    grad_comm_dtype: str = "fp32"  # ours: dtype gradients travel in (master weights stay fp32)

    # ---- compute fusion (Paddle BuildStrategy) -----------------------------------
    fuse_bn_act_ops: bool = False
    fuse_elewise_add_act_ops: bool = False
    fuse_relu_depthwise_conv: bool = False
    fuse_broadcast_ops: bool = False
    fuse_all_optimizer_ops: bool = False
    fusion_backend: str = "eager"  # ours: eager | compile (torch.compile of the fused functions)

    # ---- Local SGD (Paddle localsgd_configs / adaptive_localsgd_configs) ---------
    use_local_sgd: bool = False
    local_sgd_steps: int = 1  # k: parameters averaged after every k-th local step
    local_sgd_is_warm_steps: int = 1  # W: steps 1..W are synchronous data parallel
    use_adaptive_local_sgd: bool = False  # implies use_local_sgd
    init_k_steps: int = 1

    # ---- mixed precision (Paddle amp_configs) ------------------------------------
    amp: str = "off"  # off | bf16 | fp16
    use_dynamic_loss_scaling: Optional[bool] = None  # None: on for fp16 (Paddle's default), off for bf16
    init_loss_scaling: Optional[float] = None  # None: 32768 where loss scaling is on; set it for static scaling
    incr_every_n_steps: int = 1000
    decr_every_n_nan_or_inf: int = 2
    incr_ratio: float = 2.0
    decr_ratio: float = 0.8

    # ---- host side (Paddle ExecutionStrategy / fetch) ----------------------------
    fetch_frequency: int = 1  # losses fetched to the host every N steps
    num_threads: Optional[int] = None  # intra-op threads per rank; None = cores / local ranks (at least 1)

    # ---- optimizer (torch.optim meanings) ----------------------------------------
    optimizer: str = "sgd"
    lr: float = 0.01
    momentum: float = 0.9  # used by optimizer = momentum
    weight_decay: float = 0.0

    # ---- reader (Paddle DataLoader options; ours where Paddle has none) ----------
    use_double_buffer: bool = False
    reader_return_uint8: bool = False
    use_infinite_reader: bool = False
    reader_num_workers: int = 0
    reader_backend: str = "torch"

    # ---- benchmark conditions (ours) ---------------------------------------------
    straggler_ms: float = 0.0  # a seeded random rank sleeps this long each step

    def __post_init__(self) -> None:
        _check_types(self)
        _check_choices_and_ranges(self)
        _check_combinations(self)

    # ---- construction -------------------------------------------------------------
    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> "StrategyConfig":
        return cls(**_canonical_keys(values))

    @classmethod
    def from_toml(cls, path: str) -> "StrategyConfig":
        try:
            with open(path, "rb") as fh:
                data = tomllib.load(fh)
        except FileNotFoundError:
            raise ConfigError(f"config file {path!r} does not exist") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path!r} is not valid TOML: {exc}") from None
        if "strategy" in data and isinstance(data["strategy"], dict):
            data = data["strategy"]
        return cls.from_dict(data)

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> "StrategyConfig":
        if name not in PRESETS:
            raise ConfigError(f"preset {name!r} is unknown; allowed: {', '.join(sorted(PRESETS))}")
        return cls.from_dict({**PRESETS[name], **overrides})

    def replace(self, **changes: Any) -> "StrategyConfig":
        return dataclasses.replace(self, **_canonical_keys(changes))

    def with_overrides(self, assignments: list[str]) -> "StrategyConfig":
        """Apply ``key=value`` strings (the CLI's ``--set``), parsed by the field's type."""
        changes: dict[str, Any] = {}
        for item in assignments:
            if "=" not in item:
                raise ConfigError(f"--set {item!r}: expected key=value, e.g. --set nccl_comm_num=2")
            key, raw = item.split("=", 1)
            key = FIELD_ALIASES.get(key.strip(), key.strip())
            if key not in _FIELDS:
                raise ConfigError(_unknown_field_message(key))
            changes[key] = parse_value(key, raw.strip())
        return self.replace(**changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def diff(self, other: Optional["StrategyConfig"] = None) -> dict[str, Any]:
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

    def resolve_inter_nranks(self, world_size: int, local_world_size: Optional[int] = None) -> int:
        if self.hierarchical_allreduce_inter_nranks is not None:
            return self.hierarchical_allreduce_inter_nranks
        if local_world_size is not None:
            return local_world_size
        raise ConfigError(
            "hierarchical_allreduce_inter_nranks=None: set it to the ranks per (emulated) node, "
            f"a divisor of the world size {world_size}; it defaults to LOCAL_WORLD_SIZE only under torchrun"
        )

    def check_world(self, world_size: int, local_world_size: Optional[int] = None, torchrun: bool = False) -> None:
        """Checks that need the world size; called before any rank is started (or any step is run)."""
        if not isinstance(world_size, int) or world_size < 1:
            raise ConfigError(f"world size {world_size!r}: must be a whole number >= 1")
        if self.use_hierarchical_allreduce:
            inter = self.resolve_inter_nranks(world_size, local_world_size if torchrun else None)
            if inter > world_size or world_size % inter != 0:
                raise ConfigError(
                    f"hierarchical_allreduce_inter_nranks={inter} does not split world size {world_size} "
                    f"into whole nodes: allowed values are the divisors of {world_size} "
                    f"({', '.join(str(d) for d in _divisors(world_size))})"
                )
            if torchrun and local_world_size and self.hierarchical_allreduce_inter_nranks not in (None, local_world_size):
                warnings.warn(
                    f"hierarchical_allreduce_inter_nranks={self.hierarchical_allreduce_inter_nranks} differs from "
                    f"torchrun's LOCAL_WORLD_SIZE={local_world_size}: nodes will be emulated as blocks of "
                    f"{self.hierarchical_allreduce_inter_nranks} ranks, not the real machines",
                    stacklevel=2,
                )


_FIELDS = {f.name: f for f in fields(StrategyConfig)}


def field_names() -> list[str]:
    return list(_FIELDS)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _unknown_field_message(key: str) -> str:
    import difflib

    close = difflib.get_close_matches(key, list(_FIELDS) + list(FIELD_ALIASES), n=3)
    hint = f"; did you mean {', '.join(close)}?" if close else "; see `fleetbench config --list` for all fields"
    return f"unknown strategy field {key!r}{hint}"


def _canonical_keys(values: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in values.items():
        canon = FIELD_ALIASES.get(key, key)
        if canon not in _FIELDS:
            raise ConfigError(_unknown_field_message(key))
        if canon in out:
            raise ConfigError(f"field {canon!r} given twice (once as its alias {key!r})")
        out[canon] = value
    return out


def _base_type(name: str) -> tuple[type, bool]:
    """(python type, optional?) of a field, from its annotation string."""
    ann = str(_FIELDS[name].type)
    optional = ann.startswith("Optional[")
    inner = ann[len("Optional["):-1] if optional else ann
    return {"int": int, "float": float, "bool": bool, "str": str}[inner], optional


def parse_value(name: str, raw: str) -> Any:
    """Parse a ``--set`` string as the field's type."""
    typ, optional = _base_type(name)
    low = raw.lower()
    if optional and low in ("none", "null", ""):
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


def _check_types(cfg: StrategyConfig) -> None:
    for name in _FIELDS:
        value = getattr(cfg, name)
        typ, optional = _base_type(name)
        if value is None:
            if optional:
                continue
            raise ConfigError(f"{name}=None: a value is required ({typ.__name__})")
        if typ is bool:
            ok = isinstance(value, bool)
        elif typ is int:
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif typ is float:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            if ok and not isinstance(value, float):
                object.__setattr__(cfg, name, float(value))
                value = float(value)
            if ok and math.isnan(value):
                raise ConfigError(f"{name}=nan: a number is required")
        else:
            ok = isinstance(value, typ)
        if not ok:
            raise ConfigError(f"{name}={value!r}: expected {typ.__name__}, got {type(value).__name__}")


def _check_choices_and_ranges(cfg: StrategyConfig) -> None:
    for name, allowed in CHOICES.items():
        value = getattr(cfg, name)
        if value not in allowed:
            raise ConfigError(f"{name}={value!r}: allowed values are {', '.join(map(repr, allowed))}")
    for name, (low, high, low_incl) in RANGES.items():
        value = getattr(cfg, name)
        if value is None:
            continue
        below = value < low if low_incl else value <= low
        above = high is not None and value > high
        if below or above or (isinstance(value, float) and math.isinf(value) and name != "fuse_grad_size_in_MB"):
            lo = f"{'>=' if low_incl else '>'} {low}"
            hi = f" and <= {high}" if high is not None else ""
            raise ConfigError(f"{name}={value!r}: out of range, allowed {lo}{hi}")


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
    ]
    for name, on in suite_only:
        if on and cfg.data_parallel != "suite":
            raise ConfigError(
                f"{name}={getattr(cfg, name)!r} needs data_parallel='suite' (this project's gradient "
                f"communication), but data_parallel={cfg.data_parallel!r}"
            )
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


# Paddle's recommended settings, as named presets (overrides on the all-off default).
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
    "paddle_local_sgd": {"use_local_sgd": True, "local_sgd_steps": 4, "local_sgd_is_warm_steps": 1, "optimizer": "momentum"},
    # Paddle's AMP defaults: fp16 with dynamic loss scaling.
    "paddle_amp": {"amp": "fp16"},
}
