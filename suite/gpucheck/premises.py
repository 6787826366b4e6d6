"""The premises probe: what docs/gpu.md and the code assume of CUDA and NCCL, measured on one GPU, each as expected
vs observed.  Run under the chosen interpreter by the GPU check's phase 3 (``python -c "from suite.gpucheck.premises
import main; main()"``); one JSON line per premise as it ends, so a premise that hangs leaves the earlier ones.

1. ``x / 255.0`` rounds differently on the device (``a * (1/b)`` in float32) on as many of the 256 byte values as
   that formula differs from a true division on the host (126: :func:`host_division_mismatches` counts them from
   the same formula, never a constant); ``normalize()`` on none (issue 22.1);
2. a post-accumulate-grad hook runs off the main thread, on the stream current when its AccumulateGrad node was
   made, even when a later forward on another stream reuses the node (pytorch#137483);
3. ``work.wait()`` of an asynchronous allreduce returns while the collective, held back by a ``torch.cuda._sleep``
   on the stream it waits for, still runs (it makes the current stream wait; it does not block the host);
4. a synchronous collective runs on the current stream: issued on a side stream, it is done while an asynchronous
   one queued before it on NCCL's internal stream still waits behind a spin;
5. the side-stream chain (``wait_stream``) and ``record_stream`` hold under a spin on the side stream, with the
   freed block refilled by another pattern; without ``record_stream`` the same stress corrupts (the control);
6. after a free, ``mem_get_info`` does not see the caching allocator's reserved-but-free bytes, and
   ``Platform.free_memory`` adds them back.
"""
from __future__ import annotations

import json
import threading
import time

__all__ = ["main", "PREMISES", "host_division_mismatches", "division_verdict"]

GiB = 1 << 30


def _spin_rate(torch) -> float:
    """``torch.cuda._sleep`` cycles per second, timed with events."""
    torch.cuda._sleep(1000)
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    torch.cuda._sleep(20_000_000)
    b.record()
    torch.cuda.synchronize()
    return 20_000_000 / (a.elapsed_time(b) * 1e-3)


def host_division_mismatches(divisor: float = 255.0) -> int:
    """On how many of the 256 byte values CUDA's division by a CPU scalar (``a * (1/b)``, the reciprocal taken in
    float32: aten/src/ATen/native/cuda/BinaryDivTrueKernel.cu, ``iter.is_cpu_scalar(2)``) differs from a correctly
    rounded float32 division: computed here, on the host, with numpy's float32."""
    import numpy as np

    x = np.arange(256, dtype=np.float32)
    inv = np.float32(1.0) / np.float32(divisor)
    return int(np.count_nonzero(x * inv != x / np.float32(divisor)))


def division_verdict(divided: int, normalized: int) -> tuple:
    """(expected, observed, as expected) of premise 1 from the device's counts."""
    want = host_division_mismatches()
    return (f"x/255.0 differs on {want} of 256 byte values (a * (1/b) in float32, counted on the host); "
            f"normalize() on 0", f"x/255.0 differs on {divided}; normalize() on {normalized}",
            divided == want and normalized == 0)


def division(torch, rate) -> tuple:
    from suite.data.synthetic import normalize

    x = torch.arange(256, device="cpu").to(torch.uint8)
    divided = int(((x.float() / 255.0) != (x.cuda().float() / 255.0).cpu()).sum())
    img = x.reshape(1, 1, 16, 16)
    normalized = int((normalize(img) != normalize(img.cuda()).cpu()).sum())
    return division_verdict(divided, normalized)


def hook_stream(torch, rate) -> tuple:
    main_thread, seen = threading.get_ident(), []
    lin = torch.nn.Linear(256, 256, device="cuda")
    lin.weight.register_post_accumulate_grad_hook(
        lambda p: seen.append((threading.get_ident() != main_thread, torch.cuda.current_stream().cuda_stream)))
    x = torch.randn(64, 256, device="cuda")
    default, side = torch.cuda.current_stream(), torch.cuda.Stream()
    lin(x).sum().backward()  # forward on the default stream
    side.wait_stream(default)
    with torch.cuda.stream(side):
        y = lin(x).sum()  # forward (and a new AccumulateGrad node) on the side stream
    default.wait_stream(side)
    y.backward()  # y keeps its graph, and so the AccumulateGrad node made on the side stream, alive
    lin(x).sum().backward()  # forward on the default stream, reusing that node
    torch.cuda.synchronize()
    names = {default.cuda_stream: "default", side.cuda_stream: "side"}
    got = [f"{'off' if off else 'ON'} the main thread, {names.get(s, hex(s))} stream" for off, s in seen]
    return ("off the main thread each time; streams default, side (a node made there), side (that node reused by a "
            "default-stream forward)", "; ".join(got),
            [(o, names.get(s)) for o, s in seen] == [(True, "default"), (True, "side"), (True, "side")])


def wait_returns(torch, rate) -> tuple:
    import torch.distributed as dist

    t = torch.ones(1 << 20, device="cuda")
    torch.cuda._sleep(int(0.5 * rate))  # the collective's stream waits for this
    work = dist.all_reduce(t, async_op=True)
    t0 = time.perf_counter()
    work.wait()
    waited = time.perf_counter() - t0
    running = not work.is_completed()
    torch.cuda.synchronize()
    return ("wait() returns within 50 ms while the collective (behind a 500 ms spin) still runs",
            f"wait() returned in {waited * 1e3:.1f} ms; collective still running then: {running}",
            waited < 0.05 and running)


def sync_on_current(torch, rate) -> tuple:
    import torch.distributed as dist

    a, b = torch.ones(1024, device="cuda"), torch.ones(1024, device="cuda")
    torch.cuda._sleep(int(0.5 * rate))  # holds back NCCL's internal stream (it waits for this stream)
    held = dist.all_reduce(a, async_op=True)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        dist.all_reduce(b)  # synchronous: on the current (side) stream, which waits for nothing
        done = torch.cuda.Event()
        done.record(side)
    t0 = time.perf_counter()
    while not done.query() and time.perf_counter() - t0 < 0.3:
        time.sleep(0.001)
    early = done.query()
    earlier_pending = not held.is_completed()
    torch.cuda.synchronize()
    return ("the synchronous allreduce on a side stream is done while the held asynchronous one is not",
            f"synchronous done within 300 ms: {early}; asynchronous still held then: {earlier_pending}",
            early and earlier_pending)


def record_stream(torch, rate) -> tuple:
    main, side = torch.cuda.current_stream(), torch.cuda.Stream()
    corrupted = {}
    for keep in (True, False):
        bad = 0
        for i in range(1, 9):
            x = torch.full((1 << 22,), float(i), device="cuda")
            side.wait_stream(main)
            with torch.cuda.stream(side):
                torch.cuda._sleep(int(0.02 * rate))  # the side stream reads x late
                y = x * 2
            if keep:
                x.record_stream(side)
            del x
            torch.full((1 << 22,), -1.0, device="cuda")  # may take x's block at once without record_stream
            main.wait_stream(side)
            bad += int((y != 2.0 * i).sum())
        corrupted[keep] = bad
    torch.cuda.synchronize()
    return ("0 elements corrupted with record_stream (and some without it: the stress reaches the race)",
            f"{corrupted[True]} with record_stream, {corrupted[False]} without", corrupted[True] == 0)


def reserved_free(torch, rate) -> tuple:
    from suite.runtime.device import Platform

    torch.cuda.empty_cache()
    free0 = torch.cuda.mem_get_info()[0]
    x = torch.empty(GiB, dtype=torch.uint8, device="cuda")
    free1 = torch.cuda.mem_get_info()[0]
    del x
    free2 = torch.cuda.mem_get_info()[0]
    cached = torch.cuda.memory_reserved() - torch.cuda.memory_allocated()
    budget = Platform("cuda", "nccl", 0).free_memory()
    torch.cuda.empty_cache()
    mib = 1.0 / (1 << 20)
    return ("after freeing 1 GiB: mem_get_info unchanged (±64 MiB), >= 1 GiB reserved but free, free_memory() "
            "back to the start (±64 MiB)",
            f"mem_get_info: {free0 * mib:.0f} -> {free1 * mib:.0f} -> {free2 * mib:.0f} MiB; reserved but free "
            f"{cached * mib:.0f} MiB; free_memory() {budget * mib:.0f} MiB",
            abs(free2 - free1) <= 64 << 20 and cached >= GiB and abs(budget - free0) <= 64 << 20)


PREMISES = {"division on the device": division, "post-accumulate hook: thread and stream": hook_stream,
            "work.wait() does not block the host": wait_returns,
            "a synchronous collective runs on the current stream": sync_on_current,
            "side-stream chain and record_stream under a spin": record_stream,
            "mem_get_info vs the caching allocator": reserved_free}


def main() -> None:
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(0)
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1, device_id=torch.device("cuda", 0))
    try:
        rate = _spin_rate(torch)
        for name, fn in PREMISES.items():
            t0 = time.monotonic()
            try:
                expected, observed, ok = fn(torch, rate)
            except Exception as exc:  # noqa: BLE001 - a premise that raised is reported as such
                expected, observed, ok = "", f"raised {type(exc).__name__}: {str(exc).splitlines()[0][:300]}", False
            print(json.dumps({"premise": name, "expected": expected, "observed": observed, "ok": bool(ok),
                              "seconds": round(time.monotonic() - t0, 2)}), flush=True)
    finally:
        dist.destroy_process_group()
