"""Fakes that make the CUDA branches of fleetbench reachable on a CPU machine.

- :class:`FakeCuda`: the part of the ``torch.cuda`` API that ``suite.runtime.device.Platform`` calls,
  recording every stream switch, wait, event record and device setting in ``log`` (with the thread
  that made it), with per-thread current streams as in CUDA.  Events carry a time from a fake clock
  (``clock``) so ``elapsed_time`` is exact, and refuse ``elapsed_time`` before a synchronize, as CUDA
  does for an event that has not completed.
- :func:`fake_cuda_platform`: a ``Platform`` that takes its CUDA branches (``is_cuda``) through a
  ``FakeCuda``, while its tensors stay on the CPU (``device`` is the CPU) so gloo can carry them.
- :class:`FakeNvml`: a ``pynvml`` module stand-in with per-index utilization and names (device i has
  UUID ``GPU-fake-i``).

And one that makes `fleetbench run` reachable without ranks: :class:`FakeRankPool`.
"""
from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
import types
from dataclasses import dataclass

import torch

from suite.runtime.device import Platform


class FakeStream:
    def __init__(self, api: FakeCuda, name: str):
        self.api, self.name = api, name

    def wait_stream(self, other: FakeStream) -> None:
        self.api._log("wait_stream", self.name, other.name)

    def wait_event(self, event: FakeEvent) -> None:
        self.api._log("wait_event", self.name, event.name)

    def __repr__(self) -> str:
        return f"FakeStream({self.name})"


class FakeEvent:
    def __init__(self, api: FakeCuda, enable_timing: bool = False):
        self.api, self.enable_timing = api, enable_timing
        self.name = f"ev{next(api._ids)}"
        self.t = None
        self.stream = None

    def record(self, stream: FakeStream = None) -> None:
        stream = stream if stream is not None else self.api.current_stream()
        self.stream, self.t = stream.name, self.api.clock
        self.api._log("record", self.name, stream.name)

    def elapsed_time(self, other: FakeEvent) -> float:
        if not (self.enable_timing and other.enable_timing):
            raise RuntimeError("Both events must be created with argument 'enable_timing=True'")
        if self.api.synced_at is None or max(self.t, other.t) > self.api.synced_at:
            raise RuntimeError("event has not completed: synchronize before elapsed_time")
        return (other.t - self.t) * 1e3


class FakeCuda:
    """A recording stand-in for ``torch.cuda`` (streams, events, memory, devices)."""

    def __init__(self, device_count: int = 8, allocated: int = 0):
        self.log: list[tuple] = []
        self._ids = itertools.count()
        self._local = threading.local()
        self.default = FakeStream(self, "default")
        self.clock = 0.0  # seconds; tests advance it to stand for device time
        self.busy = 0.0  # seconds of queued device work a synchronize waits for (really sleeps)
        self.synced_at = None
        self.n = device_count
        self.allocated = allocated
        self.peak = allocated
        self.free_bytes = 16 * 2**30  # what mem_get_info reports free
        self.cached = 0  # reserved by the caching allocator but free (freed tensors' blocks)
        self.spin_hz = 1.5e9  # torch.cuda._sleep cycles per second of device time
        self.Stream = lambda device=None: FakeStream(self, f"side{next(self._ids)}")
        self.Event = lambda enable_timing=False: FakeEvent(self, enable_timing)

    def _log(self, *entry) -> None:
        self.log.append((threading.current_thread().name, *entry))

    def entries(self, kind: str) -> list[tuple]:
        return [e for e in self.log if e[1] == kind]

    # streams
    def current_stream(self, device=None) -> FakeStream:
        return getattr(self._local, "stream", self.default)

    @contextlib.contextmanager
    def stream(self, s: FakeStream):
        old = self.current_stream()
        self._local.stream = s
        self._log("enter", s.name)
        try:
            yield
        finally:
            self._local.stream = old
            self._log("exit", s.name)

    def pin_memory(self, tensor: torch.Tensor) -> torch.Tensor:
        self._log("pin", tuple(tensor.shape))
        return tensor

    def record_stream(self, tensor: torch.Tensor, stream: FakeStream) -> None:
        self._log("record_stream", tensor.data_ptr(), stream.name)

    # device
    def synchronize(self, device=None) -> None:
        if self.busy:  # queued device work the host now waits for
            time.sleep(self.busy)
            self.busy = 0.0
        self.synced_at = self.clock
        self._log("synchronize")

    def set_device(self, device) -> None:
        self._log("set_device", str(device))

    def is_available(self) -> bool:
        return True

    def device_count(self) -> int:
        return self.n

    def get_device_name(self, device=None) -> str:
        return "Fake GPU"

    # memory
    def alloc(self, nbytes: int) -> None:
        self.allocated += nbytes
        self.peak = max(self.peak, self.allocated)

    def free(self, nbytes: int) -> None:
        self.allocated -= nbytes

    def reset_peak_memory_stats(self, device=None) -> None:
        self.peak = self.allocated
        self._log("reset_peak")

    def memory_allocated(self, device=None) -> int:
        return self.allocated

    def memory_reserved(self, device=None) -> int:
        """The caching allocator's blocks: allocated, plus ``cached`` bytes of freed tensors it keeps."""
        return self.allocated + self.cached

    def max_memory_allocated(self, device=None) -> int:
        return self.peak

    def _sleep(self, cycles: int) -> None:
        """A spin kernel of ``cycles`` on the current stream; the fake device runs ``spin_hz`` cycles a second."""
        self.clock += cycles / self.spin_hz
        self._log("sleep", cycles, self.current_stream().name)

    def mem_get_info(self, device=None) -> tuple[int, int]:
        return self.free_bytes, 2 * self.free_bytes


@dataclass(frozen=True)
class _FakeCudaPlatform(Platform):
    @property
    def device(self) -> torch.device:  # the tensors stay on the CPU, so gloo carries them
        return torch.device("cpu")


def fake_cuda_platform(api: FakeCuda = None, local_rank: int = 0, backend: str = "gloo") -> Platform:
    """A platform whose CUDA branches run against ``api`` (a new FakeCuda by default)."""
    return _FakeCudaPlatform("cuda", backend, local_rank, cuda_api=api if api is not None else FakeCuda())


class FakeNvml(types.ModuleType):
    """``pynvml`` with ``len(names)`` devices; NVML index i reports utilization ``util[i]``."""

    NVML_CLOCK_SM = 1

    def __init__(self, names: list[str], util: list[int] = None):
        super().__init__("pynvml")
        self.names = names
        self.util = util or [10 * (i + 1) for i in range(len(names))]
        self.handles_asked: list[int] = []
        self.inits = 0

    def nvmlInit(self):
        self.inits += 1

    def nvmlShutdown(self):
        pass

    def nvmlDeviceGetCount(self):
        return len(self.names)

    def nvmlDeviceGetHandleByIndex(self, i):
        if not 0 <= i < len(self.names):
            raise ValueError(f"NVML index {i} out of range")
        self.handles_asked.append(i)
        return i

    def nvmlDeviceGetHandleByUUID(self, uuid):
        uuids = [f"GPU-fake-{i}" for i in range(len(self.names))]
        if uuid not in uuids:
            raise ValueError(f"NVML: no device with UUID {uuid}")
        self.handles_asked.append(uuids.index(uuid))
        return uuids.index(uuid)

    def nvmlDeviceGetUtilizationRates(self, h):
        return types.SimpleNamespace(gpu=self.util[h], memory=0)

    def nvmlDeviceGetMemoryInfo(self, h):
        return types.SimpleNamespace(used=1000 * (h + 1), total=10_000)

    def nvmlDeviceGetPowerUsage(self, h):
        return 100_000 + h

    def nvmlDeviceGetName(self, h):
        return self.names[h]

    def nvmlDeviceGetClockInfo(self, h, kind):
        return 1000

    def nvmlDeviceGetMaxClockInfo(self, h, kind):
        return 1500

    def nvmlSystemGetDriverVersion(self):
        return "999.1"


@contextlib.contextmanager
def captured_log(name: str):
    """The messages logged at INFO and above by logger ``name`` inside the block (a list, filled as they come);
    the logger's handlers and level are restored afterwards."""
    messages: list[str] = []

    class _Keep(logging.Handler):
        def emit(self, record):
            messages.append(record.getMessage())

    logger = logging.getLogger(name)
    handler, level = _Keep(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield messages
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


class FakeRankPool:
    """Stands for ``suite.runtime.RankPool`` in `fleetbench run --no-check`: every timing call answered with
    synthetic numbers (:func:`fake_answers`); each pool made is in ``made``, each call's keywords in ``calls``."""

    made: list = []

    def __init__(self, nproc, **kw):
        self.nproc, self.kw, self.calls = nproc, kw, []
        FakeRankPool.made.append(self)

    def run(self, fn, kwargs=None, timeout=None):
        from suite.runner import free_memory_on_rank

        if fn is free_memory_on_rank:
            return [2**40] * self.nproc
        self.calls.append(kwargs)
        return fake_answers([v["name"] for v in kwargs["variants"]], ranks=self.nproc)

    def close(self):
        pass


NVIDIA_SMI_Q = """
==============NVSMI LOG==============

Timestamp                                 : Mon Nov 30 12:00:00 2026
Driver Version                            : {driver}
CUDA Version                              : {cuda}

Attached GPUs                             : {gpus}
{blocks}"""
GPU_BLOCK = """GPU 00000000:{i:02X}:00.0
    Product Name                          : NVIDIA H100 80GB HBM3
    FB Memory Usage
        Total                             : 81559 MiB
        Reserved                          : 551 MiB
"""


def fake_nvidia_smi(folder, driver: str = "580.65.06", cuda: str = "13.0", gpus: int = 1) -> str:
    """An executable ``nvidia-smi`` in ``folder`` (put it first on the PATH) that claims ``gpus`` H100s under
    ``driver`` (supporting CUDA ``cuda``): ``-q`` prints the report, ``--query-gpu`` CSV lines; returns the folder."""
    import os

    text = NVIDIA_SMI_Q.format(driver=driver, cuda=cuda, gpus=gpus,
                               blocks="".join(GPU_BLOCK.format(i=i + 1) for i in range(gpus)))
    csv = "".join(f"NVIDIA H100 80GB HBM3, {driver}, 9.0, 81559 MiB\n" for _ in range(gpus))
    path = os.path.join(str(folder), "nvidia-smi")
    with open(path, "w") as fh:
        fh.write("#!/bin/sh\n"
                 f"case \"$*\" in\n  *--query-gpu*) printf '%s' '{csv}' ;;\n"
                 f"  *) printf '%s' '{text}' ;;\nesac\n")  # shell builtins only: works on any PATH
    os.chmod(path, 0o755)
    return str(folder)


# A sitecustomize for a command's processes that stands for NCCL's output (issue 43.1): each rank (a spawned child)
# writes NCCL's banner on its fd 1, as NCCL rank 0 does at its first communicator (ncclDebugFile defaults to stdout),
# and a WARN line into NCCL_DEBUG_FILE when that is set (%h and %p as NCCL fills them); the doctor's parent keeps only
# ITEMS (a short doctor).  `NCCL_LIKE_ITEMS` names the doctor's items kept, comma-separated.
NCCL_LIKE_RANKS = r'''
import os, socket, sys

argv = " ".join(getattr(sys, "orig_argv", sys.argv))
if "--multiprocessing-fork" in argv and os.environ.get("NCCL_LIKE_RANKS"):
    os.write(1, b"NCCL version 2.28.9+cuda13.0\n")
    path = os.environ.get("NCCL_DEBUG_FILE")
    if path:
        path = path.replace("%h", socket.gethostname()).replace("%p", str(os.getpid()))
        with open(path, "a") as fh:
            fh.write(f"{socket.gethostname()}:{os.getpid()} [0] NCCL WARN a warning only NCCL_DEBUG_FILE keeps\n")
elif "suite.cli.main" in argv and " doctor" in argv and os.environ.get("NCCL_LIKE_ITEMS"):
    import suite.doctor as _doctor

    keep = os.environ["NCCL_LIKE_ITEMS"].split(",")
    _doctor.ITEMS[:] = [fn for fn in _doctor.ITEMS if fn.__name__ in keep]
'''


def nccl_like_site(folder) -> str:
    """A folder holding the :data:`NCCL_LIKE_RANKS` sitecustomize (put it first on PYTHONPATH, with
    NCCL_LIKE_RANKS=1 and NCCL_LIKE_ITEMS set); returns it."""
    import os

    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "sitecustomize.py"), "w") as fh:
        fh.write(NCCL_LIKE_RANKS)
    return str(folder)


# ---- records made up: a timed record, a record for the report, a file of them ------------------------------------
def fake_record(case="mlp/plain", world=2, run_id="r1", **metrics):
    """A passing record of ``case`` with made-up windows and steps (``metrics`` added to or replacing them)."""
    from suite.results.records import CaseRecord

    base = {"samples_per_s": 100.0, "step_time_s": {"median": 0.02}, "step_times_s": [0.02, 0.021, 0.019],
            "window_s": [0.1, 0.11, 0.1], "steps_per_window": 5}
    return CaseRecord(case, case.split("/")[0], world, {"data_parallel": "suite"}, run_id, verdict="pass",
                      metrics={**base, **metrics}, metadata={"torch": "2.4.0", "cpu": "test cpu"})


def report_record(case, world=2, run_id="r1", status="ok", error=None, **metrics):
    """A record as the report reads one: ``status`` ok (made-up throughput and steps, ``metrics`` added) or not (no
    metrics, ``error`` said)."""
    from suite.results.records import CaseRecord

    base = {"samples_per_s": 100.0, "samples_per_s_ci": [90.0, 110.0], "step_time_s": {"median": 0.02},
            "step_times_s": [0.02, 0.021, 0.019, 0.02, 0.022]}
    return CaseRecord(case, case.split("/")[0], world, {"data_parallel": "suite"}, run_id, status=status,
                      verdict="pass" if status == "ok" else "error", metrics={**base, **metrics} if status == "ok"
                      else {}, metadata={"torch": "2.4.0", "cpu": "test cpu", "gpu": {"available": False}},
                      error=error)


def write_records(path, *records):
    """``records`` as a results file at ``path`` (its folder made); the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(r.to_json() + "\n" for r in records))
    return path


# a user's own model factory (a module of the current directory): the registry's mlp
GOOD_FACTORY = "from suite.models import get_model\n\ndef make(size):\n    return get_model('mlp', size)\n"


# ---- the runner's launcher, answering made-up timings -------------------------------------------------------------
RUNNER_META = {"torch": "test", "gpu": {"available": False}}


def resolved(name: str, **cfg):
    """The registry's case ``name`` resolved with its own config (``cfg`` added)."""
    from suite.cases import get_case
    from suite.config import StrategyConfig
    from suite.run_spec import ResolvedCase

    case = get_case(name)
    return ResolvedCase(case, StrategyConfig.from_dict({**case.config, **cfg}))


def fake_answers(names, losses=(1.0, 0.9), ranks=2):
    """What ``time_on_rank`` answers (typed), made up."""
    from suite.measure.timing import RankTiming

    def one(rank):
        return RankTiming.from_dict({"rank": rank, "variants": {n: {
            "windows": [0.5, 0.5], "step_times": [0.1] * 4, "losses": list(losses), "threads": 1,
            "comm_calls_per_step": {"world/all_reduce": 10.0}, "comm_bytes_per_step": {"world/all_reduce": 4e6},
            "host_syncs": 2, "describe": {"strategy": "plain", "allreduce_ops": 10}, "peak_memory_bytes": 1,
            "peak_memory_kind": "process_max_rss"} for n in names}})
    return [one(r) for r in range(ranks)]


class FakeLauncher:
    """Answers time_on_rank with synthetic numbers; fails interleaved calls of more than two variants."""

    nproc = 2

    def __init__(self, fail_interleaved=False, losses=(1.0, 0.9), free=(2**40, 2**40)):
        self.fail_interleaved, self.losses, self.calls, self.free = fail_interleaved, losses, [], free

    def run(self, fn, kwargs=None, timeout=None):
        from suite.runner import free_memory_on_rank
        from suite.runtime.pool import RankFailure

        if fn is free_memory_on_rank:  # the memory probe: each rank's free bytes
            return list(self.free)
        names = [v["name"] for v in kwargs["variants"]]
        self.calls.append(names)
        if self.fail_interleaved and len(names) > 2:
            raise RankFailure("rank(s) [1] died (rank 1 exit code -9) while running time_on_rank", [1], "x")
        return fake_answers(names, self.losses)


def fake_runner(launcher, facts=None, **opts):
    """A ``CaseRunner`` at world size 2 on ``launcher``, without the check and the utilization sampler."""
    from suite.run_spec import RunOptions
    from suite.runner import CaseRunner

    return CaseRunner(launcher, 2, RunOptions(check=False, utilization=False, **opts), metadata=RUNNER_META,
                      facts=facts)


class Borrowed:
    """A session pool lent to a command that closes its pool when it ends (the close is the session's)."""

    def __init__(self, pool):
        self.pool = pool

    def run(self, *args, **kwargs):
        return self.pool.run(*args, **kwargs)

    def close(self):
        pass


# ---- ab's trial servers, in memory -------------------------------------------------------------------------------
def structure_answer(structure: dict, verdict: str = "pass") -> dict:
    """A trial server's answer to "structure": a whole record as JSON (what `ab` reads into a CaseRecord)."""
    import json

    from suite.results.records import CaseRecord

    return json.loads(CaseRecord("mlp/plain", "mlp", 2, {}, "r", verdict=verdict, structure=structure).to_json())


class FakeServer:
    """Answers a trial server's requests in memory: a step time of `speed` per step, one key per preparation."""

    def __init__(self, speed):
        import types

        self.speed, self.requests, self.n, self.closed = speed, [], 0, False
        self.proc = types.SimpleNamespace(poll=lambda: None)
        self.log_path = "/nowhere/base.log"

    def close(self):
        self.closed = True

    def request(self, op, **fields):
        self.requests.append((op, fields))
        if op == "prepare":
            self.n += 1
            return {"key": f"k{self.n}"}
        if op == "trial":
            return {"step_s": self.speed() if callable(self.speed) else self.speed, "losses": [1.0]}
        if op == "structure":
            return {"record": structure_answer({"allreduce_ops": self.n}, "pass" if self.n == 1 else "n/a")}
        return {}


def ab_spec(seq):
    """The run specification a comparison at world size 2 takes, with these statistics."""
    from suite.run_spec import AbOptions, RunSpec, Selection

    return RunSpec(Selection(worlds=(2,)), ab=AbOptions(seq=seq))


def strategy_check(pool, model: str, strategy: str, data_parallel: str = "ddp", steps: int = 3,
                   timeout: float = 240.0, **knobs):
    """The correctness check of ``strategy`` (``module:function``) on ``model`` at size tiny, on ``pool``'s ranks:
    its ``CheckSummary``."""
    from suite.check.harness import check_on_rank, summarize
    from suite.config import StrategyConfig
    from suite.workload import WorkloadSpec

    cfg = StrategyConfig(data_parallel=data_parallel, strategy=strategy, **knobs)
    answers = pool.run(check_on_rank, dict(workload_spec=WorkloadSpec(model, size="tiny"), config=cfg.to_dict(),
                                           steps=steps), timeout=timeout)
    return summarize(cfg, answers)
