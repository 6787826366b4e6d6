"""Readers: the plain one and the optimized one, each optimization its own knob.

What a reader yields is fixed by :class:`BatchSource` (which samples, in which order, how
they are decoded and augmented); *how* it gets them to the device is the reader's business:

- :class:`PlainReader`: decode and normalize to float32 on the host, copy to the device,
  one batch at a time in the training loop, restarted each epoch; no prefetch, no workers.
- :class:`OptimizedReader`, driven by the config's reader knobs:
  ``reader_return_uint8`` (uint8 batches go to the device and are converted and normalized
  there, a quarter of the bytes to move), ``use_double_buffer`` (the next batch is prepared
  and copied while the current step runs: a background thread; on CUDA pinned memory, a side
  stream and non-blocking copies; the thread sets the rank's device first, as torch's pin-memory
  thread does, or it would create a context on GPU 0), ``use_infinite_reader`` (one pipeline for the whole run:
  persistent workers, no refill at each epoch), ``reader_num_workers`` (decode in worker
  processes, torch DataLoader; in worker threads inside a daemonic process such as the rank
  pool's ranks, which may not start children).
- ``reader_backend='dali'``: NVIDIA DALI on CUDA when installed; a clear error otherwise.

Sharding: each epoch draws a seeded permutation, pads it by wrapping around to a multiple of
the world size (as torch's DistributedSampler does) and gives rank r every world-th index
from r, so every rank has the same number of samples and batches, even when the dataset
size does not divide.  A rank that got fewer batches would hang in the last collective.

The "decode" is real: samples are stored zlib-compressed and decompressed per sample.
``decode_work`` > 0 adds a costly augmentation (a random per-sample flip and ``decode_work``
passes of an integer smoothing filter), for the data-bound benchmark case.  Its random draws come
from a private generator seeded from (seed, rank, step) (``suite.runtime.rng.step_seed``; a step is
a batch: epoch x batches per epoch + batch), so whichever thread or worker decodes a batch, and in
whatever order, a rank's batch is the same, and replayable.
Everything a reader yields is bit-for-bit the same whatever the knobs, on CPU and CUDA alike: the
normalization multiplies by constants (:func:`suite.data.synthetic.normalize`), which rounds the same
on the host and the device, where a division by a Python number would not.  The DALI backend is
the exception: its arithmetic is DALI's own (it may fuse into one multiply-add).

Every wait is bounded (``timeout``); a background thread never blocks shutdown.

Timing the data wait: :func:`timed_next` synchronizes the device *before* its timer starts.  On
CUDA a step's kernels are only queued when it returns; a blocking ``.to(device)`` (the plain
reader's copy) waits for them, so a timer started before the synchronize would count the previous
step's GPU work as data wait.
"""
from __future__ import annotations

import importlib.util
import math
import queue
import threading
import time
import zlib
from collections.abc import Iterator

import torch

from ..config import StrategyConfig
from ..runtime.device import CudaUnavailable, Platform, require_cuda
from ..runtime.rng import step_seed
from .synthetic import _INV_STD, _TO_UNIT, IMAGE_MEAN, normalize

__all__ = ["BatchSource", "EncodedImages", "PlainReader", "OptimizedReader", "build_reader", "ReaderError",
           "ReaderTimeout", "ReaderUnavailable", "shard_epoch", "augment", "CudaCopier", "reader_knobs_on",
           "timed_next"]

DEFAULT_TIMEOUT = 120.0


class ReaderError(ValueError):
    """Bad reader arguments (named, with what is allowed)."""


class ReaderTimeout(RuntimeError):
    """The reader did not produce a batch in time (a stuck or dead producer)."""


class ReaderUnavailable(RuntimeError):
    """The reader backend asked for is not available here."""


# ---------------------------------------------------------------------------------------------
# what is read: storage, decode, augmentation, sharding
# ---------------------------------------------------------------------------------------------

class EncodedImages:
    """A uint8 image dataset stored as one zlib-compressed record per sample (decoded on read)."""

    def __init__(self, images: torch.Tensor, targets: torch.Tensor, level: int = 1):
        if images.dtype != torch.uint8 or images.dim() != 4:
            raise ReaderError(f"images: expected a uint8 tensor (N, C, H, W), got {images.dtype} {tuple(images.shape)}")
        self.shape = tuple(images.shape[1:])
        self.records = [zlib.compress(images[i].contiguous().numpy().tobytes(), level) for i in range(len(images))]
        self.targets = targets.clone()

    @classmethod
    def from_dataset(cls, dataset, level: int = 1) -> EncodedImages:
        if getattr(dataset, "kind", None) != "images":
            raise ReaderError(f"the reader reads image datasets; got kind={getattr(dataset, 'kind', None)!r}")
        return cls(dataset.inputs, dataset.targets, level)

    def __len__(self) -> int:
        return len(self.records)

    def decode(self, i: int) -> torch.Tensor:
        raw = bytearray(zlib.decompress(self.records[i]))
        return torch.frombuffer(raw, dtype=torch.uint8).view(self.shape)


def augment(img: torch.Tensor, flip: bool, work: int) -> torch.Tensor:
    """Costly augmentation of one uint8 image (C, H, W): flipped along the width when ``flip`` (drawn by the
    caller), then ``work`` passes of the integer filter (l + 2c + r + 2) // 4 along the width.  Integer
    arithmetic: bit-for-bit the same anywhere."""
    if work <= 0:
        return img
    x = img.to(torch.int16)
    if flip:
        x = x.flip(-1)
    for _ in range(work):
        left = torch.cat([x[..., :1], x[..., :-1]], dim=-1)
        right = torch.cat([x[..., 1:], x[..., -1:]], dim=-1)
        x = torch.div(left + 2 * x + right + 2, 4, rounding_mode="floor")
    return x.to(torch.uint8)


def shard_epoch(n: int, epoch: int, rank: int, world: int, seed: int = 0) -> torch.Tensor:
    """Rank ``rank``'s sample indices for ``epoch``: a seeded permutation, wrapped around to a
    multiple of ``world``, every ``world``-th index from ``rank``.  Every rank gets ceil(n/world)."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + 104_729 * epoch + 17)
    perm = torch.randperm(n, generator=g)
    total = math.ceil(n / world) * world
    if total > n:
        perm = torch.cat([perm] * math.ceil(total / n))[:total]
    return perm[rank:total:world]


class BatchSource:
    """The batches one rank reads: sharding, batching, decode and augmentation (host, uint8)."""

    def __init__(self, data: EncodedImages, batch_size: int, rank: int, world: int, seed: int = 0,
                 decode_work: int = 0, drop_last: bool = False):
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ReaderError(f"batch_size={batch_size!r}: must be a whole number >= 1")
        if not isinstance(world, int) or world < 1 or not isinstance(rank, int) or not 0 <= rank < world:
            raise ReaderError(f"rank={rank!r}, world={world!r}: need world >= 1 and 0 <= rank < world")
        if len(data) < 1:
            raise ReaderError("the dataset is empty: nothing to read")
        if not isinstance(decode_work, int) or decode_work < 0:
            raise ReaderError(f"decode_work={decode_work!r}: must be a whole number >= 0")
        self.data, self.batch_size, self.rank, self.world = data, batch_size, rank, world
        self.seed, self.decode_work, self.drop_last = seed, decode_work, drop_last
        self.per_rank = math.ceil(len(data) / world)
        full, rest = divmod(self.per_rank, batch_size)
        self.batches_per_epoch = full + (1 if rest and not drop_last else 0)
        if self.batches_per_epoch == 0:
            raise ReaderError(
                f"batch_size={batch_size} with drop_last=True leaves no batch: each of {world} ranks has "
                f"{self.per_rank} samples of a dataset of {len(data)}; lower batch_size or keep the last batch"
            )

    def batch_indices(self, epoch: int) -> list[torch.Tensor]:
        idx = shard_epoch(len(self.data), epoch, self.rank, self.world, self.seed)
        b = self.batch_size
        return [idx[i * b:(i + 1) * b] for i in range(self.batches_per_epoch)]

    def load(self, indices: torch.Tensor, epoch: int, batch: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """Decode (and augment) batch ``batch`` of ``epoch``: uint8 images (B, C, H, W) and int64 labels, on the
        host; the augmentation's draws from (seed, rank, step) (the module docstring)."""
        flips = [False] * len(indices)
        if self.decode_work > 0:
            g = torch.Generator().manual_seed(step_seed(self.seed, self.rank, epoch * self.batches_per_epoch + batch))
            flips = (torch.rand(len(indices), generator=g, device="cpu") < 0.5).tolist()  # host-side decode
        imgs = [augment(self.data.decode(int(i)), f, self.decode_work) for i, f in zip(indices, flips)]
        return torch.stack(imgs), self.data.targets[indices]


def _to_float_host(batch):
    x, y = batch
    return normalize(x), y


# ---------------------------------------------------------------------------------------------
# the plain reader
# ---------------------------------------------------------------------------------------------

class PlainReader:
    """Decode and normalize on the host, then copy: one batch at a time, restarted every epoch."""

    name = "plain"

    def __init__(self, source: BatchSource, platform: Platform):
        self.source = source
        self.platform = platform
        self.batches_per_epoch = source.batches_per_epoch

    def epoch(self, epoch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        device = self.platform.device
        for b, idx in enumerate(self.source.batch_indices(epoch)):
            x, y = _to_float_host(self.source.load(idx, epoch, b))
            yield x.to(device), y.to(device)

    def close(self) -> None:
        return None

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# ---------------------------------------------------------------------------------------------
# the optimized reader's parts
# ---------------------------------------------------------------------------------------------

class _EpochBatches(torch.utils.data.Dataset):
    """Map-style view for DataLoader workers: item (epoch, batch number) -> a loaded batch."""

    def __init__(self, source: BatchSource, as_uint8: bool):
        self.source = source
        self.as_uint8 = as_uint8
        self._cache: dict[int, list] = {}

    def __len__(self) -> int:
        return self.source.batches_per_epoch

    def __getitem__(self, key):
        epoch, b = key
        # _ThreadWorkers' threads share this view and straddle an epoch's end (keys of two epochs in flight): the
        # cache is read once and replaced whole, never checked and then indexed (a thread's clear() between the two
        # was a KeyError), and keeps the epoch before this one for the threads still finishing it.
        cache = self._cache
        indices = cache.get(epoch)
        if indices is None:
            indices = self.source.batch_indices(epoch)
            self._cache = {**{e: v for e, v in cache.items() if e == epoch - 1}, epoch: indices}
        batch = self.source.load(indices[b], epoch, b)
        return batch if self.as_uint8 else _to_float_host(batch)


class _KeySampler(torch.utils.data.Sampler):
    """(epoch, batch) keys for epochs ``first`` .. ``last`` (None: forever, the infinite reader)."""

    def __init__(self, batches_per_epoch: int, first: int, last: int | None):
        self.n, self.first, self.last = batches_per_epoch, first, last

    def __iter__(self):
        e = self.first
        while self.last is None or e <= self.last:
            for b in range(self.n):
                yield (e, b)
            e += 1


class _ThreadWorkers:
    """Ordered parallel decode on ``n`` threads, at most ``2n`` batches in flight.

    Used where worker processes are not allowed: the rank pool's ranks are daemonic processes,
    which may not have children.  zlib and torch release the GIL while they work."""

    def __init__(self, dataset, keys: Iterator, n: int, timeout: float):
        from concurrent.futures import ThreadPoolExecutor

        self.dataset, self.keys, self.timeout = dataset, iter(keys), timeout
        self.pool = ThreadPoolExecutor(max_workers=n, thread_name_prefix="fleetbench-reader-worker")
        self.inflight: list = []
        self.depth = 2 * n
        self._fill()

    def _fill(self) -> None:
        while len(self.inflight) < self.depth:
            try:
                key = next(self.keys)
            except StopIteration:
                return
            self.inflight.append(self.pool.submit(self.dataset.__getitem__, key))

    def __iter__(self):
        return self

    def __next__(self):
        from concurrent.futures import TimeoutError as FutureTimeout

        if not self.inflight:
            raise StopIteration
        fut = self.inflight.pop(0)
        try:
            out = fut.result(timeout=self.timeout)
        except FutureTimeout:
            raise ReaderTimeout(f"a reader worker produced no batch within {self.timeout:.0f} s") from None
        self._fill()
        return out

    def _shutdown_workers(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.inflight.clear()


def _processes_allowed() -> bool:
    import multiprocessing

    return not multiprocessing.current_process().daemon


def _worker_init(_worker_id: int) -> None:
    torch.set_num_threads(1)  # workers decode; they must not fight the rank for its cores


class CudaCopier:
    """Pinned host memory, a side stream and non-blocking copies (CUDA only).

    ``copy(batch)`` runs on the side stream and returns the device batch with an event;
    ``ready(batch, event)`` makes the current stream wait for it before use, and records the
    batch as used there (it was allocated on the side stream)."""

    def __init__(self, platform: Platform):
        if not platform.is_cuda:
            raise CudaUnavailable(f"use_double_buffer's pinned-memory side-stream copy needs a CUDA platform; "
                                  f"this rank runs on {platform.device_type} (torch {torch.__version__})")
        self.platform = platform
        self.device = platform.device
        self.stream = platform.new_stream()

    def copy(self, tensors):
        p = self.platform
        pinned = [p.pin(t) for t in tensors]
        with p.use_stream(self.stream):
            out = [t.to(self.device, non_blocking=True) for t in pinned]
            event = p.record_event(self.stream)
        return out, event

    def ready(self, tensors, event):
        p = self.platform
        cur = p.current_stream()
        cur.wait_event(event)
        for t in tensors:
            p.record_stream(t, cur)
        return tensors


def timed_next(batches: Iterator, platform: Platform):
    """``(next(batches), seconds the step waited for it)``, the device synchronized before the timer
    starts (see the module docstring).  Raises StopIteration like ``next``."""
    platform.synchronize()
    t0 = time.perf_counter()
    batch = next(batches)
    return batch, time.perf_counter() - t0


class _Prefetcher:
    """A background thread that keeps ``depth`` prepared batches ready (the double buffer).

    Never blocks shutdown: a daemon thread whose every put is bounded and re-checks ``stop``;
    the consumer's every get is bounded by ``timeout``."""

    _END = object()

    def __init__(self, items: Iterator, prepare, depth: int = 1, timeout: float = DEFAULT_TIMEOUT,
                 on_start=None):
        """``on_start`` runs first in the thread (the rank's ``platform.set_device``)."""
        self.items, self.prepare, self.timeout, self.on_start = items, prepare, timeout, on_start
        self.q: queue.Queue = queue.Queue(maxsize=depth)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="fleetbench-reader-prefetch", daemon=True)
        self.thread.start()

    def _put(self, item) -> bool:
        while not self.stop.is_set():
            try:
                self.q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self) -> None:
        try:
            if self.on_start is not None:
                self.on_start()
            for item in self.items:
                if self.stop.is_set() or not self._put(("ok", self.prepare(item))):
                    return
            self._put(("end", None))
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer
            self._put(("error", exc))

    def get(self):
        try:
            kind, payload = self.q.get(timeout=self.timeout)
        except queue.Empty:
            alive = self.thread.is_alive()
            raise ReaderTimeout(
                f"the double-buffer thread produced no batch within {self.timeout:.0f} s "
                f"(thread {'alive: a slow or stuck decode' if alive else 'dead'})"
            ) from None
        if kind == "error":
            raise payload
        if kind == "end":
            raise StopIteration
        return payload

    def close(self) -> None:
        self.stop.set()
        try:
            while True:
                self.q.get_nowait()
        except queue.Empty:
            pass
        self.thread.join(timeout=5.0)


class OptimizedReader:
    """The reader with Paddle's options, each switched by its own config knob (see the module doc)."""

    name = "optimized"

    def __init__(self, source: BatchSource, platform: Platform, return_uint8: bool = False,
                 double_buffer: bool = False, infinite: bool = False, num_workers: int = 0,
                 timeout: float = DEFAULT_TIMEOUT, prefetch_depth: int = 1):
        if not isinstance(num_workers, int) or num_workers < 0:
            raise ReaderError(f"reader_num_workers={num_workers!r}: must be a whole number >= 0")
        self.source, self.platform = source, platform
        self.return_uint8, self.double_buffer = return_uint8, double_buffer
        self.infinite, self.num_workers = infinite, num_workers
        self.timeout, self.depth = timeout, prefetch_depth
        self.batches_per_epoch = source.batches_per_epoch
        self._copier = CudaCopier(platform) if (double_buffer and platform.is_cuda) else None
        self._dataset = _EpochBatches(source, return_uint8)
        self._stream: Iterator | None = None  # the infinite reader's one pipeline
        self._next_epoch = 0
        self._open: list = []  # prefetchers / loader iterators to close
        self.pipelines_started = 0  # 1 for the infinite reader, one per epoch otherwise
        # Worker processes (torch DataLoader) where this process may have children; threads in a
        # daemonic process (the rank pool's ranks).
        self.worker_kind = "none" if num_workers == 0 else ("process" if _processes_allowed() else "thread")

    # -- host side: decoded batches, in order -------------------------------------------
    def _host_batches(self, first: int, last: int | None) -> Iterator:
        if self.num_workers == 0:
            sampler = _KeySampler(self.batches_per_epoch, first, last)
            return (self._dataset[key] for key in sampler)
        if self.worker_kind == "thread":
            it = _ThreadWorkers(self._dataset, iter(_KeySampler(self.batches_per_epoch, first, last)),
                                self.num_workers, self.timeout)
            self._open.append(it)
            return it
        loader = torch.utils.data.DataLoader(
            self._dataset, batch_size=None, sampler=_KeySampler(self.batches_per_epoch, first, last),
            num_workers=self.num_workers, persistent_workers=False, timeout=self.timeout,
            worker_init_fn=_worker_init, prefetch_factor=2,
        )
        loader_it = iter(loader)
        self._open.append(loader_it)
        return loader_it

    # -- to the device ------------------------------------------------------------------
    def _to_device(self, batch):
        x, y = batch
        if self._copier is not None:
            (x, y), event = self._copier.copy([x, y])
            return (x, y, event)
        device = self.platform.device
        return (x.to(device), y.to(device), None)

    def _finish(self, item):
        x, y, event = item
        if event is not None:
            x, y = self._copier.ready([x, y], event)
        if self.return_uint8:
            x = normalize(x)  # uint8 -> float32, normalized on the device
        return x, y

    def _pipeline(self, first: int, last: int | None) -> Iterator:
        self.pipelines_started += 1
        host = self._host_batches(first, last)
        if not self.double_buffer:
            return (self._finish(self._to_device(b)) for b in host)
        pre = _Prefetcher(host, self._to_device, self.depth, self.timeout, on_start=self.platform.set_device)
        self._open.append(pre)

        def gen():
            while True:
                try:
                    item = pre.get()
                except StopIteration:
                    return
                yield self._finish(item)

        return gen()

    def epoch(self, epoch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        if not self.infinite:
            self._close_open()  # restart: a fresh pipeline (and fresh workers) every epoch
            yield from self._pipeline(epoch, epoch)
            return
        if epoch != self._next_epoch:
            raise ReaderError(
                f"use_infinite_reader=True reads epochs in order from 0 in one pipeline; asked for epoch {epoch}, "
                f"the next one is {self._next_epoch}"
            )
        if self._stream is None:
            self._stream = self._pipeline(0, None)
        for _ in range(self.batches_per_epoch):
            yield next(self._stream)
        self._next_epoch += 1

    def _close_open(self) -> None:
        for obj in reversed(self._open):  # the prefetch thread first, then the workers it reads from
            if isinstance(obj, _Prefetcher):
                obj.close()
            elif hasattr(obj, "_shutdown_workers"):
                obj._shutdown_workers()
        self._open.clear()

    def close(self) -> None:
        self._close_open()
        self._stream = None

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass


# ---------------------------------------------------------------------------------------------
# DALI
# ---------------------------------------------------------------------------------------------

class DaliReader:  # pragma: no cover - needs CUDA and nvidia-dali; not testable on a CPU machine
    """uint8 batches fed to a DALI pipeline (external source), moved and normalized on the GPU.

    Written against DALI's documented external_source / pipeline_def API; unexercised on the
    CPU machine this suite was developed on (see docs/local-sgd-and-reader.md)."""

    name = "dali"

    def __init__(self, source: BatchSource, platform: Platform, threads: int = 2):
        from nvidia.dali import fn, pipeline_def, types

        self.source, self.platform = source, platform
        self.batches_per_epoch = source.batches_per_epoch
        self._epoch, self._b, self._started = 0, 0, False
        self._indices: list = []

        def feed():  # called in order by DALI, one batch per call; StopIteration ends the epoch
            if self._b >= self.batches_per_epoch:
                raise StopIteration
            x, y = source.load(self._indices[self._b], self._epoch, self._b)
            self._b += 1
            return [t.numpy() for t in x], [t.reshape(1).numpy() for t in y]

        @pipeline_def(batch_size=source.batch_size, num_threads=threads, device_id=platform.device.index or 0)
        def pipe():
            images, labels = fn.external_source(source=feed, num_outputs=2, batch=True)
            x = fn.cast(images.gpu(), dtype=types.FLOAT)
            return (x * _TO_UNIT - IMAGE_MEAN) * _INV_STD, labels.gpu()  # normalize()'s constants

        self._pipe = pipe()
        self._pipe.build()

    def epoch(self, epoch: int):
        from nvidia.dali.plugin.pytorch import feed_ndarray

        self._epoch, self._b = epoch, 0
        self._indices = self.source.batch_indices(epoch)
        if self._started:
            self._pipe.reset()
        self._started = True
        for _ in range(self.batches_per_epoch):
            x_out, y_out = self._pipe.run()
            x_t, y_t = x_out.as_tensor(), y_out.as_tensor()
            x = torch.empty(x_t.shape(), dtype=torch.float32, device=self.platform.device)
            y = torch.empty(y_t.shape(), dtype=torch.int64, device=self.platform.device)
            # On the current stream, where x and y were allocated and will be used: without cuda_stream
            # DALI copies on an internal stream the training step does not wait for.
            stream = self.platform.current_stream()
            feed_ndarray(x_t, x, cuda_stream=stream)
            feed_ndarray(y_t, y, cuda_stream=stream)
            yield x, y.reshape(-1)

    def close(self) -> None:
        self._pipe = None


def _require_dali() -> None:
    require_cuda("reader_backend='dali'")
    if importlib.util.find_spec("nvidia") is None or importlib.util.find_spec("nvidia.dali") is None:
        raise ReaderUnavailable(
            "reader_backend='dali' needs NVIDIA DALI, which is not installed (pip install "
            "nvidia-dali-cuda120 from https://developer.download.nvidia.com/compute/redist); allowed here: "
            "reader_backend='torch'"
        )


# ---------------------------------------------------------------------------------------------
# choosing a reader
# ---------------------------------------------------------------------------------------------

def reader_knobs_on(config: StrategyConfig) -> bool:
    return (config.reader_return_uint8 or config.use_double_buffer or config.use_infinite_reader
            or config.reader_num_workers > 0 or config.reader_backend != "torch")


def build_reader(dataset, config: StrategyConfig, batch_size: int, rank: int, world: int, platform: Platform,
                 seed: int = 0, decode_work: int = 0, drop_last: bool = False, timeout: float = DEFAULT_TIMEOUT):
    """The reader ``config`` asks for: plain when every reader knob is off, else optimized (or DALI).

    ``dataset`` is a synthetic image dataset or an :class:`EncodedImages`."""
    if config.reader_backend == "dali":
        try:
            _require_dali()
        except RuntimeError as exc:
            raise ReaderUnavailable(f"reader_backend='dali': {exc}") from None
    data = dataset if isinstance(dataset, EncodedImages) else EncodedImages.from_dataset(dataset)
    source = BatchSource(data, batch_size, rank, world, seed, decode_work, drop_last)
    if config.reader_backend == "dali":  # pragma: no cover - CUDA + DALI only
        return DaliReader(source, platform)
    if not reader_knobs_on(config):
        return PlainReader(source, platform)
    return OptimizedReader(source, platform, return_uint8=config.reader_return_uint8,
                           double_buffer=config.use_double_buffer, infinite=config.use_infinite_reader,
                           num_workers=config.reader_num_workers, timeout=timeout)
