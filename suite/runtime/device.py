"""Device, backend and timer: the one place that knows CPU from CUDA.

Everything else asks this module, so the CPU path tested here is the code that runs on
GPU runners.  CUDA-only pieces (streams, events, NVML) are reached lazily through
:func:`require_cuda`, which on a machine without a GPU raises a clear
:class:`CudaUnavailable` naming what was asked for.
"""
from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from typing import Iterator, Optional

import torch

__all__ = ["Platform", "CudaUnavailable", "require_cuda", "select_platform", "default_threads"]


class CudaUnavailable(RuntimeError):
    """A CUDA-only feature was asked for where CUDA has no GPU."""


def require_cuda(what: str) -> None:
    if not torch.cuda.is_available():
        raise CudaUnavailable(
            f"{what} needs CUDA, which is unavailable on this machine (torch {torch.__version__}, "
            f"device count 0): run on a GPU runner or choose the CPU path"
        )


@dataclass(frozen=True)
class Platform:
    device_type: str  # "cpu" | "cuda"
    backend: str  # "gloo" | "nccl"
    local_rank: int = 0

    @property
    def device(self) -> torch.device:
        if self.device_type == "cuda":
            return torch.device("cuda", self.local_rank)
        return torch.device("cpu")

    @property
    def is_cuda(self) -> bool:
        return self.device_type == "cuda"

    def synchronize(self) -> None:
        """Wait for queued device work (a no-op on CPU, where ops run synchronously)."""
        if self.is_cuda:
            torch.cuda.synchronize(self.device)

    def now(self) -> float:
        """A timestamp (seconds) that is exact for device work: synchronizes first."""
        self.synchronize()
        return time.perf_counter()

    def stream(self) -> "contextlib.AbstractContextManager":
        """A side stream context on CUDA; a null context on CPU."""
        if self.is_cuda:
            return torch.cuda.stream(torch.cuda.Stream(self.device))
        return contextlib.nullcontext()

    def describe(self) -> dict:
        info = {"device_type": self.device_type, "backend": self.backend}
        if self.is_cuda:
            info["device_name"] = torch.cuda.get_device_name(self.device)
        return info


def select_platform(device: Optional[str] = None, local_rank: int = 0, local_world_size: int = 1) -> Platform:
    """NCCL where CUDA has a GPU for every local rank, else gloo on CPU; ``device`` overrides."""
    if device not in (None, "cpu", "cuda"):
        raise ValueError(f"--device {device!r}: allowed values are 'cpu' and 'cuda'")
    if device == "cuda" or (device is None and torch.cuda.is_available()):
        if device == "cuda":
            require_cuda("--device cuda")
        n = torch.cuda.device_count()
        if n >= local_world_size:
            return Platform("cuda", "nccl", local_rank)
        if device == "cuda":
            raise CudaUnavailable(
                f"--device cuda with {local_world_size} local ranks needs a GPU per rank; this machine has {n}"
            )
    return Platform("cpu", "gloo", local_rank)


def default_threads(local_world_size: int, num_threads: Optional[int] = None) -> int:
    """Intra-op threads per rank: ``num_threads`` if set, else cores / local ranks (at least 1)."""
    if num_threads:
        return num_threads
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // max(1, local_world_size))


@contextlib.contextmanager
def threads(n: int) -> Iterator[None]:
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)
