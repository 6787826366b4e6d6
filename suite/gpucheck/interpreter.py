"""Which Python the GPU check's phases run under, and why.

In order: the project's ``.venv`` when it imports a CUDA torch (any torch for ``--device cpu``); else, only when
asked (``--setup``: nothing is installed on a lent machine otherwise), ``make setup`` when the package index answers
within 20 s (a real runner: it installs the pinned CUDA build, constraints-cuda.txt), then the ``.venv`` again; else
the present ``python3`` when it imports torch, with ``PYTHONPATH`` at the checkout and the packages it lacks named
(a phase that needs one is skipped with that reason).  A CPU torch on a machine whose driver lists a GPU is still
chosen when nothing better exists: the versions phase then says so in one line (exit 2).

Every probe is bounded by what is left of the check's deadline (the choice is part of its six minutes); ``make
setup``, when asked, has its own bound (:data:`SETUP_TIMEOUT_S`) and the check's deadline starts after it.
"""
from __future__ import annotations

import json
import os
import shutil
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field

from ..runtime.child import run_child, tail

__all__ = ["Interpreter", "choose", "probe", "index_answers", "WANTED", "INDEX_URL", "INDEX_TIMEOUT_S"]

INDEX_URL = "https://pypi.org/simple/pip/"
INDEX_TIMEOUT_S = 20.0
PROBE_TIMEOUT_S = 90.0  # importing torch on a cold disk
SETUP_TIMEOUT_S = 1800.0  # `make setup` downloading the CUDA build (several GB)

# the modules the phases import (pynvml: nvidia-ml-py; asv is not among them: no phase needs it)
WANTED = ("torch", "numpy", "pandas", "scipy", "matplotlib", "jinja2", "rich", "pytest", "pytest_benchmark", "pynvml",
          "asv")

_PROBE = """
import importlib.util, json, sys
missing = []
for name in %r:
    try:
        if importlib.util.find_spec(name) is None:
            missing.append(name)
    except (ImportError, ValueError):
        missing.append(name)
info = {"executable": sys.executable, "python": sys.version.split()[0], "missing": missing}
try:
    import torch
    info.update(torch=str(torch.__version__), cuda=torch.version.cuda)
except BaseException as exc:
    info["torch_error"] = (type(exc).__name__ + ": " + str(exc))[:400]
print(json.dumps(info))
"""


@dataclass
class Interpreter:
    path: str | None  # None: no interpreter imports torch
    how: str  # why this one, in words
    torch: str | None = None
    cuda: str | None = None
    missing: list = field(default_factory=list)
    tried: list = field(default_factory=list)  # what was looked at before, each "path: why not"
    setup_s: float = 0.0  # seconds `make setup` (--setup) took before the choice

    @property
    def cuda_torch(self) -> bool:
        return bool(self.torch and self.cuda and not self.torch.endswith("+cpu"))

    def as_dict(self) -> dict:
        return {"path": self.path, "how": self.how, "torch": self.torch, "cuda": self.cuda, "missing": self.missing,
                "tried": self.tried, "setup_s": round(self.setup_s, 1)}


def probe(python: str, env: dict, timeout: float = PROBE_TIMEOUT_S) -> dict:
    """What ``python`` has: its torch (version, CUDA) or why it cannot import it, and which wanted modules it lacks."""
    out = run_child([python, "-c", _PROBE % (WANTED,)], timeout, env=env)
    if out.timed_out:
        return {"torch_error": f"importing torch took over {timeout:.0f} s", "missing": []}
    try:
        return json.loads(out.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"torch_error": f"exit {out.rc}: {tail(out.stderr, 3) or 'no output'}", "missing": []}


def index_answers(url: str = INDEX_URL, timeout: float = INDEX_TIMEOUT_S) -> tuple[bool, str]:
    """Whether the package index answers at all within ``timeout`` (any HTTP status counts), and what happened."""
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return True, f"{url} answered {resp.status} in {time.monotonic() - t0:.1f} s"
    except urllib.error.HTTPError as exc:
        return True, f"{url} answered {exc.code} in {time.monotonic() - t0:.1f} s"
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return False, f"{url} did not answer ({getattr(exc, 'reason', exc)}; waited up to {timeout:.0f} s)"


def _accept(name: str, info: dict, device: str) -> str | None:
    """None when ``info``'s torch suits ``device``, else why not."""
    if not info.get("torch"):
        return f"{name}: no torch ({info.get('torch_error', 'not importable')})"
    if device == "cuda" and (not info.get("cuda") or str(info["torch"]).endswith("+cpu")):
        return f"{name}: torch {info['torch']} is a CPU wheel"
    return None


def choose(root: str, venv: str, device: str, env: dict, index_url: str = INDEX_URL,
           index_timeout: float = INDEX_TIMEOUT_S, log=print, setup: bool = False,
           deadline: float | None = None) -> Interpreter:
    """The interpreter of the phases (the module's docstring says in which order); ``env`` is the phases'
    environment (``PYTHONPATH`` at the checkout); ``setup``: ``make setup`` may be tried (``--setup``);
    ``deadline`` (``time.monotonic()``): every probe ends by then."""
    tried: list[str] = []

    shifted = [0.0]  # seconds `make setup` took: not the check's (its deadline starts after it)

    def probed(python: str) -> dict:  # within what is left of the deadline
        left = PROBE_TIMEOUT_S if deadline is None else deadline + shifted[0] - time.monotonic()
        return probe(python, env, max(1.0, min(PROBE_TIMEOUT_S, left)))

    fallback: tuple[str, dict, str] | None = None  # a CPU torch, when nothing better turns up
    venv_py = os.path.join(venv if os.path.isabs(venv) else os.path.join(root, venv), "bin", "python")

    def pick(path: str, info: dict, how: str) -> Interpreter:
        return Interpreter(path, how, info.get("torch"), info.get("cuda"), list(info.get("missing") or []), tried,
                           shifted[0])

    if os.access(venv_py, os.X_OK):
        info = probed(venv_py)
        why = _accept(venv, info, device)
        if why is None:
            return pick(venv_py, info, f"the project's environment ({venv})")
        tried.append(why)
        fallback = (venv_py, info, f"the project's environment ({venv}), the best found")
    else:
        tried.append(f"{venv}: no such environment")
    if device == "cuda" and not setup:
        tried.append("make setup not tried: not asked (--setup installs the pinned CUDA build when the package "
                     "index answers)")
    elif device == "cuda":
        answered, words = index_answers(index_url, index_timeout)
        if answered:
            log(f"gpu-check: the package index answers ({words}): make setup (--setup)")
            made = run_child(["make", "setup", f"VENV={venv}"], SETUP_TIMEOUT_S, env=dict(os.environ), cwd=root)
            shifted[0] = made.seconds
            if made.rc == 0 and os.access(venv_py, os.X_OK):
                info = probed(venv_py)
                why = _accept(venv, info, device)
                if why is None:
                    return pick(venv_py, info, f"make setup ({words}), then {venv}")
                tried.append(f"make setup, then {why}")
            else:
                tried.append(f"make setup: {'timed out' if made.timed_out else f'exit {made.rc}'}: "
                             f"{tail(made.stderr, 3)}")
        else:
            tried.append(f"make setup not tried: {words}")
    python3 = shutil.which("python3", path=env.get("PATH"))
    if python3:
        info = probed(python3)
        why = _accept("python3", info, device)
        how = f"the present python3 ({python3}) with PYTHONPATH at the checkout"
        if why is None:
            return pick(python3, info, how)
        tried.append(why)
        if info.get("torch") and fallback is None:
            fallback = (python3, info, how + ", the best found")
    else:
        tried.append("python3: not on the PATH")
    if fallback is not None:
        return pick(*fallback)
    return Interpreter(None, "none: no interpreter here imports torch", tried=tried, setup_s=shifted[0])

