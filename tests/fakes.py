"""Fakes that make the CUDA branches of fleetbench reachable on a CPU machine.

- :class:`FakeCuda`: the part of the ``torch.cuda`` API that ``suite.runtime.device.Platform`` calls,
  recording every stream switch, wait, event record and device setting in ``log`` (with the thread
  that made it), with per-thread current streams as in CUDA.  Events carry a time from a fake clock
  (``clock``) so ``elapsed_time`` is exact, and refuse ``elapsed_time`` before a synchronize, as CUDA
  does for an event that has not completed.
- :func:`fake_cuda_platform`: a ``Platform`` that takes its CUDA branches (``is_cuda``) through a
  ``FakeCuda``, while its tensors stay on the CPU (``device`` is the CPU) so gloo can carry them.
- :class:`FakeNvml`: a ``pynvml`` module stand-in with per-index utilization and names (device i has
  UUID ``GPU-fake-i``).

And one that makes `fleetbench run` reachable without ranks: :class:`FakeRankPool`.
"""
from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
import types
from dataclasses import dataclass

import torch

from suite.runtime.device import Platform


class FakeStream:
    def __init__(self, api: FakeCuda, name: str):
        self.api, self.name = api, name

    def wait_stream(self, other: FakeStream) -> None:
        self.api._log("wait_stream", self.name, other.name)

    def wait_event(self, event: FakeEvent) -> None:
        self.api._log("wait_event", self.name, event.name)

    def __repr__(self) -> str:
        return f"FakeStream({self.name})"


class FakeEvent:
    def __init__(self, api: FakeCuda, enable_timing: bool = False):
        self.api, self.enable_timing = api, enable_timing
        self.name = f"ev{next(api._ids)}"
        self.t = None
        self.stream = None

    def record(self, stream: FakeStream = None) -> None:
        stream = stream if stream is not None else self.api.current_stream()
        self.stream, self.t = stream.name, self.api.clock
        self.api._log("record", self.name, stream.name)

    def elapsed_time(self, other: FakeEvent) -> float:
        if not (self.enable_timing and other.enable_timing):
            raise RuntimeError("Both events must be created with argument 'enable_timing=True'")
        if self.api.synced_at is None or max(self.t, other.t) > self.api.synced_at:
            raise RuntimeError("event has not completed: synchronize before elapsed_time")
        return (other.t - self.t) * 1e3


class FakeCuda:
    """A recording stand-in for ``torch.cuda`` (streams, events, memory, devices)."""

    def __init__(self, device_count: int = 8, allocated: int = 0):
        self.log: list[tuple] = []
        self._ids = itertools.count()
        self._local = threading.local()
        self.default = FakeStream(self, "default")
        self.clock = 0.0  # seconds; tests advance it to stand for device time
        self.busy = 0.0  # seconds of queued device work a synchronize waits for (really sleeps)
        self.synced_at = None
        self.n = device_count
        self.allocated = allocated
        self.peak = allocated
        self.free_bytes = 16 * 2**30  # what mem_get_info reports free
        self.cached = 0  # reserved by the caching allocator but free (freed tensors' blocks)
        self.spin_hz = 1.5e9  # torch.cuda._sleep cycles per second of device time
        self.Stream = lambda device=None: FakeStream(self, f"side{next(self._ids)}")
        self.Event = lambda enable_timing=False: FakeEvent(self, enable_timing)

    def _log(self, *entry) -> None:
        self.log.append((threading.current_thread().name, *entry))

    def entries(self, kind: str) -> list[tuple]:
        return [e for e in self.log if e[1] == kind]

    # streams
    def current_stream(self, device=None) -> FakeStream:
        return getattr(self._local, "stream", self.default)

    @contextlib.contextmanager
    def stream(self, s: FakeStream):
        old = self.current_stream()
        self._local.stream = s
        self._log("enter", s.name)
        try:
            yield
        finally:
            self._local.stream = old
            self._log("exit", s.name)

    def pin_memory(self, tensor: torch.Tensor) -> torch.Tensor:
        self._log("pin", tuple(tensor.shape))
        return tensor

    def record_stream(self, tensor: torch.Tensor, stream: FakeStream) -> None:
        self._log("record_stream", tensor.data_ptr(), stream.name)

    # device
    def synchronize(self, device=None) -> None:
        if self.busy:  # queued device work the host now waits for
            time.sleep(self.busy)
            self.busy = 0.0
        self.synced_at = self.clock
        self._log("synchronize")

    def set_device(self, device) -> None:
        self._log("set_device", str(device))

    def is_available(self) -> bool:
        return True

    def device_count(self) -> int:
        return self.n

    def get_device_name(self, device=None) -> str:
        return "Fake GPU"

    # memory
    def alloc(self, nbytes: int) -> None:
        self.allocated += nbytes
        self.peak = max(self.peak, self.allocated)

    def free(self, nbytes: int) -> None:
        self.allocated -= nbytes

    def reset_peak_memory_stats(self, device=None) -> None:
        self.peak = self.allocated
        self._log("reset_peak")

    def memory_allocated(self, device=None) -> int:
        return self.allocated

    def memory_reserved(self, device=None) -> int:
        """The caching allocator's blocks: allocated, plus ``cached`` bytes of freed tensors it keeps."""
        return self.allocated + self.cached

    def max_memory_allocated(self, device=None) -> int:
        return self.peak

    def _sleep(self, cycles: int) -> None:
        """A spin kernel of ``cycles`` on the current stream; the fake device runs ``spin_hz`` cycles a second."""
        self.clock += cycles / self.spin_hz
        self._log("sleep", cycles, self.current_stream().name)

    def mem_get_info(self, device=None) -> tuple[int, int]:
        return self.free_bytes, 2 * self.free_bytes


@dataclass(frozen=True)
class _FakeCudaPlatform(Platform):
    @property
    def device(self) -> torch.device:  # the tensors stay on the CPU, so gloo carries them
        return torch.device("cpu")


def fake_cuda_platform(api: FakeCuda = None, local_rank: int = 0, backend: str = "gloo") -> Platform:
    """A platform whose CUDA branches run against ``api`` (a new FakeCuda by default)."""
    return _FakeCudaPlatform("cuda", backend, local_rank, cuda_api=api if api is not None else FakeCuda())


class FakeNvml(types.ModuleType):
    """``pynvml`` with ``len(names)`` devices; NVML index i reports utilization ``util[i]``."""

    NVML_CLOCK_SM = 1

    def __init__(self, names: list[str], util: list[int] = None):
        super().__init__("pynvml")
        self.names = names
        self.util = util or [10 * (i + 1) for i in range(len(names))]
        self.handles_asked: list[int] = []
        self.inits = 0

    def nvmlInit(self):
        self.inits += 1

    def nvmlShutdown(self):
        pass

    def nvmlDeviceGetCount(self):
        return len(self.names)

    def nvmlDeviceGetHandleByIndex(self, i):
        if not 0 <= i < len(self.names):
            raise ValueError(f"NVML index {i} out of range")
        self.handles_asked.append(i)
        return i

    def nvmlDeviceGetHandleByUUID(self, uuid):
        uuids = [f"GPU-fake-{i}" for i in range(len(self.names))]
        if uuid not in uuids:
            raise ValueError(f"NVML: no device with UUID {uuid}")
        self.handles_asked.append(uuids.index(uuid))
        return uuids.index(uuid)

    def nvmlDeviceGetUtilizationRates(self, h):
        return types.SimpleNamespace(gpu=self.util[h], memory=0)

    def nvmlDeviceGetMemoryInfo(self, h):
        return types.SimpleNamespace(used=1000 * (h + 1), total=10_000)

    def nvmlDeviceGetPowerUsage(self, h):
        return 100_000 + h

    def nvmlDeviceGetName(self, h):
        return self.names[h]

    def nvmlDeviceGetClockInfo(self, h, kind):
        return 1000

    def nvmlDeviceGetMaxClockInfo(self, h, kind):
        return 1500

    def nvmlSystemGetDriverVersion(self):
        return "999.1"


@contextlib.contextmanager
def captured_log(name: str):
    """The messages logged at INFO and above by logger ``name`` inside the block (a list, filled as they come);
    the logger's handlers and level are restored afterwards."""
    messages: list[str] = []

    class _Keep(logging.Handler):
        def emit(self, record):
            messages.append(record.getMessage())

    logger = logging.getLogger(name)
    handler, level = _Keep(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield messages
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


class FakeRankPool:
    """Stands for ``suite.runtime.RankPool`` in `fleetbench run --no-check`: every timing call answered with
    synthetic numbers (``tests.test_runner``'s); each pool made is in ``made``, each call's keywords in ``calls``."""

    made: list = []

    def __init__(self, nproc, **kw):
        self.nproc, self.kw, self.calls = nproc, kw, []
        FakeRankPool.made.append(self)

    def run(self, fn, kwargs=None, timeout=None):
        from suite.runner import free_memory_on_rank
        from tests.test_runner import _answers

        if fn is free_memory_on_rank:
            return [2**40] * self.nproc
        self.calls.append(kwargs)
        return _answers([v["name"] for v in kwargs["variants"]], ranks=self.nproc)

    def close(self):
        pass


NVIDIA_SMI_Q = """
==============NVSMI LOG==============

Timestamp                                 : Mon Nov 30 12:00:00 2026
Driver Version                            : {driver}
CUDA Version                              : {cuda}

Attached GPUs                             : {gpus}
{blocks}"""
GPU_BLOCK = """GPU 00000000:{i:02X}:00.0
    Product Name                          : NVIDIA H100 80GB HBM3
    FB Memory Usage
        Total                             : 81559 MiB
        Reserved                          : 551 MiB
"""


def fake_nvidia_smi(folder, driver: str = "580.65.06", cuda: str = "13.0", gpus: int = 1) -> str:
    """An executable ``nvidia-smi`` in ``folder`` (put it first on the PATH) that claims ``gpus`` H100s under
    ``driver`` (supporting CUDA ``cuda``): ``-q`` prints the report, ``--query-gpu`` CSV lines; returns the folder."""
    import os

    text = NVIDIA_SMI_Q.format(driver=driver, cuda=cuda, gpus=gpus,
                               blocks="".join(GPU_BLOCK.format(i=i + 1) for i in range(gpus)))
    csv = "".join(f"NVIDIA H100 80GB HBM3, {driver}, 9.0, 81559 MiB\n" for _ in range(gpus))
    path = os.path.join(str(folder), "nvidia-smi")
    with open(path, "w") as fh:
        fh.write("#!/bin/sh\n"
                 f"case \"$*\" in\n  *--query-gpu*) printf '%s' '{csv}' ;;\n"
                 f"  *) printf '%s' '{text}' ;;\nesac\n")  # shell builtins only: works on any PATH
    os.chmod(path, 0o755)
    return str(folder)


# A sitecustomize for a command's processes that stands for NCCL's output (issue 43.1): each rank (a spawned child)
# writes NCCL's banner on its fd 1, as NCCL rank 0 does at its first communicator (ncclDebugFile defaults to stdout),
# and a WARN line into NCCL_DEBUG_FILE when that is set (%h and %p as NCCL fills them); the doctor's parent keeps only
# ITEMS (a short doctor).  `NCCL_LIKE_ITEMS` names the doctor's items kept, comma-separated.
NCCL_LIKE_RANKS = r'''
import os, socket, sys

argv = " ".join(getattr(sys, "orig_argv", sys.argv))
if "--multiprocessing-fork" in argv and os.environ.get("NCCL_LIKE_RANKS"):
    os.write(1, b"NCCL version 2.28.9+cuda13.0\n")
    path = os.environ.get("NCCL_DEBUG_FILE")
    if path:
        path = path.replace("%h", socket.gethostname()).replace("%p", str(os.getpid()))
        with open(path, "a") as fh:
            fh.write(f"{socket.gethostname()}:{os.getpid()} [0] NCCL WARN a warning only NCCL_DEBUG_FILE keeps\n")
elif "suite.cli.main" in argv and " doctor" in argv and os.environ.get("NCCL_LIKE_ITEMS"):
    import suite.doctor as _doctor

    keep = os.environ["NCCL_LIKE_ITEMS"].split(",")
    _doctor.ITEMS[:] = [fn for fn in _doctor.ITEMS if fn.__name__ in keep]
'''


def nccl_like_site(folder) -> str:
    """A folder holding the :data:`NCCL_LIKE_RANKS` sitecustomize (put it first on PYTHONPATH, with
    NCCL_LIKE_RANKS=1 and NCCL_LIKE_ITEMS set); returns it."""
    import os

    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "sitecustomize.py"), "w") as fh:
        fh.write(NCCL_LIKE_RANKS)
    return str(folder)
