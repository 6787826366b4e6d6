"""Your own strategy, from ``module:function``: a DDP communication hook or a gradient synchronizer.

``--strategy my_hooks:fp16`` names a function of your own (a module under the current directory or PYTHONPATH, or
one marked :func:`strategy_factory`: ``suite/usercode.py``, the rule ``--model`` follows) that takes no argument and
returns one of:

- :class:`DDPHook`: a communication hook with ``torch.distributed``'s ``register_comm_hook`` signature (``hook(state,
  bucket) -> Future[Tensor]``), run on torch's DistributedDataParallel, so torch's own hooks
  (``torch.distributed.algorithms.ddp_comm_hooks``) work unchanged.  Its ``state`` is an object, or made per rank by
  ``make_state(process_group)`` (PowerSGD's state needs the group);
- :class:`Synchronizer`: ``build(module, group, config)`` returns a gradient sync of fleetbench's own interface
  (:class:`suite.comm.grad_sync.GradSync`: ``begin_step(communicate)`` before backward, ``finish_step()`` after it
  with every gradient averaged over the group, ``average_tensors``, ``describe()``), run by fleetbench's engine where
  Paddle's strategies run (subclass :class:`suite.comm.bucketed.BucketedGradSync` for buckets launched from the
  backward hooks).

Each declares the check it passes (``check=``; the default :class:`Exact`):

- :class:`Exact`: every rank's loss, parameters and buffers equal the single-process reference at every step, within
  fp32's tolerance (what the built-in strategies are held to);
- :class:`BoundedError`: each step's averaged gradient within ``rel`` (relative to the largest element of the exact
  average of that tensor) of the exact average on the same parameters, and the ranks identical: lossy compression
  such as fp16 or bf16 on the wire;
- :class:`Convergence`: over ``steps`` steps the mean training loss stays within ``band`` (relative) of the exact
  reference's, and the ranks identical where ``ranks_identical`` (the scheme averages the same values on every rank):
  PowerSGD with error feedback.

The case is named ``MODEL/NAME``: ``name=`` if the strategy gives one, else its module and function
(``my_hooks.fp16``: two modules' functions never collide).  tests/scripts/my_strategies.py is a complete example.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..usercode import UserKind, call_in_child, check_ref, import_function, module_label

__all__ = ["Exact", "BoundedError", "Convergence", "CheckKind", "DDPHook", "Synchronizer", "Strategy", "StrategyError",
           "strategy_factory", "load_strategy", "STRATEGY_KIND", "strategy_name", "BUILTIN_PREFIX", "DDP_OWN",
           "StrategyInfo", "strategy_info"]


class StrategyError(ValueError):
    """A strategy reference or object that cannot be used; the message says what is allowed."""


@dataclass(frozen=True)
class Exact:
    """Checked as the built-in strategies are: equal to the single-process reference at every step."""

    kind = "exact"


@dataclass(frozen=True)
class BoundedError:
    """Each step's averaged gradient within ``rel`` of the exact one (relative to the largest element of the exact
    average of each tensor), on the same parameters; the ranks identical after every step."""

    rel: float
    kind = "bounded error"

    def __post_init__(self) -> None:
        if isinstance(self.rel, bool) or not isinstance(self.rel, (int, float)) or not 0 < self.rel < 1:
            raise StrategyError(f"BoundedError(rel={self.rel!r}): rel must be a fraction in (0, 1), e.g. 1e-2")


@dataclass(frozen=True)
class Convergence:
    """Over ``steps`` steps the mean training loss within ``band`` (relative) of the exact reference's, at every
    step; the ranks identical after every step where ``ranks_identical``."""

    steps: int
    band: float
    ranks_identical: bool = True
    kind = "convergence"

    def __post_init__(self) -> None:
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or not 1 <= self.steps <= 10_000:
            raise StrategyError(f"Convergence(steps={self.steps!r}): a whole number of steps from 1 to 10000")
        if isinstance(self.band, bool) or not isinstance(self.band, (int, float)) or not 0 < self.band < 1:
            raise StrategyError(f"Convergence(band={self.band!r}): band must be a fraction in (0, 1), e.g. 0.05")


CheckKind = Exact | BoundedError | Convergence


@dataclass(frozen=True)
class DDPHook:
    """A DDP communication hook (``register_comm_hook(state, hook)``), run on torch's DDP."""

    hook: Callable[..., Any]
    state: Any = None
    make_state: Callable[[Any], Any] | None = None  # (process group) -> state, made on each rank
    ddp_kwargs: dict = field(default_factory=dict)  # more of DDP's options, e.g. bucket_cap_mb (DDP_OWN ones refused)
    name: str | None = None
    check: CheckKind = field(default_factory=Exact)
    description: str = ""
    backends: tuple[str, ...] = ()  # the backends it runs on (empty: any); its cases are skipped elsewhere
    kind = "ddp hook"


@dataclass(frozen=True)
class Synchronizer:
    """A gradient synchronizer on fleetbench's engine: ``build(module, group, config)`` returns a ``GradSync``."""

    build: Callable[..., Any]
    name: str | None = None
    check: CheckKind = field(default_factory=Exact)
    description: str = ""
    backends: tuple[str, ...] = ()  # the backends it runs on (empty: any); its cases are skipped elsewhere
    kind = "gradient synchronizer"


Strategy = DDPHook | Synchronizer


def strategy_factory(fn: Callable[..., Strategy]) -> Callable[..., Strategy]:
    """Marks ``fn`` as a fleetbench strategy: ``--strategy module:fn`` may then name it even where ``module`` is an
    installed package of yours, not your code under the current directory or PYTHONPATH."""
    fn.__fleetbench_strategy__ = True  # type: ignore[attr-defined]
    return fn


# DDP's options fleetbench sets itself (from the case's knobs): a hook's ddp_kwargs may not set them
DDP_OWN = ("module", "device_ids", "output_device", "process_group", "find_unused_parameters",
           "gradient_as_bucket_view", "static_graph", "broadcast_buffers", "forward_sync_buffers")

STRATEGY_KIND = UserKind("--strategy", StrategyError, "a suite.strategies.user.DDPHook or Synchronizer",
                         "strategy_factory", "suite.strategies.user.strategy_factory", "FLEETBENCH_STRATEGIES",
                         "__fleetbench_strategy__")
BUILTIN_PREFIX = "suite.strategies."  # fleetbench's own strategies (torch's hooks as cases): not a user's code


def _function(ref: str) -> Callable[..., Any]:
    if ref.startswith(BUILTIN_PREFIX):
        import importlib

        module_name, _, fn_name = ref.partition(":")
        try:
            return getattr(importlib.import_module(module_name), fn_name)
        except (ImportError, AttributeError) as exc:
            raise StrategyError(f"--strategy {ref!r}: not one of fleetbench's strategies ({exc})") from None
    return import_function(ref, STRATEGY_KIND)


def load_strategy(ref: str) -> Strategy:
    """The strategy ``ref`` names: the function called (no argument), its answer checked."""
    made = _function(ref)()
    if not isinstance(made, (DDPHook, Synchronizer)):
        raise StrategyError(f"--strategy {ref!r}: the function returned {type(made).__name__}; expected "
                            f"{STRATEGY_KIND.returns} (docs/strategies.md)")
    if not callable(made.hook if isinstance(made, DDPHook) else made.build):
        what = "hook" if isinstance(made, DDPHook) else "build"
        raise StrategyError(f"--strategy {ref!r}: its {what} is {type(getattr(made, what)).__name__}, not callable")
    if isinstance(made, DDPHook) and made.make_state is not None and not callable(made.make_state):
        raise StrategyError(f"--strategy {ref!r}: make_state is {type(made.make_state).__name__}, not callable")
    if isinstance(made, DDPHook) and (not isinstance(made.ddp_kwargs, dict)
                                      or (own := sorted(set(made.ddp_kwargs) & set(DDP_OWN)))):
        what = f"sets {', '.join(own)}" if isinstance(made.ddp_kwargs, dict) else "is not a dict"
        raise StrategyError(f"--strategy {ref!r}: ddp_kwargs {what}; fleetbench sets {', '.join(DDP_OWN[3:])} from "
                            f"the case's knobs (data_parallel, find_unused_parameters, ddp_gradient_as_bucket_view, "
                            f"ddp_static_graph)")
    if not isinstance(made.check, (Exact, BoundedError, Convergence)):
        raise StrategyError(f"--strategy {ref!r}: check={made.check!r}; expected Exact(), BoundedError(rel=...) or "
                            f"Convergence(steps=..., band=...)")
    if not isinstance(made.backends, tuple) or not all(b in ("gloo", "nccl") for b in made.backends):
        raise StrategyError(f"--strategy {ref!r}: backends={made.backends!r}; expected a tuple of gloo and nccl")
    if made.name is not None and not (isinstance(made.name, str) and made.name and "/" not in made.name
                                      and len(made.name) <= 80 and made.name.isprintable()):
        raise StrategyError(f"--strategy {ref!r}: name={made.name!r}; expected a short name without '/'")
    return made


def strategy_name(ref: str, made: Strategy) -> str:
    """The variant name of ``ref``'s cases: the strategy's ``name``, else its module and function."""
    return made.name or module_label(ref)


FACTORY_TIMEOUT = 120.0  # seconds a user's strategy function may take to return (imports included)


@dataclass(frozen=True)
class StrategyInfo:
    """What the parent knows of a strategy (read in a child for a user's: nothing of it runs in the parent)."""

    ref: str
    name: str
    kind: str  # "ddp hook" | "gradient synchronizer"
    check: str  # "exact" | "bounded error" | "convergence"
    backends: tuple[str, ...]
    description: str

    @property
    def data_parallel(self) -> str:
        """The engine it runs on: torch's DDP for a hook, fleetbench's for a synchronizer."""
        return "ddp" if self.kind == DDPHook.kind else "suite"


def _info_of(ref: str) -> StrategyInfo:
    made = load_strategy(ref)
    return StrategyInfo(ref, strategy_name(ref, made), made.kind, made.check.kind, tuple(made.backends),
                        made.description)


_INFO: dict[str, StrategyInfo] = {}


def strategy_info(ref: str, timeout: float = FACTORY_TIMEOUT) -> StrategyInfo:
    """:class:`StrategyInfo` of ``ref``: fleetbench's own read here; a user's function called once, in a child
    bounded by ``timeout`` (suite/usercode.py: a function that raises, exits, hangs or returns something else is
    one :class:`StrategyError` naming it)."""
    if ref not in _INFO:
        if ref.startswith(BUILTIN_PREFIX):
            _INFO[ref] = _info_of(ref)
        else:
            check_ref(ref, STRATEGY_KIND)  # refused before anything is imported
            _INFO[ref] = call_in_child(_info_of, (ref,), ref, STRATEGY_KIND, timeout)
    return _INFO[ref]
