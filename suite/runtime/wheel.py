"""Which torch build this is and whether the machine's NVIDIA driver can run it, said in one line before anything
touches CUDA (the doctor's first line, `.ci/gpu-check`'s versions phase).  Torch-free: the caller passes torch's
``__version__`` and ``version.cuda``, so a broken or CPU-only torch is still named.

- the wheel: ``CPU`` (``torch.version.cuda`` is None) or ``CUDA x.y`` (the toolkit torch was built with);
- the driver: ``nvidia-smi -q``'s driver version, the newest CUDA it supports and the GPUs it lists (None where
  there is no ``nvidia-smi``: no NVIDIA driver on this machine);
- the fit (:func:`misfit`): a CPU wheel where the driver lists a GPU is refused, and so is a wheel whose CUDA major
  is newer than the driver's (CUDA's minor-version compatibility lets a 13.0 driver run any 13.x build, never a
  12.x driver a 13.x build); a same-major driver older than the build's minor is a warning only (:func:`warning`).
"""
from __future__ import annotations

import re
import shutil
import subprocess

__all__ = ["wheel_label", "driver_facts", "parse_nvidia_smi", "misfit", "warning", "first_line"]

# torch's `make setup` pins on a machine with nvidia-smi (constraints-cuda.txt); the message names the way out
HOW_TO_GET_CUDA = "`make setup` on this machine pins it, constraints-cuda.txt"


def wheel_label(torch_version: str, cuda: str | None) -> str:
    """``CPU`` or ``CUDA 13.0``."""
    if not cuda or torch_version.endswith("+cpu"):
        return "CPU"
    return f"CUDA {cuda}"


def parse_nvidia_smi(text: str) -> dict:
    """The driver version, the newest CUDA it supports and the GPUs (name, memory) from ``nvidia-smi -q``."""
    def first(key: str) -> str | None:
        m = re.search(rf"^\s*{key}\s*:\s*(.+?)\s*$", text, re.M)
        return m.group(1) if m else None

    names = re.findall(r"^\s*Product Name\s*:\s*(.+?)\s*$", text, re.M)
    memory = re.findall(r"^\s*FB Memory Usage\s*\n\s*Total\s*:\s*(.+?)\s*$", text, re.M)
    count = first("Attached GPUs")
    return {"driver": first("Driver Version"), "cuda": first("CUDA Version"),
            "gpus": int(count) if count and count.isdigit() else len(names), "names": names, "memory": memory}


def driver_facts(timeout: float = 20.0) -> dict | None:
    """What ``nvidia-smi -q`` says (:func:`parse_nvidia_smi`, plus ``text`` and any ``error``); None without
    ``nvidia-smi`` on the PATH."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        proc = subprocess.run([smi, "-q"], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"driver": None, "cuda": None, "gpus": 0, "names": [], "memory": [], "text": "",
                "error": f"nvidia-smi -q: {type(exc).__name__}: {exc}"}
    facts = parse_nvidia_smi(proc.stdout)
    facts["text"] = proc.stdout
    if proc.returncode:
        facts["error"] = f"nvidia-smi -q exited {proc.returncode}: {(proc.stderr or proc.stdout).strip()[:300]}"
    return facts


def _major_minor(v: str | None) -> tuple[int, int] | None:
    m = re.match(r"(\d+)\.(\d+)", v or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def _driver_words(driver: dict) -> str:
    return f"NVIDIA driver {driver.get('driver') or '?'} (CUDA {driver.get('cuda') or '?'})"


def misfit(torch_version: str, cuda: str | None, driver: dict | None) -> str | None:
    """One line saying why this torch cannot use this machine's GPUs, or None when it can (or there is no GPU)."""
    if driver is None or not driver.get("gpus"):
        return None
    if wheel_label(torch_version, cuda) == "CPU":
        return (f"torch {torch_version} is a CPU wheel, on a machine whose {_driver_words(driver)} lists "
                f"{driver['gpus']} GPU(s): install torch's CUDA build ({HOW_TO_GET_CUDA})")
    built, runs = _major_minor(cuda), _major_minor(driver.get("cuda"))
    if built and runs and built[0] > runs[0]:
        return (f"torch {torch_version} is built for CUDA {cuda}, newer than the {_driver_words(driver)} supports: "
                f"update the driver to one that supports CUDA {built[0]}.x, or install a torch built for CUDA "
                f"{runs[0]}")
    return None


def warning(torch_version: str, cuda: str | None, driver: dict | None) -> str | None:
    """A same-major driver older than the build's minor: it runs (minor-version compatibility), but PTX built for
    the newer minor cannot be JIT-compiled by it."""
    if driver is None or not driver.get("gpus") or not cuda:
        return None
    built, runs = _major_minor(cuda), _major_minor(driver.get("cuda"))
    if built and runs and built[0] == runs[0] and built[1] > runs[1]:
        return (f"torch {torch_version} is built for CUDA {cuda}, the {_driver_words(driver)} is older within the "
                f"same major: it runs by CUDA's minor-version compatibility, without JIT compilation of newer PTX")
    return None


def first_line(torch_version: str, cuda: str | None, driver: dict | None) -> str:
    """``torch 2.13.0 (CUDA 13.0 wheel), NVIDIA driver 580.65 (CUDA 13.0), 8 GPU(s)`` or ``..., no NVIDIA driver``."""
    head = f"torch {torch_version} ({wheel_label(torch_version, cuda)} wheel)"
    if driver is None:
        return head + ", no NVIDIA driver (no nvidia-smi)"
    return head + f", {_driver_words(driver)}, {driver.get('gpus', 0)} GPU(s)"
