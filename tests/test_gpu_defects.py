"""The smaller defects of the first GPU nightly (issue 22, item 6): platform without a rank context,
the per-call timeout, ab's slowdown on the device, collective marks, NVML on every node."""
from __future__ import annotations

import types

import pytest
import torch

from suite.runtime.device import Platform, platform_of
from tests.test_gpu_paths import one_rank_world  # noqa: F401 - the fixture: a one-rank world on fake CUDA


def test_platform_of_a_users_process_group_is_the_parameters_device_and_the_groups_backend(monkeypatch):
    import suite.runtime.device as device

    monkeypatch.setattr(device, "dist", types.SimpleNamespace(get_backend=lambda group=None: "nccl"))
    on_gpu = [types.SimpleNamespace(device=torch.device("cuda", 3))]  # a parameter on GPU 3
    p = platform_of(on_gpu)
    assert (p.device_type, p.backend, p.local_rank, p.is_cuda) == ("cuda", "nccl", 3, True)
    assert platform_of([torch.zeros(1)]) == Platform("cpu", "nccl", 0)


def bucketed_platform_without_context_on_rank() -> dict:
    """A user's own process group: no fleetbench rank context while the engine is built."""
    import suite.runtime.device as device
    from suite.config import StrategyConfig
    from suite.engine import build_engine
    from suite.models import get_model
    from suite.runtime import context

    saved, real = context._CURRENT, device.dist
    context.set_current(None)
    device.dist = types.SimpleNamespace(get_backend=lambda group=None: "the-groups-backend")
    try:
        spec = get_model("mlp", "tiny")
        cfg = StrategyConfig(fuse_all_reduce_ops=True, sync_nccl_allreduce=False, use_hierarchical_allreduce=True,
                             hierarchical_allreduce_inter_nranks=2)
        engine = build_engine(spec.make(0), spec.loss_fn, cfg)
        p = engine.grad_sync.platform
        engine.grad_sync.close()
        return {"device_type": p.device_type, "backend": p.backend}
    finally:
        device.dist = real
        context.set_current(saved)


def test_bucketed_sync_without_a_rank_context_asks_the_process_group(pool2):
    """hierarchical+overlap picks worker threads (CPU) or side streams (CUDA) from its platform: with no rank
    context it used to assume CPU/gloo whatever the group; now the group's backend (here a stand-in) counts."""
    got = pool2.run(bucketed_platform_without_context_on_rank)
    assert got == [{"device_type": "cpu", "backend": "the-groups-backend"}] * 2, got


# ---- Platform.busy, a straggler's delay: on the device, a spin kernel (call-sequence tests on the fake) ----
def test_busy_on_cuda_queues_a_spin_kernel_on_the_current_stream_sized_by_event_timing():
    """Locks the call sequence only: the fake's clock stands for the GPU's, so the event calibration is exact."""
    from tests.fakes import FakeCuda, fake_cuda_platform

    api = FakeCuda()
    api.spin_hz = 2.0e9  # this fake GPU spins 2e9 cycles a second
    p = fake_cuda_platform(api)
    p.spin_rate()  # calibrated once: a spin timed between two events, one synchronize
    assert len(api.entries("synchronize")) == 1
    api.log.clear()
    with p.use_stream(side := p.new_stream()):
        p.busy(0.01)
    (work,) = api.entries("sleep")
    assert work[3] == side.name  # the step's (current) stream, where the spin delays what follows
    assert abs(work[2] - 0.01 * 2.0e9) <= 1, work  # 10 ms of this GPU's cycles
    assert not api.entries("synchronize")  # the host does not wait


def test_busy_on_cpu_spins_the_host_until_the_time_is_spent(monkeypatch):
    import suite.runtime.device as device

    clock = iter(i * 1e-3 for i in range(10_000))  # a host clock that advances 1 ms a reading
    monkeypatch.setattr(device.time, "perf_counter", lambda: next(clock))
    Platform("cpu", "gloo").busy(0.010)
    assert next(clock) == pytest.approx(11e-3)  # readings at 0 (the start), 1, … 10 ms (the end): 11 taken


def test_ab_refuses_too_few_gpus_instead_of_running_on_the_cpu(monkeypatch):

    from suite.cli import ab

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    from suite.cli.main import build_parser

    args = build_parser().parse_args(["ab", "BASE", "HEAD", "--nproc", "2"])  # every option as the CLI gives it
    try:
        ab.options(args)
    except ValueError as exc:
        assert "--nproc 2" in str(exc) and "torch sees 1" in str(exc), exc
    else:
        raise AssertionError("ab chose a device with 2 ranks on 1 GPU")


# ---- what a collective's start mark means -------------------------------------------------------------
@pytest.mark.usefixtures("one_rank_world")
def test_collective_spans_say_what_their_start_marks():
    """On CUDA the start is a mark on the calling stream: a synchronous NCCL collective runs on that stream
    (torch >= 2.8 takes the current stream when asyncOp is false), an asynchronous one on NCCL's own stream,
    which is not reachable from Python and waits for the calling stream at launch. The span and the trace say
    which, rather than passing the mark off as the kernel's start."""
    from suite.comm import collectives as C
    from suite.measure.timeline import chrome_trace

    C.STATS.record_spans(True)
    try:
        C.all_reduce(torch.ones(4))
        C.all_reduce(torch.ones(4), async_op=True).wait()
        span, queued = C.STATS.spans
    finally:
        C.STATS.record_spans(False)
    assert span.ev_launch is not None and span.ev_launch.stream == "default"  # the calling stream
    assert queued.ev_launch is not None and queued.ev_launch.stream == "default"
    assert "runs on that stream" in span.start_means and "queueing" not in span.start_means
    assert "calling stream reached the collective" in queued.start_means and "queueing" in queued.start_means
    comm = {"op": "all_reduce", "group": "world", "nbytes": 16, "start": span.start_means, "t0": 1.0, "t1": 2.0}
    trace = chrome_trace([{"rank": 0, "steps": [{"t0": 0.0, "t1": 3.0, "forward": None, "grads": [],
                                                  "comm": [comm]}], "buckets": []}])
    (begin,) = [e for e in trace["traceEvents"] if e.get("ph") == "b"]
    assert begin["args"]["start"] == span.start_means
    assert "inside the call" in C.Span("all_reduce", "world", 16, 0.0).start_means  # gloo: host time is right


# ---- the per-call timeout ---------------------------------------------------------------------------------
def test_the_per_call_timeout_scales_with_steps_variants_and_model_and_a_given_one_wins():
    """600 s for every call was too short for GPT-2 `full` with its 13 variants interleaved."""
    from suite.run_spec import RunFacts, RunOptions
    from suite.runner import CaseRunner

    def runner(**kw):
        return CaseRunner(None, 8, RunOptions(**kw), metadata={}, facts=RunFacts(size="full", device="cuda"))

    r = runner()
    one = r.call_timeout("gpt2", steps=1) - 600
    assert one > 0
    assert r.call_timeout("gpt2", steps=27, variants=13) - 600 == pytest.approx(27 * 13 * one)  # steps x variants
    assert r.call_timeout("gpt2", 27, 13) > 1800  # the default run (2 + 5 x 5 steps), every variant at once
    assert r.call_timeout("mlp", 1) - 600 < one  # a smaller model, a smaller allowance
    assert runner(timeout=42.0).call_timeout("gpt2", 27, 13) == 42.0  # --timeout given: exactly that


# ---- the straggler on CUDA --------------------------------------------------------------------------------
@pytest.mark.usefixtures("one_rank_world")
def test_a_cuda_straggler_is_a_spin_kernel_on_the_compute_stream_not_a_host_sleep(monkeypatch):
    """A host sleep hides behind work already queued on the GPU (fetch_frequency > 1 queues ahead), so on CUDA
    the straggler is delayed by a spin kernel of straggler_ms on its compute stream; the spin's calibration
    (a synchronize) happens when the case is prepared, not in a window.  **Call sequence only.**"""
    import time as time_module

    from suite.config import StrategyConfig
    from suite.measure.timing import TimedCase
    from suite.runtime.context import current
    from suite.workload import Workload, WorkloadSpec

    api = current().platform.cuda
    wl = Workload(WorkloadSpec("mlp", "tiny"))
    case = TimedCase("plain", StrategyConfig(straggler_ms=20.0, fetch_frequency=4), wl)
    calibrated = [e for e in api.log if e[1] == "sleep"]
    assert calibrated, "the spin kernel was not calibrated when the case was prepared"
    monkeypatch.setattr(time_module, "sleep", lambda s: pytest.fail(f"host sleep of {s} s on CUDA"))
    del api.log[:]
    case.window(3)
    spins = [e for e in api.log if e[1] == "sleep"]
    assert len(spins) == 3 and case.straggler_sleeps == 3  # one rank: the straggler every step
    assert all(e[3] == "default" and e[2] == pytest.approx(0.020 * api.spin_hz, rel=0.05) for e in spins), spins


def test_the_memory_budget_counts_the_caching_allocators_reserved_but_free_blocks():
    """mem_get_info sees blocks torch keeps after a free as used; the budget adds them back (reserved - allocated).
    **Call sequence only** for what CUDA reports: the premises probe of .ci/gpu-check measures it on a GPU."""
    from tests.fakes import FakeCuda, fake_cuda_platform

    api = FakeCuda(allocated=2**30)
    api.free_bytes, api.cached = 5 * 2**30, 3 * 2**30
    assert fake_cuda_platform(api).free_memory() == 8 * 2**30
    api.cached = 0
    assert fake_cuda_platform(api).free_memory() == 5 * 2**30


def test_a_gpu_bound_to_each_process_by_slurm_is_the_ranks_device_and_elsewhere_too_few_gpus_is_refused(monkeypatch):
    import torch

    from suite.runtime import device as dev

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    for k in ("SLURM_LOCALID", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5")
    with pytest.raises(dev.CudaUnavailable, match="8 local ranks need a GPU each; torch sees 1"):
        dev.select_platform("cuda", 5, 8)  # one GPU for 8 ranks of a job: refused, as before
    monkeypatch.setenv("SLURM_LOCALID", "5")
    monkeypatch.setenv("SLURM_STEP_GPUS", "0,1,2,3,4,5,6,7")  # srun --gpu-bind: this task sees its own GPU
    p = dev.select_platform("cuda", 5, 8)
    assert (p.device_type, p.backend, p.local_rank, str(p.device)) == ("cuda", "nccl", 5, "cuda:0")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)  # a job-wide binding: the local rank's GPU
    assert str(dev.select_platform("cuda", 5, 8).device) == "cuda:5"


def test_compute_fusion_is_labelled_eager_composition_on_cuda_in_the_record_and_the_report(one_rank_world):  # noqa: F811
    """On a (fake) CUDA platform the fused case's describe says its kernels are an eager composition, and why that
    matters against cuDNN; compiled says torch.compile; on CPU the label says what the CPU measures.  The report
    labels a CUDA record's case (hover and a note under its model's table) and leaves a CPU record's alone."""
    import types

    from suite.compute.fusion import apply_compute_fusion
    from suite.config import StrategyConfig
    from suite.models import get_model
    from suite.report.page import _row, _table
    from suite.results.records import Metrics
    from suite.runtime import context

    spec = get_model("resnet", "tiny")
    eager = StrategyConfig(fuse_bn_act_ops=True, fuse_elewise_add_act_ops=True)
    _, report = apply_compute_fusion(spec.make(0, torch.device("cpu")), eager)
    assert report["kernels"] == "eager composition" and "cuDNN's one batch-norm kernel" in report["kernels_note"]
    _, compiled = apply_compute_fusion(spec.make(0, torch.device("cpu")),
                                       StrategyConfig(fuse_bn_act_ops=True, fusion_backend="compile"))
    assert compiled["kernels"] == "torch.compile"
    ctx = context.current()
    context.set_current(context.RankContext(0, 1, 0, 1, Platform("cpu", "gloo")))
    try:
        _, on_cpu = apply_compute_fusion(spec.make(0, torch.device("cpu")), eager)
    finally:
        context.set_current(ctx)
    assert on_cpu["kernels"] == "eager composition" and "on CPU" in on_cpu["kernels_note"]

    def record(device, fusion):
        return types.SimpleNamespace(case="resnet/compute_fusion", world_size=8, verdict="pass", metrics=Metrics(),
                                     device=device, describe=types.SimpleNamespace(engine={"compute_fusion": fusion}))

    gpu, cpu = record("cuda (NVIDIA H100 80GB HBM3)", report), record("cpu", on_cpu)
    cells, why = _row(gpu)
    assert why["case"].startswith("eager composition: on CUDA each fused op")
    assert "case" not in _row(cpu)[1]
    notes = _table([(gpu, cells, why), (cpu, *_row(cpu))])["notes"]
    assert [n for n in notes if "eager composition" in n] == [
        f"resnet/compute_fusion@8: eager composition: {report['kernels_note']}."]
