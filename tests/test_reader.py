"""The reader: the optimized reader yields the plain reader's batches bit for bit, in the same
order, on every rank; every rank gets the same number of batches (uneven dataset sizes too);
the infinite reader's sequence across epochs equals the restarted reader's; bad input and
missing backends give clear errors; nothing waits forever."""
from __future__ import annotations

import hashlib
import math
import sys
import threading
import time

import pytest
import torch

from suite.config import ConfigError, StrategyConfig
from suite.data.reader import (
    BatchSource,
    CudaCopier,
    EncodedImages,
    OptimizedReader,
    PlainReader,
    ReaderError,
    ReaderTimeout,
    ReaderUnavailable,
    _EpochBatches,
    _Prefetcher,
    build_reader,
    shard_epoch,
)
from suite.data.synthetic import SyntheticImages, SyntheticTokens, normalize
from suite.measure.reader_timing import measure_reader_on_rank
from suite.runtime.context import current
from suite.runtime.device import CudaUnavailable, Platform
from suite.workload import WorkloadSpec

CPU = Platform("cpu", "gloo")

# Pairwise cover of (return_uint8, double_buffer, infinite, workers>0): every pair of values of every
# two knobs appears in some row.  Row 0 is the optimized reader's code path with every part off.
KNOB_ROWS = [
    (False, False, False, 0),
    (False, True, True, 2),
    (True, False, True, 2),
    (True, True, False, 2),
    (True, True, True, 0),
]


def _digest(x: torch.Tensor, y: torch.Tensor) -> str:
    h = hashlib.sha256()
    for t in (x, y):
        h.update(str((t.dtype, tuple(t.shape))).encode())
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def read_all_on_rank(dataset_size: int, batch_size: int, epochs: int, decode_work: int = 0,
                     drop_last: bool = False, seed: int = 3) -> dict:
    """This rank's batches (digests) per epoch from the plain reader and every knob row."""
    ctx = current()
    data = EncodedImages.from_dataset(SyntheticImages(dataset_size, seed))
    src = lambda: BatchSource(data, batch_size, ctx.rank, ctx.world_size, seed, decode_work, drop_last)  # noqa: E731

    def run(reader):
        out = []
        with reader:
            for e in range(epochs):
                batches = list(reader.epoch(e))
                assert all(x.dtype == torch.float32 and x.device == ctx.platform.device for x, _ in batches)
                out.append([_digest(x, y) for x, y in batches])
        return out

    plain = run(PlainReader(src(), ctx.platform))
    rows, started, kinds = [], [], []
    for u8, db, inf, workers in KNOB_ROWS:
        reader = OptimizedReader(src(), ctx.platform, return_uint8=u8, double_buffer=db, infinite=inf,
                                 num_workers=workers, timeout=60)
        rows.append(run(reader))
        started.append(reader.pipelines_started)
        kinds.append(reader.worker_kind)
    # the samples this rank read, to check coverage across ranks
    indices = [[int(i) for b in src().batch_indices(e) for i in b] for e in range(epochs)]
    return {"plain": plain, "rows": rows, "started": started, "kinds": kinds, "indices": indices}


@pytest.mark.parametrize("world,size,batch,work,drop_last", [
    (2, 101, 8, 2, False),  # 101 samples over 2 ranks: 51 each (one sample read twice), last batch 3
    (4, 64, 5, 0, True),  # 16 each, batches of 5, the short last batch dropped
])
def test_optimized_reader_equals_plain_on_every_rank(pools, world, size, batch, work, drop_last):
    epochs = 3
    answers = pools(world).run(read_all_on_rank,
                               dict(dataset_size=size, batch_size=batch, epochs=epochs, decode_work=work,
                                    drop_last=drop_last))
    per_rank = math.ceil(size / world)
    expect_batches = per_rank // batch if drop_last else math.ceil(per_rank / batch)
    for a in answers:
        assert [len(e) for e in a["plain"]] == [expect_batches] * epochs
        for row, got in zip(KNOB_ROWS, a["rows"]):
            assert got == a["plain"], f"knobs {row}: batches differ from the plain reader's"
        # the infinite reader ran one pipeline over all epochs; the others restarted each epoch
        assert a["started"] == [epochs if not row[2] else 1 for row in KNOB_ROWS]
        # the pool's ranks are daemonic processes: their workers are threads
        assert a["kinds"] == ["none" if not row[3] else "thread" for row in KNOB_ROWS]
    # every rank the same number of batches; different ranks read different batches
    assert len({tuple(len(e) for e in a["plain"]) for a in answers}) == 1
    assert answers[0]["plain"][0][0] != answers[1]["plain"][0][0]
    # the epochs differ (reshuffled), and together the ranks read every sample of each epoch
    assert answers[0]["plain"][0] != answers[0]["plain"][1]
    for e in range(epochs):
        seen = [i for a in answers for i in a["indices"][e]]
        if drop_last:  # the short last batch of every rank is left out
            assert len(seen) == expect_batches * batch * world == len(set(seen))
        else:
            assert len(seen) == per_rank * world
            assert set(seen) == set(range(size))


def test_worker_processes_equal_plain_for_every_rank_of_a_world():
    """DataLoader worker processes (allowed here, in pytest's own process): each rank of a world
    of 3, simulated one after the other, gets the plain reader's batches, across restarts and
    across the infinite reader's epochs."""
    data = EncodedImages.from_dataset(SyntheticImages(50, 1))
    for rank in range(3):
        def seq(reader):
            with reader:
                return [[_digest(x, y) for x, y in reader.epoch(e)] for e in range(2)]

        plain = seq(PlainReader(BatchSource(data, 7, rank, 3, 1, 1), CPU))
        for inf in (False, True):
            reader = OptimizedReader(BatchSource(data, 7, rank, 3, 1, 1), CPU, return_uint8=inf,
                                     double_buffer=not inf, infinite=inf, num_workers=2, timeout=60)
            assert reader.worker_kind == "process"
            assert seq(reader) == plain, (rank, inf)
            assert len(plain[0]) == 3  # ceil(ceil(50/3) / 7)


@pytest.mark.parametrize("n,world", [(1, 4), (7, 4), (10, 3), (64, 4), (5, 5), (3, 2)])
def test_shards_cover_the_epoch_with_equal_counts(n, world):
    shards = [shard_epoch(n, 1, r, world, seed=0) for r in range(world)]
    assert {len(s) for s in shards} == {math.ceil(n / world)}
    assert set(torch.cat(shards).tolist()) == set(range(n))


def test_uneven_dataset_same_batch_count_every_rank():
    data = EncodedImages.from_dataset(SyntheticImages(37, 0))
    counts = [len(list(PlainReader(BatchSource(data, 4, r, 4, 0), CPU).epoch(0))) for r in range(4)]
    assert counts == [3, 3, 3, 3]  # ceil(37/4) = 10 samples each: 4 + 4 + 2


def test_plain_reader_decodes_and_normalizes_the_stored_images():
    ds = SyntheticImages(20, 5)
    data = EncodedImages.from_dataset(ds)
    src = BatchSource(data, 6, 0, 1, seed=5)
    (x, y), = list(PlainReader(src, CPU).epoch(0))[:1]
    idx = src.batch_indices(0)[0]
    assert torch.equal(x, normalize(ds.inputs[idx])) and torch.equal(y, ds.targets[idx])


def test_augmentation_is_real_work_and_deterministic():
    data = EncodedImages.from_dataset(SyntheticImages(16, 0))
    a = BatchSource(data, 16, 0, 1, decode_work=3).load(torch.arange(16), epoch=0)[0]
    b = BatchSource(data, 16, 0, 1, decode_work=3).load(torch.arange(16), epoch=0)[0]
    raw = BatchSource(data, 16, 0, 1, decode_work=0).load(torch.arange(16), epoch=0)[0]
    assert torch.equal(a, b) and not torch.equal(a, raw)


def test_infinite_reader_refuses_out_of_order_epochs():
    data = EncodedImages.from_dataset(SyntheticImages(16, 0))
    with OptimizedReader(BatchSource(data, 4, 0, 1), CPU, infinite=True) as r:
        list(r.epoch(0))
        with pytest.raises(ReaderError, match="asked for epoch 2, the next one is 1"):
            list(r.epoch(2))


def test_bad_reader_arguments_are_named():
    data = EncodedImages.from_dataset(SyntheticImages(8, 0))
    with pytest.raises(ReaderError, match="batch_size=0"):
        BatchSource(data, 0, 0, 1)
    with pytest.raises(ReaderError, match="rank=2, world=2"):
        BatchSource(data, 2, 2, 2)
    with pytest.raises(ReaderError, match="batch_size=9 with drop_last=True"):
        BatchSource(data, 9, 0, 1, drop_last=True)
    with pytest.raises(ReaderError, match="decode_work=-1"):
        BatchSource(data, 2, 0, 1, decode_work=-1)
    with pytest.raises(ReaderError, match="kind='tokens'"):
        EncodedImages.from_dataset(SyntheticTokens(8, 0))
    with pytest.raises(ConfigError, match="reader_num_workers=-1"):
        StrategyConfig(reader_num_workers=-1)
    with pytest.raises(ConfigError, match="reader_backend='pil'"):
        StrategyConfig(reader_backend="pil")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU message; this machine has CUDA")
def test_cuda_and_dali_pieces_say_why_on_cpu():
    with pytest.raises(CudaUnavailable, match="pinned-memory"):
        CudaCopier(CPU)
    with pytest.raises(ReaderUnavailable, match="reader_backend='dali'.*CUDA"):
        build_reader(SyntheticImages(8, 0), StrategyConfig(reader_backend="dali"), 2, 0, 1, CPU)


def test_prefetch_thread_times_out_reports_errors_and_never_blocks_shutdown():
    def slow():
        time.sleep(2.0)
        yield 1

    pre = _Prefetcher(slow(), lambda v: v, timeout=0.2)
    t0 = time.monotonic()
    with pytest.raises(ReaderTimeout, match="no batch within"):
        pre.get()
    pre.close()
    assert time.monotonic() - t0 < 10

    def broken():
        yield 1
        raise OSError("disk gone")

    pre = _Prefetcher(broken(), lambda v: v, timeout=5)
    assert pre.get() == 1
    with pytest.raises(OSError, match="disk gone"):
        pre.get()
    pre.close()

    # A consumer that walks away: the producer is blocked on a full queue and must still stop.
    pre = _Prefetcher(iter(range(1000)), lambda v: v, timeout=5)
    assert pre.get() == 0
    t0 = time.monotonic()
    pre.close()
    assert not pre.thread.is_alive() and time.monotonic() - t0 < 6
    assert not any(t.name == "fleetbench-reader-prefetch" and t.is_alive() for t in threading.enumerate())


def _lockstep(code, *calls) -> list:
    """Each call on a thread of its own, the threads taking turns line by line inside ``code`` (in the order given;
    what a line calls runs within its turn): one interleaving of the lines, every time.  What each call returned or
    raised, in order; a turn not given within 10 s is a failure."""
    cond, n = threading.Condition(), len(calls)
    state = {"turn": 0, "done": set()}
    out: list = [None] * n

    def pass_turn(i: int) -> None:  # with cond held
        live = [j for j in range(n) if j not in state["done"]]
        if live:
            state["turn"] = next((j for j in live if j > i), live[0])
        cond.notify_all()

    def wait_turn(i: int) -> None:  # with cond held
        assert cond.wait_for(lambda: state["turn"] == i, timeout=10), f"call {i} never got its turn"

    def body(i: int) -> None:
        ran = [False]

        def local(frame, event, arg):
            if event == "line":
                with cond:
                    if ran[0]:
                        pass_turn(i)
                    wait_turn(i)
                ran[0] = True
            return local

        sys.settrace(lambda frame, event, arg: local if frame.f_code is code else None)
        try:
            out[i] = calls[i]()
        except Exception as exc:  # noqa: BLE001 - what the call raised is its result here
            out[i] = exc
        finally:
            sys.settrace(None)
            with cond:
                state["done"].add(i)
                pass_turn(i)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads)
    return out


class _TwoBatchSource:
    """Two batches an epoch; a batch is (epoch, number, the indices it was given)."""

    batches_per_epoch = 2

    def batch_indices(self, epoch):
        return [[epoch, b] for b in range(self.batches_per_epoch)]

    def load(self, indices, epoch, b):
        return epoch, b, indices


def test_reader_threads_straddling_an_epochs_end_each_get_their_own_epochs_batch():
    """The optimized reader's decode threads (the ranks' _ThreadWorkers) share one map from (epoch, batch) to a
    batch and hold keys of two epochs near an epoch's end.  Line by line in turn: a thread starting epoch 1 while
    another still reads epoch 0 (make test's two workers once met it as `KeyError: 0` in a rank)."""
    ds = _EpochBatches(_TwoBatchSource(), as_uint8=True)
    assert ds[(0, 0)] == (0, 0, [0, 0])
    got = _lockstep(_EpochBatches.__getitem__.__code__, lambda: ds[(1, 0)], lambda: ds[(0, 1)],
                    lambda: ds[(1, 1)])
    assert got == [(1, 0, [1, 0]), (0, 1, [0, 1]), (1, 1, [1, 1])], got


def test_reader_measurement_reports_data_wait_and_trains(pool2):
    variants = [{"name": "plain", "config": {}},
                {"name": "db+inf", "config": {"use_double_buffer": True, "use_infinite_reader": True}}]
    answers = pool2.run(measure_reader_on_rank,
                        dict(workload_spec=WorkloadSpec("resnet", per_rank_batch=4, dataset_size=40),
                             variants=variants, warmup=1, rounds=2, epochs_per_window=1, decode_work=1))
    steps = answers[0].steps_per_window
    assert steps == 5  # ceil(40 / 2) = 20 samples per rank, batches of 4
    for a in answers:
        plain, fast = a.variants["plain"], a.variants["db+inf"]
        assert (plain.reader, fast.reader) == ("PlainReader", "OptimizedReader")
        for v in (plain, fast):
            assert len(v.windows) == 2 and len(v.data_wait_s) == len(v.step_times) == 2 * steps
            assert all(t >= 0 for t in v.data_wait_s) and all(math.isfinite(x) for x in v.losses)
        # both readers fed the same batches in the same order to identically started engines
        assert plain.losses == fast.losses


# -- one normalization formula on the host and the device (issue 22.1) ------------------------------------
class _CudaScalarDivision(torch.utils._python_dispatch.TorchDispatchMode):
    """CPU stand-in for CUDA's true division by a CPU scalar (a Python number or a 0-dim CPU tensor):
    ``a * (1/b)`` with the reciprocal in the tensor's type (aten/src/ATen/native/cuda/BinaryDivTrueKernel.cu,
    ``iter.is_cpu_scalar(2)``: ``inv_b = opmath_t(1.0) / b``, then a multiplication)."""

    def __init__(self):
        super().__init__()
        self.emulated = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        import numpy as np

        kwargs = kwargs or {}
        aten = torch.ops.aten
        if func in (aten.div.Tensor, aten.div_.Tensor, aten.div.Scalar, aten.div_.Scalar):
            a, b = args
            cpu_scalar = not isinstance(b, torch.Tensor) or (b.dim() == 0 and b.device.type == "cpu")
            if cpu_scalar and a.dtype == torch.float32:
                self.emulated += 1
                inv = float(np.float32(1.0) / np.float32(float(b)))
                return a.mul_(inv) if func in (aten.div_.Tensor, aten.div_.Scalar) else a * inv
        return func(*args, **kwargs)


def _byte_values() -> torch.Tensor:
    return torch.arange(256).to(torch.uint8).reshape(1, 1, 16, 16)


def test_the_emulation_reproduces_cudas_rounding_of_a_division_by_255():
    """``x / 255.0``: the CPU divides, CUDA multiplies by the reciprocal; they differ on 126 of the 256 byte values
    (numpy's float32 agrees, and so does the GPU check's premise 1, which counts the same formula on the host); the
    old normalization, ``(x / 255.0 - 0.5) / 0.25``, on 111 (the number issue 22 reported)."""
    import numpy as np

    x = _byte_values().to(torch.float32)
    with _CudaScalarDivision() as mode:
        device = x / 255.0
    assert mode.emulated == 1 and int((x / 255.0 != device).sum()) == 126
    b = np.arange(256, dtype=np.float32)
    assert int(np.count_nonzero(b * (np.float32(1) / np.float32(255)) != b / np.float32(255))) == 126
    old = lambda t: (t / 255.0 - 0.5) / 0.25  # noqa: E731
    host = old(x)
    with _CudaScalarDivision() as mode:
        device = old(x)
    assert mode.emulated == 2
    assert int((host != device).sum()) == 111


def test_reader_normalization_is_the_same_formula_on_host_and_device_for_every_byte_value():
    import numpy as np

    x = _byte_values()
    host = normalize(x)
    with _CudaScalarDivision() as mode:
        device = normalize(x)
    assert torch.equal(host, device), f"{int((host != device).sum())} of 256 byte values differ"
    assert mode.emulated == 0  # no division left to round differently
    b = np.arange(256, dtype=np.float32)
    want = (b * np.float32(1.0 / 255.0) - np.float32(0.5)) * np.float32(4.0)  # independent: numpy float32
    assert np.array_equal(host.reshape(-1).numpy(), want)


def test_plain_reader_equals_the_uint8_reader_normalizing_under_cudas_division():
    """The plain reader normalizes on the host (CPU rounding); the uint8 reader on the device, here under
    CUDA's rounding: the batches are identical bit for bit."""
    data = EncodedImages.from_dataset(SyntheticImages(24, 2))
    plain = list(PlainReader(BatchSource(data, 8, 0, 1, seed=2), CPU).epoch(0))
    with _CudaScalarDivision():
        fast = list(OptimizedReader(BatchSource(data, 8, 0, 1, seed=2), CPU, return_uint8=True).epoch(0))
    assert len(plain) == len(fast) == 3
    assert all(torch.equal(a, c) and torch.equal(b, d) for (a, b), (c, d) in zip(plain, fast))


def test_augmentation_draws_from_seed_rank_and_step():
    """The flips come from (seed, rank, step), not from the thread or worker that decodes: one rank's batch is the
    same every time; another rank, batch, epoch or seed draws others."""
    data = EncodedImages.from_dataset(SyntheticImages(64, 0))
    idx = torch.arange(64)

    def load(rank=0, epoch=0, batch=0, seed=0):
        return BatchSource(data, 64, rank, 2, seed, decode_work=1).load(idx, epoch, batch)[0]

    first = load()
    assert torch.equal(first, load())
    for other in (load(rank=1), load(batch=1), load(epoch=1), load(seed=1)):
        assert not torch.equal(first, other)
