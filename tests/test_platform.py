"""The Platform object: device choice (no silent CPU fallback on a GPU machine), streams, timing
marks and memory windows, CUDA branches driven through a recording fake (tests/fakes.py)."""
from __future__ import annotations

import threading

import pytest
import torch

from suite.runtime import device as D
from suite.runtime.device import CudaUnavailable, HostMark, Platform, select_platform

from .fakes import FakeCuda, fake_cuda_platform


def _gpus(monkeypatch, n: int) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: n > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: n)


# -- select_platform -------------------------------------------------------------------------
def test_gpu_machine_with_too_few_gpus_is_an_error_not_a_cpu_run(monkeypatch):
    _gpus(monkeypatch, 1)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    with pytest.raises(CudaUnavailable, match=r"2 local ranks need a GPU each; torch sees 1.*"
                                              r"CUDA_VISIBLE_DEVICES='3'.*--device cpu"):
        select_platform(None, local_rank=0, local_world_size=2)
    with pytest.raises(CudaUnavailable, match="torch sees 1"):
        select_platform("cuda", local_rank=0, local_world_size=2)


def test_cpu_only_when_asked_or_without_cuda(monkeypatch):
    _gpus(monkeypatch, 1)
    assert select_platform("cpu", 0, 8) == Platform("cpu", "gloo", 0)  # asked for: fine, whatever the GPUs
    _gpus(monkeypatch, 4)
    p = select_platform(None, local_rank=3, local_world_size=4)
    assert (p.device_type, p.backend, p.device) == ("cuda", "nccl", torch.device("cuda", 3))
    _gpus(monkeypatch, 0)
    assert select_platform(None, 0, 4) == Platform("cpu", "gloo", 0)
    with pytest.raises(CudaUnavailable, match="--device cuda needs CUDA"):
        select_platform("cuda", 0, 1)
    with pytest.raises(ValueError, match="allowed values are 'cpu' and 'cuda'"):
        select_platform("gpu")


def test_gpu_count_is_torchs(monkeypatch):
    _gpus(monkeypatch, 3)
    assert D.cuda_device_count() == 3
    _gpus(monkeypatch, 0)
    assert D.cuda_device_count() == 0


# -- CPU platform: no-ops and host marks --------------------------------------------------------
def test_cpu_platform_streams_are_none_and_marks_are_host_times():
    p = Platform("cpu", "gloo")
    assert p.new_stream() is None and p.current_stream() is None and p.record_event() is None
    with p.use_stream(None):
        pass
    p.set_device()
    p.synchronize()
    a = p.mark()
    b = p.mark()
    assert isinstance(a, HostMark) and p.elapsed(a, b) >= 0.0


def test_cpu_memory_window_reports_the_peak_above_its_start():
    p = Platform("cpu", "gloo")
    with p.memory_window() as mem:
        big = torch.ones(64 * 2**20 // 4)  # 64 MiB, touched
        del big
    assert mem.kind in ("process_rss", "process_rss_lifetime_peak")
    if mem.kind == "process_rss_lifetime_peak":
        pytest.skip("this kernel refuses /proc/self/clear_refs: the CPU peak cannot be reset here")
    assert 60 * 2**20 <= mem.peak_above_start < 400 * 2**20, mem.as_dict()
    with p.memory_window() as quiet:  # the earlier 64 MiB are not counted again
        pass
    assert quiet.peak_above_start < 32 * 2**20, quiet.as_dict()


# -- CUDA branches through the fake -------------------------------------------------------------
def test_cuda_marks_are_timing_events_read_after_a_synchronize():
    api = FakeCuda()
    p = fake_cuda_platform(api)
    a = p.mark()
    api.clock += 0.25  # the device spends 250 ms
    b = p.mark()
    assert a.enable_timing and b.enable_timing
    assert [e[1:] for e in api.entries("record")] == [("record", a.name, "default"), ("record", b.name, "default")]
    with pytest.raises(RuntimeError, match="synchronize"):
        p.elapsed(a, b)  # not yet completed: CUDA refuses too
    p.synchronize()
    assert p.elapsed(a, b) == pytest.approx(0.25)


def test_cuda_memory_window_is_the_peak_above_the_start():
    api = FakeCuda(allocated=5_000)
    api.alloc(10_000)
    api.free(10_000)  # an earlier variant's peak (15 000) must not count
    p = fake_cuda_platform(api)
    with p.memory_window() as mem:
        api.alloc(3_000)
        api.free(3_000)
    assert mem.as_dict() == {"start_bytes": 5_000, "peak_bytes": 8_000, "peak_above_start_bytes": 3_000,
                             "kind": "cuda_allocated"}
    with pytest.raises(RuntimeError, match="still open"):
        _ = p.memory_window().peak_above_start


def test_cuda_streams_and_device_per_thread():
    api = FakeCuda()
    p = fake_cuda_platform(api, local_rank=2)
    side = p.new_stream()
    assert p.current_stream() is api.default
    with p.use_stream(side):
        assert p.current_stream() is side
        seen = []
        t = threading.Thread(target=lambda: seen.append(p.current_stream()))  # per thread, as in CUDA
        t.start()
        t.join()
        assert seen == [api.default]
        ev = p.record_event()
    assert p.current_stream() is api.default
    assert api.entries("record")[-1][2:] == (ev.name, side.name)

    t = threading.Thread(target=p.set_device, name="worker")
    t.start()
    t.join()
    assert ("worker", "set_device", "cpu") in api.log  # the fake platform's device is the CPU
