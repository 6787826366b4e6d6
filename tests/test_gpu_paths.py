"""The CUDA paths, exercised on CPU through a fake platform (tests/fakes.py), and static guards.

What a fake can show: which thread issues each collective, in which order, on which stream, and
that every stream wait / event record / record_stream the CUDA semantics need is made, in order.
What it cannot show (real NCCL timing, a real hang): ``fleetbench doctor`` on a GPU (docs/gpu.md).
"""
from __future__ import annotations

import ast
import threading
import time
import types

import pytest
import torch

from suite.runtime.device import Platform, platform_of

COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce")


def _record_collectives(api, calls: list):
    """Wrap every collective of suite.comm.collectives to note (thread, op, group, current stream)."""
    from suite.comm import collectives as C
    from suite.runtime.groups import label_of

    saved = {op: getattr(C, op) for op in COLLECTIVES}
    for op, orig in saved.items():
        def wrapped(*args, _orig=orig, _op=op, **kwargs):
            group = kwargs.get("group")
            stream = api.current_stream().name if api is not None else None
            calls.append((threading.current_thread().name, _op, label_of(group), stream))
            if api is not None:
                api._log("collective", _op, label_of(group))
            return _orig(*args, **kwargs)

        setattr(C, op, wrapped)

    def restore() -> None:
        for op, orig in saved.items():
            setattr(C, op, orig)

    return restore


def _net(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8), torch.nn.ReLU(),
                               torch.nn.Linear(8, 4))


def _grads(net, x):
    net.zero_grad(set_to_none=True)
    net(x).square().sum().backward()
    return [p.grad.clone() for p in net.parameters()]


def bucketed_order_on_rank(fake: bool, config: dict) -> dict:
    """One step of the bucketed path (and one average_tensors) on a fake-CUDA or the real CPU platform."""
    from dataclasses import replace

    from suite.comm.bucketed import BucketedGradSync
    from suite.config import StrategyConfig
    from suite.runtime import context
    from tests.fakes import FakeCuda, fake_cuda_platform

    ctx = context.current()
    api = FakeCuda() if fake else None
    if fake:
        context.set_current(replace(ctx, platform=fake_cuda_platform(api, ctx.local_rank)))
    calls: list = []
    restore = _record_collectives(api, calls)
    sync = None
    try:
        world, rank = ctx.world_size, ctx.rank
        xs = [torch.randn(5, 6, generator=torch.Generator().manual_seed(100 + r)) for r in range(world)]
        want = [sum(g) / world for g in zip(*(_grads(_net(), x) for x in xs))]  # the exact average, local

        net = _net()
        sync = BucketedGradSync(net, StrategyConfig.from_dict(config))
        sync.begin_step()
        net(xs[rank]).square().sum().backward()
        step_calls = len(calls)
        sync.finish_step()
        err = max(float((p.grad - w).abs().max()) for p, w in zip(net.parameters(), want))

        tensors = [torch.full((7,), float(rank + 1)), torch.full((3, 2), float(rank + 1))]
        sync.average_tensors(tensors)
        avg_err = max(float((t - (world + 1) / 2).abs().max()) for t in tensors)
        return {"calls": calls, "step_calls": step_calls, "log": api.log if api else [],
                "buckets": [(b.index, b.comm_index, b.flat.data_ptr()) for b in sync.buckets],
                "main": threading.current_thread().name, "grad_err": err, "avg_err": avg_err}
    finally:
        restore()
        if sync is not None:
            sync.close()
        context.set_current(ctx)


HIER = dict(fuse_all_reduce_ops=True, fuse_grad_size_in_layers=1, sync_nccl_allreduce=False, nccl_comm_num=2,
            use_hierarchical_allreduce=True, hierarchical_allreduce_inter_nranks=2)


def test_cuda_hierarchical_overlap_issues_collectives_from_the_hook_in_bucket_order_on_side_streams(pool4):
    """Issue 11, defect 1: on CUDA no worker thread may issue a collective (NCCL's wait would block the
    default stream backward uses, and threads of two communicators could order differently per rank)."""
    answers = pool4.run(bucketed_order_on_rank, dict(fake=True, config=HIER))
    for a in answers:
        assert a["grad_err"] < 1e-5 and a["avg_err"] < 1e-6, a
        threads = {c[0] for c in a["calls"]}
        assert threads == {a["main"]}, f"collectives issued from {threads}; only the hook's/caller's thread may"
        buckets = a["buckets"]
        assert len(buckets) == 3 and [c for _, c, _ in buckets] == [0, 1, 0]
        # the step: per bucket in order, the three steps on that communicator's groups, on its side stream
        step = a["calls"][:a["step_calls"]]
        assert [(op, g.split(".")[0]) for _, op, g, _ in step] == [
            (op, f"{lvl}{c}") for _, c, _ in buckets
            for op, lvl in (("reduce_scatter", "intra"), ("all_reduce", "inter"), ("all_gather", "intra"))]
        side_of = {}
        for (_, c, _), k in zip(buckets, range(0, len(step), 3)):
            streams = {s for *_, s in step[k:k + 3]}
            assert len(streams) == 1 and streams != {"default"}, streams
            side_of.setdefault(c, streams.pop())
        assert side_of[0] != side_of[1], "each communicator has its own side stream"

        # the stream protocol, in log order
        log = [e[1:] for e in a["log"]]
        launches = [i for i, e in enumerate(log) if e[0] == "wait_stream"]
        assert len(launches) == 4  # three buckets, then average_tensors' one fused chunk
        launches = launches[:3]
        for (_bi, c, _ptr), i in zip(buckets, launches):
            side = side_of[c]
            assert log[i] == ("wait_stream", side, "default"), "the side stream waits for the producing stream"
            assert log[i + 1] == ("enter", side)
            assert [e[0] for e in log[i + 2:i + 5]] == ["collective"] * 3
            assert log[i + 5][0] == "record" and log[i + 5][2] == side
            assert log[i + 6] == ("exit", side)
        events = [log[i + 5][1] for i in launches]
        completions = [e for e in log if e[0] in ("wait_event", "record_stream")]
        assert completions[:6] == [x for (bi, c, ptr), ev in zip(buckets, events)
                                   for x in (("wait_event", "default", ev), ("record_stream", ptr, side_of[c]))]
        # all three launched before the first completion: the chains overlap backward, nothing waits in it
        assert log.index(completions[0]) > launches[-1] + 6
        # average_tensors takes the same path from the caller's thread
        assert all(s != "default" for *_, s in a["calls"][a["step_calls"]:])


def test_cpu_hierarchical_overlap_keeps_the_worker_threads(pool4):
    """On gloo the CPU path is unchanged: each communicator's chains run on its own worker thread."""
    answers = pool4.run(bucketed_order_on_rank, dict(fake=False, config=HIER))
    for a in answers:
        assert a["grad_err"] < 1e-5 and a["avg_err"] < 1e-6, a
        threads = {c[0] for c in a["calls"]}  # (the workers may still be issuing when backward returns)
        assert threads == {"fleetbench-comm0_0", "fleetbench-comm1_0"}, threads


def test_cuda_flat_overlap_on_two_communicators_issues_in_bucket_order_from_one_thread(pool2):
    cfg = dict(fuse_all_reduce_ops=True, fuse_grad_size_in_layers=1, sync_nccl_allreduce=False, nccl_comm_num=2)
    for a in pool2.run(bucketed_order_on_rank, dict(fake=True, config=cfg)):
        assert a["grad_err"] < 1e-5 and a["avg_err"] < 1e-6, a
        step = a["calls"][:a["step_calls"]]
        assert {c[0] for c in step} == {a["main"]}
        assert [(op, g) for _, op, g, _ in step] == [("all_reduce", f"comm{c}") for _, c, _ in a["buckets"]]


# -- collective spans: device time from CUDA events, not host clocks (defect 5) -------------------------
@pytest.fixture
def one_rank_world():
    """A one-rank gloo world in this process, with a rank context on a fake CUDA platform."""
    import torch.distributed as dist

    from suite.runtime import context

    from .fakes import FakeCuda, fake_cuda_platform

    api = FakeCuda()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    context.set_current(context.RankContext(0, 1, 0, 1, fake_cuda_platform(api)))
    try:
        yield api
    finally:
        context.set_current(None)
        dist.destroy_process_group()


def test_cuda_collective_spans_take_device_time_from_events(one_rank_world, monkeypatch):
    """Under NCCL a call returns when the work is queued: host clocks would show ~0 s.  The fake device
    spends 0.5 s in each collective while the host returns at once; the spans must show 0.5 s."""
    import time

    import torch.distributed as dist

    from suite.comm import collectives as C

    api = one_rank_world
    real = dist.all_reduce

    def queued(tensor, *args, **kwargs):
        api.clock += 0.5  # the device works for 0.5 s after the host call returned
        return real(tensor, *args, **kwargs)

    monkeypatch.setattr(dist, "all_reduce", queued)
    C.STATS.record_spans(True)
    try:
        api.synchronize()
        t0, anchor = time.perf_counter(), None
        from suite.runtime.context import current

        p = current().platform
        anchor = p.mark()
        C.all_reduce(torch.ones(4))
        work = C.all_reduce(torch.ones(4), async_op=True)
        work.wait()
        p.synchronize()
        C.STATS.resolve_spans(p, anchor, t0)
        spans = list(C.STATS.spans)
    finally:
        C.STATS.record_spans(False)
    assert len(spans) == 2
    for s in spans:
        assert s.t_end - s.t_launch == pytest.approx(0.5), s
    assert spans[1].t_launch - t0 == pytest.approx(0.5)  # the second starts after the first on the device
    # the async end event sits on a timing stream of the group that waited for the work, not the caller's
    rec = [e for e in api.log if e[1] == "record"]
    assert [e[3] for e in rec] == ["default", "default", "default", "default", rec[-1][3]]
    assert rec[-1][3] != "default"
    entered = [e for e in api.log if e[1] == "enter"]
    assert entered and entered[-1][2] == rec[-1][3]


# -- the reader's CUDA paths (defects 4, 8) ---------------------------------------------------------------
def _source(n: int = 12, batch: int = 4):
    from suite.data.reader import BatchSource, EncodedImages
    from suite.data.synthetic import SyntheticImages

    return BatchSource(EncodedImages.from_dataset(SyntheticImages(n, 1)), batch, 0, 1, seed=1)


def test_double_buffer_on_cuda_sets_the_device_in_its_thread_and_syncs_streams():
    """The prefetch thread must set the rank's device before it touches CUDA (else a context on GPU 0,
    as torch's pin-memory thread avoids); copies run on a side stream the consumer waits for."""
    from suite.data.reader import OptimizedReader, PlainReader
    from suite.runtime.device import Platform

    from .fakes import FakeCuda, fake_cuda_platform

    api = FakeCuda()
    with PlainReader(_source(), Platform("cpu", "gloo")) as plain:
        want = [(x.clone(), y.clone()) for x, y in plain.epoch(0)]
    with OptimizedReader(_source(), fake_cuda_platform(api, local_rank=5), double_buffer=True) as reader:
        got = list(reader.epoch(0))
    assert len(got) == len(want) == 3
    for (x, y), (wx, wy) in zip(got, want):
        assert torch.equal(x, wx) and torch.equal(y, wy)
    prefetch = [e for e in api.log if e[0] == "fleetbench-reader-prefetch"]
    assert prefetch[0][1] == "set_device", prefetch[:3]  # before any pinning or stream use
    assert {e[1] for e in prefetch[1:]} == {"pin", "enter", "record", "exit"}
    consumer = [e[1:] for e in api.log if e[0] == "MainThread"]
    records = [e[2] for e in prefetch if e[1] == "record"]
    assert [e[2] for e in consumer if e[0] == "wait_event"] == records  # every copy waited on, in order
    assert all(e[1] == "default" for e in consumer if e[0] == "wait_event")
    assert sum(1 for e in consumer if e[0] == "record_stream") == 2 * len(records)  # x and y of each batch


def test_data_wait_excludes_the_previous_steps_queued_gpu_work():
    """A blocking .to(device) waits for the stream's queued work; timing from before that wait counts the
    previous step's GPU time as data wait.  timed_next synchronizes before its timer starts."""
    import time

    from suite.data.reader import timed_next

    from .fakes import FakeCuda, fake_cuda_platform

    api = FakeCuda()
    p = fake_cuda_platform(api)

    def batches():
        while True:
            api.synchronize()  # the plain reader's blocking copy: waits for whatever the stream holds
            yield torch.zeros(1)

    it = batches()
    api.busy = 0.3  # the previous step's kernels, still queued
    t0 = time.perf_counter()
    next(it)
    naive = time.perf_counter() - t0
    assert naive >= 0.25  # what the old timer measured: the previous step's GPU time
    api.busy = 0.3
    _, wait = timed_next(it, p)
    assert wait < 0.1, wait


# -- static guard: every tensor created in rank-side code names its device (defect 2) --------------------
FACTORIES = {"zeros", "empty", "ones", "full", "tensor", "arange", "rand", "randn", "randint", "randperm"}

# (module path under suite/, enclosing function) -> why a tensor without device= is right there.
HOST_SIDE = {
    ("data/synthetic.py", "SyntheticImages.__init__"): "the dataset lives on the host; prepare() moves batches",
    ("data/synthetic.py", "SyntheticTokens.__init__"): "the dataset lives on the host; prepare() moves batches",
    ("data/synthetic.py", "step_indices"): "host indices into the host dataset (seeded CPU generator)",
    ("data/reader.py", "shard_epoch"): "host indices into the host dataset (seeded CPU generator)",
    ("figures/local_sgd.py", "quality_on_rank"): "host indices into the host dataset (data.get)",
    ("figures/compute.py", "saved_bytes_rows"): "runs in the parent process (one forward, bytes saved), no rank",
    ("models/transformer.py", "TinyTransformer.__init__"): "module construction; ModelSpec.make moves it .to(device)",
    ("models/gpt2.py", "Conv1D.__init__"): "module construction; ModelSpec.make moves it .to(device)",
    ("models/bert.py", "BertLMPredictionHead.__init__"): "module construction; ModelSpec.make moves it .to(device)",
    ("data/synthetic.py", "SyntheticMaskedTokens.__init__"): "the host dataset; batches are moved by prepare()",
    ("compute/fused_optim.py", "FlatOptimizer.state"):
        "the step count, a CPU scalar as in torch.optim (non-capturable)",
    ("check/harness.py", "check_on_rank"): "host floats (losses already fetched with .item()) compared on the host",
}



def _tensors_without_device() -> set:
    import ast
    import pathlib

    root = pathlib.Path(__file__).resolve().parent.parent / "suite"
    found = set()
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        stack: list = []

        class Visitor(ast.NodeVisitor):
            def generic_visit(self, node, rel=rel, stack=stack):
                scoped = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                if scoped:
                    stack.append(node.name)
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and node.func.attr in FACTORIES and isinstance(node.func.value, ast.Name)
                        and node.func.value.id == "torch" and not any(k.arg == "device" for k in node.keywords)):
                    found.add((rel, ".".join(stack) or "<module>", node.lineno, node.func.attr))
                super().generic_visit(node)
                if scoped:
                    stack.pop()

        Visitor().visit(ast.parse(path.read_text(), str(path)))
    return found


def test_every_tensor_created_in_rank_side_code_names_its_device():
    """On NCCL a collective on a tensor made without device= raises "No backend type associated with
    device type cpu"; an optimizer benchmark made so silently runs on the CPU of a GPU machine."""
    found = _tensors_without_device()
    bad = sorted(f"suite/{rel}:{line} {fn}: torch.{name}(...) without device="
                 for rel, fn, line, name in found if (rel, fn) not in HOST_SIDE)
    assert not bad, "\n".join(bad)
    stale = sorted(k for k in HOST_SIDE if not any((rel, fn) == k for rel, fn, _, _ in found))
    assert not stale, f"allow-list entries that match nothing any more (remove them): {stale}"


# -- static guard: no true division by a Python number in code whose values are compared bit for bit ------
# On CUDA ``tensor / python_number`` is computed as ``a * (1/b)`` (aten/src/ATen/native/cuda/
# BinaryDivTrueKernel.cu, the CPU-scalar branch, "may lose one bit"); a 0-dim CPU tensor counts as
# such a scalar (``is_cpu_scalar``).  The CPU kernel divides.  So code whose values are compared across
# devices or bit for bit multiplies by a constant or divides by a tensor on the device (issue 22.1).
DIVISION_SCOPE = ("data/", "compute/", "strategies/", "doctor.py")
DOCTOR_PARENT_SIDE = ("item_", "format_table")  # the doctor's items format host floats; its checks are guarded
DIV_CALLS = {"div", "div_", "divide", "divide_", "true_divide", "true_divide_", "_foreach_div", "_foreach_div_"}
SCALAR_BUILTINS = {"float", "int", "len", "max", "min"}

# (module under suite/, enclosing function, the division as written) -> why it divides Python numbers only
PYTHON_DIVISIONS = {
    ("compute/fused_ops.py", "BatchNormReLUFunction.forward", "n / max(n - 1, 1)"): "Python ints (Bessel's factor)",
    ("compute/fused_optim.py", "FlatOptimizer.step", "-lr / bc1"): "Python floats: Adam's step size, passed as value=",
    ("strategies/local_sgd.py", "adaptive_k", "lr0 * loss / (lr * loss0)"): "Python floats (typed arguments)",
}


def _is_math(node) -> bool:
    f = node.func if isinstance(node, ast.Call) else node
    return isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "math"


def _python_number(node) -> bool:
    """Certainly a Python number: a numeric literal, ``math.*``, int/float/len/max/min(), or arithmetic of those."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, (int, float)) and not isinstance(node.value, bool)
    if isinstance(node, ast.UnaryOp):
        return _python_number(node.operand)
    if isinstance(node, ast.BinOp):
        return _python_number(node.left) and _python_number(node.right)
    if isinstance(node, ast.Call):
        return _is_math(node) or (isinstance(node.func, ast.Name) and node.func.id in SCALAR_BUILTINS)
    return _is_math(node)


def _divisions(tree) -> list:
    """(function, line, expression, numerator, divisor) for every true division in ``tree``."""
    out: list = []

    def visit(node, stack, device_tensors, python_only):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            stack = stack + [node.name]
            device_tensors = set()
        fn = ".".join(stack) or "<module>"
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and any(
                k.arg == "device" for k in node.value.keywords):  # a tensor made on a named device
            device_tensors |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        pair = None
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            pair = (node.left, node.right)
        elif isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Div):
            pair = (node.target, node.value)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in DIV_CALLS
              and not any(k.arg == "rounding_mode" for k in node.keywords)):  # floor/trunc: not true division
            f = node.func
            on_torch = isinstance(f.value, ast.Name) and f.value.id == "torch"
            args = node.args if on_torch else [f.value] + node.args
            pair = (args[0] if args else None, args[1] if len(args) > 1 else None)
            if f.attr.startswith("_foreach"):
                pair = (None, None)  # always reported: a list of divisors is not checked here
        if pair is not None and not python_only:
            num, den = pair
            safe = (num is not None and _python_number(num)) or (
                isinstance(den, ast.Name) and den.id in device_tensors)
            if not safe:
                out.append((fn, node.lineno, ast.unparse(node), num, den))
        python_only = python_only or (isinstance(node, ast.Call) and _is_math(node))  # math.ceil(n / w): Python ints
        for child in ast.iter_child_nodes(node):
            visit(child, stack, device_tensors, python_only)

    visit(tree, [], set(), False)
    return out


def _division_findings(rel: str, source: str) -> list:
    found = []
    for fn, line, expr, _, _ in _divisions(ast.parse(source)):
        if rel == "doctor.py" and fn.startswith(DOCTOR_PARENT_SIDE):
            continue
        if (rel, fn, expr) not in PYTHON_DIVISIONS:
            found.append((rel, fn, line, expr))
    return found


def _suite_sources() -> dict:
    import pathlib

    root = pathlib.Path(__file__).resolve().parent.parent / "suite"
    return {p.relative_to(root).as_posix(): p.read_text() for p in sorted(root.rglob("*.py"))
            if p.relative_to(root).as_posix().startswith(DIVISION_SCOPE)}


def test_no_true_division_by_a_python_number_in_data_compute_strategies_and_doctor_checks():
    """A division by a Python number rounds differently on CUDA than on CPU (see above): the reader's host
    and device normalizations, the fused Adam against torch.optim, would differ bit for bit on a GPU."""
    sources = _suite_sources()
    assert {"data/synthetic.py", "data/reader.py", "compute/fused_optim.py", "doctor.py"} <= set(sources)
    found = [f for rel, src in sources.items() for f in _division_findings(rel, src)]
    assert not found, "\n".join(f"suite/{rel}:{line} {fn}: {expr}: true division by what may be a Python number "
                                 "(CUDA computes a * (1/b)); multiply by a constant or divide by a tensor on the device"
                                 for rel, fn, line, expr in found)
    listed = {(rel, fn, expr) for rel, src in sources.items() for fn, _, expr, _, _ in _divisions(ast.parse(src))}
    stale = sorted(k for k in PYTHON_DIVISIONS if k not in listed)
    assert not stale, f"allow-list entries that match nothing any more (remove them): {stale}"


@pytest.mark.parametrize("snippet", [
    "def f(x):\n    return x / 255.0",
    "def f(x, n):\n    x /= n",
    "def f(x, b):\n    return x / math.sqrt(b)",
    "def f(v, bc2):\n    return v.div_(math.sqrt(bc2))",
    "def f(x):\n    return x.div(2)",
    "def f(x, b):\n    return torch.div(x, b)",
    "def f(x):\n    return torch.true_divide(x, 3)",
    "def f(xs, s):\n    torch._foreach_div_(xs, s)",
    "def f(x, b):\n    d = torch.full((), b)\n    return x / d",  # a 0-dim CPU tensor is a scalar on CUDA
])
def test_the_division_guard_flags_an_injected_division(snippet):
    assert _division_findings("compute/injected.py", "import math\nimport torch\n" + snippet), snippet


@pytest.mark.parametrize("snippet", [
    "def f(x):\n    return x * (1.0 / 255.0)",
    "def f(n, w):\n    return math.ceil(n / w)",
    "def f(x):\n    return torch.div(x, 4, rounding_mode='floor')",
    "def f(v, b):\n    d = torch.full((), b, device=v.device)\n    return v.div_(d)",
])
def test_the_division_guard_passes_multipliers_python_arithmetic_and_device_divisors(snippet):
    assert not _division_findings("compute/injected.py", "import math\nimport torch\n" + snippet), snippet


@pytest.mark.parametrize("rel, now, before", [
    ("data/synthetic.py", "* _TO_UNIT - IMAGE_MEAN) * _INV_STD", "/ 255.0 - IMAGE_MEAN) / IMAGE_STD"),
    ("compute/fused_optim.py", ".div_(bc2_sqrt)", ".div_(math.sqrt(bc2))"),
])
def test_the_division_guard_flags_the_old_normalization_and_the_old_fused_adam(rel, now, before):
    source = _suite_sources()[rel]
    assert now in source and not _division_findings(rel, source)
    assert _division_findings(rel, source.replace(now, before)), f"the guard misses {before!r} in suite/{rel}"


# -- NVML: the GPUs this process sees, one sampler per node (defect 9) -----------------------------------
def _nvml(monkeypatch, n: int = 4):
    import sys

    from .fakes import FakeNvml

    fake = FakeNvml([f"GPU {i}" for i in range(n)])
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    return fake


def _sample(monkeypatch) -> dict:
    from suite.measure.utilization import UtilizationSampler

    s = UtilizationSampler(interval=0.02, device="cuda")
    with s:
        time.sleep(0.15)
    return s.summary()



@pytest.mark.parametrize("visible, want", [("2,3", [2, 3]), ("GPU-fake-3,GPU-fake-0", [3, 0]), ("1,-1,2", [1])])
def test_nvml_samples_the_visible_gpus_in_cudas_order(monkeypatch, visible, want):
    fake = _nvml(monkeypatch)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    out = _sample(monkeypatch)
    assert out["nvml_ids"] == [visible.split(",")[i] for i in range(len(want))]
    assert [g["util_pct"]["median"] for g in out["gpus"]] == [float(fake.util[i]) for i in want], out["gpus"]


def test_nvml_unknown_visible_entry_is_reported_not_replaced(monkeypatch):
    _nvml(monkeypatch)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-elsewhere")
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    out = _sample(monkeypatch)
    assert "gpus" not in out and any("NVML failed" in u and "GPU-elsewhere" in u for u in out["unavailable"])


def test_only_local_rank_0_samples_under_torchrun(monkeypatch):
    fake = _nvml(monkeypatch)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("LOCAL_RANK", "1")
    out = _sample(monkeypatch)
    assert fake.inits == 0 and out["n"] == 0 and out["sampled"] is False
    assert any("local rank 0 samples" in u for u in out["unavailable"])
    monkeypatch.setenv("LOCAL_RANK", "0")
    out = _sample(monkeypatch)
    assert fake.inits == 1 and out["n"] > 0 and len(out["gpus"]) == 4


def test_metadata_names_the_visible_gpus(monkeypatch):
    from suite.measure.metadata import gpu_info

    fake = _nvml(monkeypatch)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,3")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: f"cuda {i}")
    info = gpu_info()
    assert info["count"] == 2 and info["names"] == ["cuda 0", "cuda 1"]
    assert [(d["nvml_id"], d["name"]) for d in info["nvml"]] == [("1", "GPU 1"), ("3", "GPU 3")]
    assert fake.handles_asked == [1, 3]


# -- the emulated cluster is CPU-only (defect 9) -----------------------------------------------------------
def test_emulated_cluster_ranks_see_no_gpu_and_cuda_is_refused():
    import types

    from suite.cluster.launch import cluster_option, rank_env
    from suite.cluster.spec import parse_cluster
    from suite.config import ConfigError

    spec = parse_cluster("2x2:inter=200mbit")
    cluster = types.SimpleNamespace(spec=spec, node_of_rank=lambda r: types.SimpleNamespace(index=r // 2))
    for r in range(4):
        assert rank_env(cluster, r)["CUDA_VISIBLE_DEVICES"] == ""  # so the ranks pick CPU/gloo
    with pytest.raises(ConfigError, match="bypass its rate-limited links"):
        cluster_option("2x2:inter=200mbit", device="cuda")


# -- traces: overlapping collectives are async events ------------------------------------------------------
def test_trace_draws_overlapping_collectives_as_async_begin_end_pairs():
    from suite.measure.timeline import chrome_trace

    step = {"t0": 1.0, "t1": 1.1, "forward": [1.0, 1.02], "grads": [("w", 1.05), ("b", 1.06)],
            "comm": [{"op": "all_reduce", "group": "comm0", "nbytes": 64, "t0": 1.050, "t1": 1.090},
                     {"op": "all_reduce", "group": "comm0", "nbytes": 32, "t0": 1.060, "t1": 1.080}]}  # overlapping
    trace = chrome_trace([{"rank": 0, "steps": [step], "buckets": [["w"], ["b"]]}])
    comm = [e for e in trace["traceEvents"] if e.get("cat") == "comm"]
    assert all(e["ph"] in ("b", "e") for e in comm), [e["ph"] for e in comm]
    begins = {e["id"]: e for e in comm if e["ph"] == "b"}
    ends = {e["id"]: e for e in comm if e["ph"] == "e"}
    assert len(begins) == len(ends) == 2 and begins.keys() == ends.keys()
    for i, b in begins.items():
        e = ends[i]
        assert (b["name"], b["cat"], b["pid"]) == (e["name"], e["cat"], e["pid"]) and e["ts"] >= b["ts"]
    spans = sorted((b["ts"], ends[i]["ts"]) for i, b in begins.items())
    assert spans == [(1050000.0, 1090000.0), (1060000.0, 1080000.0)]
    assert begins[min(begins)]["args"] == {"bytes": 64, "group": "comm0", "step": 1}


# -- profile and trace: gradient-ready times and forward marks from device events (defect 5) ----------------
def _device_time_passes_between_marks(monkeypatch, api, seconds: float = 1.0):
    """Every mark first lets ``seconds`` of device time pass: a stand-in for kernels that the host only
    queued (host clocks would put every gradient at the start of backward)."""
    from suite.runtime.context import current

    platform = current().platform
    real = type(platform).mark

    def mark(self, stream=None):
        api.clock += seconds
        return real(self, stream)

    monkeypatch.setattr(type(platform), "mark", mark)


def test_trace_marks_come_from_device_events(one_rank_world, monkeypatch):
    from suite.measure.trace import trace_on_rank
    from suite.workload import WorkloadSpec, drop_workloads

    _device_time_passes_between_marks(monkeypatch, one_rank_world)
    drop_workloads()
    try:
        out = trace_on_rank(WorkloadSpec("mlp", "tiny", per_rank_batch=4, dataset_size=16), {}, steps=1, warmup=0)
    finally:
        drop_workloads()
    (step,) = out["steps"]
    f0, f1 = step["forward"]
    assert f1 - f0 == pytest.approx(1.0)
    times = [t for _, t in step["grads"]]
    assert [b - a for a, b in zip(times, times[1:])] == pytest.approx([1.0] * (len(times) - 1))


# ---- the first GPU nightly's smaller defects: platform, spin kernels, marks, memory, SLURM, labels -----------------
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


def test_compute_fusion_is_labelled_eager_composition_on_cuda_in_the_record_and_the_report(one_rank_world):
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
