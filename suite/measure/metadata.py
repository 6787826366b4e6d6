"""What a measurement was taken on: commit, versions, devices, host, environment.

NVML is used where present (GPU runners); on CPU the GPU fields say so plainly.
"""
from __future__ import annotations

import os
import platform
import socket
import subprocess
from functools import lru_cache

from .utilization import visible_nvml_handles

__all__ = ["collect", "git_info", "cpu_model", "gpu_info", "machine_line", "machine_name", "ENV_PREFIXES"]

ENV_PREFIXES = ("NCCL_", "OMP_", "GLOO_", "MKL_", "CUDA_VISIBLE_DEVICES", "TORCH_", "FLEETBENCH_")


@lru_cache(maxsize=1)
def git_info() -> dict:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    dirty = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "branch": git("rev-parse", "--abbrev-ref", "HEAD"),
            "dirty": bool(dirty) if dirty is not None else None}


@lru_cache(maxsize=1)
def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpu_info() -> dict:
    """GPU names, clocks and driver through NVML where present; otherwise why not.  Only the GPUs this
    process sees (``CUDA_VISIBLE_DEVICES``), counted by torch, in torch's order."""
    import torch

    if not torch.cuda.is_available():
        return {"available": False, "reason": "CUDA unavailable (no GPU on this machine)"}
    info: dict = {"available": True, "count": torch.cuda.device_count(),
                  "names": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]}
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            info["driver"] = pynvml.nvmlSystemGetDriverVersion()
            devs = []
            for nvml_id, h in visible_nvml_handles(pynvml):  # the GPUs torch sees, in its order
                devs.append({
                    "nvml_id": nvml_id,
                    "name": pynvml.nvmlDeviceGetName(h),
                    "sm_clock_mhz": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
                    "max_sm_clock_mhz": pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM),
                    "memory_total": pynvml.nvmlDeviceGetMemoryInfo(h).total,
                })
            info["nvml"] = devs
        finally:
            pynvml.nvmlShutdown()
    except Exception as exc:  # noqa: BLE001 - NVML is optional
        info["nvml_error"] = f"{type(exc).__name__}: {exc}"
    return info


def nccl_version() -> str | None:
    """NCCL's version as torch reports it, or None without CUDA (or a torch built without NCCL)."""
    import torch

    if not torch.cuda.is_available():
        return None
    try:
        return ".".join(map(str, torch.cuda.nccl.version()))
    except Exception:  # noqa: BLE001
        return None


def collect(world_size: int | None = None, backend: str | None = None, threads: int | None = None) -> dict:
    import torch

    nccl = nccl_version()
    return {
        "git": git_info(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl": nccl,
        "cudnn": torch.backends.cudnn.version() if torch.cuda.is_available() else None,
        "python": platform.python_version(),
        "backend": backend,
        "host": socket.gethostname(),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "gpu": gpu_info(),
        "world_size": world_size,
        "threads_per_rank": threads,
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)},
    }


def machine_line(world_size: int | None = None) -> str:
    """One line naming the machine, for figures written into the README."""
    import torch

    gpu = gpu_info()
    dev = ", ".join(gpu["names"]) if gpu.get("available") else "no GPU"
    world = f"world size {world_size}; " if world_size is not None else ""
    return (f"measured on {cpu_model()}, {os.cpu_count()} cores, {dev}; torch {torch.__version__}; "
            f"{world}commit {(git_info().get('commit') or 'unknown')[:10]}")


def machine_name() -> str:
    """A name for asv's machine: the GPU model and count (``4xNVIDIA-A100-SXM4-80GB``), or the CPU's."""
    import re

    gpu = gpu_info()
    if gpu.get("available"):
        names = gpu.get("names") or ["gpu"]
        text = f"{len(names)}x{names[0]}"
    else:
        text = f"cpu-{os.cpu_count()}x{cpu_model()}"
    return re.sub(r"[^A-Za-z0-9.+_-]+", "-", text).strip("-")[:80]
