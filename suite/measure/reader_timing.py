"""Timing training fed by a reader: samples/s and the time each step waits for its data.

:func:`measure_reader_on_rank` follows :mod:`suite.measure.timing`'s discipline (variants
interleaved in one process group, rotated round by round by ``interleaved_rounds``, barriers
only at a window's two ends) but draws every step's batch from the variant's reader instead
of pre-built tensors.  A window is ``epochs_per_window`` whole epochs, so a reader that restarts each epoch pays its
restart inside the window, as it would in training.

Caveat, stated with the figures: a reader with a background pipeline (double buffer, workers,
the infinite reader) keeps prefetching while the *other* variants' windows run, so it may
start a window with up to its prefetch depth of batches ready.  Windows of several epochs keep
that head start small; the per-step data wait is reported as a median, which it barely moves.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass

import torch

from ..config import StrategyConfig
from ..data.reader import build_reader, timed_next
from ..runtime.context import current
from ..runtime.device import default_threads
from ..workload import WorkloadSpec, workload
from .interleave import interleaved_rounds
from .timing import timed_window

__all__ = ["measure_reader_on_rank", "ReaderTiming", "ReaderVariant"]


@dataclass
class ReaderVariant:
    """What one rank measured of one reader variant."""

    windows: list[float]  # each window's seconds (a window: ``epochs_per_window`` whole epochs)
    data_wait_s: list[float]  # every step's wait for its batch
    step_times: list[float]
    losses: list[float]
    threads: int
    reader: str  # the reader's class
    worker_kind: str  # "process", "thread" or "none"


@dataclass
class ReaderTiming:
    """One rank's answer to :func:`measure_reader_on_rank` (kept as JSON by the reader figure: :meth:`to_dict`,
    read back by :meth:`from_dict`)."""

    rank: int
    steps_per_window: int
    variants: dict[str, ReaderVariant]

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> ReaderTiming:
        return cls(data["rank"], data["steps_per_window"],
                   {n: ReaderVariant(**v) for n, v in data["variants"].items()})


def _stream(reader) -> Iterator:
    epoch = 0
    while True:
        yield from reader.epoch(epoch)
        epoch += 1


def measure_reader_on_rank(workload_spec: WorkloadSpec, variants: list[dict], warmup: int = 1, rounds: int = 5,
                           epochs_per_window: int = 1, decode_work: int = 0) -> ReaderTiming:
    """Time every variant (``{"name": …, "config": {…}}``, reader knobs in the config) on this rank."""
    ctx = current()
    wl = workload(workload_spec)
    world, rank, seed, per_rank_batch = wl.world, wl.rank, wl.ws.seed, wl.per_rank_batch
    if wl.spec.data != "images":
        raise ValueError(f"model {wl.ws.model!r} trains on {wl.spec.data}; the reader benchmark needs an image model")
    data = wl.data
    runs = []
    for v in variants:
        cfg = StrategyConfig.from_dict(v["config"])
        reader = build_reader(data, cfg, per_rank_batch, rank, world, ctx.platform, seed=seed,
                              decode_work=decode_work)
        engine = wl.engine(cfg)
        runs.append({"name": v["name"], "config": cfg, "reader": reader, "engine": engine, "stream": _stream(reader),
                     "threads": default_threads(ctx.local_world_size, cfg.num_threads), "windows": [],
                     "waits": [], "step_times": [], "losses": []})
    steps = runs[0]["reader"].batches_per_epoch * epochs_per_window
    threads_before = torch.get_num_threads()

    def window(r: dict, n: int, record: bool) -> None:
        torch.set_num_threads(r["threads"])
        waits = []

        def step() -> torch.Tensor:
            # the time this step waited for its batch, the previous step's device work excluded
            (x, y), wait = timed_next(r["stream"], ctx.platform)
            waits.append(wait)
            return r["engine"].train_step(x, y)

        w = timed_window(ctx.platform, n, step, r["config"].fetch_frequency)
        if record:
            r["windows"].append(w.seconds)
            r["waits"].extend(waits)
            r["step_times"].extend(w.step_times)
            r["losses"].extend(w.losses)

    try:
        interleaved_rounds(runs, rounds, lambda r: window(r, steps, True),
                           warmup=lambda r: window(r, steps * warmup, False))
    finally:
        torch.set_num_threads(threads_before)
        for r in runs:
            r["reader"].close()
    return ReaderTiming(rank, steps, {
        r["name"]: ReaderVariant(r["windows"], r["waits"], r["step_times"], r["losses"], r["threads"],
                                 type(r["reader"]).__name__, getattr(r["reader"], "worker_kind", "none"))
        for r in runs})
