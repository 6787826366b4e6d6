"""`fleetbench doctor`: a first-run self-check of every path that differs between CPU and GPU.

In under two minutes it exercises each path with exact checks and prints one row per item (pass,
fail, or "not applicable here" with the reason), the numbers it saw, and the versions:

- platform: the device and backend chosen, the GPUs torch sees (CUDA_VISIBLE_DEVICES honoured);
- allreduce on each communicator (the world and comm0..comm2): inputs whose sums are exact in
  floating point (nccl-tests' method), zero wrong elements allowed;
- half-precision allreduce (fp16, bf16): exact small integers;
- bucketed overlap (2 communicators): gradients equal the exact average, every bucket launched from
  the backward hooks;
- hierarchical allreduce with overlap on 2 communicators, several steps, under a short timeout
  (on NCCL a worker-thread design hangs here: issue 11);
- the reader's device copy (double buffer + uint8): bit-for-bit the plain reader's batches;
- CUDA event timing against the host clock (CUDA only);
- on CUDA, what one GPU can confirm (``--nproc 1``): the precision switches take effect (TF32 off gives
  fp32's accuracy, on makes a matmul coarser on TF32 hardware); the fused optimizers against torch.optim;
  the AMP (fp16, bf16) and compute-fusion correctness checks;
- NVML: the visible GPUs found, in torch's order (CUDA only);
- memory window: the peak above the start of a window, for a known allocation;
- the torchrun error path: a rank that raises while its peer is inside a collective is reported
  within seconds (a real torchrun job of 2 ranks).

The same code runs on CPU (gloo) and on CUDA (NCCL); CUDA-only items say "not applicable here" on
CPU.  Exit status 0 when nothing failed.  ``--json`` prints the same report as JSON.
"""
from __future__ import annotations

import math
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable

import torch

from .check.errors import rel_error, worst_error
from .check.harness import check_on_rank as check
from .check.harness import summarize
from .comm.bucketed import BucketedGradSync
from .comm.table import COLLECTIVES, Layout
from .compute.fused_ops import BatchNormReLU
from .compute.fused_optim import build_fused_optimizer
from .config import StrategyConfig
from .data.reader import BatchSource, EncodedImages, OptimizedReader, PlainReader
from .data.synthetic import SyntheticImages, normalize
from .doctor_report import FAIL, NA, PASS, Item, Report, format_table
from .engine import apply_precision, precision_in_effect
from .measure.interleave import interleaved_rounds
from .measure.metadata import git_info, nccl_version
from .measure.timing import TimedCase, footprint_bytes
from .measure.utilization import visible_nvml_handles
from .runtime.child import run_child
from .runtime.context import current
from .runtime.device import CudaUnavailable, cuda_device_count, select_platform
from .runtime.groups import comm_groups, label_of
from .runtime.launch import init_from_env, shutdown
from .runtime.pool import RankPool, owned_tempdir, remove_stale
from .runtime.spawn import set_parent_death_signal
from .runtime.torchrun import TorchrunLauncher
from .runtime.wheel import driver_facts, first_line, misfit
from .strategies.optim import torch_optimizer
from .workload import WorkloadSpec, workload

__all__ = ["Item", "Report", "run_doctor", "format_table", "PASS", "FAIL", "NA"]  # the report: suite.doctor_report

CALL_TIMEOUT = 30.0  # per check; a hang fails its item, the pool restarts for the next
GROUPS_TIMEOUT = 120.0  # the hierarchical item's communicators (12 splits under NCCL) and first step
PG_TIMEOUT = 30.0


# ---------------------------------------------------------------------------------------------
# rank functions (run on every rank of the doctor's pool)
# ---------------------------------------------------------------------------------------------
def allreduce_exact_on_rank(comm_num: int, counts: list, dtypes: list) -> dict:
    """Allreduce exact inputs (``suite.comm.table``'s: nccl-tests' in fp32, small integers in half precision)
    on the world and on each of ``comm_num`` communicators; wrong elements per (group, dtype), or why a dtype
    cannot be reduced by this backend."""
    import torch.distributed as dist

    ctx = current()
    allreduce = COLLECTIVES["allreduce"]
    groups = [None] + comm_groups(comm_num)
    rows, unsupported = [], {}
    for name in dtypes:
        dtype = getattr(torch, name)
        for g in groups:
            wrong = elements = 0
            run = allreduce.build(Layout(group=g))
            for n in counts:
                try:
                    wrong += allreduce.wrong(run, n, dtype, ctx.platform.device)
                except RuntimeError as exc:
                    unsupported[name] = str(exc).splitlines()[0][:160]
                    break
                elements += n
            if name in unsupported:
                break
            rows.append({"group": label_of(g), "dtype": name, "wrong": wrong, "elements": elements})
    dist.barrier()
    return {"rows": rows, "unsupported": unsupported}


def _grad(p: torch.nn.Parameter) -> torch.Tensor:
    if p.grad is None:
        raise RuntimeError("a parameter received no gradient")
    return p.grad


# The doctor's model and data: the registry's small MLP at size tiny, 4 samples a rank (every rank function below
# builds it through the workload, as the suite's timings do).
DOCTOR_WORKLOAD = WorkloadSpec("mlp", size="tiny", per_rank_batch=4)


def bucketed_on_rank(config: dict, steps: int = 3) -> dict:
    """``steps`` steps of the bucketed path on the workload's model (its gradient sync from ``Workload.grad_sync``):
    the worst gradient error against the exact average (every rank's gradients recomputed here, on the same
    shards), and whether every bucket was launched from the hooks."""
    ctx = current()
    world, rank = ctx.world_size, ctx.rank
    wl = workload(DOCTOR_WORKLOAD)
    ref, net = wl.module(), wl.module()
    sync = wl.grad_sync(StrategyConfig.from_dict(config), net)
    if not isinstance(sync, BucketedGradSync):
        raise ValueError(f"config {config}: not a bucketed gradient sync ({type(sync).__name__})")
    sync.events = []
    worst, scale, launched_in_backward = 0.0, 0.0, True
    try:
        for step in range(steps):
            total: list[torch.Tensor] = []
            for r in range(world):
                ref.zero_grad(set_to_none=True)
                x, y = wl.shard_of(step, r)
                wl.spec.loss_fn(ref(x), y).backward()
                g = [_grad(p).detach().clone() for p in ref.parameters()]
                total = g if not total else [a + b for a, b in zip(total, g)]
            want = [w * (1.0 / world) for w in total]  # a multiplier: no division by a Python number
            for p in net.parameters():
                if p.grad is not None:
                    p.grad.zero_()
            sync.events.clear()
            sync.begin_step()
            x, y = wl.shard_of(step, rank)
            wl.spec.loss_fn(net(x), y).backward()
            after_backward = time.perf_counter()
            sync.finish_step()
            launches = [t for kind, _, t in sync.events if kind == "launch"]
            launched_in_backward &= len(launches) == len(sync.buckets) and max(launches) <= after_backward
            for p, w in zip(net.parameters(), want):
                worst = max(worst, float((_grad(p) - w).abs().max()))
                scale = max(scale, float(w.abs().max()))
        ctx.platform.synchronize()
        return {"max_error": worst, "scale": scale, "buckets": len(sync.buckets),
                "comms": sorted({b.comm_index for b in sync.buckets}), "launched_in_backward": launched_in_backward,
                "describe": sync.describe().get("hierarchical")}
    finally:
        sync.close()


def reader_copy_on_rank() -> dict:
    """The optimized reader (double buffer, uint8 to the device) against the plain one, bit for bit; and
    the normalization's one formula on every byte value, on the host and on the device."""
    ctx = current()
    every = torch.arange(256, device="cpu").to(torch.uint8).reshape(1, 1, 16, 16)
    bytes_same = torch.equal(normalize(every), normalize(every.to(ctx.platform.device)).cpu())
    data = EncodedImages.from_dataset(SyntheticImages(48, 3))

    def batches(reader):
        with reader:
            return [(x.cpu(), y.cpu(), str(x.device)) for x, y in reader.epoch(0)]

    src = lambda: BatchSource(data, 8, ctx.rank, ctx.world_size, seed=3)  # noqa: E731
    plain = batches(PlainReader(src(), ctx.platform))
    opt_reader = OptimizedReader(src(), ctx.platform, return_uint8=True, double_buffer=True)
    copier = opt_reader._copier is not None
    fast = batches(opt_reader)
    same = len(plain) == len(fast) and all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
                                           for a, b in zip(plain, fast))
    return {"batches": len(plain), "identical": same, "device": fast[0][2] if fast else "-",
            "cuda_copier": copier, "bytes_identical": bytes_same}


def event_timing(p, work: Callable[[], object], repeats: int) -> dict:
    """Device time of ``repeats`` queued ``work()`` calls from timing marks, and the host clock around them:
    without a synchronize (queuing only) and after one (the work done)."""
    p.synchronize()
    t0 = time.perf_counter()
    start = p.mark()
    for _ in range(repeats):
        work()
    end = p.mark()
    queued = time.perf_counter() - t0  # the host returns once the kernels are queued
    p.synchronize()
    host = time.perf_counter() - t0
    return {"event_s": p.elapsed(start, end), "host_s": host, "queued_s": queued}


def events_agree(r: dict) -> bool:
    """Events within 0.8 to 1.02 of the synchronized host clock (the host also counts launch overhead)."""
    return r["host_s"] > 0 and 0.8 * r["host_s"] <= r["event_s"] <= 1.02 * r["host_s"]


def event_timing_on_rank(matmuls: int = 40, n: int = 2048) -> dict:
    """CUDA: device time of queued matmuls from timing events vs the host clock around a synchronize."""
    p = current().platform
    if not p.is_cuda:
        return {"applicable": False}
    a = torch.randn(n, n, device=p.device)
    for _ in range(3):
        a @ a  # warm-up (cuBLAS handles, clocks)
    return dict(event_timing(p, lambda: a @ a, matmuls), applicable=True)


def precision_on_rank(n: int = 512) -> dict:
    """An fp32 matmul and convolution against float64 on the host, with TF32 off (strict) and on, and what
    torch reports in each; the switches are left at PyTorch's defaults after."""
    import torch.nn.functional as F

    p = current().platform
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(n, n, generator=g, device="cpu"), torch.randn(n, n, generator=g, device="cpu")
    x, w = torch.randn(4, 64, 32, 32, generator=g, device="cpu"), torch.randn(64, 64, 3, 3, generator=g, device="cpu")
    want_mm, want_conv = a.double() @ b.double(), F.conv2d(x.double(), w.double(), padding=1)
    out: dict = {"tf32_hardware": p.is_cuda and torch.cuda.get_device_capability(p.device) >= (8, 0)}
    try:
        for name, tf32 in (("strict", False), ("tf32", True)):
            apply_precision(StrategyConfig(matmul_allow_tf32=tf32, cudnn_allow_tf32=tf32))
            mm = (a.to(p.device) @ b.to(p.device)).cpu().double()
            conv = F.conv2d(x.to(p.device), w.to(p.device), padding=1).cpu().double()
            out[name] = {"reported": precision_in_effect(p.device_type), "matmul": rel_error(mm, want_mm),
                         "conv": rel_error(conv, want_conv)}
    finally:
        apply_precision(StrategyConfig())
    return out


def precision_verdict(r: dict) -> tuple[bool, str]:
    """TF32 off gives fp32's accuracy; torch reports each setting as set; on TF32 hardware (compute
    capability 8.0 and up) TF32 on makes the matmul at least 10 times less accurate.  cuDNN may pick a
    convolution algorithm without TF32 even when allowed, so the convolution's TF32 error is only shown."""
    s, t = r["strict"], r["tf32"]
    switches = [(x["reported"]["matmul_allow_tf32"], x["reported"]["cudnn_allow_tf32"]) for x in (s, t)]
    reported = switches == [(False, False), (True, True)]
    strict = s["matmul"] <= 1e-5 and s["conv"] <= 1e-5
    effect = t["matmul"] >= 10 * max(s["matmul"], 1e-9) if r["tf32_hardware"] else True
    numbers = (f"TF32 off: matmul {s['matmul']:.1e}, conv {s['conv']:.1e}; TF32 on: matmul {t['matmul']:.1e}, "
               f"conv {t['conv']:.1e} (relative to float64); torch reports {'each as set' if reported else switches}"
               + ("" if r["tf32_hardware"] else "; no TF32 hardware here: TF32 on changes nothing"))
    return reported and strict and effect, numbers


def optimizers_on_rank(steps: int = 5) -> dict:
    """The fused optimizers against torch.optim (its default implementation on this device), per kind."""
    wl = workload(DOCTOR_WORKLOAD)
    out = {}
    for kind in ("sgd", "momentum", "adam"):
        cfg = StrategyConfig(optimizer=kind, lr=0.01, weight_decay=0.01, fuse_all_optimizer_ops=True)
        ref, fused = wl.module(), wl.module()
        opts: tuple = (torch_optimizer(ref.parameters(), cfg), build_fused_optimizer(fused, cfg, None))
        for step in range(steps):
            x, y = wl.shard_of(step, 0)
            for net, opt in zip((ref, fused), opts):
                opt.zero_grad(set_to_none=False)
                wl.spec.loss_fn(net(x), y).backward()
                opt.step()
        out[kind] = worst_error(dict(fused.named_parameters()), dict(ref.named_parameters()))[0]
    return out


def model_check_on_rank(model: str, config: dict) -> dict:
    """The correctness check (engine against its reference) of ``config`` on ``model`` at size tiny."""
    return check(WorkloadSpec(model, size="tiny", per_rank_batch=4), config, steps=3)


def fusion_timing_on_rank(shape: tuple = (32, 256, 56, 56), repeats: int = 20) -> dict:
    """Forward and backward of BatchNorm + ReLU as the compute-fusion case runs it (``BatchNormReLU``, eager
    composition) and unfused (``nn.BatchNorm2d`` (cuDNN on a GPU) then ReLU), interleaved call by call over
    ``repeats`` rounds after a warm-up (``interleaved_rounds``), each call between two of the platform's marks (read
    after one synchronize at the end); the mean per call, and the two outputs' largest difference."""
    p = current().platform
    torch.manual_seed(0)
    bn = torch.nn.BatchNorm2d(shape[1]).to(p.device)
    fused, unfused = BatchNormReLU(bn), lambda t: torch.relu(bn(t))
    x = torch.randn(*shape, device=p.device, requires_grad=True)
    g = torch.randn(*shape, device=p.device)

    def step(module):
        x.grad = None
        y = module(x)
        y.backward(g)
        return y

    def warm(variant) -> None:
        for _ in range(3):
            step(variant[1])
        p.synchronize()

    def marked(variant) -> tuple:
        a = p.mark()
        step(variant[1])
        return a, p.mark()

    variants = (("fused", fused), ("unfused", unfused))
    spans = interleaved_rounds(variants, repeats, marked, warmup=warm)
    p.synchronize()
    out: dict = {f"{name}_ms": sum(p.elapsed(a, b) for a, b in marks) * 1e3 * (1.0 / repeats)
                 for (name, _), marks in zip(variants, spans)}
    with torch.no_grad():
        out["max_diff"] = float((fused(x) - unfused(x)).abs().max())
    out["shape"] = list(shape)
    return out


def fusion_timing_verdict(r: dict) -> tuple[bool, str]:
    """Both timings finite and positive and the outputs the same within 1e-4: the numbers are the item (a fused
    case slower than unfused on a GPU is what "eager composition" in its record says, not a failure)."""
    ok = all(math.isfinite(r[k]) and r[k] > 0 for k in ("fused_ms", "unfused_ms")) and r["max_diff"] <= 1e-4
    ratio = float(r["unfused_ms"]) / float(r["fused_ms"]) if r["fused_ms"] > 0 else float("nan")  # host floats
    return ok, (f"BN+ReLU {tuple(r['shape'])}, forward+backward: fused (eager composition) {r['fused_ms']:.3f} ms, "
                f"unfused (BatchNorm2d + ReLU) {r['unfused_ms']:.3f} ms, speedup {ratio:.2f}x; outputs differ by at "
                f"most {r['max_diff']:.1e}")


def footprint_on_rank() -> dict:
    """The engine's footprint (``measure.timing.footprint_bytes``: parameters, gradients, buckets, optimizer
    state) against the bytes the device's allocator holds for it: allocated after the engine is built and one
    step run (gradients, buckets and Adam's state exist, the step's batch and activations freed), minus before."""
    import gc

    p = current().platform
    wl = workload(DOCTOR_WORKLOAD)
    wl.prepare_batches()  # the timing batches it keeps on the device are not the engine's
    warm = torch.nn.Linear(8, 8, device=p.device)  # cuBLAS's workspaces (main and autograd threads) come from
    warm(torch.ones(2, 8, device=p.device)).sum().backward()  # the allocator: taken now, in case no item has yet
    del warm
    gc.collect()
    p.synchronize()
    before = torch.cuda.memory_allocated(p.device) if p.is_cuda else 0
    tc = TimedCase("doctor-footprint", StrategyConfig(fuse_all_reduce_ops=True, sync_nccl_allreduce=False,
                                                      optimizer="adam"), wl)
    tc.window(1, record=False)
    gc.collect()
    p.synchronize()
    held = (torch.cuda.memory_allocated(p.device) - before) if p.is_cuda else 0
    return {"footprint": footprint_bytes(tc.engine), "allocated": held}


def footprint_verdict(answers: list[dict]) -> tuple[bool, str]:
    """Every rank's footprint is what its allocator holds for the engine, give or take the allocator's
    rounding (blocks of 512 bytes and up): footprint <= allocated <= 1.5 x footprint + 2 MiB."""
    ok = all(a["footprint"] <= a["allocated"] <= 1.5 * a["footprint"] + 2**21 for a in answers)
    a = answers[0]
    mib = 2.0**-20  # bytes to MiB, multiplied (the doctor's checks divide by no Python number)
    return ok, (f"mlp tiny, overlap + Adam, rank 0: footprint {a['footprint'] * mib:.2f} MiB, allocator "
                f"{a['allocated'] * mib:.2f} MiB (bound: footprint to 1.5x + 2 MiB)")


def memory_window_on_rank(mib: int = 64) -> dict:
    """The peak above a window's start for one known allocation (touched, then freed)."""
    p = current().platform
    with p.memory_window() as mem:
        x = torch.ones(mib * 2**20 // 4, device=p.device)
        del x
    return dict(mem.as_dict(), expected=mib * 2**20)


def torchrun_probe() -> float:
    """Run under torchrun by the doctor: rank 1 raises while rank 0 waits in an allreduce it never joins."""
    import torch.distributed as dist

    if dist.get_rank() == 1:
        raise ValueError("fleetbench-doctor: deliberate error on rank 1")
    t = torch.ones(1, device=current().platform.device)
    dist.all_reduce(t)
    return t.item()  # on NCCL the allreduce is only queued: .item() is where rank 0 waits


# ---------------------------------------------------------------------------------------------
# the items (parent side)
# ---------------------------------------------------------------------------------------------
def _fmt_err(r: dict) -> str:
    return f"max |error| {r['max_error']:.2e} (gradients up to {r['scale']:.2e})"


def _within(r: dict) -> bool:
    return r["max_error"] <= 1e-5 * max(1.0, r["scale"]) and r["max_error"] == r["max_error"]


def item_platform(ctx: DoctorRun) -> Item:
    n = cuda_device_count()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    vis = f", CUDA_VISIBLE_DEVICES={visible!r}" if visible is not None else ""
    nums = f"{ctx.device}/{ctx.backend}, {ctx.nproc} ranks; torch sees {n} GPU(s){vis}"
    if ctx.device == "cuda" and n < ctx.nproc:
        return Item("platform", FAIL, nums + f": {ctx.nproc} ranks need {ctx.nproc} GPUs")
    return Item("platform", PASS, nums)


def item_allreduce(ctx: DoctorRun) -> Item:
    out = ctx.call(allreduce_exact_on_rank, dict(comm_num=3, counts=[1031, 262147], dtypes=["float32"]))
    rows = out[0]["rows"]
    wrong = sum(r["wrong"] for a in out for r in a["rows"])
    groups = ", ".join(r["group"] for r in rows)
    status = PASS if wrong == 0 and len(rows) == 4 else FAIL
    return Item("allreduce on each communicator (fp32, exact)", status,
                f"{groups}: {wrong} wrong of {len(rows)} x {rows[0]['elements'] if rows else 0} elements per rank")


def item_half(ctx: DoctorRun) -> Item:
    out = ctx.call(allreduce_exact_on_rank, dict(comm_num=1, counts=[1031, 65537], dtypes=["float16", "bfloat16"]))
    parts, status = [], PASS
    for name in ("float16", "bfloat16"):
        rows = [r for a in out for r in a["rows"] if r["dtype"] == name]
        why = out[0]["unsupported"].get(name)
        if why:
            parts.append(f"{name}: {ctx.backend} cannot reduce it ({why})")
            # gloo's half support is a CPU limitation; NCCL must reduce both
            status = FAIL if ctx.backend == "nccl" else (status if status == FAIL else NA)
        else:
            wrong = sum(r["wrong"] for r in rows)
            groups = ", ".join(r["group"] for r in out[0]["rows"] if r["dtype"] == name)
            parts.append(f"{name}: {wrong} wrong ({groups}; {rows[0]['elements']} elements each per rank)")
            if wrong:
                status = FAIL
    if status == NA and any("wrong" in p for p in parts):
        status = PASS  # one half type checked exactly; the other is named as unsupported here
    return Item("half-precision allreduce (exact)", status, "; ".join(parts))


BUCKETED = dict(fuse_all_reduce_ops=True, fuse_grad_size_in_layers=1, sync_nccl_allreduce=False, nccl_comm_num=2)


def item_bucketed(ctx: DoctorRun) -> Item:
    out = ctx.call(bucketed_on_rank, dict(config=BUCKETED))
    r = max(out, key=lambda a: a["max_error"])
    hooked = all(a["launched_in_backward"] for a in out)
    ok = all(_within(a) for a in out) and hooked
    return Item("bucketed overlap (2 communicators)", PASS if ok else FAIL,
                f"{r['buckets']} buckets on comms {r['comms']}, 3 steps; {_fmt_err(r)}; "
                f"{'all launched from the backward hooks' if hooked else 'NOT all launched in backward'}")


def item_hierarchical(ctx: DoctorRun) -> Item:
    if ctx.nproc < 2:
        return Item("hierarchical overlap (2 communicators, no hang)", NA,
                    "one rank: a hierarchy needs nodes of at least 2 ranks (run with --nproc 4 for two nodes)")
    # ranks per node: the smallest divisor >= 2 that leaves two nodes or more; else one node of every rank
    rpn = next((d for d in range(2, ctx.nproc) if ctx.nproc % d == 0), ctx.nproc)
    cfg = dict(BUCKETED, use_hierarchical_allreduce=True, hierarchical_allreduce_inter_nranks=rpn)
    # the communicators first (12 splits under NCCL, each rank's cached), under their own bound: the hang bound
    # below is the overlap's alone
    try:
        ctx.call(bucketed_on_rank, dict(config=cfg, steps=1), timeout=GROUPS_TIMEOUT)
    except Exception as exc:  # noqa: BLE001 - named as the set-up's failure, not a hang of the overlap
        return Item("hierarchical overlap (2 communicators, no hang)", FAIL,
                    f"building its communicators and one step (bound {GROUPS_TIMEOUT:.0f} s) failed: "
                    f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}")
    out = ctx.call(bucketed_on_rank, dict(config=cfg), timeout=ctx.hang_timeout)
    r = max(out, key=lambda a: a["max_error"])
    hooked = all(a["launched_in_backward"] for a in out)
    ok = all(_within(a) for a in out) and hooked
    nodes = (r.get("describe") or {}).get("nodes")
    return Item("hierarchical overlap (2 communicators, no hang)", PASS if ok else FAIL,
                f"{nodes} node(s) of {rpn}; {r['buckets']} buckets, 3 steps within {ctx.hang_timeout:.0f} s; "
                f"{_fmt_err(r)}")


def item_reader(ctx: DoctorRun) -> Item:
    out = ctx.call(reader_copy_on_rank)
    same = all(a["identical"] for a in out)
    byte_values = all(a["bytes_identical"] for a in out)
    cuda = out[0]["cuda_copier"]
    path = "pinned memory, side stream, event" if cuda else "host path (no CUDA copier on CPU)"
    ok = same and byte_values and cuda == (ctx.device == "cuda")
    return Item("reader device copy (double buffer, uint8)", PASS if ok else FAIL,
                f"{out[0]['batches']} batches/rank on {out[0]['device']}, {path}: "
                f"{'bit-for-bit the plain reader' if same else 'DIFFERENT from the plain reader'}; "
                f"normalize() of the 256 byte values {'identical' if byte_values else 'DIFFERENT'} on host and device")


def item_events(ctx: DoctorRun) -> Item:
    if ctx.device != "cuda":
        return Item("CUDA event timing vs host clock", NA, "CPU: marks are host timestamps")
    out = ctx.call(event_timing_on_rank)
    worst = max(out, key=lambda a: abs(a["event_s"] - a["host_s"]) / a["host_s"])
    ratio = worst["event_s"] / worst["host_s"]
    ok = all(events_agree(a) for a in out)
    return Item("CUDA event timing vs host clock", PASS if ok else FAIL,
                f"events {worst['event_s'] * 1e3:.1f} ms, host (synchronized) {worst['host_s'] * 1e3:.1f} ms, "
                f"ratio {ratio:.3f}; host clock without a synchronize: {worst['queued_s'] * 1e3:.1f} ms")


def item_precision(ctx: DoctorRun) -> Item:
    name = "precision settings take effect (TF32)"
    if ctx.device != "cuda":
        return Item(name, NA, "CPU: no TF32 (logic: tests/test_doctor.py::test_precision_verdict)")
    out = ctx.call(precision_on_rank)
    verdicts = [precision_verdict(a) for a in out]
    return Item(name, PASS if all(ok for ok, _ in verdicts) else FAIL, verdicts[0][1])


def item_fused_optimizers(ctx: DoctorRun) -> Item:
    name = "fused optimizers vs torch.optim"
    if ctx.device != "cuda":
        return Item(name, NA, "CPU: tests/test_fused_optim.py checks them here")
    return fused_optimizers_item(ctx, name)


def fused_optimizers_item(ctx: DoctorRun, name: str) -> Item:
    out = ctx.call(optimizers_on_rank)
    worst = {k: max(a[k] for a in out) for k in out[0]}
    ok = all(v <= 1e-6 for v in worst.values())  # tests/test_fused_optim.py's bound (a few ulp, not bit for bit)
    return Item(name, PASS if ok else FAIL,
                "5 steps, worst relative parameter error " + ", ".join(f"{k} {v:.1e}" for k, v in worst.items())
                + " (bound 1e-6)")


# item -> (model, [(label, config)]): each the correctness check of the config on the GPU
CUDA_CHECKS: dict[str, tuple[str, list]] = {
    "AMP against its reference": ("transformer", [("fp16", {"amp": "fp16"}), ("bf16", {"amp": "bf16"})]),
    "compute fusion against the unfused model": ("resnet", [("bn+act, add+act, relu+depthwise", {
        "fuse_bn_act_ops": True, "fuse_elewise_add_act_ops": True, "fuse_relu_depthwise_conv": True})]),
}


def item_amp(ctx: DoctorRun) -> Item:
    return checks_item(ctx, "AMP against its reference", "tests/test_amp.py checks it here")


def item_compute_fusion(ctx: DoctorRun) -> Item:
    return checks_item(ctx, "compute fusion against the unfused model", "tests/test_fusion.py checks it here")


def checks_item(ctx: DoctorRun, name: str, on_cpu: str, cpu_too: bool = False) -> Item:
    """The correctness checks of :data:`CUDA_CHECKS` ``name`` on this device (``cpu_too``: also on CPU, for tests)."""
    if ctx.device != "cuda" and not cpu_too:
        return Item(name, NA, f"CPU: {on_cpu}")
    model, configs = CUDA_CHECKS[name]
    parts, ok = [], True
    for label, config in configs:
        if config.get("amp") == "bf16" and ctx.device == "cuda" and not torch.cuda.is_bf16_supported():
            parts.append(f"{label}: this GPU has no bf16")
            continue
        answers = ctx.call(model_check_on_rank, dict(model=model, config=config))
        res = summarize(StrategyConfig.from_dict(config), answers)
        ok &= res.passed
        parts.append(f"{label}: {res.verdict}, parameter error {res.param_error:.1e} (tolerance {res.param_tol:g})"
                     + (f" {res.message}" if res.message else ""))
    return Item(name, PASS if ok else FAIL, f"{model}, 3 steps; " + "; ".join(parts))


def item_fusion_timing(ctx: DoctorRun) -> Item:
    name = "compute fusion timing (BN+ReLU fused vs unfused)"
    if ctx.device != "cuda":
        return Item(name, NA, "CPU: it times GPU kernels; the fused ops' effect here is their memory "
                              "(tests/test_fusion.py)")
    return fusion_timing_item(ctx, name)


def fusion_timing_item(ctx: DoctorRun, name: str, **kwargs) -> Item:
    verdicts = [fusion_timing_verdict(a) for a in ctx.call(fusion_timing_on_rank, kwargs)]
    return Item(name, PASS if all(ok for ok, _ in verdicts) else FAIL, verdicts[0][1])


def item_nvml(ctx: DoctorRun) -> Item:
    if ctx.device != "cuda":
        return Item("NVML", NA, "no GPU")

    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            pairs = visible_nvml_handles(pynvml)
            names = [pynvml.nvmlDeviceGetName(h) for _, h in pairs]
            util = [pynvml.nvmlDeviceGetUtilizationRates(h).gpu for _, h in pairs]
            driver = pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
    except Exception as exc:  # noqa: BLE001 - reported as the item's failure
        return Item("NVML", FAIL, f"{type(exc).__name__}: {exc}")
    names = [n.decode() if isinstance(n, bytes) else n for n in names]
    ctx.versions["driver"] = driver.decode() if isinstance(driver, bytes) else driver
    n = torch.cuda.device_count()
    ok = len(pairs) == n
    return Item("NVML", PASS if ok else FAIL,
                f"{len(pairs)} visible GPU(s) (torch sees {n}), NVML ids {[i for i, _ in pairs]}: "
                f"{', '.join(sorted(set(names)))}; utilization {util} %")


def item_footprint(ctx: DoctorRun) -> Item:
    name = "memory footprint vs the allocator"
    if ctx.device != "cuda":
        return Item(name, NA, "CPU: no allocator statistics (footprints counted by hand: tests/test_comm_structure.py)")
    ok, numbers = footprint_verdict(ctx.call(footprint_on_rank))
    return Item(name, PASS if ok else FAIL, numbers)


def item_memory(ctx: DoctorRun) -> Item:
    out = ctx.call(memory_window_on_rank)
    r = out[0]
    if r["kind"] == "process_rss_lifetime_peak":
        return Item("memory window", NA, "this kernel refuses /proc/self/clear_refs: the CPU peak cannot be reset")
    got, want = r["peak_above_start_bytes"], r["expected"]
    # CUDA: the caching allocator's exact bytes; CPU: resident pages, give or take the interpreter's own
    ok = (want <= got <= want * 1.25) if r["kind"] == "cuda_allocated" else (0.9 * want <= got <= 4 * want)
    return Item("memory window (peak above start)", PASS if ok else FAIL,
                f"{r['kind']}: {got / 2**20:.1f} MiB above a start of {r['start_bytes'] / 2**20:.1f} MiB "
                f"for a {want / 2**20:.0f} MiB allocation")


def item_torchrun(ctx: DoctorRun) -> Item:
    device = ctx.device if (ctx.device == "cpu" or torch.cuda.device_count() >= 2) else "cpu"
    ctx.release()  # the job's ranks take GPUs the pool's ranks hold: in EXCLUSIVE_PROCESS mode only one may
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "suite.cli.main", "torchrun-probe", "--device", device]
    # torchrun's rendezvous store listens on every interface (TCPStore has no bind address): where a private
    # network namespace can be made (root), the job runs in one with only loopback up.
    private = _private_netns_prefix()

    remove_stale()
    tmp, owner = owned_tempdir("fleetbench-doctor-")  # torchelastic_* directories go here, removed after
    env["TMPDIR"] = tmp
    # torchrun and its ranks: a process group of their own with a parent-death signal (a killed doctor takes them
    # along at once; each rank also dies with torchrun: torchrun_probe_main), the group killed when the job is over
    try:
        job = run_child(private + cmd, 90.0, env=env, cwd=root, death_signal=signal.SIGKILL, stop=signal.SIGKILL)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        os.close(owner)
    if job.timed_out:
        return Item("torchrun error path", FAIL, "the job did not end within 90 s (the error was not reported)")
    took = job.seconds
    out = job.stdout + job.stderr
    reported = "deliberate error on rank 1" in out and "rank 1 raised" in out
    ok = job.rc != 0 and reported and took < 60
    return Item("torchrun error path", PASS if ok else FAIL,
                f"2 ranks ({device}): rank 1's error {'reported' if reported else 'NOT reported'}, job ended "
                f"in {took:.1f} s with exit status {job.rc}; "
                + ("in a private network namespace (loopback only)" if private else
                   "its rendezvous store listened on all interfaces meanwhile (no private network namespace here)"))


def _private_netns_prefix() -> list:
    """A command prefix that runs a command in a new network namespace with loopback up, or [] when
    one cannot be made here (not root, no unshare/ip)."""
    unshare, ip = shutil.which("unshare"), shutil.which("ip")
    if not unshare or not ip:
        return []
    prefix = [unshare, "-n", "sh", "-c", f'"{ip}" link set lo up && exec "$@"', "sh"]
    try:
        ok = subprocess.run(prefix + ["true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    return prefix if ok else []


ITEMS: list[Callable] = [item_platform, item_allreduce, item_half, item_bucketed, item_hierarchical, item_reader,
                         item_events, item_precision, item_fused_optimizers, item_amp, item_compute_fusion,
                         item_fusion_timing, item_nvml,
                         item_footprint, item_memory, item_torchrun]


# ---------------------------------------------------------------------------------------------
# running
# ---------------------------------------------------------------------------------------------
class DoctorRun:
    """The doctor's pool and settings, handed to every item."""

    def __init__(self, nproc: int, device: str, hang_timeout: float, versions: dict):
        self.nproc, self.device, self.hang_timeout, self.versions = nproc, device, hang_timeout, versions
        self.backend = "nccl" if device == "cuda" else "gloo"
        self.pool: RankPool | None = self._pool()

    def _pool(self) -> RankPool:
        return RankPool(self.nproc, device=self.device, timeout=CALL_TIMEOUT, pg_timeout=PG_TIMEOUT,
                        num_threads=1 if self.device == "cpu" else None)

    def call(self, fn, kwargs: dict | None = None, timeout: float | None = None) -> list:
        if self.pool is None:  # released for an item that needs the GPUs to itself; back for the next
            self.pool = self._pool()
        return self.pool.run(fn, kwargs or {}, timeout=timeout or CALL_TIMEOUT)

    def release(self) -> None:
        """The pool's ranks (and their CUDA contexts) gone until the next :meth:`call`."""
        if self.pool is not None:
            self.pool.close()
            self.pool = None

    def close(self) -> None:
        self.release()


def versions(driver: dict | None = None) -> dict:
    """torch, its wheel (CPU or CUDA x.y) and the NVIDIA driver beside it (``driver``: ``driver_facts()``), NCCL,
    Python and the commit; ``wheel_line`` is the report's first line."""
    import platform as _platform

    return {"torch": torch.__version__, "cuda": torch.version.cuda, "nccl": nccl_version(),
            "python": _platform.python_version(), "commit": (git_info().get("commit") or "unknown")[:10],
            "driver": (driver or {}).get("driver"), "driver_cuda": (driver or {}).get("cuda"),
            "wheel_line": first_line(torch.__version__, torch.version.cuda, driver)}


def default_nproc(device: str) -> int:
    if device == "cuda":
        return torch.cuda.device_count()
    return 4  # two emulated nodes of two ranks: the hierarchical item has an inter-node level


def run_doctor(nproc: int | None = None, device: str | None = None, hang_timeout: float = 30.0,
               items: list | None = None, on_item: Callable[[Item], None] | None = None,
               on_start: Callable[[Report], None] | None = None) -> Report:
    """Every item in turn; ``on_start`` is told the report (platform, versions) before the first item, ``on_item``
    each item as it ends (``--json`` streams them: suite.doctor_report)."""

    t0 = time.monotonic()
    driver = driver_facts()
    # a CPU wheel beside a GPU, or a driver too old for the wheel's CUDA: one line saying which, before any rank
    problem = misfit(torch.__version__, torch.version.cuda, driver) if device != "cpu" else None
    if problem:
        raise CudaUnavailable(problem)
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    nproc = nproc or default_nproc(device)
    platform = select_platform(device, 0, nproc)  # a GPU machine with too few GPUs is an error, named
    report = Report(f"{platform.device_type}/{platform.backend}", nproc, versions(driver))
    if on_start is not None:
        on_start(report)
    run = DoctorRun(nproc, device, hang_timeout, report.versions)
    try:
        for fn in items or ITEMS:
            s = time.monotonic()
            try:
                item = fn(run)
            except Exception as exc:  # noqa: BLE001 - a check that raised or hung is that item's failure
                name = fn.__name__.replace("item_", "")
                lines = [ln for ln in str(exc).splitlines() if ln.strip()]
                why = lines[0] if lines else type(exc).__name__
                if len(lines) > 1:
                    why += " … " + lines[-1]
                item = Item(name, FAIL, f"{type(exc).__name__}: {why[:400]}")
            item.seconds = round(time.monotonic() - s, 2)
            report.items.append(item)
            if on_item is not None:
                on_item(item)
    finally:
        run.close()
    report.seconds = time.monotonic() - t0
    return report


def torchrun_probe_main(device: str) -> int:
    """``fleetbench torchrun-probe --device D`` (hidden) under torchrun: the error-path item's job.  Each rank dies
    with torchrun (the parent-death signal; torchrun itself dies with the doctor that started it)."""
    parent = os.getppid()
    set_parent_death_signal(signal.SIGKILL)
    if parent == 1 or os.getppid() != parent:  # torchrun is gone already
        os._exit(3)
    ctx = init_from_env(device=device, pg_timeout=60.0)
    try:
        TorchrunLauncher(ctx, report_timeout=5.0).run(torchrun_probe)
    finally:
        shutdown()
    return 0
