"""Device, backend, streams, events, memory and timers: the one place that knows CPU from CUDA.

Everything else asks the :class:`Platform` object, so the CPU path tested here is the code that
runs on GPU runners, and the CUDA branches are reachable from CPU tests: every CUDA call goes
through ``platform.cuda`` (``torch.cuda`` unless a test puts a fake there, see ``tests/fakes.py``).

What the CUDA semantics are (torch 2.13, checked against its sources), and why the API is shaped so:

- Kernels are *queued*; the host returns at once.  Host clocks around device work measure queuing,
  so device time is read from timing events (:meth:`Platform.mark`, :meth:`Platform.elapsed`),
  resolved after a synchronize.
- ``Work.wait()`` of an NCCL collective blocks the calling thread's *current stream*, not the CPU.
- A stream switch (:meth:`Platform.use_stream`) is per thread; a thread starts on the default stream
  of the current device, which is device 0 unless the thread sets it (:meth:`Platform.set_device`,
  as torch's pin-memory thread does).

On CPU every operation runs synchronously: streams are ``None``, stream operations are no-ops and
marks are host timestamps, so callers need no ``if cuda`` of their own.

    p = ctx.platform
    a = p.mark(); ...device work...; b = p.mark()
    p.synchronize(); seconds = p.elapsed(a, b)
    with p.memory_window() as mem: ...steps...
    mem.peak_above_start          # bytes above what was allocated when the window opened
"""
from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["Platform", "CudaUnavailable", "require_cuda", "select_platform", "default_threads", "HostMark",
           "MemoryWindow", "cuda_device_count", "host_available_memory", "platform_of", "bound_per_process",
           "timed_block", "BARRIERS"]


class CudaUnavailable(RuntimeError):
    """A CUDA-only feature was asked for where CUDA has no GPU."""


def require_cuda(what: str) -> None:
    if not torch.cuda.is_available():
        raise CudaUnavailable(
            f"{what} needs CUDA, which is unavailable on this machine (torch {torch.__version__}, "
            f"device count 0): run on a GPU runner or choose the CPU path"
        )


def cuda_device_count() -> int:
    """GPUs this process may use, as torch counts them (honours CUDA_VISIBLE_DEVICES; 0 without CUDA)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@dataclass(frozen=True)
class HostMark:
    """A CPU-platform mark: a host timestamp (``time.perf_counter``)."""

    t: float


class MemoryWindow:
    """Peak memory of a window, above what was in use when it opened (see :meth:`Platform.memory_window`).

    CUDA: bytes allocated by the caching allocator (``memory_allocated`` at the start, the peak reset
    there).  CPU: the process's resident set (VmRSS at the start; the high-water mark VmHWM reset
    through ``/proc/self/clear_refs`` where the kernel allows, else the process's lifetime peak and
    ``kind`` says so)."""

    def __init__(self, platform: Platform):
        self.platform = platform
        self.start_bytes = 0
        self.peak_bytes: int | None = None
        self.kind = ""

    def open(self) -> MemoryWindow:
        p = self.platform
        if p.is_cuda:
            p.synchronize()
            p.cuda.reset_peak_memory_stats(p.device)
            self.start_bytes = int(p.cuda.memory_allocated(p.device))
            self.kind = "cuda_allocated"
        else:
            self.start_bytes = _proc_status("VmRSS") or 0
            self.kind = "process_rss" if _reset_rss_peak() else "process_rss_lifetime_peak"
        return self

    def close(self) -> MemoryWindow:
        p = self.platform
        if p.is_cuda:
            p.synchronize()
            self.peak_bytes = int(p.cuda.max_memory_allocated(p.device))
        else:
            self.peak_bytes = _proc_status("VmHWM") or _ru_maxrss()
        return self

    @property
    def peak_above_start(self) -> int:
        if self.peak_bytes is None:
            raise RuntimeError("memory window still open: read peak_above_start after close() (or the with block)")
        return max(0, self.peak_bytes - self.start_bytes)

    def as_dict(self) -> dict:
        return {"start_bytes": self.start_bytes, "peak_bytes": self.peak_bytes,
                "peak_above_start_bytes": self.peak_above_start, "kind": self.kind}

    def __enter__(self) -> MemoryWindow:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _proc_status(field_name: str) -> int | None:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(field_name + ":"):
                    return int(line.split()[1]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        return None
    return None


def _reset_rss_peak() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0: write 5 to /proc/self/clear_refs)."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def host_available_memory() -> int:
    """The host's available RAM (``MemAvailable``), bytes; 8 GiB where /proc/meminfo cannot be read."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 * 2**30


def _ru_maxrss() -> int:
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux reports KiB


_SPIN_RATE: dict = {}  # (CUDA API, device) -> torch.cuda._sleep cycles per second


@dataclass(frozen=True)
class Platform:
    device_type: str  # "cpu" | "cuda"
    backend: str  # "gloo" | "nccl"
    local_rank: int = 0
    # The torch.cuda API the CUDA branches call; None = torch.cuda.  Tests put a recording fake here.
    cuda_api: Any = field(default=None, compare=False, repr=False)
    # The CUDA index of this rank's GPU when it is not the local rank: a scheduler that binds one GPU to each process
    # (SLURM's gpu-bind: every process sees its own GPU as cuda:0), see select_platform.
    device_index: int | None = None

    @property
    def cuda(self):
        return torch.cuda if self.cuda_api is None else self.cuda_api

    @property
    def device(self) -> torch.device:
        if self.device_type == "cuda":
            return torch.device("cuda", self.local_rank if self.device_index is None else self.device_index)
        return torch.device("cpu")

    @property
    def is_cuda(self) -> bool:
        return self.device_type == "cuda"

    # -- host and device ---------------------------------------------------------------
    def synchronize(self) -> None:
        """Wait for queued device work (a no-op on CPU, where ops run synchronously)."""
        if self.is_cuda:
            self.cuda.synchronize(self.device)

    def now(self) -> float:
        """A timestamp (seconds) that is exact for device work: synchronizes first."""
        self.synchronize()
        return time.perf_counter()

    def set_device(self) -> None:
        """Make this rank's GPU the current device of the calling thread (call first in every thread
        that touches CUDA: a new thread starts on device 0 and would create a context there)."""
        if self.is_cuda:
            self.cuda.set_device(self.device)

    # -- streams (None on CPU) ---------------------------------------------------------
    def new_stream(self):
        """A new side stream on this rank's device; None on CPU."""
        return self.cuda.Stream(self.device) if self.is_cuda else None

    def current_stream(self):
        """The calling thread's current stream; None on CPU."""
        return self.cuda.current_stream(self.device) if self.is_cuda else None

    def use_stream(self, stream) -> contextlib.AbstractContextManager:
        """Queue work on ``stream`` inside the block (``torch.cuda.stream``); a null context on CPU."""
        if self.is_cuda and stream is not None:
            return self.cuda.stream(stream)
        return contextlib.nullcontext()

    def record_event(self, stream=None):
        """A (non-timing) event recorded on ``stream`` (default: current) for another stream to wait on;
        None on CPU."""
        if not self.is_cuda:
            return None
        ev = self.cuda.Event()
        ev.record(stream if stream is not None else self.current_stream())
        return ev

    def pin(self, tensor: torch.Tensor) -> torch.Tensor:
        """A page-locked copy of a host tensor, so a non-blocking copy to the GPU is truly asynchronous;
        the tensor itself on CPU."""
        if not self.is_cuda:
            return tensor
        return self.cuda_api.pin_memory(tensor) if self.cuda_api is not None else tensor.pin_memory()

    def record_stream(self, tensor: torch.Tensor, stream) -> None:
        """Tell the caching allocator that ``tensor`` is in use on ``stream`` until the work queued there
        now is done (``Tensor.record_stream``), so freeing it elsewhere cannot recycle it early; CPU: no-op."""
        if not self.is_cuda:
            return
        if self.cuda_api is not None:
            self.cuda_api.record_stream(tensor, stream)
        else:
            tensor.record_stream(stream)

    # -- timing ------------------------------------------------------------------------
    def mark(self, stream=None):
        """A point in time on the device's queue: a timing event recorded on ``stream`` (default: the
        current stream) on CUDA, a host timestamp on CPU.  Never synchronizes."""
        if not self.is_cuda:
            return HostMark(time.perf_counter())
        ev = self.cuda.Event(enable_timing=True)
        ev.record(stream if stream is not None else self.current_stream())
        return ev

    def elapsed(self, a, b) -> float:
        """Seconds from mark ``a`` to mark ``b``.  On CUDA both must have completed: call after
        :meth:`synchronize` (``elapsed_time`` raises on an event that has not)."""
        if isinstance(a, HostMark) and isinstance(b, HostMark):
            return b.t - a.t
        return a.elapsed_time(b) / 1e3  # milliseconds -> seconds

    # -- busy work (a straggler's delay) --------------------------------------------
    def busy(self, seconds: float) -> None:
        """Add ``seconds`` of work where this rank's step runs, never a sleep of the host.  CUDA: a spin
        kernel (``torch.cuda._sleep``, cycles) queued on the current (compute) stream, its cycles per second
        measured once with timing events; the host returns at once, as with any kernel.  CPU: a busy loop
        on the host, which competes for the cores as real work does."""
        if seconds <= 0:
            return
        if not self.is_cuda:
            end = time.perf_counter() + seconds
            while time.perf_counter() < end:
                pass
            return
        self.cuda._sleep(max(1, int(seconds * self.spin_rate())))

    def spin_rate(self) -> float:
        """Cycles of ``torch.cuda._sleep`` per second on this GPU, timed with events (cached per device)."""
        key = (id(self.cuda), str(self.device))
        if key not in _SPIN_RATE:
            self.cuda._sleep(1000)  # the first launch pays for loading the kernel
            cycles = 20_000_000  # ~10 ms at the clocks of current GPUs
            a = self.mark()
            self.cuda._sleep(cycles)
            b = self.mark()
            self.synchronize()
            _SPIN_RATE[key] = cycles / self.elapsed(a, b)
        return _SPIN_RATE[key]

    # -- memory ------------------------------------------------------------------------
    def memory_window(self) -> MemoryWindow:
        """Open a peak-memory window now; ``close()`` it (or use it as a context manager) at the end."""
        return MemoryWindow(self).open()

    def free_memory(self, local_ranks: int = 1) -> int:
        """Bytes this rank may fill.  CUDA: its GPU's free memory as the driver sees it (``mem_get_info``) plus the
        caching allocator's reserved-but-free blocks (``memory_reserved - memory_allocated``: blocks of freed tensors
        that torch keeps, which the driver counts as used but torch hands out again); on CPU its share of the host's
        available RAM, which the ``local_ranks`` ranks on the host share."""
        if self.is_cuda:
            cached = int(self.cuda.memory_reserved(self.device)) - int(self.cuda.memory_allocated(self.device))
            return int(self.cuda.mem_get_info(self.device)[0]) + max(0, cached)
        return host_available_memory() // max(1, local_ranks)

    def describe(self) -> dict:
        info = {"device_type": self.device_type, "backend": self.backend, "device": str(self.device)}
        if self.is_cuda:
            info["device_name"] = self.cuda.get_device_name(self.device)
        return info


def select_platform(device: str | None = None, local_rank: int = 0, local_world_size: int = 1) -> Platform:
    """NCCL on this rank's GPU where CUDA is available, gloo on CPU where it is not; ``device`` overrides.

    Never falls back to CPU on a machine with CUDA unless asked (``device='cpu'``): a GPU machine with
    fewer visible GPUs than local ranks is an error naming both counts, not a silent CPU run, except where a
    scheduler bound GPUs to each process (:func:`bound_per_process`: SLURM's gpu-bind), where every rank takes the
    first GPU it sees."""
    if device not in (None, "cpu", "cuda"):
        raise ValueError(f"--device {device!r}: allowed values are 'cpu' and 'cuda'")
    if device == "cpu":
        return Platform("cpu", "gloo", local_rank)
    if device == "cuda":
        require_cuda("--device cuda")
    elif not torch.cuda.is_available():
        return Platform("cpu", "gloo", local_rank)
    n = cuda_device_count()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if n < local_world_size and n >= 1 and visible is not None and bound_per_process():
        # the scheduler gave this process its own GPU(s) (SLURM gpu-bind): its GPU is the first it sees; ranks that
        # were handed the same GPU are NCCL's "Duplicate GPU detected" error at the first collective
        return Platform("cuda", "nccl", local_rank, device_index=0)
    if n < local_world_size:
        raise CudaUnavailable(
            f"{local_world_size} local ranks need a GPU each; torch sees {n} on this machine"
            + (f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else "")
            + ": start at most that many ranks per node, or ask for the CPU with --device cpu"
        )
    return Platform("cuda", "nccl", local_rank)


def bound_per_process(environ=None) -> bool:
    """Whether a scheduler bound the GPUs to each process rather than to the job: a SLURM task (``SLURM_LOCALID``)
    of a step with GPUs (``SLURM_STEP_GPUS`` or ``SLURM_JOB_GPUS``), whose ``CUDA_VISIBLE_DEVICES`` is its own."""
    env = os.environ if environ is None else environ
    return "SLURM_LOCALID" in env and any(env.get(k) for k in ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS"))


def platform_of(tensors, group=None) -> Platform:
    """The platform of a user's own process group (no fleetbench rank context): the device of the first of
    ``tensors`` (the parameters) and the group's backend, so NCCL on GPUs takes the CUDA paths."""
    dev = next((t.device for t in tensors), torch.device("cpu"))
    return Platform("cuda" if dev.type == "cuda" else "cpu", str(dist.get_backend(group)), dev.index or 0)


def default_threads(local_world_size: int, num_threads: int | None = None) -> int:
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


BARRIERS = ("both", "start", "none")


def timed_block(fn: Callable[[], Any], reps: int, platform: Platform, barriers: str = "both",
                cpu_s: list[float] | None = None) -> float:
    """Seconds per call of ``reps`` back-to-back ``fn()`` calls, the device's queued work included (the clock
    starts and stops after a synchronize: NCCL calls return once queued).  The one timed block of the suite
    (``suite.measure.interleave`` re-exports it for the interleaved timings; ``fleetbench comm``'s sweep times
    through it too).

    ``barriers``: ``"both"``, a barrier at each end and the clock read after the second (the block lasts until
    the slowest rank is done: what the collectives cost the job); ``"start"``, the ranks start together and
    each stops its own clock (the parent takes the slowest); ``"none"``, this rank alone.  ``cpu_s``: if given,
    the process's CPU seconds per call over the same span are appended to it."""
    if barriers not in BARRIERS:
        raise ValueError(f"barriers={barriers!r}: allowed {', '.join(BARRIERS)}")
    if barriers != "none":
        dist.barrier()
    c0 = time.process_time()
    t0 = platform.now()
    for _ in range(reps):
        fn()
    platform.synchronize()
    if cpu_s is not None:
        cpu_s.append((time.process_time() - c0) / reps)
    if barriers == "both":
        dist.barrier()
    return (time.perf_counter() - t0) / reps
