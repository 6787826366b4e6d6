"""Models: a registry of workloads, each built at a size, and the user's own through ``module:function``.

A :class:`ModelSpec` is one workload at one size: how to build the module, its loss, and the
synthetic data it trains on.  ``get_model(ref, size)`` returns one:

- ``ref`` is a registry name (``resnet50``, ``gpt2``, ``bert``, and the small ``resnet``,
  ``mlp``, ``transformer``: one line each in ``suite/model_registry.py``, their factories in the modules
  here), or ``module:function`` naming the user's factory: a module of their own, found under the current
  directory or PYTHONPATH, or a function marked :func:`model_factory` (``_check_user_ref``: nothing else runs).
  The factory takes the size (``def make_spec(size)``) or nothing, and returns a :class:`ModelSpec`.
- ``size`` is one of :data:`SIZES`: ``full`` (the published size, what GPU runners time),
  ``cpu`` (the full parameter layout, so gradient bytes, buckets and communication are real;
  resolution, sequence length and batch shrink so a CPU step is affordable), ``tiny`` (for
  tests).  The default is ``full`` on CUDA and ``cpu`` on CPU (:func:`default_size`).

Building a spec builds no module: ``spec.make(seed)`` does, so the parent process can read a
spec's data kind and batch without allocating the model.
"""
from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..comm.buckets import gradient_layout
from ..comm.grad_sync import sparse_gradient_names
from ..data.synthetic import SyntheticImages, SyntheticTokens
from ..model_registry import DATA_KINDS, REGISTRY, SIZES, is_user_ref
from ..usercode import UserKind, call_in_child, check_ref, import_function

__all__ = ["ModelSpec", "SIZES", "DATA_KINDS", "get_model", "MODELS", "default_size", "model_names",
           "is_user_ref", "ModelError", "count_parameters", "ModelInfo", "model_info", "finds_batchnorm",
           "model_factory", "sparse_gradient_names"]


class ModelError(ValueError):
    """A model reference, size or factory that cannot be used; the message says what is allowed."""


@dataclass(frozen=True)
class ModelSpec:
    """One workload at one size.

    ``build()`` returns a fresh module (the caller seeds the generator); a ``build`` with a parameter named
    ``rank`` is told the rank it builds for (``build(rank=r)``; the check's reference and the parent's look at
    the model build rank 0's).  ``loss_fn(outputs, targets)`` a scalar; ``make_data(n, seed)`` a dataset of
    ``n`` samples with ``kind``, ``len()`` and ``get(indices) -> (inputs, targets)`` (host tensors, or tuples,
    lists and dicts of them; see ``suite.data.synthetic``): a tensor is the model's one argument, a tuple or
    list its positional arguments and a dict its keyword arguments (:func:`suite.engine.call_model`), and
    ``loss_fn`` gets the model's output and the targets as they are.  ``per_rank_batch`` is the batch each
    rank trains on.  ``has_batchnorm`` need not be set: a module with a BatchNorm layer is found to have one
    (:func:`finds_batchnorm`), and gets the cases and the float64 check that BatchNorm calls for.
    ``find_unused_parameters``: the model leaves parameters without a gradient in some steps (an unused
    layer, control flow), so every case of it runs with ``find_unused_parameters=true`` unless a
    ``--config``/``--set`` says otherwise.
    """

    name: str
    build: Callable[..., nn.Module]  # build() or build(rank)
    loss_fn: Callable[[Any, Any], torch.Tensor]
    make_data: Callable[[int, int], Any]
    data: str = "images"
    size: str = "cpu"
    per_rank_batch: int = 16
    dataset_size: int = 1024
    has_batchnorm: bool = False
    description: str = ""
    find_unused_parameters: bool = False

    def __post_init__(self) -> None:
        if self.data not in DATA_KINDS:
            raise ModelError(f"model {self.name!r}: data={self.data!r}; allowed: {', '.join(DATA_KINDS)}")
        if self.size not in SIZES:
            raise ModelError(f"model {self.name!r}: size={self.size!r}; allowed: {', '.join(SIZES)}")
        for what in ("per_rank_batch", "dataset_size"):
            v = getattr(self, what)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ModelError(f"model {self.name!r}: {what}={v!r}; must be a whole number >= 1")
        for what in ("build", "loss_fn", "make_data"):
            if not callable(getattr(self, what)):
                raise ModelError(f"model {self.name!r}: {what} must be callable")
        for what in ("has_batchnorm", "find_unused_parameters"):
            if not isinstance(getattr(self, what), bool):
                raise ModelError(f"model {self.name!r}: {what}={getattr(self, what)!r}; must be True or False")

    @property
    def takes_rank(self) -> bool:
        """Whether ``build`` has a parameter named ``rank`` (it is then told the rank it builds for)."""
        try:
            return "rank" in inspect.signature(self.build).parameters
        except (TypeError, ValueError):  # a builtin or a class whose signature cannot be read
            return False

    def module(self, rank: int = 0) -> nn.Module:
        """``build()``, told ``rank`` when it takes one; the caller seeds the generator."""
        return self.build(rank=rank) if self.takes_rank else self.build()

    def make(self, seed: int, device: Any = "cpu", rank: int = 0) -> nn.Module:
        """The model for ``rank``, initialised from ``seed`` (identical for an identical seed), on ``device``."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return self.module(rank).to(device)

    def dataset(self, n: int | None = None, seed: int = 0) -> Any:
        return self.make_data(n or self.dataset_size, seed)


def finds_batchnorm(module: nn.Module) -> bool:
    """Whether ``module`` holds a BatchNorm layer (torch's 1d/2d/3d, lazy and SyncBatchNorm alike)."""
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in module.modules())


def count_parameters(spec: ModelSpec) -> tuple[int, int]:
    """(parameter tensors, parameter elements) of the trainable parameters, built on the meta device."""
    with torch.device("meta"):
        module = spec.module()
    seen: set = set()
    tensors = elements = 0
    for p in module.parameters():
        if p.requires_grad and id(p) not in seen:
            seen.add(id(p))
            tensors += 1
            elements += p.numel()
    return tensors, elements


# ---- the registry ---------------------------------------------------------------------------------
def _ce(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(out, target)


def _images(image_size: int, classes: int = 10, signal: float = 0.6) -> Callable[[int, int], Any]:
    def make(n: int, seed: int) -> Any:
        return SyntheticImages(n, seed, image_size, 3, classes, signal)

    return make


def _tokens(vocab: int, seq_len: int) -> Callable[[int, int], Any]:
    def make(n: int, seed: int) -> Any:
        return SyntheticTokens(n, seed, vocab, seq_len)

    return make


# The three small models: ``tiny`` and ``cpu`` are the same; ``full`` is four times wider (GPU-sized).
_TOY_SCALE = {"full": 4, "cpu": 1, "tiny": 1}


def _registered(factory: str) -> Callable[..., ModelSpec]:
    """A registry line's ``module:function``, imported when the spec is asked for."""
    module, function = factory.split(":")

    def make(size: str = "cpu", **options: Any) -> ModelSpec:
        return getattr(importlib.import_module(f"{__name__}.{module}"), function)(size, **options)

    return make


MODELS: dict[str, Callable[..., ModelSpec]] = {m.name: _registered(m.factory) for m in REGISTRY}


def model_names() -> list[str]:
    return list(MODELS)


def default_size(device_type: str) -> str:
    """``full`` on CUDA (the published sizes), ``cpu`` elsewhere."""
    return "full" if device_type == "cuda" else "cpu"


def get_model(ref: str, size: str = "cpu", **options: Any) -> ModelSpec:
    """The workload ``ref`` at ``size``; see the module docstring.  Errors name what is allowed."""
    if size not in SIZES:
        raise ModelError(f"--size {size!r}: allowed values are {', '.join(SIZES)}")
    if not isinstance(ref, str) or not ref:
        raise ModelError(f"model {ref!r}: expected a registry name ({', '.join(MODELS)}) or module:function")
    if ref in MODELS:
        return MODELS[ref](size, **options)
    if ref.startswith("hf:"):
        from .hf import hf_model  # hf imports this package: only once it is initialized

        return hf_model(ref[3:], size)
    if is_user_ref(ref):
        return _user_model(ref, size)
    raise ModelError(f"model {ref!r} is unknown; allowed: {', '.join(MODELS)}, hf:GPT2Config / hf:BertConfig, "
                     f"or module:function naming your own factory")


def model_factory(fn: Callable[..., ModelSpec]) -> Callable[..., ModelSpec]:
    """Marks ``fn`` as a fleetbench model factory: ``--model module:fn`` may then name it even where ``module`` is
    not the user's own code under the current directory or PYTHONPATH (an installed package of theirs).  The mark
    is read from the module's source before anything is imported (the decorator by this name, or the module's
    ``FLEETBENCH_FACTORIES = ("fn", ...)``), and checked again once imported."""
    fn.__fleetbench_factory__ = True  # type: ignore[attr-defined]
    return fn


# what a --model reference names (suite/usercode.py: the one mechanism for the user's own code)
MODEL_KIND = UserKind("--model", ModelError, "a suite.models.ModelSpec", "model_factory", "suite.models.model_factory",
                      "FLEETBENCH_FACTORIES", "__fleetbench_factory__")


def _check_user_ref(ref: str) -> tuple[str, str, bool]:
    """(module, function, whether the module is the user's own) of a ``--model module:function``
    (:func:`suite.usercode.check_ref`)."""
    return check_ref(ref, MODEL_KIND)


def _user_model(ref: str, size: str) -> ModelSpec:
    obj = import_function(ref, MODEL_KIND)
    try:
        takes_size = bool(inspect.signature(obj).parameters)
    except (TypeError, ValueError):
        takes_size = True
    spec = obj(size) if takes_size else obj()
    if not isinstance(spec, ModelSpec):
        raise ModelError(f"--model {ref!r}: the factory returned {type(spec).__name__}; expected "
                         f"suite.models.ModelSpec")
    return spec


# ---- a user's factory, called in a child process ----------------------------------------------------------
FACTORY_TIMEOUT = 120.0  # seconds a user's factory may take to return its spec (imports included)


@dataclass(frozen=True)
class ModelInfo:
    """What the parent process needs to know of a model: read from the spec, never by building it here."""

    name: str
    data: str
    has_batchnorm: bool  # declared by the spec, or found in the module
    per_rank_batch: int
    parameter_tensors: int
    parameter_elements: int
    gradients: tuple = ()  # gradient_layout(): (bytes, layer, dtype) per trainable parameter, for bucket plans
    find_unused_parameters: bool = False  # declared by the spec: its cases run with find_unused_parameters=true
    sparse_gradients: tuple = ()  # the parameters whose gradients are sparse (nn.Embedding(sparse=True) …)
    fusible: tuple = ()  # (pattern, found, fused) of the compute-fusion pass over the model; () if it could not run


def _fusible(module: nn.Module) -> tuple:
    """What the compute-fusion pass finds and fuses in ``module`` (on the meta device; nothing runs), every pattern
    enabled; () when the pass cannot run there (the case is then not skipped for it: the engine's report says)."""
    from ..compute.fusion import PATTERNS, fuse_model  # the fx pass: imported when a model is looked at

    try:
        _, report = fuse_model(module)
    except Exception:  # noqa: BLE001 - a model the pass cannot handle on the meta device: unknown, not nothing
        return ()
    return tuple((name, report[name]["found"], report[name]["fused"]) for name in PATTERNS)


def _info(spec: ModelSpec) -> ModelInfo:
    with torch.device("meta"):
        module = spec.module()
    if not isinstance(module, nn.Module):
        raise ModelError(f"model {spec.name!r}: build() returned {type(module).__name__}; expected a "
                         f"torch.nn.Module")
    tensors, elements = count_parameters(spec)
    has_bn = spec.has_batchnorm or finds_batchnorm(module)
    layout, sparse = gradient_layout(module), sparse_gradient_names(module)
    with torch.device("meta"):
        fusible = _fusible(spec.module()) if has_bn else ()  # compute fusion's cases are BatchNorm models'
    return ModelInfo(spec.name, spec.data, has_bn, spec.per_rank_batch, tensors, elements, layout,
                     spec.find_unused_parameters, sparse, fusible)


def _info_of(ref: str, size: str) -> ModelInfo:
    """In the factory's child: the spec's :class:`ModelInfo` (what the parent reads of a user's model)."""
    return _info(get_model(ref, size))


_INFO: dict = {}


def model_info(ref: str, size: str = "cpu", timeout: float | None = None) -> ModelInfo:
    """:class:`ModelInfo` of ``ref`` at ``size``.  A registry model is read here; a user's ``module:function``
    factory is called once, in a child process bounded by ``timeout``: a factory that raises, exits, hangs
    or returns something else than a ModelSpec is a :class:`ModelError` naming it (nothing it does can touch
    the parent)."""
    key = (ref, size)
    if key in _INFO:
        return _INFO[key]
    if not is_user_ref(ref):
        _INFO[key] = _info(get_model(ref, size))
        return _INFO[key]
    _check_user_ref(ref)
    if size not in SIZES:
        raise ModelError(f"--size {size!r}: allowed values are {', '.join(SIZES)}")
    timeout = FACTORY_TIMEOUT if timeout is None else timeout
    _INFO[key] = call_in_child(_info_of, (ref, size), ref, MODEL_KIND, timeout)
    return _INFO[key]
