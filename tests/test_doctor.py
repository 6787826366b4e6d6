"""`fleetbench doctor`: the whole self-check on CPU (every CPU item passes, CUDA items say why they do not
apply, under two minutes), and its failure paths (a failing, raising or hanging item fails the run)."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from suite import doctor as D
from suite.doctor_report import end_line, head_line, item_line, read_lines
from tests.clitools import gone_within


def asdict_report(rep) -> dict:
    """A report read back from the doctor's JSON lines, as plain values."""
    assert rep is not None and rep.complete, "no complete report in the doctor's output"
    return {"ok": rep.ok, "platform": rep.platform, "nproc": rep.nproc, "versions": rep.versions,
            "items": [{"item": i.item, "status": i.status, "numbers": i.numbers} for i in rep.items]}

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ALL_ITEMS = ["platform", "allreduce on each communicator", "half-precision allreduce", "bucketed overlap",
             "hierarchical overlap", "reader device copy", "CUDA event timing vs host clock",
             "precision settings take effect", "fused optimizers vs torch.optim", "AMP against its reference",
             "compute fusion against the unfused model", "compute fusion timing", "NVML",
             "memory footprint vs the allocator", "memory window", "torchrun error path"]
CUDA_ONLY = ("CUDA event timing vs host clock", "precision settings take effect", "fused optimizers vs torch.optim",
             "AMP against its reference", "compute fusion against the unfused model", "compute fusion timing", "NVML",
             "memory footprint vs the allocator")


@pytest.fixture(scope="module")
def cpu_report():
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "suite.cli.main", "doctor", "--device", "cpu", "--json"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)
    return proc, time.monotonic() - t0


@pytest.mark.heavy  # the whole doctor as a subprocess, ~20 s (its items are tested one by one here): make test-slow
def test_doctor_on_cpu_passes_every_cpu_item(cpu_report):
    proc, _elapsed = cpu_report
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-3000:]
    rep = asdict_report(read_lines(proc.stdout))
    assert rep["ok"] is True and rep["platform"] == "cpu/gloo" and rep["nproc"] == 4
    # its duration (under 2 minutes on a quiet machine) is not asserted: the subprocess timeout bounds a hang
    items = {i["item"].split(" (")[0]: i for i in rep["items"]}
    assert list(items) == ALL_ITEMS
    for name in CUDA_ONLY:  # skipped on CPU, with the reason printed
        assert items[name]["status"] == D.NA and items[name]["numbers"].startswith(("CPU", "no GPU")), items[name]
    for name, item in items.items():
        if name not in CUDA_ONLY + ("memory window",):
            assert item["status"] == D.PASS, item
    assert items["memory window"]["status"] in (D.PASS, D.NA)
    assert "0 wrong of" in items["allreduce on each communicator"]["numbers"]
    assert "2 node(s) of 2" in items["hierarchical overlap"]["numbers"]
    assert "rank 1's error reported" in items["torchrun error path"]["numbers"]
    assert rep["versions"]["torch"] and rep["versions"]["python"]


def _ok(ctx):
    return D.Item("fine", D.PASS, "1 = 1")


def _wrong(ctx):
    return D.Item("sums", D.FAIL, "3 wrong of 1024 elements")


def _raises(ctx):
    raise RuntimeError("no such thing\nlast line says why")


def _hangs(ctx):
    from suite.runtime.probes import sleep_then_allreduce

    ctx.call(sleep_then_allreduce, dict(seconds=20.0, sleeper=1), timeout=2.0)  # rank 0 waits in the allreduce
    return D.Item("never", D.PASS, "")


def test_a_failing_raising_or_hanging_item_fails_the_run():
    seen = []
    t0 = time.monotonic()
    rep = D.run_doctor(nproc=2, device="cpu", items=[_ok, _wrong, _raises, _hangs], on_item=seen.append)
    assert time.monotonic() - t0 < 60
    assert [i.status for i in rep.items] == [D.PASS, D.FAIL, D.FAIL, D.FAIL] and not rep.ok
    assert rep.items[2].item == "_raises" and "no such thing … last line says why" in \
        rep.items[2].numbers
    assert "RankFailure" in rep.items[3].numbers and "within 2 s" in rep.items[3].numbers, rep.items[3]
    assert seen == rep.items
    table = D.format_table(rep)
    assert table.splitlines()[0].startswith(f"fleetbench doctor: torch {D.torch.__version__} (")
    assert "; cpu/gloo, 2 ranks; " in table.splitlines()[0]
    assert "FAIL: sums, _raises, _hangs" in table and "3 wrong of 1024 elements" in table
    stream = head_line(rep) + "".join(map(item_line, rep.items)) + end_line(rep)
    lines = [json.loads(ln) for ln in stream.splitlines()]
    assert lines[0]["kind"] == "fleetbench.doctor" and lines[-1]["end"] is True and lines[-1]["ok"] is False
    assert [x["item"] for x in lines[1:-1]] == ["fine", "sums", "_raises", "_hangs"]
    back = read_lines("NCCL version 2.28.9+cuda13.0\n" + stream)  # a line not the doctor's is skipped
    assert back is not None and back.complete and back.items == rep.items and back.failed == ["sums", "_raises",
                                                                                               "_hangs"]
    cut = read_lines(head_line(rep) + item_line(rep.items[0]))  # a doctor stopped after its first item
    assert cut is not None and not cut.complete and not cut.ok and [i.item for i in cut.items] == ["fine"]


def _doctor_with_printing_ranks(tmp_path, *json_args: str):
    """`fleetbench doctor --device cpu --nproc 2 --json ...` (its platform and allreduce items only) whose ranks
    print NCCL's banner on their stdout, as NCCL rank 0 does (tests/fakes.py NCCL_LIKE_RANKS)."""
    from .fakes import nccl_like_site

    site = nccl_like_site(tmp_path / "site")
    env = dict(os.environ, PYTHONPATH=site + os.pathsep + ROOT, NCCL_LIKE_RANKS="1",
               NCCL_LIKE_ITEMS="item_platform,item_allreduce")
    return subprocess.run([sys.executable, "-m", "suite.cli.main", "doctor", "--device", "cpu", "--nproc", "2",
                           "--json", *json_args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)


def test_ranks_printing_on_stdout_never_break_the_doctors_json(tmp_path):
    """NCCL prints `NCCL version ...` on its process's stdout (issue 43.1): the doctor's ranks write to stderr, its
    stdout holds the JSON lines alone, one per item as it ends; --json FILE streams the same into the file."""
    proc = _doctor_with_printing_ranks(tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [json.loads(ln) for ln in proc.stdout.splitlines()]  # every line the doctor's: no banner among them
    assert lines[0]["kind"] == "fleetbench.doctor" and lines[0]["nproc"] == 2 and lines[-1]["ok"] is True
    assert [x["item"].split(" (")[0] for x in lines[1:-1]] == ["platform", "allreduce on each communicator"]
    assert proc.stderr.count("NCCL version 2.28.9+cuda13.0") == 2  # both ranks' banners, on stderr


@pytest.mark.heavy  # a second doctor (tests/test_gpu_check.py's printing ranks read --json FILE in make test)
def test_ranks_printing_on_stdout_never_break_the_doctors_json_file(tmp_path):
    path = tmp_path / "doctor.jsonl"
    proc = _doctor_with_printing_ranks(tmp_path, str(path))
    assert proc.returncode == 0 and "NCCL version" not in proc.stdout, proc.stdout[-2000:]
    rep = read_lines(path.read_text())
    assert rep is not None and rep.complete and rep.ok and len(rep.items) == 2


def test_cli_exit_status_follows_the_report(monkeypatch, capsys):
    from suite.cli.main import main

    monkeypatch.setattr(D, "ITEMS", [_ok])
    assert main(["doctor", "--device", "cpu", "--nproc", "1"]) == 0
    assert "all checks passed" in capsys.readouterr().out
    monkeypatch.setattr(D, "ITEMS", [_ok, _wrong])
    assert main(["doctor", "--device", "cpu", "--nproc", "1", "--json"]) == 1
    lines = [json.loads(ln) for ln in capsys.readouterr().out.splitlines()]  # JSON lines, nothing else
    assert lines[0]["kind"] == "fleetbench.doctor" and lines[-1]["end"] is True and lines[-1]["ok"] is False
    assert [x["status"] for x in lines[1:-1]] == [D.PASS, D.FAIL]


# -- the single-GPU items' logic, on CPU (issue 22.7); a GPU confirms them with `fleetbench doctor --nproc 1` --
def test_event_timing_reads_events_after_a_synchronize_and_the_verdict_wants_them_near_the_host_clock():
    from .fakes import FakeCuda, fake_cuda_platform

    api = FakeCuda()
    p = fake_cuda_platform(api)

    def work():  # one queued kernel: 10 ms of device time, waited for only at the synchronize
        api.clock += 0.01
        api.busy += 0.01

    r = D.event_timing(p, work, 5)
    assert r["event_s"] == pytest.approx(0.05)  # the fake clock: exact device time, read after the synchronize
    assert r["queued_s"] <= r["host_s"]
    kinds = [e[1] for e in api.log]
    assert kinds.count("record") == 2 and kinds.index("synchronize") < kinds.index("record") and \
        kinds[-1] == "synchronize", kinds
    assert D.events_agree({"event_s": 0.099, "host_s": 0.1})
    assert not D.events_agree({"event_s": 0.002, "host_s": 0.1})  # events that saw queuing only
    assert not D.events_agree({"event_s": 0.2, "host_s": 0.1})
    assert not D.events_agree({"event_s": 0.1, "host_s": 0.0})


def _run(strict_mm, strict_conv, tf32_mm, tf32_conv, hardware=True, reported=((False, False), (True, True))):
    keys = ("matmul_allow_tf32", "cudnn_allow_tf32")
    return {"tf32_hardware": hardware,
            "strict": {"matmul": strict_mm, "conv": strict_conv, "reported": dict(zip(keys, reported[0]))},
            "tf32": {"matmul": tf32_mm, "conv": tf32_conv, "reported": dict(zip(keys, reported[1]))}}


def test_footprint_verdict():
    assert D.footprint_verdict([{"footprint": 10 * 2**20, "allocated": 11 * 2**20}])[0]
    assert not D.footprint_verdict([{"footprint": 10 * 2**20, "allocated": 9 * 2**20}])[0]  # counted too much
    assert not D.footprint_verdict([{"footprint": 10 * 2**20, "allocated": 30 * 2**20}])[0]  # missed state
    ok, numbers = D.footprint_verdict([{"footprint": 2**20, "allocated": 2**20}, {"footprint": 1, "allocated": 0}])
    assert not ok and "footprint 1.00 MiB" in numbers  # every rank must hold


def test_footprint_rank_function_runs_on_cpu_ranks(pool2):
    """The rank side on CPU (no allocator statistics: allocated 0), so the GPU run meets no missing name."""
    out = pool2.run(D.footprint_on_rank)
    assert all(a["footprint"] > 0 and a["allocated"] == 0 for a in out), out


def test_precision_verdict():
    assert D.precision_verdict(_run(4e-7, 5e-7, 3e-4, 5e-7))[0]  # Ampere: TF32 coarser; cuDNN's choice is shown only
    assert not D.precision_verdict(_run(4e-7, 5e-7, 4e-7, 5e-7))[0]  # TF32 asked for, not taken
    assert not D.precision_verdict(_run(3e-4, 5e-7, 3e-4, 5e-7))[0]  # TF32 not off in strict mode
    assert not D.precision_verdict(_run(4e-7, 3e-4, 3e-4, 3e-4))[0]  # convolutions not strict
    assert not D.precision_verdict(_run(4e-7, 5e-7, 3e-4, 5e-7, reported=((False, False), (False, True))))[0]
    ok, numbers = D.precision_verdict(_run(4e-7, 5e-7, 4e-7, 5e-7, hardware=False))
    assert ok and "no TF32 hardware" in numbers


def _ctx(pool):
    import types

    return types.SimpleNamespace(device="cpu", nproc=pool.nproc, call=lambda fn, kwargs=None, timeout=None:
                                 pool.run(fn, kwargs or {}))


def test_precision_rank_function_measures_fp32_accuracy_and_reads_what_torch_reports(pool2):
    for r in pool2.run(D.precision_on_rank, dict(n=128)):
        ok, numbers = D.precision_verdict(r)
        assert ok, numbers
        assert 0 < r["strict"]["matmul"] <= 1e-5 and r["strict"]["reported"]["float32_matmul_precision"] == "highest"
        assert r["tf32"]["reported"]["float32_matmul_precision"] == "high" and r["tf32_hardware"] is False


def test_fused_optimizer_and_correctness_check_items_on_cpu(pool2, monkeypatch):
    ctx = _ctx(pool2)
    item = D.fused_optimizers_item(ctx, "fused")
    assert item.status == D.PASS and "adam" in item.numbers, item
    item = D.checks_item(ctx, "compute fusion against the unfused model", "", cpu_too=True)
    assert item.status == D.PASS and "parameter error" in item.numbers, item
    item = D.checks_item(ctx, "AMP against its reference", "", cpu_too=True)
    assert item.status == D.PASS and "bf16: pass" in item.numbers, item

    item = D.fusion_timing_item(ctx, "timing", shape=(4, 8, 6, 6), repeats=2)  # the GPU item's code on CPU ranks
    assert item.status == D.PASS and "fused (eager composition)" in item.numbers and "unfused" in item.numbers, item

    def wrong(fn, kwargs=None, timeout=None):  # an update that drifts: the items must fail
        out = pool2.run(fn, kwargs or {})
        if fn is D.optimizers_on_rank:
            return [dict(a, adam=1e-3) for a in out]
        if fn is D.fusion_timing_on_rank:
            return [dict(a, max_diff=0.5) for a in out]
        for a in out:
            a["per_step"][-1]["param_error"] = 1.0
        return out

    ctx.call = wrong
    assert D.fusion_timing_item(ctx, "timing", shape=(4, 8, 6, 6), repeats=2).status == D.FAIL
    assert D.fused_optimizers_item(ctx, "fused").status == D.FAIL
    assert D.checks_item(ctx, "compute fusion against the unfused model", "", cpu_too=True).status == D.FAIL


def test_every_test_docs_gpu_md_cites_exists():
    import re

    doc = open(os.path.join(ROOT, "docs", "gpu.md"), encoding="utf-8").read()
    cited = set(re.findall(r"\b(test_\w+)\b", doc)) - {"test_x"}
    defined = set()
    for name in os.listdir(os.path.join(ROOT, "tests")):
        if name.endswith(".py"):
            defined |= set(re.findall(r"^def (test_\w+)", open(os.path.join(ROOT, "tests", name)).read(), re.M))
    files = {m for m in re.findall(r"tests/(test_\w+)\.py", doc)}
    missing = sorted(cited - defined - files)
    assert len(cited) > 20 and not missing, missing


def test_the_first_line_names_the_wheel_and_the_driver_and_a_misfit_is_refused_in_one_line(monkeypatch, capsys,
                                                                                          tmp_path):
    """The table's first line: the wheel (CPU or CUDA x.y) and the NVIDIA driver (a fake nvidia-smi on the PATH);
    a CPU wheel beside a GPU, or a CUDA 13 wheel under a CUDA 12 driver, is one error line (exit 2) before any rank."""
    from suite.cli.main import main
    from tests.fakes import fake_nvidia_smi

    monkeypatch.setattr(D, "ITEMS", [_ok])
    monkeypatch.setenv("PATH", str(tmp_path / "none"))  # no nvidia-smi at all
    assert main(["doctor", "--device", "cpu", "--nproc", "1"]) == 0
    head = capsys.readouterr().out.splitlines()[0]
    wheel = "CPU" if D.torch.version.cuda is None else f"CUDA {D.torch.version.cuda}"
    assert head.startswith(f"fleetbench doctor: torch {D.torch.__version__} ({wheel} wheel), no NVIDIA driver"), head

    (tmp_path / "smi").mkdir()
    monkeypatch.setenv("PATH", fake_nvidia_smi(tmp_path / "smi", driver="580.65.06", cuda="13.0", gpus=2)
                       + os.pathsep + os.environ["PATH"])
    monkeypatch.setattr(D.torch.version, "cuda", None)
    assert main(["doctor", "--device", "cpu", "--nproc", "1"]) == 0  # the CPU path asked for: not refused
    head = capsys.readouterr().out.splitlines()[0]
    assert "(CPU wheel), NVIDIA driver 580.65.06 (CUDA 13.0), 2 GPU(s); cpu/gloo, 1 ranks" in head, head
    for device in (["--device", "cuda"], []):
        assert main(["doctor", "--nproc", "1", *device]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"torch {D.torch.__version__} is a CPU wheel" in err[0] and "2 GPU(s)" in err[0], err

    (tmp_path / "old").mkdir()
    monkeypatch.setenv("PATH", fake_nvidia_smi(tmp_path / "old", driver="550.54", cuda="12.4") + os.pathsep
                       + os.environ["PATH"])
    monkeypatch.setattr(D.torch.version, "cuda", "13.0")
    monkeypatch.setattr(D.torch, "__version__", "2.13.0")
    assert main(["doctor", "--device", "cuda", "--nproc", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "built for CUDA 13.0" in err[0] and "driver 550.54 (CUDA 12.4)" in err[0], err


class _Ctx:
    """A DoctorRun stand-in that records each call (function, keywords, timeout) and answers from ``answer``."""

    def __init__(self, nproc: int, answer, hang_timeout: float = 30.0):
        self.nproc, self.device, self.hang_timeout, self.answer = nproc, "cuda", hang_timeout, answer
        self.calls: list = []
        self.released = 0

    def call(self, fn, kwargs=None, timeout=None):
        self.calls.append((fn, kwargs, timeout))
        return self.answer(fn, kwargs)

    def release(self):
        self.released += 1


def test_the_hierarchical_hang_bound_is_the_overlaps_alone_not_its_communicators_set_up():
    """The communicators (12 splits under NCCL) and a first step run under their own bound; the hang bound then
    covers the timed steps only; a set-up that fails says so.  **Call sequence only**: a GPU shows the splits' time."""
    good = {"max_error": 0.0, "scale": 1.0, "launched_in_backward": True, "buckets": 4, "describe": {"nodes": 2}}
    ctx = _Ctx(4, lambda fn, kw: [good] * 4, hang_timeout=7.0)
    item = D.item_hierarchical(ctx)
    assert item.status == D.PASS, item
    assert [(fn, kw.get("steps"), t) for fn, kw, t in ctx.calls] == [(D.bucketed_on_rank, 1, D.GROUPS_TIMEOUT),
                                                                     (D.bucketed_on_rank, None, 7.0)]

    def slow_setup(fn, kw):
        if kw.get("steps") == 1:
            raise RuntimeError("RankFailure: no answer within 120 s")
        return [good] * 4

    item = D.item_hierarchical(_Ctx(4, slow_setup))
    assert item.status == D.FAIL and item.numbers.startswith("building its communicators and one step"), item


def test_the_torchrun_item_releases_the_pools_gpus_before_its_job_starts(monkeypatch):
    """In EXCLUSIVE_PROCESS mode a GPU takes one process: the doctor's pool lets go of its GPUs before the torchrun
    job starts (and comes back for a later item).  **Call sequence only**."""
    ctx = _Ctx(1, lambda fn, kw: [])
    ctx.device = "cpu"
    seen = []

    from suite.runtime.child import ChildResult

    def job(cmd, timeout, **kw):  # torchrun's job, as the bounded-child helper runs it
        seen.append(ctx.released)
        return ChildResult(1, False, "", "fleetbench-doctor: deliberate error on rank 1\nrank 1 raised", 3.0)

    with monkeypatch.context() as m:
        m.setattr(D, "_private_netns_prefix", lambda: [])
        m.setattr(D, "run_child", job)
        item = D.item_torchrun(ctx)
    assert seen == [1] and item.status == D.PASS, item

    class Pool:  # no ranks: which pool each call reaches
        made: list = []

        def __init__(self, *a, **k):
            self.closed = False
            Pool.made.append(self)

        def run(self, fn, kwargs, timeout=None):
            assert not self.closed
            return [len(Pool.made)]

        def close(self):
            self.closed = True

    monkeypatch.setattr(D, "RankPool", Pool)
    run = D.DoctorRun(1, "cpu", 30.0, {})
    assert run.call(D.memory_window_on_rank) == [1]
    run.release()
    assert Pool.made[0].closed and run.pool is None
    assert run.call(D.memory_window_on_rank) == [2]  # a released pool comes back for the next item that calls it
    run.close()
    assert Pool.made[1].closed


# ---- the hierarchical item -----------------------------------------------------------------------------------------
class _PoolCtx:
    """What the doctor's items use of its run, over a session pool."""

    def __init__(self, pool, nproc):
        self.pool, self.nproc, self.hang_timeout = pool, nproc, 120.0

    def call(self, fn, kwargs=None, timeout=None):
        return self.pool.run(fn, kwargs or {}, timeout=timeout)


def test_doctor_hierarchical_item_adapts_to_two_ranks_and_is_not_applicable_at_one(pool2):
    from suite.doctor import FAIL, NA, PASS, item_hierarchical

    one = item_hierarchical(_PoolCtx(None, 1))
    assert one.status == NA and "one rank" in one.numbers
    two = item_hierarchical(_PoolCtx(pool2, 2))
    assert two.status == PASS and two.status != FAIL, two
    assert "1 node(s) of 2" in two.numbers


# ---- a killed doctor takes torchrun and its ranks along ------------------------------------------------------------
def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _has_socket(pid: int) -> bool:
    try:
        return any(os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:") for fd in os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return False


DOCTOR_TORCHRUN = """
import sys
from suite import doctor

class Ctx:  # what item_torchrun asks of the doctor's run: its device, and to let go of the pool's GPUs
    device = "cpu"

    def release(self):
        pass

print(doctor.item_torchrun(Ctx()), flush=True)
"""


def _rank_of_the_job(pid: int) -> bool:
    line = _cmdline(pid)
    return "suite.cli.main torchrun-probe" in line and "torch.distributed.run" not in line


def _kill_the_doctor_while_torchrun_runs(tmp_path: Path, sig: int, when: str) -> tuple[list[int], list[str]]:
    """The doctor's torchrun item (torchrun and its 2 ranks) in a process killed with ``sig`` as soon as both ranks
    have started (``when="started"``: importing) or have met at the rendezvous (``"met"``: a socket open each).
    What of the job is alive 3 s later, and the leftovers in its TMPDIR once a sweep of dead runs' directories has
    run (what the next command does first)."""
    from suite.runtime.pool import remove_stale
    from suite.runtime.spawn import RUN_TOKEN, processes_with_token

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    token = f"probe36-doctor-{os.getpid()}-{sig}-{when}"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp), RUN_TOKEN: token}
    doctor = subprocess.Popen([sys.executable, "-c", DOCTOR_TORCHRUN], cwd=tmp_path, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    job: list[int] = []
    try:
        deadline = time.monotonic() + 240
        ranks: list[int] = []
        while time.monotonic() < deadline and doctor.poll() is None:
            job = [p for p, _ in processes_with_token(token, (doctor.pid,))]
            ranks = [p for p in job if _rank_of_the_job(p)]
            if len(ranks) == 2 and (when == "started" or all(map(_has_socket, ranks))):
                break
            time.sleep(0.02)
        assert len(ranks) == 2 and doctor.poll() is None, f"torchrun's ranks never {when} ({job}, {doctor.poll()})"
        assert any("torch.distributed.run" in _cmdline(p) for p in job), [_cmdline(p) for p in job]
        doctor.send_signal(sig)
        doctor.wait(timeout=30)
        left = gone_within(job, 3.0)
        remove_stale(tmp=str(tmp))
        return left, sorted(os.listdir(tmp))
    finally:
        for pid in job + [doctor.pid]:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        doctor.wait()


@pytest.mark.heavy  # torchrun and two ranks started, each time (15-40 s on 2 cores): make test-slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("sig,when", [(signal.SIGKILL, "started"), (signal.SIGKILL, "met"), (signal.SIGTERM, "met")],
                         ids=["SIGKILL-importing", "SIGKILL-met", "SIGTERM-met"])
def test_a_killed_doctor_takes_torchrun_and_its_ranks_along(tmp_path, sig, when):
    """The probe: a killed `doctor` left torchrun and 2 ranks about 10 s (until the job ended by itself).  Killed
    while the ranks import torch (seconds), each rank goes at once too: its parent-death signal is set first."""
    left, entries = _kill_the_doctor_while_torchrun_runs(tmp_path, sig, when)
    assert not left, f"{[(p, _cmdline(p)[:80]) for p in left]} outlived the doctor by 3 s"
    assert entries == [], entries
