"""Utilization sampled in a background thread while a case runs.

On CUDA: the utilization (%), memory used (bytes) and power (W) of every GPU this process can
see, through NVML (``pynvml``, imported lazily).  ``gpus[i]`` is ``cuda:i``: NVML numbers the
machine's GPUs itself, so the visible ones are found from ``CUDA_VISIBLE_DEVICES`` (indices or
``GPU-``/``MIG-`` UUIDs; :func:`visible_nvml_handles`).  On CPU: the host's CPU utilization (%)
from ``/proc/stat`` deltas (psutil is not a dependency).  What cannot be sampled says why,
plainly, in the summary's ``unavailable`` field; sampling never fails a case.

Under torchrun every rank runs the same code; only local rank 0 of each node samples (one
sampler per machine: they would all sample the same GPUs and host), and the runner gathers every
node's summary to rank 0 (``utilization["nodes"]``, each with its ``host``), so every node's GPUs
are seen, not only rank 0's.

    with UtilizationSampler(interval=0.2) as sampler:
        ...                       # the case runs
    metrics = Metrics(utilization=sampler.summary())

The machine's state beside a case's timings: :class:`CpuSpan` (a rank's own CPU time and the machine's, from
/proc/stat, over its recorded windows), :func:`others_cpu` (what processes other than the ranks took) and
:func:`busy_reason`, the one rule `run`, `compare`, `ab` and the report state ("machine busy: timings
unreliable" above :data:`BUSY_SHARE` of the machine's CPU time, or a load average above the cores by more than
:data:`LOAD_MARGIN`).
"""
from __future__ import annotations

import math
import os
import socket
import statistics
import threading
import time

from ..results.records import Metrics

__all__ = ["UtilizationSampler", "read_proc_stat", "cpu_busy_fraction", "visible_nvml_handles", "samples_here",
           "CpuSpan", "host_cpu_seconds", "busy_reason", "BUSY", "BUSY_SHARE", "LOAD_MARGIN", "others_cpu"]

# The machine's state beside the timings: another process's CPU time during a case's windows, or a load average
# above the cores, makes them unreliable.  The rule, stated once (run, compare, ab and the report say it):
BUSY = "machine busy: timings unreliable"
BUSY_SHARE = 0.10  # others' CPU time over this share of the machine's CPU time during the windows
# The load average counts the run itself: ranks that fill the cores, their communication threads and the parent
# put it a little above the cores on a quiet machine (2.13 on 2 cores, others' CPU 0.0%, in `make run`), so the
# load says "busy" only above the cores by more than one process's worth; others' CPU time is the direct measure.
LOAD_MARGIN = 1.0
CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100  # /proc/stat's unit, per second


def visible_nvml_handles(nvml, environ: dict | None = None) -> list[tuple[str, object]]:
    """``[(NVML id, handle)]`` of the GPUs this process sees, in CUDA's order (``cuda:0`` first).

    ``CUDA_VISIBLE_DEVICES`` lists NVML indices or UUIDs (``GPU-…``, ``MIG-…``); unset, every GPU.
    Indices are CUDA's enumeration order, which is NVML's (PCI bus order) on a node of identical GPUs
    or with ``CUDA_DEVICE_ORDER=PCI_BUS_ID``.  An entry NVML does not know raises: no other GPU is
    sampled in its place."""
    env = os.environ if environ is None else environ
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return [(str(i), nvml.nvmlDeviceGetHandleByIndex(i)) for i in range(nvml.nvmlDeviceGetCount())]
    out = []
    for token in (t.strip() for t in visible.split(",")):
        if not token:
            continue
        if token.lstrip("-").isdigit():
            if int(token) < 0:
                break  # CUDA stops at the first invalid entry
            out.append((token, nvml.nvmlDeviceGetHandleByIndex(int(token))))
        else:
            out.append((token, nvml.nvmlDeviceGetHandleByUUID(token)))
    return out


def samples_here(environ: dict | None = None) -> bool:
    """False on every torchrun rank but local rank 0 (one sampler per node)."""
    env = os.environ if environ is None else environ
    return env.get("LOCAL_RANK", "0") == "0"


def read_proc_stat(path: str = "/proc/stat") -> tuple[int, int] | None:
    """(busy, total) jiffies of all CPUs, or None where /proc/stat is absent."""
    try:
        with open(path) as fh:
            first = fh.readline().split()
    except OSError:
        return None
    if not first or first[0] != "cpu":
        return None
    vals = [int(v) for v in first[1:]]
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0)  # idle + iowait
    total = sum(vals[:8])  # guest time is already counted in user
    return total - idle, total


def cpu_busy_fraction(before: tuple[int, int], after: tuple[int, int]) -> float | None:
    busy = after[0] - before[0]
    total = after[1] - before[1]
    return busy / total if total > 0 else None


def host_cpu_seconds() -> tuple[float, float] | None:
    """(busy, total) CPU seconds of the whole machine since boot, every core summed (/proc/stat), or None."""
    got = read_proc_stat()
    return None if got is None else (got[0] / CLK_TCK, got[1] / CLK_TCK)


class CpuSpan:
    """This process's CPU time (every thread: ``time.process_time``) and the machine's busy and total CPU time
    (``/proc/stat``) from :meth:`begin` to the latest :meth:`end`.  A rank's spans, summed over its ranks, are the
    ranks' own CPU time; the machine's busy time less the ranks' is everyone else's (:func:`others_cpu`).
    /proc/stat counts in ticks (10 ms a core), so a span is best long: a timing call's rounds, not one window."""

    def __init__(self) -> None:
        self._start: tuple | None = None
        self.cpu_s = 0.0
        self.host_busy_s = math.nan
        self.host_total_s = math.nan

    @property
    def started(self) -> bool:
        return self._start is not None

    def begin(self) -> CpuSpan:
        self._start = (time.process_time(), host_cpu_seconds())
        return self

    def end(self) -> CpuSpan:
        """Measure from :meth:`begin` to now (a later ``end`` replaces an earlier one)."""
        if self._start is None:
            raise RuntimeError("CpuSpan.end() before begin()")
        cpu0, host0 = self._start
        host1 = host_cpu_seconds()
        self.cpu_s = time.process_time() - cpu0
        if host0 is not None and host1 is not None:
            self.host_busy_s, self.host_total_s = host1[0] - host0[0], host1[1] - host0[1]
        return self

    def to_dict(self) -> dict:
        return {"cpu_s": self.cpu_s, "host_busy_s": self.host_busy_s, "host_total_s": self.host_total_s,
                "host": socket.gethostname()}


def others_cpu(ranks: list[dict]) -> tuple[float, float]:
    """(seconds, share) of the machine's CPU time that processes other than the ranks took, from the ranks'
    :meth:`CpuSpan.to_dict` (the first rank's host: the ranks there, and that machine's /proc/stat): the
    machine's busy time less the ranks' own, over the machine's whole CPU time (every core) in the span.
    (nan, nan) where /proc/stat was not readable."""
    first = ranks[0] if ranks else {}
    busy, total = first.get("host_busy_s", math.nan), first.get("host_total_s", math.nan)
    if not (math.isfinite(busy) and math.isfinite(total) and total > 0):
        return math.nan, math.nan
    own = sum(r.get("cpu_s", 0.0) for r in ranks if r.get("host") == first.get("host"))
    others = max(0.0, busy - own)  # ticks against nanoseconds: a quiet machine can come out a hair below 0
    return others, others / total


def busy_reason(metrics: Metrics, share: float = BUSY_SHARE) -> str | None:
    """Why a case's timings are unreliable ("machine busy: ..."), or None: other processes' CPU time over
    ``share`` of the machine's during its windows (``others_cpu_share``), or a 1-minute load average at the
    start or end of its timing above the machine's cores by more than :data:`LOAD_MARGIN` (``load_avg_start``/
    ``load_avg_end``, ``cpu_cores``).
    ``metrics``: a record's metrics, or a :class:`Metrics` of those five alone (`ab`'s comparison of a case)."""
    why = []
    others = metrics.others_cpu_share
    if isinstance(others, (int, float)) and math.isfinite(others) and others > share:
        why.append(f"other processes took {others:.0%} of the CPU during the windows (over {share:.0%})")
    cores = metrics.cpu_cores
    loads = [x for x in (metrics.load_avg_start, metrics.load_avg_end)
             if isinstance(x, (int, float)) and math.isfinite(x)]
    if isinstance(cores, int) and cores > 0 and loads and max(loads) > cores + LOAD_MARGIN:
        why.append(f"load average {max(loads):.1f} above the {cores} cores by more than {LOAD_MARGIN:g}")
    return f"{BUSY} ({'; '.join(why)})" if why else None


class UtilizationSampler:
    """Samples in a daemon thread between ``start()`` and ``stop()`` (or as a context manager)."""

    def __init__(self, interval: float = 0.25, device: str = "cpu"):
        if not interval > 0:
            raise ValueError(f"interval={interval!r}: must be > 0 seconds")
        self.interval = interval
        self.device = device
        self.samples: list[dict] = []
        self.unavailable: list[str] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nvml = None
        self._handles: list = []
        self._nvml_ids: list = []
        self.active = samples_here()
        self.t_start: float | None = None
        self.t_stop: float | None = None

    # -- life cycle ------------------------------------------------------------------
    def start(self) -> UtilizationSampler:
        self.t_start = time.time()
        if not self.active:
            self.unavailable.append("not sampled on this rank: local rank 0 samples this node's GPUs and host")
            return self
        if self.device == "cuda":
            self._init_nvml()
        self._thread = threading.Thread(target=self._loop, name="fleetbench-utilization", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=max(5.0, 4 * self.interval))
        self.t_stop = time.time()
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:  # noqa: BLE001
                pass
            self._nvml = None

    def __enter__(self) -> UtilizationSampler:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _init_nvml(self) -> None:
        try:
            import pynvml

            pynvml.nvmlInit()
            pairs = visible_nvml_handles(pynvml)
            self._nvml_ids = [i for i, _ in pairs]
            self._handles = [h for _, h in pairs]
            self._nvml = pynvml
        except Exception as exc:  # noqa: BLE001 - NVML is optional
            self.unavailable.append(f"GPU utilization unavailable: NVML failed ({type(exc).__name__}: {exc})")

    # -- sampling --------------------------------------------------------------------------
    def _loop(self) -> None:
        prev = read_proc_stat()
        if prev is None:
            self.unavailable.append("CPU utilization unavailable: /proc/stat cannot be read on this system")
        stopped = False
        while not stopped:  # a sample every interval, and a last one at stop (a short run still gets one)
            stopped = self._stop.wait(self.interval)
            sample: dict = {"t": time.time()}
            if prev is not None:
                now = read_proc_stat()
                if now is not None:
                    frac = cpu_busy_fraction(prev, now)
                    if frac is not None:
                        sample["cpu_util_pct"] = 100.0 * frac
                    prev = now
            if self._nvml is not None:
                gpus = []
                for h in self._handles:
                    try:
                        u = self._nvml.nvmlDeviceGetUtilizationRates(h)
                        used = int(self._nvml.nvmlDeviceGetMemoryInfo(h).used)
                        gpus.append({"util_pct": float(u.gpu), "mem_used": used,
                                     "power_w": self._nvml.nvmlDeviceGetPowerUsage(h) / 1e3})
                    except Exception as exc:  # noqa: BLE001
                        gpus.append({"error": f"{type(exc).__name__}: {exc}"})
                sample["gpus"] = gpus
            self.samples.append(sample)

    def summary(self) -> dict:
        """Medians and maxima over the samples, plus the raw samples (small: a few per second)."""
        out: dict = {"interval_s": self.interval, "n": len(self.samples), "device": self.device,
                     "unavailable": list(self.unavailable), "sampled": self.active, "host": socket.gethostname()}
        if self._nvml_ids:
            out["nvml_ids"] = list(self._nvml_ids)  # gpus[i] is cuda:i, NVML's nvml_ids[i]
        if self.device != "cuda" and self.active:
            out["unavailable"].append("GPU utilization unavailable: no CUDA device (CPU run)")
        cpu = [s["cpu_util_pct"] for s in self.samples if "cpu_util_pct" in s]
        if cpu:
            out["cpu_util_pct"] = {"median": statistics.median(cpu), "max": max(cpu)}
        ngpu = max((len(s.get("gpus", [])) for s in self.samples), default=0)
        gpus = []
        for i in range(ngpu):
            rows = [s["gpus"][i] for s in self.samples if len(s.get("gpus", [])) > i and "util_pct" in s["gpus"][i]]
            if rows:
                gpus.append({k: {"median": statistics.median(r[k] for r in rows), "max": max(r[k] for r in rows)}
                             for k in ("util_pct", "mem_used", "power_w")})
        if gpus:
            out["gpus"] = gpus
        out["samples"] = self.samples
        return out
