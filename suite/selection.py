"""The selection resolved: which cases, at which world sizes, with which configs, on which platform.

The typed, frozen ``Selection`` (what a command's options say; ``suite/run_spec.py``) resolved once
(:func:`resolve`) into :class:`Resolved`: the platform, the model size, the world
sizes and, per world size, every selected case with its validated config (or why it is skipped
there).  ``fleetbench run``, ``ab`` (and its trial servers), ``nightly``, pytest-benchmark and asv
(``bench_cases/``) all select through here; argparse stays in ``suite/cli``.

World sizes: the requested ones *replace* each case's; by default there is one, 2 on CPU and the
GPU count on CUDA (:func:`default_worlds`).  A requested size that applies to no selected case is
an error naming the size; a case that cannot run at a size (``min_world``, a hierarchy that does
not split it) is skipped there with its reason.  The default device is decided here only
(:func:`choose_platform`).

Cases prove their names (``suite.cases``): a bucketed case's buckets are planned here, from the
model's parameter sizes read on the meta device (``model_info``), before any rank starts; sized
buckets (``*/overlap``, ``*/multicomm``) get their cap from the same sizes (:func:`case_fields`); a
case whose plan does not meet its name is skipped with the reason, and the plan travels with the
case (``ResolvedCase.plan``) for the runner to compare with what the engine built.  The same holds for what
the model is (``model_info``): a model whose factory declares ``find_unused_parameters`` runs every case with
it (under ``--config``/``--set``); a case whose flat buckets or flat gradient buffer cannot hold the model's
sparse gradients, whose compute fusion finds nothing to fuse, or whose knobs a ``--set``/``--config``
contradicts (``Case.named_by``) is skipped with the reason.

The baseline stays what its name says: ``--config`` and ``--set`` give it their workload knobs only (the optimizer,
threads, precision, a straggler: ``suite.config.WORKLOAD``), every other case all of them, unless
``--set-baseline`` asks (``suite.config.baseline_sets``, the one rule; the runner's baseline config follows it).
``--vary KEY=V1,V2`` makes each selected case but the baseline once per value (:func:`vary_cases`), so the values
are timed interleaved with one baseline in one run.
"""
from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field

from .cases import BASELINE, CASES, Case, cases_for_model, model_label, select_cases
from .comm.buckets import CommPlan, comm_plan, sized_bucket_mb
from .comm.factory import uses_buckets
from .comm.grad_sync import sparse_gradients_refused
from .config import (
    WORKLOAD,
    ConfigError,
    StrategyConfig,
    baseline_sets,
    check_overrides,
    parse_set,
    refuse_unused_fields,
    set_text,
)
from .models import MODELS, ModelError, default_size, model_info
from .outputs import NAME_CHARS
from .run_spec import DEVICES, ResolvedCase, Selection
from .strategies.user import StrategyError, strategy_info

__all__ = ["resolve", "base_cases", "Resolved", "choose_platform", "default_worlds", "resolve_at", "case_fields",
           "plan_case", "vary_cases", "vary_axes"]

CPU_WORLD = 2  # the default world size on CPU


def choose_platform(device: str | None, local_world: int = 1, probe: bool = True) -> tuple[str, str]:
    """(device type, backend) of the ranks: the one place the default device is decided.

    ``device`` None: CUDA where torch sees a GPU (then a GPU for every local rank, or an error naming
    both counts: never a silent CPU run), else the CPU.  ``probe=False`` (a plan) takes ``device`` as
    declared and looks at no GPU (None then means the CPU)."""
    if device not in (None, *DEVICES):
        raise ConfigError(f"--device {device!r}: allowed values are {', '.join(DEVICES)}")
    if not probe:
        return ("cuda", "nccl") if device == "cuda" else ("cpu", "gloo")
    from .runtime.device import CudaUnavailable, select_platform  # at call time: tests replace it

    try:
        platform = select_platform(device, 0, local_world)
    except (CudaUnavailable, ValueError) as exc:
        raise ConfigError(str(exc)) from None
    return platform.device_type, platform.backend


def default_worlds(device: str) -> tuple[int, ...]:
    """One world size: 2 on CPU, every GPU torch sees on CUDA."""
    if device != "cuda":
        return (CPU_WORLD,)
    from .runtime.device import cuda_device_count  # at call time: tests replace it

    n = cuda_device_count()
    if n < 1:
        raise ConfigError("--device cuda with no world size given: torch sees no GPU here to count; give the "
                          "world sizes (e.g. --worlds 1,8)")
    return (n,)


def _is_glob(name: str) -> bool:
    return any(ch in name for ch in "*?[")


def _pool(models: tuple[str, ...], size: str) -> list[Case]:
    """The case pool: the registry, plus every applicable variant of each non-registry model named."""
    pool = list(CASES)
    known = {c.model for c in CASES}
    for ref in models:
        if ref in known:
            continue
        try:
            spec = model_info(ref, size)  # a user's factory runs in a child process, bounded
        except ModelError as exc:
            raise ConfigError(str(exc)) from None
        if ref in MODELS:  # registered, but with no case of its own in the registry
            raise ConfigError(f"--model {ref!r} has no cases in the registry (suite/cases.py)")
        pool += cases_for_model(ref, spec.data, spec.has_batchnorm, tags=("user",))
    return pool


def base_cases(sel: Selection, size: str) -> list[Case]:
    """The selected cases of the registry (and of user models), before any world size, and a case of each of
    ``--strategy``'s strategies on every model selected.  With strategies and no case or tag, each model (those of
    ``--model``, else of the default tag) brings its baseline: the comparison of the strategy with it."""
    tags = list(sel.tags) or ([] if (sel.cases or sel.models) else [sel.default_tag])
    try:
        pool = _pool(sel.models, size)
        out = select_cases(list(sel.cases), tags, list(sel.models), cases=pool)
        if sel.strategies and not (sel.cases or sel.tags):
            out = [c for c in out if c.variant == BASELINE]
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if not out:
        raise ConfigError("no case matches the selection (--case/--tag/--model); `fleetbench run --list --tag "
                          "nightly-cpu` shows the cases")
    out += strategy_cases(sel.strategies, list(dict.fromkeys(c.model for c in out)), pool)
    return vary_cases(vary_axes(sel), out)


def vary_axes(sel: Selection) -> list[tuple[str, list[tuple[str, object]]]]:
    """``--vary``'s axes, each checked: (the field, by our name; its values as (name text, value)).  One error naming
    ``--vary`` and the item for: no ``=``, an unknown field or a value it refuses, fewer than two distinct values, a
    workload knob (every case's and the baseline's: no comparison with one baseline), a field given twice or also
    by ``--set``."""
    axes: list[tuple[str, list[tuple[str, object]]]] = []
    if not sel.varies:
        return axes
    check_overrides(list(sel.sets))  # a bad --set is named as --set first
    set_keys = {f for item in sel.sets for f in parse_set(item)}
    for item in sel.varies:
        key, eq, raw = (part.strip() for part in item.partition("="))
        values = [v.strip() for v in raw.split(",") if v.strip()]
        if not eq or not key or not values:
            raise ConfigError(f"--vary {item!r}: expected KEY=V1,V2 (a strategy knob and its values), e.g. --vary "
                              f"fuse_grad_size_in_MB=8,32")
        try:
            check_overrides([f"{key}={v}" for v in values])
        except ConfigError as exc:
            raise ConfigError(f"--vary {item!r}: {str(exc).split(': ', 1)[-1]}") from None
        parsed = [parse_set(f"{key}={v}") for v in values]
        name = next((n for p in parsed for n in p), key)
        if name in WORKLOAD:
            raise ConfigError(f"--vary {item!r}: {name} is a workload knob (every case's, the baseline's too), so its "
                              f"values have no common baseline; --vary takes a strategy knob (`fleetbench config "
                              f"--list` marks the workload's); for {name}, one run per value with --set {name}=VALUE")
        texts = [(set_text(p[name]), p[name]) for p in parsed if name in p]
        if len(texts) != len(values) or len(dict(texts)) < 2 or len(dict(texts)) != len(texts):
            raise ConfigError(f"--vary {item!r}: give two or more distinct values of {name}, comma-separated")
        bad = next((t for t, _ in texts if not set(t) <= NAME_CHARS), None)
        if bad is not None:
            raise ConfigError(f"--vary {item!r}: the value {bad!r} cannot name a case (allowed: letters, digits and "
                              f". _ - : @ +)")
        if name in set_keys or any(name == k for k, _ in axes):
            raise ConfigError(f"--vary {item!r}: {name} is also given by " + ("--set" if name in set_keys else
                              "another --vary") + "; give each knob once")
        axes.append((name, texts))
    return axes


def vary_cases(axes: list[tuple[str, list[tuple[str, object]]]], cases: list[Case]) -> list[Case]:
    """Each case but the baseline once per value of each axis (:func:`vary_axes`; several: every combination), in
    their order, named ``CASE+KEY:VALUE`` (its variant too, so the values are timed interleaved as variants of the
    model, with one baseline); each asserts its values (``named_by``).  The baseline stays once, as it is."""
    if not axes:
        return cases
    keys = tuple(k for k, _ in axes)
    out = []
    for case in cases:
        if case.variant == BASELINE:
            out.append(case)
            continue
        for combo in itertools.product(*(values for _, values in axes)):
            suffix = "".join(f"+{k}:{text}" for k, (text, _) in zip(keys, combo))
            out.append(dataclasses.replace(
                case, name=case.name + suffix, variant=case.variant + suffix,
                config={**case.config, **{k: value for k, (_, value) in zip(keys, combo)}},
                description=f"{case.description}; {', '.join(f'{k}={t}' for k, (t, _) in zip(keys, combo))}",
                named_by=tuple(dict.fromkeys((*case.named_by, *keys))),
                sized_buckets=case.sized_buckets and "fuse_grad_size_in_MB" not in keys))
    return out


def strategy_cases(refs: tuple[str, ...], models: list[str], pool: list[Case]) -> list[Case]:
    """One case per (model, strategy): ``MODEL/NAME`` on the engine the strategy runs on (torch's DDP for a hook,
    fleetbench's for a synchronizer); its name is the strategy's (suite/strategies/user.py: a user's function is
    read in a bounded child)."""
    out: list[Case] = []
    taken = {c.name for c in pool}
    for ref in refs:
        try:
            info = strategy_info(ref)
        except StrategyError as exc:
            raise ConfigError(str(exc)) from None
        for model in models:
            name = f"{model_label(model)}/{info.name}"
            if name in taken:
                raise ConfigError(f"--strategy {ref!r}: its case {name} would have the name of another case; give "
                                  f"the strategy another name (name=...)")
            taken.add(name)
            out.append(Case(name, model, info.name, {"data_parallel": info.data_parallel, "strategy": ref},
                            info.description or f"your strategy {ref} ({info.kind})", tags=("user",),
                            named_by=("data_parallel", "strategy")))
    return out


def resolve(sel: Selection, world: int | None = None, local_world: int | None = None, probe: bool = True
            ) -> Resolved:
    """Platform, size, world sizes and every case's config at each, all validated (no rank started).

    ``world`` (a launcher's own, e.g. ``--nproc`` or torchrun's) replaces ``sel.worlds``; ``local_world``
    is torchrun's LOCAL_WORLD_SIZE (the hierarchy's nodes are then the real machines)."""
    worlds = (world,) if world is not None else sel.worlds
    device, backend = choose_platform(sel.device, local_world or max(worlds or (1,)) if probe else 1, probe)
    worlds = worlds or default_worlds(device)
    size = sel.size or default_size(device)
    base = base_cases(sel, size)
    at = {w: resolve_at(sel, base, w, local_world, size, backend) for w in worlds}
    for w, rcs in at.items():
        if all(rc.skip for rc in rcs):
            why = "; ".join(sorted({rc.skip for rc in rcs if rc.skip}))
            raise ConfigError(f"world size {w}: no selected case can run at it ({why})")
    return Resolved(sel, device, backend, size, tuple(worlds), at)


def case_fields(case: Case, size: str) -> dict:
    """The case's own config at ``size``: its variant's fields, and the cap of sized buckets
    (``suite.comm.buckets.sized_bucket_mb`` of the model's gradients at that size)."""
    fields = dict(case.config)
    if case.sized_buckets:
        layers = StrategyConfig.from_dict(fields).fuse_grad_size_in_layers
        fields["fuse_grad_size_in_MB"] = sized_bucket_mb(_model_info(case.model, size).gradients, layers)
    return fields


def plan_case(case: Case, cfg: StrategyConfig, size: str, world: int, local_world: int | None = None
              ) -> CommPlan | None:
    """What the case's gradient sync will do at ``world`` ranks (None: its config does not bucket gradients)."""
    if not uses_buckets(cfg):
        return None
    rpn = cfg.resolve_inter_nranks(world, local_world) if cfg.use_hierarchical_allreduce else None
    return comm_plan(_model_info(case.model, size).gradients, cfg.fuse_all_reduce_ops, cfg.fuse_grad_size_in_MB,
                     cfg.fuse_grad_size_in_layers, cfg.nccl_comm_num, not cfg.sync_nccl_allreduce, world, rpn,
                     cfg.first_bucket_MB)


def _model_info(ref: str, size: str):
    try:
        return model_info(ref, size)  # cached; a user's factory runs in a child process, bounded
    except ModelError as exc:
        raise ConfigError(str(exc)) from None


def resolve_at(sel: Selection, cases: list[Case], world: int, local_world: int | None = None,
               size: str | None = None, backend: str | None = None) -> list[ResolvedCase]:
    """Each case with its validated config at ``world`` ranks (``skip`` set when it cannot run there) and its
    plan; ``size``: the models' (default: the selection's, else ``cpu``).

    A case that cannot run there, or not under its name (``Case.unmet``), is skipped with its reason when a
    tag, a glob or a model selected it, and is an error when it was named exactly (``--case mlp/hierarchical``)."""
    size = size or sel.size or "cpu"
    check_overrides(list(sel.sets))  # a bad --set is every case's: named as --set, not as one case's
    # --config's fields then --set's items: every case takes them all, the baseline its workload knobs only
    everything = baseline_sets(sel.config, sel.sets, everything=True)
    plain = baseline_sets(sel.config, sel.sets, everything=sel.set_baseline)
    for item in everything:  # a knob no case here reads (a reader's), refused whichever cases take it
        refuse_unused_fields(parse_set(item), "run")
    exact = {n for n in sel.cases if not _is_glob(n)}
    out = []
    for case in cases:
        info = _model_info(case.model, size)
        declared = {"find_unused_parameters": True} if info.find_unused_parameters else {}  # the factory's
        try:
            cfg = StrategyConfig.from_dict({**case_fields(case, size), **case.world_config(world, local_world),
                                            **declared}).with_overrides(
                list(plain if case.variant == BASELINE else everything))
        except ConfigError as exc:
            raise ConfigError(f"case {case.name}: {exc}") from None
        why, plan = contradicted(case, cfg, sel) or case.applies_to_world(world), None
        if why is None:
            try:
                # Under torchrun (local_world given) the hierarchy's nodes default to the real machines.
                cfg.check_world(world, local_world, torchrun=local_world is not None)
            except ConfigError as exc:
                why = str(exc)
        if why is None:
            plan = plan_case(case, cfg, size, world, local_world)
            why = (case.unmet(plan, info.fusible, cfg.to_dict()) or sparse_unmet(cfg, info.sparse_gradients)
                   or ddp_unmet(cfg, info) or strategy_unmet(cfg, backend))
        if why is not None and case.name in exact:
            raise ConfigError(f"case {case.name} cannot run at world size {world}: {why}")
        out.append(ResolvedCase(case, cfg, why, plan))
    return out


def contradicted(case: Case, cfg: StrategyConfig, sel: Selection) -> str | None:
    """Why ``cfg`` (the case's config under ``--config``/``--set``) contradicts what the case's name asserts
    (``Case.named_by``: its own value of each knob, else the default), or None."""
    default = StrategyConfig()
    for key in case.named_by:
        named, got = case.config.get(key, getattr(default, key)), getattr(cfg, key)
        if got == named:
            continue
        where = next((f"--set {s.strip()}" for s in reversed(sel.sets) if s.split("=", 1)[0].strip() == key),
                     f"{key}={got!r} (--config {sel.config})")
        return (f"{where} contradicts the case's name: {case.name} runs {key}={named!r}; select a case that runs "
                f"{key}={got!r}, or leave {key} alone")
    return None


def sparse_unmet(cfg: StrategyConfig, sparse: tuple) -> str | None:
    """Why ``cfg`` cannot train a model whose gradients ``sparse`` (names) are sparse, or None: flat buckets and the
    fused optimizer's flat gradient buffer hold dense gradients only, where torch DDP keeps a sparse gradient sparse
    in a bucket of its own and plain data parallel reduces it as it is."""
    if not sparse:
        return None
    what = ("flat gradient buckets" if uses_buckets(cfg) else
            "the fused optimizer's flat gradient buffer" if cfg.fuse_all_optimizer_ops else None)
    if what is None:
        return None
    return sparse_gradients_refused(what, sparse)


def ddp_unmet(cfg: StrategyConfig, info) -> str | None:
    """Why torch DDP's settings in ``cfg`` cannot train the model ``info`` describes, or None: a communication hook
    is handed dense buckets (DDP refuses a hook beside sparse gradients); a static graph is the same graph every
    step, which a model that declares ``find_unused_parameters`` (its graph changes with its inputs) is not."""
    if cfg.data_parallel != "ddp":
        return None
    if cfg.strategy and info.sparse_gradients:
        return (f"a DDP communication hook gets dense buckets, and this model has sparse gradients "
                f"({', '.join(info.sparse_gradients[:3])})")
    if cfg.ddp_static_graph and info.find_unused_parameters:
        return ("ddp_static_graph=True needs the same graph every step, and this model declares "
                "find_unused_parameters (its graph changes with its inputs)")
    return None


def strategy_unmet(cfg: StrategyConfig, backend: str | None) -> str | None:
    """Why the case's strategy (``strategy``: a user's, or torch's hooks') cannot run here, or None: it names the
    backends it runs on, and this run's is another."""
    if not cfg.strategy or backend is None:
        return None
    try:
        info = strategy_info(cfg.strategy)  # cached; a user's function runs in a child process, bounded
    except StrategyError as exc:
        raise ConfigError(str(exc)) from None
    if info.backends and backend not in info.backends:
        return f"{info.name} runs on {', '.join(info.backends)} only, this run on {backend} ({info.description})"
    return None


@dataclass(frozen=True)
class Resolved:
    """A selection resolved: platform, size, world sizes and the cases at each (``at[world]``)."""

    selection: Selection
    device: str
    backend: str
    size: str
    worlds: tuple[int, ...]
    at: dict = field(default_factory=dict)  # world -> [ResolvedCase]

    def matrix(self, runnable: bool = False) -> list[tuple[ResolvedCase, int]]:
        """(case, world) pairs, world by world; ``runnable`` leaves out the skipped ones."""
        return [(rc, w) for w in self.worlds for rc in self.at[w] if not (runnable and rc.skip)]

    def find(self, name: str, world: int) -> ResolvedCase | None:
        return next((rc for rc in self.at.get(world, ()) if rc.case.name == name), None)
