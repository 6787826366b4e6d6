"""The case registry: one declarative list of named benchmark cases.

A case is a strategy setting (config overrides on the all-off default) applied to a model,
with tags.  ``fleetbench run``, pytest-benchmark (``bench_cases/``) and asv read this one
list.  Case names are ``model/variant`` (``resnet/overlap``); every case of a model is
measured interleaved with that model's baseline (``plain``: plain data parallel), so its
speedup is paired round by round.

Tags: ``default`` (the short list ``fleetbench run`` runs), ``smoke`` (a handful of cases for CI
and ``make bench``, listed in ``SMOKE`` and timed at the default world size by the benchmark
harnesses), ``nightly-cpu``, ``nightly-gpu``, ``gate`` (the cases the nightly's regression gate compares:
a few per model, every strategy family ``Variant.family`` covered).

Which variants a model gets: the three small models (``resnet``, ``mlp``, ``transformer``)
name theirs explicitly (``Variant.models``); every other model, the published ones
(``resnet50``, ``gpt2``, ``bert``) and a user's own (``--model pkg.mod:make_spec``), gets every
variant that applies to its data kind (images, tokens, masked tokens) and to whether it has
BatchNorm (compute fusion and fused broadcasts need it).  A user model's cases are named
``<module>.<function>/<variant>`` (``my_models.make_spec/plain``: the module's last part, so two modules' factories
of one name never collide).

World sizes are the runner's, not the case's: the selection (``suite/selection.py``) runs every
selected case at the requested world sizes (default one: 2 on CPU, every GPU on CUDA) and skips
a case where it cannot run (``min_world``, with the reason).  ``Case.world_config`` adapts a
case's config to a world size: ``*/hierarchical`` on one host uses two emulated nodes of half the
ranks each (from 4 ranks up), and the real machines (LOCAL_WORLD_SIZE) under torchrun.

Cases prove their names.  A variant states what its name requires (``Variant.requires``, the keys of
:data:`REQUIRES`); the selection plans each bucketed case's buckets in the parent, from the model's
parameter sizes, before any rank runs (``suite.comm.buckets.comm_plan``), and a case whose plan does not
meet its name at that model, size and world is skipped with the reason (:meth:`Case.unmet`), never run
under the name.  After it ran, the runner compares what the engine built with the plan
(:meth:`Case.observed_unmet`): a difference is a failure.  ``*/overlap`` and ``*/multicomm`` size their
buckets from the model's gradient bytes (``Variant.sized_buckets``; the rule:
``suite.comm.buckets.sized_bucket_mb``, 2 to 16 buckets at every size); a ``--set
fuse_grad_size_in_MB=…`` still wins, and is skipped if it leaves one bucket.

A case's name also asserts some knobs (``Variant.named_by``: ``amp_bf16`` is ``amp='bf16'``, ``ddp`` is
``data_parallel='ddp'`` …); a ``--set`` or ``--config`` that gives one of them another value contradicts the name, and
the case is refused (skipped with the reason; an error when named exactly), never run and recorded under it.
``compute_fusion`` requires a pattern its knobs fuse in the model (``REQUIRES["fused"]``, from the fusion pass run
over the model built on the meta device): a model with nothing to fuse is skipped "nothing to fuse".

What a case records (``RECORDED``): the metric names of ``suite.results.records.Metrics``, the one
list; ``Case.records`` names the case-specific ones a variant adds (e.g. ``compute_s``).
"""
from __future__ import annotations

import difflib
import fnmatch
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .model_registry import DATA_KINDS, PUBLISHED_MODELS, REGISTRY, SMALL_MODELS
from .results.records import METRIC_NAMES
from .usercode import module_label

if TYPE_CHECKING:  # a plan is made in the parent (suite.selection); listing cases imports no torch
    from .comm.buckets import CommPlan

__all__ = ["Case", "VARIANTS", "FAMILIES", "CASES", "select_cases", "BASELINE", "RECORDED", "get_case",
           "cases_for_model", "model_label", "PUBLISHED_MODELS", "SMOKE", "REQUIRES"]

BASELINE = "plain"

# the metric names a case's record may carry: the one list, the fields of suite.results.records.Metrics
RECORDED = METRIC_NAMES

# What a variant's name requires of its case at a model, size and world (``Variant.requires``).
REQUIRES = {
    "fusion": "fewer collectives than gradients",
    "overlap": "at least 2 buckets, the first launched before backward ends",
    "communicators": "buckets on at least 2 communicators",
    "nodes": "at least 2 nodes of at least 2 ranks",
    "fused": "a pattern its knobs fuse in the model",
}

# the compute-fusion patterns and the knob that enables each (suite.compute.fusion.PATTERNS; torch-free here)
FUSION_KNOBS = {"bn_act": "fuse_bn_act_ops", "elewise_add_act": "fuse_elewise_add_act_ops",
                "relu_depthwise_conv": "fuse_relu_depthwise_conv"}


def unmet_fusion(fusible: Iterable, config: Mapping) -> str | None:
    """Why compute fusion has nothing to fuse in a model (``fusible``: (pattern, found, fused) of the pass over it;
    empty: unknown, never a reason), given the case's knobs (``config``: knob -> value), or None."""
    rows = list(fusible)
    if not rows:
        return None
    enabled = [(name, found, fused) for name, found, fused in rows if config.get(FUSION_KNOBS.get(name, ""), False)]
    if any(fused for _, _, fused in enabled):
        return None
    found = ", ".join(f"{name} {n}" for name, n, _ in enabled if n)
    knobs = " / ".join(FUSION_KNOBS[n] for n, _, _ in enabled) or "enabled"
    return (f"nothing to fuse: the fusion pass finds no {knobs} pattern it can fuse in the model (BatchNorm -> ReLU, "
            f"add -> ReLU, ReLU -> depthwise conv)" + (f"; found but not fusable: {found}" if found else ""))


def _mb(nbytes: float) -> str:
    return f"{nbytes / 1e6:.3g} MB"


def unmet(requirement: str, plan: CommPlan | None) -> str | None:
    """Why ``plan`` does not meet ``requirement`` (a key of :data:`REQUIRES`), or None when it does."""
    if plan is None:
        return f"needs {REQUIRES[requirement]}, but its config does not bucket gradients"
    cap = f"fuse_grad_size_in_MB={plan.cap_mb:g}"
    if requirement == "fusion" and plan.buckets >= plan.gradients:
        how = f"{cap} on {_mb(plan.gradient_bytes)} of gradients" if plan.fuse else "fuse_all_reduce_ops=False"
        return f"needs {REQUIRES['fusion']}: {plan.buckets} collective(s) for {plan.gradients} gradient(s) ({how})"
    if requirement == "overlap":
        if not plan.overlap:
            return f"needs {REQUIRES['overlap']}: sync_nccl_allreduce=True waits on each bucket as it is launched"
        if plan.buckets < 2:
            return (f"needs {REQUIRES['overlap']}: {cap} makes {plan.buckets} bucket of the model's "
                    f"{_mb(plan.gradient_bytes)} of gradients, launched when backward ends (set a smaller "
                    f"fuse_grad_size_in_MB)")
    if requirement == "communicators" and plan.communicators < 2:
        return (f"needs {REQUIRES['communicators']}: its {plan.buckets} bucket(s) use {plan.communicators} "
                f"communicator(s)")
    if requirement == "nodes" and (plan.nodes < 2 or plan.ranks_per_node < 2):
        nodes = f"{plan.nodes} node" + ("s" if plan.nodes != 1 else "")
        return (f"needs {REQUIRES['nodes']}: {plan.nodes * plan.ranks_per_node} ranks in nodes of "
                f"{plan.ranks_per_node} make {nodes}, a reduce-scatter and an all-gather with no inter-node "
                f"step; run 4 ranks or more on one host (two emulated nodes), or under torchrun on 2 or more hosts")
    return None



@dataclass(frozen=True)
class Variant:
    """A strategy setting: the config overrides that switch it on."""

    name: str
    config: dict
    description: str
    models: tuple = SMALL_MODELS  # which of the small models get it (others: by data kind)
    tags: tuple = ("nightly-cpu", "nightly-gpu")
    min_world: int = 1
    default_on: tuple = ()  # models on which the case is in the short `default` list
    records: tuple = ()  # what this variant records beyond RECORDED
    kinds: tuple = DATA_KINDS  # data kinds of other models it applies to
    needs_batchnorm: bool = False  # applies only to models with BatchNorm (compute fusion, fused broadcast)
    family: str = "communication"  # the strategy family (FAMILIES); the gate covers every one
    gate_on: tuple = ()  # models on which the case is in the nightly's `gate` tag
    requires: tuple = ()  # what its name requires (keys of REQUIRES), checked against the case's plan
    sized_buckets: bool = False  # fuse_grad_size_in_MB follows the model's gradient bytes (2 to 16 buckets)
    named_by: tuple = ()  # the knobs its name asserts (their values: its config's, else the default)

    def applies(self, model: str, kind: str, has_batchnorm: bool) -> bool:
        if model in SMALL_MODELS:
            return model in self.models
        return kind in self.kinds and (has_batchnorm or not self.needs_batchnorm)


@dataclass(frozen=True)
class Case:
    name: str
    model: str
    variant: str
    config: dict
    description: str
    tags: tuple = ()
    per_rank_batch: int | None = None  # None: the model's own at the run's size
    min_world: int = 1
    records: tuple = RECORDED  # metrics keys the case's record carries
    requires: tuple = ()  # what its name requires (keys of REQUIRES)
    sized_buckets: bool = False  # fuse_grad_size_in_MB from the model's gradient bytes (the selection sets it)
    named_by: tuple = ()  # the knobs its name asserts (Variant.named_by)

    def applies_to_world(self, world: int) -> str | None:
        """None when the case runs at ``world`` ranks, else why not."""
        if world < self.min_world:
            return f"needs at least {self.min_world} ranks"
        return None

    def unmet(self, plan: CommPlan | None, fusible: Iterable = (), config: Mapping | None = None) -> str | None:
        """Why the case cannot run under its name with this plan (its first unmet requirement), or None;
        ``fusible`` and ``config`` (knob -> value) for ``fused`` (:func:`unmet_fusion`)."""
        for r in self.requires:
            why = unmet_fusion(fusible, config or {}) if r == "fused" else unmet(r, plan)
            if why is not None:
                return why
        return None

    def observed_unmet(self, plan: CommPlan | None, describe: Mapping) -> str | None:
        """How what the engine built and did (its ``describe()``) differs from the plan, or None (also when the
        describe holds no buckets: nothing of them was observed)."""
        if "fused" in self.requires and isinstance(describe.get("compute_fusion"), Mapping):
            report = describe["compute_fusion"]
            rows = [(name, r.get("found", 0), r.get("fused", 0)) for name, r in report.items()
                    if name in FUSION_KNOBS and isinstance(r, Mapping)]
            enabled = {FUSION_KNOBS[name]: bool(report[name].get("enabled")) for name, _, _ in rows}
            if rows and (why := unmet_fusion(rows, enabled)):
                return f"plan and observation differ: the engine's {why}"
        if plan is None or "buckets" not in describe:
            return None
        why = plan.mismatch(describe)
        if why is None and "overlap" in self.requires and not (describe.get("launched_in_backward") or 0) >= 1:
            why = (f"the plan launches the first of {plan.buckets} buckets before backward ends, but no bucket "
                   f"was launched before backward ended")
        return why and f"plan and observation differ: {why}"

    def world_config(self, world: int, local_world: int | None = None) -> dict:
        """Config fields that depend on the world size (applied under a user's --config/--set).

        A hierarchical case's nodes: the real machines under torchrun (``local_world``, its
        LOCAL_WORLD_SIZE); on one host, two emulated nodes of half the ranks each from 4 ranks up
        (e.g. 4 + 4 on one 8-GPU host), the case's own below."""
        if not self.config.get("use_hierarchical_allreduce"):
            return {}
        if local_world is not None:
            return {"hierarchical_allreduce_inter_nranks": local_world}
        if world >= 4 and world % 2 == 0:
            return {"hierarchical_allreduce_inter_nranks": world // 2}
        return {}


ALL_TAGS = ("default", "smoke", "nightly-cpu", "nightly-gpu", "gate")
# Strategy families.  The `gate` tag: a few cases per model family (small CPU models and the published ones,
# convolutional and transformer) chosen so that every strategy family is compared by the nightly's gate.
FAMILIES = ("baseline", "communication", "compute", "precision", "method", "host")
# The `smoke` tag: a few cases, distinct from `default`, that a benchmark harness times in about a minute
# on a 2-core machine (pytest-benchmark's default selection; `make bench`) at the CPU's default world size.
SMOKE = ("mlp/plain", "mlp/overlap", "resnet/plain", "resnet/compute_fusion")
_N = ("nightly-cpu", "nightly-gpu")
_RM = ("resnet", "mlp")
# The variants compared with DDP broadcast buffers over flat buckets, as DDP coalesces its own; the knob keeps
# Paddle's default (fuse_broadcast_ops=False), and `plain` keeps one broadcast per tensor.
_FB = {"fuse_broadcast_ops": True}
_HOOKS = "suite.strategies.torch_hooks"  # torch's DDP communication hooks as strategies

VARIANTS: list[Variant] = [
    Variant("none", {"data_parallel": "none"}, "no gradient communication: compute alone", default_on=_RM,
            records=("compute_s",), family="baseline", named_by=("data_parallel",)),
    Variant(BASELINE, {}, "plain data parallel: one allreduce per gradient after backward", default_on=_RM,
            family="baseline", gate_on=("mlp", "resnet50", "gpt2"), named_by=("data_parallel",)),
    Variant("ddp", {"data_parallel": "ddp"}, "torch DDP (baseline implementation)", default_on=_RM,
            family="baseline", named_by=("data_parallel",)),
    Variant("ddp_best", {"data_parallel": "ddp", "ddp_gradient_as_bucket_view": True, "ddp_static_graph": True},
            "torch DDP at its best setting: gradients as views into its buckets, a static graph", family="baseline",
            named_by=("data_parallel", "ddp_gradient_as_bucket_view", "ddp_static_graph")),
    # torch's own communication hooks, through the protocol a user's strategy follows (suite/strategies/user.py)
    Variant("ddp_fp16_compress", {"data_parallel": "ddp", "strategy": f"{_HOOKS}:fp16_compress"},
            "torch DDP, gradients allreduced in fp16 (fp16_compress_hook; checked: bounded error)",
            family="precision", named_by=("data_parallel", "strategy")),
    Variant("ddp_bf16_compress", {"data_parallel": "ddp", "strategy": f"{_HOOKS}:bf16_compress"},
            "torch DDP, gradients allreduced in bf16 (bf16_compress_hook; checked: bounded error)",
            family="precision", named_by=("data_parallel", "strategy")),
    Variant("ddp_powersgd_r1", {"data_parallel": "ddp", "strategy": f"{_HOOKS}:powersgd_r1"},
            "torch DDP with PowerSGD, rank 1, error feedback, warm start (checked: convergence)", family="method",
            named_by=("data_parallel", "strategy")),
    Variant("ddp_powersgd_r4", {"data_parallel": "ddp", "strategy": f"{_HOOKS}:powersgd_r4"},
            "torch DDP with PowerSGD, rank 4, error feedback, warm start (checked: convergence)", family="method",
            named_by=("data_parallel", "strategy")),
    # communication
    Variant("fusion", {"fuse_all_reduce_ops": True, "fuse_grad_size_in_MB": 25.0, **_FB},
            "allreduce fusion: 25 MB buckets, synchronous", default_on=("mlp",), gate_on=("resnet50",),
            requires=("fusion",)),
    Variant("overlap", {"fuse_all_reduce_ops": True, "sync_nccl_allreduce": False, **_FB},
            "bucketed allreduce overlapped with backward (buckets of about a tenth of the gradients)", default_on=_RM,
            gate_on=("mlp", "gpt2", "bert"), requires=("overlap",), sized_buckets=True),
    Variant("multicomm", {"fuse_all_reduce_ops": True, "sync_nccl_allreduce": False, "nccl_comm_num": 2, **_FB},
            "overlap on 2 communicators (buckets of about a tenth of the gradients)", default_on=("mlp",),
            requires=("overlap", "communicators"), sized_buckets=True),
    Variant("hierarchical", {"fuse_all_reduce_ops": True, "use_hierarchical_allreduce": True,
                             "hierarchical_allreduce_inter_nranks": 2, **_FB},
            "hierarchical allreduce over 2 or more (emulated) nodes", min_world=2, default_on=("mlp",),
            requires=("nodes",)),
    # compute
    Variant("compute_fusion", {"fuse_bn_act_ops": True, "fuse_elewise_add_act_ops": True,
                               "fuse_relu_depthwise_conv": True},
            "bn+act, add+act and relu+depthwise-conv fusion", models=("resnet",), default_on=("resnet",),
            needs_batchnorm=True, family="compute", gate_on=("resnet", "resnet50"), requires=("fused",)),
    Variant("fused_broadcast", {"fuse_broadcast_ops": True}, "broadcasts over flat buckets", models=("resnet",),
            default_on=("resnet",), needs_batchnorm=True, family="compute", named_by=("fuse_broadcast_ops",)),
    Variant("fused_optimizer", {"fuse_all_optimizer_ops": True}, "one optimizer update over flat buffers",
            default_on=("mlp",), family="compute", gate_on=("gpt2",), named_by=("fuse_all_optimizer_ops",)),
    # precision
    Variant("amp_bf16", {"amp": "bf16"}, "bf16 autocast", default_on=("resnet",), records=("losses",),
            family="precision", gate_on=("resnet50", "bert"), named_by=("amp",)),
    Variant("grad_bf16", {"grad_comm_dtype": "bf16"}, "gradients communicated in bf16", models=("mlp",),
            default_on=("mlp",), family="precision", gate_on=("mlp",), named_by=("grad_comm_dtype",)),
    # training method and host
    Variant("local_sgd", {"use_local_sgd": True, "local_sgd_steps": 4, "local_sgd_is_warm_steps": 1},
            "Local SGD, k=4 after 1 warm-up step", default_on=("mlp",), records=("losses",), family="method",
            gate_on=("mlp", "gpt2"), named_by=("use_local_sgd", "use_adaptive_local_sgd")),
    Variant("adaptive_local_sgd", {"use_adaptive_local_sgd": True, "local_sgd_is_warm_steps": 1},
            "adaptive Local SGD", tags=_N, records=("losses",), family="method", named_by=("use_adaptive_local_sgd",)),
    Variant("fetch_10", {"fetch_frequency": 10}, "losses fetched to the host every 10 steps", models=("mlp",),
            default_on=("mlp",), family="host", gate_on=("mlp", "bert"), named_by=("fetch_frequency",)),
]

def model_label(ref: str) -> str:
    """The name a model's cases carry: the registry name, ``hf-<Config>``, or a user factory's module and function
    (``my_models.make_spec`` for ``pkg.my_models:make_spec``: two modules' ``make_spec`` never share a name, a case
    or a history)."""
    if ref.startswith("hf:"):
        return "hf-" + ref[3:]
    if ":" in ref:
        return module_label(ref)
    return ref


def cases_for_model(ref: str, kind: str, has_batchnorm: bool, tags: tuple = ()) -> list[Case]:
    """Every variant that applies to a model, as cases named ``<label>/<variant>``."""
    label = model_label(ref)
    out = []
    for v in VARIANTS:
        if not v.applies(ref, kind, has_batchnorm):
            continue
        extra: tuple = ("default",) if ref in v.default_on else ()
        extra += ("smoke",) if f"{label}/{v.name}" in SMOKE else ()
        extra += ("gate",) if ref in v.gate_on else ()
        out.append(Case(f"{label}/{v.name}", ref, v.name, dict(v.config), v.description,
                        (tuple(v.tags) + extra) if not tags else tags, min_world=v.min_world,
                        records=RECORDED + tuple(v.records), requires=v.requires, sized_buckets=v.sized_buckets,
                        named_by=v.named_by))
    return out


# Every registry model's cases (suite/model_registry.py), listed variant by variant in the registry's order.
CASES: list[Case] = [c for m in REGISTRY for c in cases_for_model(m.name, m.data, m.has_batchnorm)]
CASES.sort(key=lambda c: ([v.name for v in VARIANTS].index(c.variant), [m.name for m in REGISTRY].index(c.model)))


def get_case(name: str) -> Case:
    """The case called ``name`` (``model/variant``); an error listing what exists otherwise."""
    for c in CASES:
        if c.name == name:
            return c
    raise ValueError(f"case {name!r} is unknown; cases are model/variant, e.g. mlp/plain "
                     f"(`fleetbench run --list --tag nightly-cpu` lists them)")


def select_cases(names: Iterable[str] = (), tags: Iterable[str] = (), models: Iterable[str] = (),
                 cases: list[Case] | None = None) -> list[Case]:
    """Cases matching any of ``names`` (globs allowed) and any of ``tags`` and ``models``.

    With neither names nor tags: the ``default`` tag, or, when ``models`` are named, every
    case of those models.  ``cases`` (default: the registry) is the pool to select from; a
    user's model passes its own cases.  Unknown names or tags are errors that list what exists.
    """
    pool = CASES if cases is None else cases
    names, tags, models = list(names), list(tags), list(models)
    for t in tags:
        if t not in ALL_TAGS:
            raise ValueError(f"--tag {t!r} is unknown; allowed: {', '.join(ALL_TAGS)}")
    for n in names:
        if not any(fnmatch.fnmatchcase(c.name, n) or c.variant == n for c in pool):
            close = difflib.get_close_matches(n, [c.name for c in pool] + [c.variant for c in pool], n=1)
            hint = f"did you mean {close[0]}? " if close else ""
            raise ValueError(f"--case {n!r} matches no case; {hint}`fleetbench run --list` shows them "
                             f"(names are model/variant, e.g. resnet/overlap; globs allowed)")
    if not names and not tags and not models:
        tags = ["default"]
    out = [c for c in pool
           if (not names or any(fnmatch.fnmatchcase(c.name, n) or c.variant == n for n in names))
           and (not tags or any(t in c.tags for t in tags))
           and (not models or c.model in models)]
    return out
