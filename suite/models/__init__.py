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

import contextlib
import importlib
import inspect
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..comm.buckets import gradient_layout
from ..comm.grad_sync import sparse_gradient_names
from ..data.synthetic import SyntheticImages, SyntheticTokens
from ..model_registry import DATA_KINDS, REGISTRY, SIZES, is_user_ref
from ..runtime.spawn import child_sys_path, keeper, kill_group, safe_start, set_parent_death_signal, spawn_context

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


MAX_FACTORY_SOURCE = 4 * 2**20  # bytes of a module's source read to find a factory's mark


def _own_roots() -> list[str]:
    """The directories whose modules are the user's own: the current directory and PYTHONPATH's entries, less
    any inside the standard library's or the installed packages' directories."""
    import site
    import sysconfig

    system = {os.path.realpath(p) for k in ("stdlib", "platstdlib", "purelib", "platlib")
              if (p := sysconfig.get_paths().get(k))}
    try:
        system |= {os.path.realpath(p) for p in site.getsitepackages()} | {os.path.realpath(site.getusersitepackages())}
    except AttributeError:  # a virtualenv's old site module
        pass
    roots = []
    for entry in [os.getcwd()] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]:
        real = os.path.realpath(os.path.abspath(entry))
        if not any(real == s or real.startswith(s.rstrip(os.sep) + os.sep) for s in system) and real not in roots:
            roots.append(real)
    return roots


def _import_path() -> list[str]:
    """The path a module is imported from here, as a spawned child of fleetbench has it (the current directory
    last: suite.runtime.spawn)."""
    return [p for p in child_sys_path(list(sys.path)) if isinstance(p, str)]


def _origin(spec) -> str | None:
    if spec is None:
        return None
    if spec.origin and spec.origin not in ("namespace", "built-in", "frozen"):
        return os.path.realpath(spec.origin)
    locations = list(spec.submodule_search_locations or [])
    return os.path.realpath(locations[0]) if locations else None


def _find(module_name: str, path: list[str]):
    """The spec of ``module_name`` found on ``path`` by ``importlib.machinery.PathFinder``, its packages searched
    through their spec's locations: nothing is imported or executed."""
    from importlib.machinery import PathFinder

    parts = module_name.split(".")
    spec = PathFinder.find_spec(parts[0], path)
    for i in range(1, len(parts)):
        if spec is None or not spec.submodule_search_locations:
            return None
        spec = PathFinder.find_spec(".".join(parts[: i + 1]), list(spec.submodule_search_locations))
    return spec


def _marked_in_source(spec, fn_name: str) -> bool:
    """Whether the module's source marks ``fn_name`` a factory (read and parsed, never run): a top-level function
    decorated ``@model_factory`` (any spelling ending in that name), or ``FLEETBENCH_FACTORIES`` listing it."""
    import ast

    origin = getattr(spec, "origin", None)
    if not origin or not origin.endswith(".py") or "." in fn_name:
        return False
    try:
        with open(origin, "rb") as fh:
            tree = ast.parse(fh.read(MAX_FACTORY_SOURCE + 1)[:MAX_FACTORY_SOURCE])
    except (OSError, SyntaxError, ValueError, RecursionError):
        return False
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == fn_name:
            for dec in node.decorator_list:
                target = dec.func if isinstance(dec, ast.Call) else dec
                if (isinstance(target, ast.Name) and target.id == "model_factory") or \
                        (isinstance(target, ast.Attribute) and target.attr == "model_factory"):
                    return True
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "FLEETBENCH_FACTORIES"
                                                for t in node.targets):
            if isinstance(node.value, (ast.List, ast.Tuple, ast.Set)) and any(
                    isinstance(e, ast.Constant) and e.value == fn_name for e in node.value.elts):
                return True
    return False


def _check_user_ref(ref: str) -> tuple[str, str, bool]:
    """(module, function, whether the module is the user's own) of a ``module:function`` reference, refused before
    anything is imported or run unless it names the user's own code: the top-level module, found by
    ``importlib.machinery.PathFinder`` (no package executed), is under the current directory or PYTHONPATH (and is
    the one an import finds), or the function is marked a fleetbench factory (:func:`model_factory`).  The standard
    library and installed packages' functions are refused."""
    module_name, _, fn_name = ref.partition(":")
    if not module_name or not fn_name or module_name.startswith(".") or len(ref) > 300 or not all(
            p.isidentifier() for p in module_name.split(".") + fn_name.split(".")):
        raise ModelError(f"--model {ref[:300]!r}: expected module:function (an absolute module name), e.g. "
                         f"mypkg.models:make_spec")
    top = module_name.split(".")[0]
    if top in sys.stdlib_module_names or top == "builtins":
        raise ModelError(f"--model {ref!r}: {module_name!r} is Python's standard library; expected your own "
                         f"module with a factory returning a suite.models.ModelSpec")
    from importlib.machinery import PathFinder

    roots = _own_roots()
    path = _import_path()
    found = _origin(PathFinder.find_spec(top, path))  # what an import would find (installed packages first)
    own = _origin(PathFinder.find_spec(top, roots))
    if own is not None and own == found:
        return module_name, fn_name, True
    spec = _find(module_name, path)
    if spec is not None and _marked_in_source(spec, fn_name):
        return module_name, fn_name, False
    if found is None and own is None:
        raise ModelError(f"--model {ref!r}: cannot import {module_name!r}: no module {top!r} in the current directory "
                         f"{os.getcwd()}, PYTHONPATH or the import path")
    where = (f"found at {found}, not under the current directory or PYTHONPATH" if own is None
             else f"{top!r} under {own} is not the module an import finds ({found} comes first)")
    raise ModelError(f"--model {ref!r}: {module_name!r} is not your own code ({where}); a factory is your own "
                     f"module under the current directory or PYTHONPATH, or a function marked "
                     f"@suite.models.model_factory; nothing was imported")


def _user_model(ref: str, size: str) -> ModelSpec:
    module_name, fn_name, own = _check_user_ref(ref)
    cwd = os.getcwd()
    if cwd not in sys.path:  # the user's own module, found last: after the standard library and installed packages
        sys.path.append(cwd)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ModelError(f"--model {ref!r}: cannot import {module_name!r} ({exc}); the current directory "
                         f"{cwd} is on the import path") from None
    except Exception as exc:  # noqa: BLE001 - a syntax error, or the module raised while imported
        raise ModelError(f"--model {ref!r}: importing {module_name!r} failed: {type(exc).__name__}: {exc}") from None
    obj: Any = module
    for part in fn_name.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise ModelError(f"--model {ref!r}: module {module_name!r} has no {fn_name!r}")
    if not inspect.isfunction(obj) or (obj.__module__ or "").split(".")[0] in sys.stdlib_module_names:
        raise ModelError(f"--model {ref!r}: {fn_name!r} is {type(obj).__name__}, not a Python function of your "
                         f"own; expected a factory function returning a ModelSpec")
    if not own and not (getattr(obj, "__fleetbench_factory__", False)
                        or fn_name in (getattr(module, "FLEETBENCH_FACTORIES", None) or ())):
        raise ModelError(f"--model {ref!r}: {fn_name!r} is not marked @suite.models.model_factory once imported; "
                         f"not called")
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


def _die_with(parent: int) -> None:
    """In the factory's process: its own process group, and it (with whatever the factory forked) dies with the
    fleetbench process that started it: the parent-death signal (SIGTERM, whose handler kills the group), and a
    thread that does the same when the parent is gone (a handler waits for the main thread's next bytecode)."""
    import signal
    import threading
    import time

    with contextlib.suppress(OSError):
        os.setpgid(0, 0)

    def kill_group(*_):
        with contextlib.suppress(OSError):
            os.killpg(0, signal.SIGKILL)
        os._exit(3)

    signal.signal(signal.SIGTERM, kill_group)
    set_parent_death_signal(signal.SIGTERM)
    if os.getppid() != parent:  # it died before the signal was set
        kill_group()

    def watch():
        while os.getppid() == parent:
            time.sleep(0.2)
        kill_group()

    threading.Thread(target=watch, name="fleetbench-parent-watch", daemon=True).start()


def _info_child(ref: str, size: str, conn, parent: int = 0) -> None:
    if parent:
        _die_with(parent)
    try:
        conn.send(("ok", _info(get_model(ref, size))))
    except BaseException as exc:  # noqa: BLE001 - SystemExit too: a factory that exits is an error, said
        what = (f"called sys.exit({exc.code!r})" if isinstance(exc, SystemExit)
                else str(exc) if isinstance(exc, ModelError) else f"{type(exc).__name__}: {exc}")  # ours says it all
        conn.send(("error", what[:2000]))


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
    ctx = spawn_context()  # the child's path has the current directory last, never first

    def start():  # on the keeper thread, which lives as long as this process: the parent-death signal's thread
        with safe_start():
            recv, send = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=_info_child, args=(ref, size, send, os.getpid()), daemon=True,
                               name="fleetbench-model-factory")
            proc.start()
        return recv, send, proc

    recv, send, proc = keeper.call(start)
    send.close()
    ready = False
    try:
        ready = recv.poll(timeout)
        got = recv.recv() if ready else None
    except (EOFError, OSError):
        got = None
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join(5)
        kill_group(proc.pid)  # what the factory forked, still running in its group
        recv.close()
    if got is None:
        if not ready:
            raise ModelError(f"--model {ref!r}: the factory did not return within {timeout:.0f} s; it was stopped")
        raise ModelError(f"--model {ref!r}: the factory's process ended (exit code {proc.exitcode}) without "
                         f"returning a ModelSpec")
    if got[0] != "ok":
        raise ModelError(f"--model {ref!r}: {got[1]}" if not got[1].startswith("--model") else got[1])
    _INFO[key] = got[1]
    return got[1]
