"""Timing cases on the ranks: the one step loop, interleaved variants, and prepared cases.

Two ways in, one loop (:func:`timed_window`) and one per-case state (:class:`TimedCase`):

- :func:`time_on_rank` (``fleetbench run``, figures): builds one engine per variant on the
  same workload (same model seed, same batches), warms each up, then runs ``rounds`` rounds;
  in each round every variant runs one *window* of ``steps`` steps, in an order rotated round
  by round (A B C, B C A, …: :func:`suite.measure.interleave.interleaved_rounds`), so slow
  drifts of a noisy machine hit every variant alike.
- :func:`prepare_case` / :func:`run_window` / :func:`drop_case` (pytest-benchmark, asv and
  `ab`'s trial server, which time rounds themselves): the case's engine is built and warmed up
  once and kept on the rank, and each call runs one window.

What a rank answers is typed: :class:`RankTiming` (per variant a :class:`VariantTiming`),
:class:`WindowTiming` (one window of a prepared case), :class:`CasePrepared`.

Two figures per window:
- the window time, with a barrier only at its two ends (per-step barriers would hide
  stragglers, and the gains of strategies that let ranks drift, such as Local SGD);
- per-step times (host timestamps on CPU; CUDA events on GPU, resolved at the window's end,
  so timing adds no device sync inside the window).
"""
from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch
import torch.distributed as dist

from ..comm import collectives as C
from ..config import StrategyConfig
from ..runtime.context import current
from ..runtime.device import default_threads
from ..runtime.torchrun import rebuild_world_on_rank
from ..strategies.fetch import LossFetcher
from ..workload import Workload, WorkloadSpec, workload
from .interleave import interleaved_rounds
from .utilization import CpuSpan

__all__ = ["time_on_rank", "prepare_case", "run_window", "drop_case", "prepared_cases", "rebuild_on_rank",
           "straggler_for_step", "StepClock", "Window", "timed_window", "TimedCase", "footprint_bytes", "VariantTiming",
           "RankTiming", "WindowTiming", "CasePrepared"]


def straggler_for_step(step: int, world: int, seed: int = 0) -> int:
    """The rank that straggles at ``step``: seeded, a different draw each step, the same on every rank."""
    return random.Random(seed * 7_777_777 + step).randrange(world)


class StepClock:
    """Marks step boundaries without syncing the device (``platform.mark``: a CUDA timing event on the
    current stream, a host timestamp on CPU); converts them to seconds after one synchronize at the end."""

    def __init__(self, platform):
        self.platform = platform
        self.marks: list = []

    def mark(self) -> None:
        self.marks.append(self.platform.mark())

    def durations(self) -> list[float]:
        self.platform.synchronize()
        return [self.platform.elapsed(a, b) for a, b in zip(self.marks, self.marks[1:])]


@dataclass
class Window:
    """One timed window: its wall time (barriers at both ends only), per-step times, every step's loss."""

    seconds: float
    step_times: list
    losses: list
    host_syncs: int
    cpu: dict | None = None  # a recorded window's CpuSpan (TimedCase.window): this rank's and the machine's CPU time


@dataclass
class VariantTiming:
    """What one rank measured of one variant over its recorded windows (:meth:`TimedCase.result`): what
    :mod:`suite.measure.summary` folds into the variant's metrics."""

    windows: list[float]  # each recorded window's seconds (barriers at both ends only)
    step_times: list[float]  # every recorded step's seconds
    losses: list[float]  # every recorded step's loss
    threads: int  # intra-op threads this rank ran with
    comm_calls_per_step: dict[str, float]  # per "group label/collective", the last recorded window's
    comm_bytes_per_step: dict[str, float]
    host_syncs: int  # device-to-host syncs (loss fetches) in the recorded windows
    describe: dict  # the engine's describe(): strategy, buckets, fusion counts .., and the precision
    threads_observed: list[int] = field(default_factory=list)  # torch.get_num_threads() inside the windows
    straggler_sleeps: int = 0  # steps this rank slept as the straggler
    peak_memory_bytes: int = 0  # the largest transient rise above a window's start
    peak_memory_kind: str = ""
    footprint_bytes: int = 0  # what the engine holds between steps (footprint_bytes)
    machine: dict | None = None  # CpuSpan.to_dict(): this rank's and the machine's CPU time in the windows


@dataclass
class RankTiming:
    """One rank's answer to :func:`time_on_rank` (and :func:`prepared_result`): per variant, its timing.

    Kept as JSON by the figures that save their raw data (:meth:`to_dict`, read back by :meth:`from_dict`)."""

    rank: int
    variants: dict[str, VariantTiming]

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> RankTiming:
        return cls(data["rank"], {n: VariantTiming(**v) for n, v in data["variants"].items()})


@dataclass
class WindowTiming:
    """One rank's answer to :func:`run_window`: one recorded window of a prepared case."""

    rank: int
    window_s: float
    step_times_s: list[float]
    losses: list[float]
    machine: dict | None = None  # the window's CpuSpan.to_dict()


@dataclass
class CasePrepared:
    """One rank's answer to :func:`prepare_case`: what the engine set up."""

    rank: int
    describe: dict


def timed_window(platform, n: int, step: Callable[[], torch.Tensor], fetch_frequency: int = 1) -> Window:
    """Run ``step()`` ``n`` times between two barriers; losses fetched to the host every ``fetch_frequency``."""
    fetcher = LossFetcher(fetch_frequency)
    clock = StepClock(platform)
    dist.barrier()
    t0 = time.perf_counter()
    clock.mark()
    for _ in range(n):
        fetcher.push(step())
        clock.mark()
    fetcher.flush()
    platform.synchronize()
    dist.barrier()
    return Window(time.perf_counter() - t0, clock.durations(), fetcher.values, fetcher.fetches)


def footprint_bytes(engine) -> int:
    """Bytes the engine holds between steps on this rank: parameters, gradients, gradient buckets and
    optimizer state (torch.optim's per-parameter state, or a fused optimizer's flat buffers), each storage
    counted once (a gradient that is a view into a bucket adds nothing).  DDP's own buckets are internal to
    its reducer: only the gradients (views into them when ``gradient_as_bucket_view``) are seen."""
    opt = engine.optimizer
    tensors = [t for p in engine.module.parameters() for t in (p.data, p.grad)]
    tensors += [b.flat for b in getattr(engine.grad_sync, "buckets", None) or []]
    if hasattr(opt, "groups"):  # a fused optimizer: flat parameters, gradients, state and scratch per group
        held = [v for g in opt.groups for v in vars(g).values()]
    else:  # torch.optim: per-parameter state
        held = list(opt.state.values())
    tensors += [t for v in held for t in (v.values() if isinstance(v, dict) else [v])]
    storages = {}
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            continue
        for part in ((t._indices(), t._values()) if t.layout == torch.sparse_coo else (t,)):  # a sparse gradient
            st = part.untyped_storage()
            storages[(str(part.device), st.data_ptr())] = st.nbytes()
    return sum(storages.values())


class TimedCase:
    """One case's engine on one workload, and everything its recorded windows measured on this rank."""

    def __init__(self, name: str, config: StrategyConfig, wl: Workload):
        self.name = name
        self.config = config
        self.wl = wl
        self.engine = wl.engine(config)
        wl.prepare_batches()  # every timing batch on the device before any window
        if config.straggler_ms and wl.platform.is_cuda:
            wl.platform.spin_rate()  # the straggler's spin kernel calibrated (one synchronize) outside any window
        self.threads = default_threads(current().local_world_size, config.num_threads)
        self.step_no = 0  # steps run by this case (its batches and stragglers follow it)
        self.windows: list[float] = []
        self.step_times: list[float] = []
        self.losses: list[float] = []
        self.comm_calls: dict = {}
        self.comm_bytes: dict = {}
        self.host_syncs = 0
        self.threads_observed: set = set()  # torch.get_num_threads() inside the recorded windows
        self.straggler_sleeps = 0  # steps this rank slept in the recorded windows
        # transient memory: the largest peak above a window's start (platform.memory_window), recorded as
        # ``peak_memory_bytes``; what the engine holds between steps is ``footprint_bytes``
        self.peak_memory = 0
        self.peak_memory_kind = ""
        # the machine's state: this rank's and the machine's CPU time from the first recorded window's start to
        # the last one's end (``span``: one shared by the variants timed together, set by time_on_rank), else
        # summed window by window (prepared cases, whose windows come one call at a time)
        self.span: CpuSpan | None = None
        self.windows_cpu = {"cpu_s": 0.0, "host_busy_s": 0.0, "host_total_s": 0.0}

    def window(self, n: int, record: bool = True) -> Window:
        """``n`` steps between two barriers; recorded windows add to this case's figures."""
        platform, world, rank, seed = self.wl.platform, self.wl.world, self.wl.rank, self.wl.ws.seed
        cfg = self.config
        torch.set_num_threads(self.threads)
        C.STATS.reset()
        sleeps = 0
        memory = platform.memory_window()  # this window's peak above what was in use at its start

        def step() -> torch.Tensor:
            nonlocal sleeps
            self.step_no += 1
            if cfg.straggler_ms and straggler_for_step(self.step_no, world, seed) == rank:
                if platform.is_cuda:  # a spin kernel on the compute stream: a host sleep hides behind queued work
                    platform.busy(cfg.straggler_ms / 1e3)
                else:
                    time.sleep(cfg.straggler_ms / 1e3)
                sleeps += 1
            x, y = self.wl.batch(self.step_no)
            return self.engine.train_step(x, y)

        if record and self.span is not None and not self.span.started:
            self.span.begin()
        one = CpuSpan().begin() if record else None
        w = timed_window(platform, n, step, cfg.fetch_frequency)
        if one is not None:
            one.end()
            for k in self.windows_cpu:
                self.windows_cpu[k] += getattr(one, k)
            w.cpu = one.to_dict()
            if self.span is not None:
                self.span.end()
        memory.close()
        if record:
            self.windows.append(w.seconds)
            self.step_times.extend(w.step_times)
            self.losses.extend(w.losses)
            self.host_syncs += w.host_syncs
            self.threads_observed.add(torch.get_num_threads())
            self.straggler_sleeps += sleeps
            self.peak_memory = max(self.peak_memory, memory.peak_above_start)
            self.peak_memory_kind = memory.kind
            snap = C.STATS.snapshot()
            self.comm_calls = {k: v / n for k, v in snap["calls"].items()}
            self.comm_bytes = {k: v / n for k, v in snap["bytes"].items()}
        return w

    def result(self) -> VariantTiming:
        """What this rank measured, in the form :mod:`suite.measure.summary` reads."""
        return VariantTiming(
            windows=self.windows, step_times=self.step_times, losses=self.losses, threads=self.threads,
            comm_calls_per_step=self.comm_calls, comm_bytes_per_step=self.comm_bytes, host_syncs=self.host_syncs,
            describe=self.engine.describe(), threads_observed=sorted(self.threads_observed),
            straggler_sleeps=self.straggler_sleeps, peak_memory_bytes=self.peak_memory,
            peak_memory_kind=self.peak_memory_kind, footprint_bytes=footprint_bytes(self.engine),
            machine=self.span.to_dict() if self.span is not None and self.span.started
            else dict(CpuSpan().to_dict(), **self.windows_cpu))


def time_on_rank(workload_spec: WorkloadSpec, variants: list[dict], warmup: int = 2, steps: int = 5,
                 rounds: int = 5) -> RankTiming:
    """Time every variant (``{"name": …, "config": {…}}``) on this rank; see the module docstring."""
    wl = workload(workload_spec)
    runs = [TimedCase(v["name"], StrategyConfig.from_dict(v["config"]), wl) for v in variants]
    span = CpuSpan()  # the variants' windows interleave: one span over all their recorded rounds
    for tc in runs:
        tc.span = span
    threads_before = torch.get_num_threads()
    try:
        interleaved_rounds(runs, rounds, lambda tc: tc.window(steps), warmup=lambda tc: tc.window(warmup, record=False))
    finally:
        torch.set_num_threads(threads_before)  # the rank's own setting, for whatever runs next
    return RankTiming(wl.rank, {tc.name: tc.result() for tc in runs})


# ---- prepared cases: harnesses that time rounds themselves (pytest-benchmark, asv) -----------------
_PREPARED: dict[str, TimedCase] = {}


def prepare_case(key: str, workload_spec: WorkloadSpec, config: dict, warmup: int = 2) -> CasePrepared:
    """Build (once) and warm up the engine of ``key``; returns what the engine set up."""
    if key not in _PREPARED:
        tc = _PREPARED[key] = TimedCase(key, StrategyConfig.from_dict(config), workload(workload_spec))
        if warmup:
            tc.window(warmup, record=False)
    return CasePrepared(current().rank, _PREPARED[key].engine.describe())


def run_window(key: str, steps: int, warmup: int = 0) -> WindowTiming:
    """``warmup`` steps not recorded, then one recorded window of ``steps`` steps of the prepared case ``key``."""
    if key not in _PREPARED:
        raise KeyError(f"case {key!r} is not prepared on rank {current().rank}; call prepare_case first "
                       f"(prepared: {sorted(_PREPARED)})")
    tc = _PREPARED[key]
    before = torch.get_num_threads()
    try:
        if warmup:
            tc.window(warmup, record=False)
        w = tc.window(steps)
    finally:
        torch.set_num_threads(before)
    return WindowTiming(tc.wl.rank, w.seconds, w.step_times, w.losses, w.cpu)


def prepared_result(key: str) -> RankTiming:
    """Everything the prepared case's recorded windows measured on this rank (as :func:`time_on_rank`)."""
    tc = _PREPARED[key]
    return RankTiming(tc.wl.rank, {key: tc.result()})


def drop_case(key: str) -> bool:
    return _PREPARED.pop(key, None) is not None


def prepared_cases() -> list:
    return sorted(_PREPARED)


def rebuild_on_rank(tag: str) -> int:
    """After a rank error: every prepared case dropped (its engine holds the old world's communicators, on which a
    peer may have left a collective queued), then the world rebuilt (``rebuild_world_on_rank``: NCCL's communicators
    aborted, gloo's group destroyed, a new one joined under ``tag``).  Returns how many cases were dropped."""
    dropped = len(_PREPARED)
    _PREPARED.clear()
    rebuild_world_on_rank(tag)
    return dropped
