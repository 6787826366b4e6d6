"""Timing variants of a case, interleaved in one process group.

:func:`measure_on_rank` runs on every rank.  It builds one engine per variant (same model
seed, same data), warms each up, then runs ``rounds`` rounds; in each round every variant
runs one *window* of ``steps`` steps, in an order rotated round by round (A B C, B C A, …),
so slow drifts of a noisy machine hit every variant alike.

Two figures per window:
- the window time, with a barrier only at its two ends (per-step barriers would hide
  stragglers, and the gains of strategies that let ranks drift, such as Local SGD);
- per-step times (host timestamps; CUDA events on GPU, resolved at the window's end, so
  timing adds no device sync inside the window).
"""
from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist

from ..comm import collectives as C
from ..config import StrategyConfig
from ..data.synthetic import make_dataset, prepare, shard, step_indices
from ..engine import build_engine
from ..models import get_model
from ..runtime.context import current
from ..runtime.device import default_threads
from ..strategies.fetch import LossFetcher

__all__ = ["measure_on_rank", "straggler_for_step", "StepClock", "Window", "timed_window"]


def straggler_for_step(step: int, world: int, seed: int = 0) -> int:
    """The rank that straggles at ``step``: seeded, a different draw each step, the same on every rank."""
    return random.Random(seed * 7_777_777 + step).randrange(world)


class StepClock:
    """Marks step boundaries without syncing the device; converts them to seconds at the end."""

    def __init__(self, platform):
        self.cuda = platform.is_cuda
        self.marks: list = []

    def mark(self) -> None:
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self.marks.append(ev)
        else:
            self.marks.append(time.perf_counter())

    def durations(self) -> list[float]:
        if self.cuda:
            torch.cuda.synchronize()
            return [a.elapsed_time(b) / 1e3 for a, b in zip(self.marks, self.marks[1:])]
        return [b - a for a, b in zip(self.marks, self.marks[1:])]


@dataclass
class Window:
    """One timed window: its wall time (barriers at both ends only), per-step times, every step's loss."""

    seconds: float
    step_times: list
    losses: list
    host_syncs: int


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


class _Variant:
    def __init__(self, name: str, config: StrategyConfig, spec, seed: int, scale: int, device):
        self.name = name
        self.config = config
        net = spec.make(seed, device)
        self.engine = build_engine(net, spec.loss_fn, config)
        self.threads = default_threads(current().local_world_size, config.num_threads)
        self.windows: list[float] = []
        self.step_times: list[float] = []
        self.losses: list[float] = []
        self.comm_calls: dict = {}
        self.comm_bytes: dict = {}
        self.host_syncs = 0
        self.threads_observed: set = set()  # torch.get_num_threads() inside the recorded windows
        self.straggler_sleeps = 0  # steps this rank slept in the recorded windows
        self.peak_memory = 0


def _peak_memory(platform) -> int:
    """CUDA: peak bytes allocated in the window; CPU: the rank process's peak RSS (all variants share it)."""
    if platform.is_cuda:
        return int(torch.cuda.max_memory_allocated(platform.device))
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux reports KiB


def measure_on_rank(model: str, variants: list[dict], warmup: int = 2, steps: int = 5, rounds: int = 5,
                    per_rank_batch: int = 16, seed: int = 0, scale: int = 1, dataset_size: int = 1024) -> dict:
    """Time every variant (``{"name": …, "config": {…}}``) on this rank; see the module docstring."""
    ctx = current()
    device, world, rank = ctx.platform.device, ctx.world_size, ctx.rank
    spec = get_model(model)
    data = make_dataset(spec, dataset_size, seed)
    nbatches = max(1, min(16, dataset_size // (per_rank_batch * world)))
    batches = []
    for b in range(nbatches):
        x, y = data.get(shard(step_indices(len(data), b, per_rank_batch * world, seed), rank, world))
        batches.append((prepare(data, x, device), y.to(device)))

    runs = [_Variant(v["name"], StrategyConfig.from_dict(v["config"]), spec, seed, scale, device) for v in variants]
    step_no = 0

    def window(v: _Variant, n: int, record: bool) -> None:
        torch.set_num_threads(v.threads)
        C.STATS.reset()
        sleeps = 0
        if ctx.platform.is_cuda:
            torch.cuda.reset_peak_memory_stats(device)

        def step() -> torch.Tensor:
            nonlocal step_no, sleeps
            step_no += 1
            if v.config.straggler_ms and straggler_for_step(step_no, world, seed) == rank:
                time.sleep(v.config.straggler_ms / 1e3)
                sleeps += 1
            x, y = batches[step_no % nbatches]
            return v.engine.train_step(x, y)

        w = timed_window(ctx.platform, n, step, v.config.fetch_frequency)
        if record:
            v.windows.append(w.seconds)
            v.step_times.extend(w.step_times)
            v.losses.extend(w.losses)
            v.host_syncs += w.host_syncs
            v.threads_observed.add(torch.get_num_threads())
            v.straggler_sleeps += sleeps
            v.peak_memory = max(v.peak_memory, _peak_memory(ctx.platform))
            v.comm_calls = {k: n_ / n for k, n_ in C.STATS.snapshot()["calls"].items()}
            v.comm_bytes = {k: n_ / n for k, n_ in C.STATS.snapshot()["bytes"].items()}

    threads_before = torch.get_num_threads()
    try:
        for v in runs:
            window(v, warmup, record=False)
        for r in range(rounds):
            order = runs[r % len(runs):] + runs[:r % len(runs)]
            for v in order:
                window(v, steps, record=True)
    finally:
        torch.set_num_threads(threads_before)  # the rank's own setting, for whatever runs next

    return {
        "rank": rank,
        "variants": {
            v.name: {
                "windows": v.windows, "step_times": v.step_times, "losses": v.losses, "threads": v.threads,
                "comm_calls_per_step": v.comm_calls, "comm_bytes_per_step": v.comm_bytes,
                "host_syncs": v.host_syncs, "describe": v.engine.describe(),
                "threads_observed": sorted(v.threads_observed), "straggler_sleeps": v.straggler_sleeps,
                "peak_memory_bytes": v.peak_memory,
                "peak_memory_kind": "cuda_max_allocated" if ctx.platform.is_cuda else "process_max_rss",
            }
            for v in runs
        },
    }
