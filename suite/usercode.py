"""The user's own code, named ``module:function``: a model factory (``--model``) or a strategy (``--strategy``).

One mechanism for both (``suite.models`` and ``suite.strategies.user``):

- :func:`check_ref` refuses a reference before anything is imported or run unless it names the user's own code: the
  top-level module, found by ``importlib.machinery.PathFinder`` (no package executed), is under the current
  directory or PYTHONPATH (and is the one an import finds), or the function is marked with the kind's decorator in
  the module's source (read, never run); the standard library's and installed packages' functions are refused;
- :func:`import_function` imports it (the current directory searched last, after the standard library and the
  installed packages) and returns the function, checked again for its mark once imported;
- :func:`call_in_child` runs a function of the parent's choosing (which calls the user's) in a spawned child bounded
  by a timeout, in its own process group that dies with the parent: a factory that raises, exits, hangs or returns
  the wrong thing is one error naming it, and nothing it does touches the parent.

A results file never names code to run: ``run --resume`` asks for ``--model``/``--strategy`` again.  Torch-free.
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

from .runtime.spawn import child_sys_path, keeper, kill_group, safe_start, set_parent_death_signal, spawn_context

__all__ = ["UserKind", "check_ref", "import_function", "call_in_child", "module_label", "MAX_FACTORY_SOURCE"]


@dataclass(frozen=True)
class UserKind:
    """What a ``module:function`` reference names: its option, error type, what the function returns, and the
    decorator and module-level list that mark an installed package's function as one."""

    option: str  # "--model"
    error: type  # raised with a message naming the option and the reference
    returns: str  # "a suite.models.ModelSpec", in messages
    marker: str  # "model_factory"
    marker_path: str  # "suite.models.model_factory", in messages
    listing: str  # "FLEETBENCH_FACTORIES"
    attribute: str  # the attribute the decorator sets on the function


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


def _marked_in_source(spec, fn_name: str, kind: UserKind) -> bool:
    """Whether the module's source marks ``fn_name`` a factory (read and parsed, never run): a top-level function
    decorated with ``kind``'s marker (``@model_factory``, any spelling ending in that name), or the module's list
    of them (``FLEETBENCH_FACTORIES``) naming it."""
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
                if (isinstance(target, ast.Name) and target.id == kind.marker) or \
                        (isinstance(target, ast.Attribute) and target.attr == kind.marker):
                    return True
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == kind.listing
                                                for t in node.targets):
            if isinstance(node.value, (ast.List, ast.Tuple, ast.Set)) and any(
                    isinstance(e, ast.Constant) and e.value == fn_name for e in node.value.elts):
                return True
    return False


def check_ref(ref: str, kind: UserKind) -> tuple[str, str, bool]:
    """(module, function, whether the module is the user's own) of a ``module:function`` reference, refused before
    anything is imported or run unless it names the user's own code: the top-level module, found by
    ``importlib.machinery.PathFinder`` (no package executed), is under the current directory or PYTHONPATH (and is
    the one an import finds), or the function is marked a fleetbench factory (:func:`model_factory`).  The standard
    library and installed packages' functions are refused (``kind``: what the reference names, its option and error)."""
    module_name, _, fn_name = ref.partition(":")
    if not module_name or not fn_name or module_name.startswith(".") or len(ref) > 300 or not all(
            p.isidentifier() for p in module_name.split(".") + fn_name.split(".")):
        raise kind.error(f"{kind.option} {ref[:300]!r}: expected module:function (an absolute module name), e.g. "
                         f"mypkg.models:make_spec")
    top = module_name.split(".")[0]
    if top in sys.stdlib_module_names or top == "builtins":
        raise kind.error(f"{kind.option} {ref!r}: {module_name!r} is Python's standard library; expected your own "
                         f"module with a factory returning {kind.returns}")
    from importlib.machinery import PathFinder

    roots = _own_roots()
    path = _import_path()
    found = _origin(PathFinder.find_spec(top, path))  # what an import would find (installed packages first)
    own = _origin(PathFinder.find_spec(top, roots))
    if own is not None and own == found:
        return module_name, fn_name, True
    spec = _find(module_name, path)
    if spec is not None and _marked_in_source(spec, fn_name, kind):
        return module_name, fn_name, False
    if found is None and own is None:
        raise kind.error(f"{kind.option} {ref!r}: cannot import {module_name!r}: no module {top!r} in the current "
                         f"directory {os.getcwd()}, PYTHONPATH or the import path")
    where = (f"found at {found}, not under the current directory or PYTHONPATH" if own is None
             else f"{top!r} under {own} is not the module an import finds ({found} comes first)")
    raise kind.error(f"{kind.option} {ref!r}: {module_name!r} is not your own code ({where}); a factory is your own "
                     f"module under the current directory or PYTHONPATH, or a function marked "
                     f"@{kind.marker_path}; nothing was imported")


def module_label(ref: str) -> str:
    """The name a user's code is known by in case names: its module's last part and its function, ``my_models.
    make_spec`` for ``pkg.my_models:make_spec`` (two modules' ``make_spec`` never collide)."""
    module_name, _, fn_name = ref.partition(":")
    return f"{module_name.rsplit('.', 1)[-1]}.{fn_name.rsplit('.', 1)[-1]}"


def import_function(ref: str, kind: UserKind) -> Callable[..., Any]:
    """The user's function ``ref`` names (:func:`check_ref` first), imported; refused unless it is a Python function
    of the user's own, or marked as ``kind``'s."""
    module_name, fn_name, own = check_ref(ref, kind)
    cwd = os.getcwd()
    if cwd not in sys.path:  # the user's own module, found last: after the standard library and installed packages
        sys.path.append(cwd)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise kind.error(f"{kind.option} {ref!r}: cannot import {module_name!r} ({exc}); the current directory "
                         f"{cwd} is on the import path") from None
    except Exception as exc:  # noqa: BLE001 - a syntax error, or the module raised while imported
        raise kind.error(f"{kind.option} {ref!r}: importing {module_name!r} failed: {type(exc).__name__}: "
                         f"{exc}") from None
    obj: Any = module
    for part in fn_name.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise kind.error(f"{kind.option} {ref!r}: module {module_name!r} has no {fn_name!r}")
    if not inspect.isfunction(obj) or (obj.__module__ or "").split(".")[0] in sys.stdlib_module_names:
        raise kind.error(f"{kind.option} {ref!r}: {fn_name!r} is {type(obj).__name__}, not a Python function of your "
                         f"own; expected a factory function returning {kind.returns}")
    if not own and not (getattr(obj, kind.attribute, False) or fn_name in (getattr(module, kind.listing, None) or ())):
        raise kind.error(f"{kind.option} {ref!r}: {fn_name!r} is not marked @{kind.marker_path} once imported; "
                         f"not called")
    return obj


def die_with(parent: int) -> None:
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


def _child(target: Callable[..., Any], args: tuple, conn, parent: int, kind_error: type) -> None:
    if parent:
        die_with(parent)
    try:
        conn.send(("ok", target(*args)))
    except BaseException as exc:  # noqa: BLE001 - SystemExit too: a factory that exits is an error, said
        what = (f"called sys.exit({exc.code!r})" if isinstance(exc, SystemExit)
                else str(exc) if isinstance(exc, kind_error) else f"{type(exc).__name__}: {exc}")  # ours says it all
        conn.send(("error", what[:2000]))


def call_in_child(target: Callable[..., Any], args: tuple, ref: str, kind: UserKind, timeout: float) -> Any:
    """``target(*args)`` (a top-level function, importable in a spawned child) in a child bounded by ``timeout``;
    its answer, or one ``kind.error`` naming ``ref``: the child raised (its message), exited, or did not answer in
    time (stopped, with what it forked)."""
    ctx = spawn_context()  # the child's path has the current directory last, never first

    def start():  # on the keeper thread, which lives as long as this process: the parent-death signal's thread
        with safe_start():
            recv, send = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=_child, args=(target, args, send, os.getpid(), kind.error), daemon=True,
                               name="fleetbench-user-factory")
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
            raise kind.error(f"{kind.option} {ref!r}: the factory did not return within {timeout:.0f} s; it was "
                             f"stopped")
        raise kind.error(f"{kind.option} {ref!r}: the factory's process ended (exit code {proc.exitcode}) without "
                         f"returning {kind.returns}")
    if got[0] != "ok":
        raise kind.error(f"{kind.option} {ref!r}: {got[1]}" if not got[1].startswith(kind.option) else got[1])
    return got[1]
