"""The GPU check's phases and their driver: each phase a bounded subprocess under the chosen interpreter, its result
written (``SUMMARY.md``, ``env.json``) as it ends, a phase that hangs killed at its bound and the later ones run.

====  ==============  ================================================================  ==========================
 #    phase           what                                                              on ``--device cpu``
====  ==============  ================================================================  ==========================
 0    host facts      ``nvidia-smi -q`` and its CSV query (driver, GPUs, capability,    run (no driver: said so)
                      memory), cores, memory, OS
 1    versions        torch, CUDA, cuDNN, NCCL, TF32 defaults, the freeze; exit 2 with  not applicable
                      one line when torch is a CPU wheel beside a GPU, or the driver
                      is too old for its CUDA
 2    doctor          ``fleetbench doctor --device D --nproc 1 --json FILE`` (streamed)  run on CPU
 3    premises        :mod:`.premises` (1-rank NCCL)                                    not applicable
 4    cases           ``fleetbench run --nproc 1`` over one case per strategy family    run, size tiny
                      of resnet50, gpt2 and bert (a call per model, the first traced,
                      its communication case an overlap on 2 communicators), capped
 5    plan            ``fleetbench nightly --plan --workflow gpu --step-times FILE``    run (worlds 1,2)
                      from phase 4's step times (worlds 1,8): the workflow's own
                      options (suite/nightly.py WORKFLOWS)
====  ==============  ================================================================  ==========================

Nothing a phase's processes print reaches a result: the doctor streams its JSON into a file, NCCL writes its
lines into files of the work folder (``NCCL_DEBUG_FILE``), which each phase's end collects into ``stderr.log`` and
the summary.  A phase rerun, or a check that reruns every phase, first removes the files that phase wrote before
(a reused ``OUT`` never shows an earlier check's results as this one's).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import tarfile
import tempfile
import time
import tomllib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from ..cases import BASELINE, CASES, FAMILIES, VARIANTS
from ..doctor_report import read_lines
from ..model_registry import PUBLISHED_MODELS, REGISTRY
from ..nightly import WORKFLOWS
from ..outputs import OutputDir
from ..runtime.child import ChildResult, run_child, tail
from ..runtime.wheel import driver_facts, misfit, warning, wheel_label
from .interpreter import INDEX_TIMEOUT_S, INDEX_URL, Interpreter, choose
from .summary import PHASE_FILES, write_summary

__all__ = ["Options", "Phase", "Check", "PHASE_NAMES", "phase_cases", "plan_args", "PASS", "FAIL", "TIMED_OUT", "NA",
           "SKIPPED", "NOT_RUN", "NCCL_LINES"]

PASS, FAIL, TIMED_OUT, NA, SKIPPED, NOT_RUN = ("pass", "fail", "timed out", "not applicable", "skipped",
                                               "not run (--only)")
PHASE_NAMES = {0: "host facts", 1: "versions", 2: "doctor", 3: "premises", 4: "cases", 5: "plan"}
CUDA_ONLY = {1: "CUDA, cuDNN and NCCL versions and the wheel's fit to the driver: no GPU asked for (--device cpu)",
             3: "the premises are CUDA's and NCCL's (streams, events, the caching allocator): no GPU asked for "
                "(--device cpu)"}
# hard bound of each phase, seconds; the whole check also stops starting phases at its deadline (6 min on a GPU)
BOUNDS = {"cuda": {0: 20, 1: 40, 2: 110, 3: 45, 4: 150, 5: 40}, "cpu": {0: 20, 1: 40, 2: 240, 3: 45, 4: 240, 5: 90}}
DEADLINE_S = {"cuda": 345.0, "cpu": 720.0}
ELASTIC = 4  # the phase that takes the deadline's unspent seconds (Check.bound)
NEEDS = {1: ("torch",), 2: ("torch", "numpy"), 3: ("torch", "numpy"), 4: ("torch", "numpy"), 5: ("torch", "numpy")}
# phase 4's models in order, the registry's published ones (the first is traced and gets the first share of the cap);
# on CPU the fastest first (the registry's rough step times)
MODELS = {"cuda": tuple(PUBLISHED_MODELS),
          "cpu": tuple(sorted(PUBLISHED_MODELS, key=lambda m: next(r.rough_step_s[0] for r in REGISTRY
                                                                   if r.name == m)))}
# phase 4's settings per device: size, rounds, steps per round, warm-up, check steps
RUN = {"cuda": ("full", 2, 3, 1, 2), "cpu": ("tiny", 2, 2, 1, 1)}
WORLDS = {"cuda": "1,8", "cpu": "1,2"}
WORKFLOW = WORKFLOWS["gpu"].name  # the scheduled workflow phase 5 plans (suite/nightly.py WORKFLOWS)
NCCL_LINES = 40  # NCCL's lines kept per phase in env.json and the summary (all of them in stderr.log)


@dataclass
class Options:
    device: str = "cuda"
    out: str = "results/gpu-check"
    only: tuple = ()  # phase numbers; () = every phase
    venv: str = ".venv"
    setup: bool = False  # `make setup` may be tried (nothing is installed on a lent machine unless asked)
    index_url: str = INDEX_URL
    index_timeout: float = INDEX_TIMEOUT_S
    root: str = field(default_factory=lambda: os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))))


@dataclass
class Phase:
    number: int
    name: str
    status: str
    seconds: float = 0.0
    next: str = ""  # what to do next, in words
    details: dict = field(default_factory=dict)


def phase_cases(models: tuple = MODELS["cuda"], families: tuple = FAMILIES) -> dict[str, list[str]]:
    """One case per strategy family of each model, runnable on one rank: ``plain`` for the baseline family, an
    overlap case on several communicators for the communication family (what the trace of the first model shows:
    buckets launched in backward on their own NCCL streams), else the gate's case where the family has one.  On CPU
    (``families`` the baseline and compute) the script is what is proven, not the cases: a few keep phase 4 within
    its cap on a 2-core machine."""
    overlap = {v.name: len(v.requires) for v in VARIANTS if "overlap" in v.requires}  # multicomm 2, overlap 1
    out: dict[str, list[str]] = {}
    for model in models:
        chosen = []
        for family in families:
            mine = [c for c in CASES if c.model == model and c.min_world <= 1 and _family(c.variant) == family]
            if family == "baseline":
                mine = [c for c in mine if c.variant == BASELINE] or mine
            mine.sort(key=lambda c: (-overlap.get(c.variant, 0), "gate" not in c.tags))
            if mine:
                chosen.append(mine[0].name)
        out[model] = chosen
    return out


def _family(variant: str) -> str:
    return next(v.family for v in VARIANTS if v.name == variant)


def torch_floor(root: str) -> str | None:
    """pyproject.toml's ``torch>=X`` (None when it names no floor)."""
    with open(os.path.join(root, "pyproject.toml"), "rb") as fh:
        deps = tomllib.load(fh)["project"]["dependencies"]
    for d in deps:
        m = re.match(r"torch\s*>=\s*([\d.]+)", d)
        if m:
            return m.group(1)
    return None


def _version_tuple(v: str) -> tuple:
    return tuple(int(x) for x in re.findall(r"\d+", v.split("+")[0])[:3])


class Check:
    """One run of the check: the interpreter, the phases in order, the files under ``out`` (written through
    ``suite.outputs``: never through a link, each whole)."""

    def __init__(self, opts: Options, log: Callable[[str], None] = print):
        self.opts, self.log = opts, log
        self.out = os.path.abspath(opts.out)
        self.dir = OutputDir(self.out)
        self.work = ""  # the run's temporary folder (run() makes and removes it)
        self.started = time.time()
        self.deadline = time.monotonic() + DEADLINE_S[opts.device]
        self.results: dict[int, Phase] = {}
        self.facts: dict = {"device": opts.device, "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        self.interpreter: Interpreter | None = None
        self.driver: dict | None = None
        self.fatal: str | None = None  # phase 1's one line (exit 2)
        self.notes: list[str] = []
        self.nccl: dict[str, list[str]] = {}  # phase number -> NCCL's lines (NCCL_DEBUG_FILE), the first NCCL_LINES
        self._load_earlier()

    # -- environment and bounded commands ------------------------------------------------------------------------
    def env(self) -> dict:
        env = dict(os.environ, NCCL_DEBUG="WARN", MPLCONFIGDIR=os.path.join(self.work, "mpl"),
                   NCCL_DEBUG_FILE=os.path.join(self.work, "nccl", "nccl.%h.%p.log"),
                   PYTHONPATH=self.opts.root + (os.pathsep + os.environ["PYTHONPATH"]
                                                if os.environ.get("PYTHONPATH") else ""))
        env.pop("CUDA_LAUNCH_BLOCKING", None)
        return env

    def bound(self, number: int) -> float:
        """The phase's own bound, shortened so the later phases keep 5 s each before the deadline; the cases phase
        (:data:`ELASTIC`) also takes what the earlier phases left unused, keeping the later phases' own bounds (on
        the first H200 the cases ran out of their 150 s with 130 s of the deadline unspent)."""
        later = [n for n in PHASE_NAMES if n > number and (not self.opts.only or n in self.opts.only)]
        remaining = self.deadline - time.monotonic()
        left = remaining - 5.0 * len(later)
        own = float(BOUNDS[self.opts.device][number])
        if number == ELASTIC:
            own = max(own, remaining - sum(BOUNDS[self.opts.device][n] for n in later))
        return max(min(own, 5.0), min(own, left))

    def command(self, number: int, cmd: list[str], timeout: float) -> ChildResult:
        os.makedirs(os.path.join(self.work, "nccl"), exist_ok=True)
        out = run_child(cmd, timeout, env=self.env(), cwd=self.opts.root)
        nccl = self._nccl_lines()
        self.dir.append("stderr.log",
                        f"==== phase {number} ({PHASE_NAMES[number]}): {' '.join(cmd)[:300]}\n"
                        f"==== exit {'killed at its bound' if out.timed_out else out.rc} after {out.seconds:.1f} s\n"
                        + out.stderr[-(2 << 20):]  # the last 2 MiB of each: the files stay under 16 MiB
                        + "\n" + "".join(f"NCCL: {ln}\n" for ln in nccl[-2000:]))
        if nccl:
            self.nccl.setdefault(str(number), [])
            self.nccl[str(number)] = (self.nccl[str(number)] + nccl)[:NCCL_LINES]
        return out

    def _nccl_lines(self) -> list[str]:
        """The lines NCCL wrote (``NCCL_DEBUG_FILE``) since the last command; their files removed."""
        folder = os.path.join(self.work, "nccl")
        lines: list[str] = []
        for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else ():
            path = os.path.join(folder, name)
            try:
                with open(path, errors="replace") as fh:
                    lines += [ln.rstrip() for ln in fh if ln.strip()]
            finally:
                os.remove(path)
        return lines

    def python(self) -> list[str]:
        assert self.interpreter is not None and self.interpreter.path
        return [self.interpreter.path]

    def fleetbench(self, *args: str) -> list[str]:
        return [*self.python(), "-m", "suite.cli.main", *args]

    # -- results -------------------------------------------------------------------------------------------------
    def _load_earlier(self) -> None:
        """What an earlier check left in ``out`` is removed for every phase this one runs (all of them without
        --only), so the summary never reads another check's results as this one's; with --only, the phases not
        rerun keep what the last check wrote (env.json)."""
        rerun = self.opts.only or tuple(PHASE_NAMES)
        stale = [f for n in rerun for f in PHASE_FILES.get(n, ())] + ([] if self.opts.only else ["stderr.log"])
        for name in stale:
            if self.dir.lstat(name) is not None:
                self.dir.remove(name)
        if not self.opts.only:
            return
        try:
            with open(os.path.join(self.out, "env.json")) as fh:
                earlier = json.load(fh)
        except (OSError, ValueError):
            return
        for p in earlier.get("phases", []):
            if p.get("number") not in self.opts.only:
                self.results[p["number"]] = Phase(**p)
        for key in ("host", "versions", "step_times", "plan", "nccl"):
            if key in earlier:
                self.facts[key] = earlier[key]
        self.nccl = {k: v for k, v in (earlier.get("nccl") or {}).items() if int(k) not in self.opts.only}

    def write(self) -> None:
        self.facts["phases"] = [asdict(self.results[n]) for n in sorted(self.results)]
        self.facts["interpreter"] = self.interpreter.as_dict() if self.interpreter else None
        self.facts["notes"] = self.notes
        self.facts["nccl"] = self.nccl
        self.dir.write("env.json", json.dumps(self.facts, indent=1, default=str))
        write_summary(self)

    def exit_code(self) -> int:
        if self.fatal:
            return 2
        return 1 if any(p.status in (FAIL, TIMED_OUT, SKIPPED) for p in self.results.values()) else 0

    # -- the run -------------------------------------------------------------------------------------------------
    def run(self) -> int:
        self.work = tempfile.mkdtemp(prefix="fleetbench-gpu-check-")
        try:
            self.driver = driver_facts()
            self.interpreter = choose(self.opts.root, self.opts.venv, self.opts.device, self.env(),
                                      self.opts.index_url, self.opts.index_timeout, log=self.log,
                                      setup=self.opts.setup, deadline=self.deadline)
            self.deadline += self.interpreter.setup_s  # `make setup` (--setup, asked) is not the check's time
            self.log(f"gpu-check: phases run under {self.interpreter.path or 'nothing'} ({self.interpreter.how}; "
                     f"torch {self.interpreter.torch or '-'})"
                     + (f"; lacks {', '.join(self.interpreter.missing)}" if self.interpreter.missing else ""))
            self._floor_note()
            for number, fn in PHASES:
                if self.opts.only and number not in self.opts.only:
                    self.results.setdefault(number, Phase(number, PHASE_NAMES[number], NOT_RUN))
                    continue
                self.results[number] = self._one(number, fn)
                p = self.results[number]
                self.log(f"gpu-check: phase {number} {p.name}: {p.status} ({p.seconds:.1f} s)"
                         + (f": {p.next}" if p.status not in (PASS, NA) and p.next else ""))
                self.write()
        finally:
            shutil.rmtree(self.work, ignore_errors=True)
        self.write()
        self.dir.close()
        return self.exit_code()

    def _one(self, number: int, fn) -> Phase:
        name = PHASE_NAMES[number]
        if self.opts.device == "cpu" and number in CUDA_ONLY:
            return Phase(number, name, NA, next=CUDA_ONLY[number])
        if number in NEEDS:
            if self.interpreter is None or not self.interpreter.path:
                return Phase(number, name, SKIPPED, next="no interpreter imports torch: " + "; ".join(
                    self.interpreter.tried if self.interpreter else []))
            lacking = [m for m in NEEDS[number] if m in self.interpreter.missing]
            if lacking:
                return Phase(number, name, SKIPPED, next=f"{self.interpreter.path} lacks {', '.join(lacking)}")
        if self.fatal and number in (2, 3, 4):
            return Phase(number, name, SKIPPED, next=f"phase 1: {self.fatal}")
        if time.monotonic() > self.deadline:
            return Phase(number, name, SKIPPED, next=f"the check's {DEADLINE_S[self.opts.device]:.0f} s were spent")
        t0 = time.monotonic()
        try:
            status, nxt, details = fn(self, self.bound(number))
        except Exception as exc:  # noqa: BLE001 - a phase's own bug is that phase's failure, the rest still runs
            status, nxt, details = FAIL, f"the check itself raised {type(exc).__name__}: {exc}", {}
        return Phase(number, name, status, round(time.monotonic() - t0, 1), nxt, details)

    def _floor_note(self) -> None:
        floor = torch_floor(self.opts.root)
        have = self.interpreter.torch if self.interpreter else None
        if floor and have and _version_tuple(have) < _version_tuple(floor):
            self.notes.append(f"torch {have} here is below the declared floor torch>={floor} (pyproject.toml, the "
                              f"version the tests run on): this check ran the code on an untested torch")


def _status(out: ChildResult, ok: bool) -> str:
    return TIMED_OUT if out.timed_out else PASS if ok else FAIL


def _why(out: ChildResult, bound: float) -> str:
    if out.timed_out:
        return f"killed at its bound of {bound:.0f} s: rerun with --only (stderr.log has its last lines)"
    return tail(out.stderr, 4) or tail(out.stdout, 4)


# ---------------------------------------------------------------------------------------------------------------
# the phases: each (check, bound in seconds) -> (status, what to do next, details)
# ---------------------------------------------------------------------------------------------------------------
def host_facts(c: Check, bound: float) -> tuple:
    import platform

    host: dict = {"os": platform.platform(), "cores": os.cpu_count(),
                  "cores_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
                  "orchestrator_python": platform.python_version()}
    try:
        with open("/proc/meminfo") as fh:
            host["memory_kib"] = int(next(ln for ln in fh if ln.startswith("MemTotal:")).split()[1])
    except (OSError, StopIteration, ValueError):
        pass
    drv = dict(c.driver or {})
    host["nvidia_smi_q"] = drv.pop("text", None)
    host["driver"] = drv or None
    if c.driver is not None:
        q = c.command(0, ["nvidia-smi", "--query-gpu=name,driver_version,compute_cap,memory.total,memory.used",
                          "--format=csv,noheader"], bound)
        host["gpus"] = [dict(zip(("name", "driver", "capability", "memory_total", "memory_used"),
                                 (x.strip() for x in ln.split(","))))
                        for ln in q.stdout.splitlines() if ln.strip()]
    c.facts["host"] = host
    if c.opts.device == "cuda":
        if c.driver is None:
            return FAIL, "no nvidia-smi: no NVIDIA driver on this machine (--device cpu checks the CPU path)", {}
        if not c.driver.get("gpus"):
            return FAIL, f"nvidia-smi lists no GPU: {c.driver.get('error') or 'see env.json'}", {}
    return PASS, "", {}


def versions(c: Check, bound: float) -> tuple:
    out = c.command(1, [*c.python(), "-c", "from suite.gpucheck.versions import main; main()"], bound)
    try:
        v = json.loads(out.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return _status(out, False), _why(out, bound) or "the versions probe printed nothing", {}
    c.dir.write("pip-freeze.txt", "\n".join(v.pop("freeze", [])) + "\n")
    c.facts["versions"] = v
    c.facts["versions"]["wheel"] = wheel_label(v["torch"], v.get("cuda"))
    problem = misfit(v["torch"], v.get("cuda"), c.driver)
    if problem is None and v.get("cuda") and not v.get("cuda_available") and (c.driver or {}).get("gpus"):
        problem = (f"torch {v['torch']} (CUDA {v['cuda']} wheel) cannot initialise CUDA beside the NVIDIA driver "
                   f"{(c.driver or {}).get('driver')}: {v.get('cuda_init_error')}")
    if problem:
        c.fatal = problem
        return FAIL, problem, {}
    note = warning(v["torch"], v.get("cuda"), c.driver)
    if note:
        c.notes.append(note)
    if not v.get("cuda_available"):
        return FAIL, f"CUDA unavailable: {v.get('cuda_init_error') or 'torch sees no GPU'}", {}
    return PASS, "", {}


def doctor(c: Check, bound: float) -> tuple:
    """The doctor on one rank, its report streamed item by item into OUT/doctor.jsonl (a doctor killed at its bound
    keeps what ended; nothing its ranks or NCCL print can break it: they never write into that file)."""
    path = c.dir.join("doctor.jsonl")
    out = c.command(2, c.fleetbench("doctor", "--device", c.opts.device, "--nproc", "1", "--json", path), bound)
    try:
        with open(path, errors="replace") as fh:
            rep = read_lines(fh.read())
    except OSError:
        rep = None
    if rep is None:
        return _status(out, False), _why(out, bound) or "the doctor wrote no report", {}
    failed = rep.failed
    if failed:
        return (_status(out, False), f"failed items: {', '.join(failed)} (their numbers: below and in doctor.jsonl)",
                {})
    if not rep.complete:
        return (_status(out, False), _why(out, bound) + f"; {len(rep.items)} item(s) ended first (doctor.jsonl)", {})
    return _status(out, out.rc == 0), "" if out.rc == 0 else _why(out, bound), {}


def premises(c: Check, bound: float) -> tuple:
    out = c.command(3, [*c.python(), "-c", "from suite.gpucheck.premises import main; main()"], bound)
    rows = []
    for ln in out.stdout.splitlines():
        try:
            rows.append(json.loads(ln))
        except ValueError:
            continue
    c.dir.write("premises.json", json.dumps(rows, indent=1))
    wrong = [r["premise"] for r in rows if not r.get("ok")]
    if out.timed_out or out.rc:
        return _status(out, False), _why(out, bound) + (f"; {len(rows)} premise(s) measured first" if rows else ""), {}
    return (PASS if rows and not wrong else FAIL,
            f"premises not as docs/gpu.md says: {', '.join(wrong)} (fix the code that relies on them, or the doc)"
            if wrong else "", {})


def cases(c: Check, bound: float) -> tuple:
    size, rounds, steps, warmup, check_steps = RUN[c.opts.device]
    results = os.path.join(c.work, "results", "runs.jsonl")
    chosen = phase_cases(MODELS[c.opts.device], FAMILIES if c.opts.device == "cuda" else ("baseline", "compute"))
    end = time.monotonic() + bound
    calls: list[dict] = []
    for i, (model, names) in enumerate(chosen.items()):
        share = (end - time.monotonic()) / (len(chosen) - i)
        if share < 5:
            calls.append({"model": model, "status": SKIPPED, "why": "the phase's cap was spent"})
            continue
        cmd = c.fleetbench("run", "--nproc", "1", "--device", c.opts.device, "--size", size, "--rounds", str(rounds),
                           "--steps", str(steps), "--warmup", str(warmup), "--check-steps", str(check_steps),
                           "--results", results, "--trace-steps", "1" if i == 0 else "0",
                           *[x for n in names for x in ("--case", n)])
        out = c.command(4, cmd, share)
        calls.append({"model": model, "cases": names, "exit": out.rc, "timed_out": out.timed_out,
                      "seconds": round(out.seconds, 1), "tail": tail(out.stderr, 6)})
    records = []
    if os.path.exists(results):
        c.dir.copy_in(results, "runs.jsonl")
        with open(results) as fh:
            records = [json.loads(ln) for ln in fh if ln.strip()]
        _archive_traces(os.path.dirname(results), c.dir, "traces.tar.gz")
    seen = {r["case"]: r for r in records}
    wanted = [n for names in chosen.values() for n in names]
    missing = [n for n in wanted if n not in seen]
    bad = [n for n in wanted if n in seen and (seen[n].get("status") != "ok" or seen[n].get("verdict") != "pass")]
    details = {"calls": calls, "wanted": wanted}
    if missing:
        return TIMED_OUT, (f"not reached within the {bound:.0f} s cap: {', '.join(missing)} (rerun with --only 4,5; "
                           f"each model's call got an equal share of what was left)"), details
    if bad:
        return FAIL, f"cases that did not pass: {', '.join(bad)} (verdicts and error tails below, runs.jsonl)", details
    if any(x.get("timed_out") or x.get("exit") not in (0, None) for x in calls):
        return FAIL, "every case recorded, but a call did not end cleanly (stderr.log)", details
    return PASS, "", details


def _archive_traces(results_dir: str, out: OutputDir, name: str) -> None:
    """Every trace of phase 4 in one gzipped tar; only the first when all would pass the 15 MiB the lent machine
    brings back (16 MiB a file)."""
    traces = os.path.join(results_dir, "traces")
    files = sorted(os.path.join(d, f) for d, _, fs in os.walk(traces) for f in fs)
    archive = os.path.join(results_dir, name)
    for chosen in (files, files[:1]):
        if not chosen:
            return
        with tarfile.open(archive, "w:gz") as tar:
            for f in chosen:
                tar.add(f, arcname=os.path.relpath(f, results_dir))
        if os.path.getsize(archive) <= 15 << 20:
            out.copy_in(archive, name)
            return


def step_times(runs_jsonl: str) -> dict | None:
    """Seconds per step measured at world size 1 (median of each passed case; each model's: its baseline's, else
    the median of its cases), for ``nightly --plan --step-times``."""
    try:
        with open(runs_jsonl) as fh:
            records = [json.loads(ln) for ln in fh if ln.strip()]
    except (OSError, ValueError):
        return None
    measured: dict[str, float] = {}
    by_model: dict[str, dict] = {}
    for r in records:
        med = ((r.get("metrics") or {}).get("step_time_s") or {}).get("median")
        if r.get("status") == "ok" and r.get("world_size") == 1 and isinstance(med, (int, float)) and med > 0:
            measured[r["case"]] = float(med)
            by_model.setdefault(r["model"], {})[r["case"].split("/", 1)[1]] = float(med)
    if not measured:
        return None
    models = {m: v.get(BASELINE) or statistics.median(v.values()) for m, v in by_model.items()}
    return {"models": models, "cases": measured, "source": "phase 4 of .ci/gpu-check, world size 1"}


def plan_args(device: str, out: str, step_times_file: str | None) -> list[str]:
    """Phase 5's command: the nightly's plan with the scheduled workflow's own options (``--workflow``, the one
    place the workflow reads them from too), at this check's device, sizes and world sizes."""
    args = ["nightly", "--plan", "--workflow", WORKFLOW, "--device", device, "--worlds", WORLDS[device], "--size",
            RUN[device][0], "--out", out, "--machine", "gpu-check"]
    return args + (["--step-times", step_times_file] if step_times_file else [])


def plan(c: Check, bound: float) -> tuple:
    measured = step_times(c.dir.join("runs.jsonl"))
    c.facts["step_times"] = measured
    path = None
    if measured:
        path = os.path.join(c.work, "step-times.json")
        with open(path, "w") as fh:
            json.dump(measured, fh)
    out = c.command(5, c.fleetbench(*plan_args(c.opts.device, os.path.join(c.work, "nightly"), path)), bound)
    c.facts["plan"] = out.stdout
    if out.timed_out or out.rc:
        return _status(out, False), _why(out, bound), {}
    return PASS, "" if measured else "no step times measured (phase 4): the plan used the rough table", {}


PHASES = ((0, host_facts), (1, versions), (2, doctor), (3, premises), (4, cases), (5, plan))
