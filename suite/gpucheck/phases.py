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
 2    doctor          ``fleetbench doctor --device D --nproc 1 --json``                  run on CPU
 3    premises        :mod:`.premises` (1-rank NCCL)                                    not applicable
 4    cases           ``fleetbench run --nproc 1`` over one case per strategy family    run, size tiny
                      of resnet50, gpt2 and bert (a call per model, one traced), capped
 5    plan            ``fleetbench nightly --plan --step-times FILE`` from phase 4's     run (worlds 1,2)
                      step times (worlds 1,8)
====  ==============  ================================================================  ==========================
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
from ..runtime.wheel import driver_facts, misfit, warning, wheel_label
from .bounded import Outcome, run_bounded, tail
from .interpreter import INDEX_TIMEOUT_S, INDEX_URL, Interpreter, choose
from .summary import write_summary

__all__ = ["Options", "Phase", "Check", "PHASE_NAMES", "phase_cases", "PASS", "FAIL", "TIMED_OUT", "NA", "SKIPPED",
           "NOT_RUN"]

PASS, FAIL, TIMED_OUT, NA, SKIPPED, NOT_RUN = ("pass", "fail", "timed out", "not applicable", "skipped",
                                               "not run (--only)")
PHASE_NAMES = {0: "host facts", 1: "versions", 2: "doctor", 3: "premises", 4: "cases", 5: "plan"}
CUDA_ONLY = {1: "CUDA, cuDNN and NCCL versions and the wheel's fit to the driver: no GPU asked for (--device cpu)",
             3: "the premises are CUDA's and NCCL's (streams, events, the caching allocator): no GPU asked for "
                "(--device cpu)"}
# hard bound of each phase, seconds; the whole check also stops starting phases at its deadline (6 min on a GPU)
BOUNDS = {"cuda": {0: 20, 1: 40, 2: 110, 3: 45, 4: 150, 5: 40}, "cpu": {0: 20, 1: 40, 2: 240, 3: 45, 4: 240, 5: 90}}
DEADLINE_S = {"cuda": 345.0, "cpu": 720.0}
NEEDS = {1: ("torch",), 2: ("torch", "numpy"), 3: ("torch", "numpy"), 4: ("torch", "numpy"), 5: ("torch", "numpy")}
# phase 4's models in order (the first is traced and gets the first share of the cap); on CPU the fastest first
MODELS = {"cuda": ("resnet50", "gpt2", "bert"), "cpu": ("bert", "gpt2", "resnet50")}
# phase 4's settings per device: size, rounds, steps per round, warm-up, check steps
RUN = {"cuda": ("full", 2, 3, 1, 2), "cpu": ("tiny", 2, 2, 1, 1)}
WORLDS = {"cuda": "1,8", "cpu": "1,2"}


@dataclass
class Options:
    device: str = "cuda"
    out: str = "results/gpu-check"
    only: tuple = ()  # phase numbers; () = every phase
    venv: str = ".venv"
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
    """One case per strategy family of each model, the gate's where the family has one (``plain`` for the
    baseline family), runnable on one rank.  On CPU (``families`` the baseline and compute) the script is what is
    proven, not the cases: a few keep phase 4 within its cap on a 2-core machine."""
    out: dict[str, list[str]] = {}
    for model in models:
        chosen = []
        for family in families:
            mine = [c for c in CASES if c.model == model and c.min_world <= 1 and _family(c.variant) == family]
            if family == "baseline":
                mine = [c for c in mine if c.variant == BASELINE] or mine
            mine.sort(key=lambda c: "gate" not in c.tags)
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
    """One run of the check: the interpreter, the phases in order, the files under ``out``."""

    def __init__(self, opts: Options, log: Callable[[str], None] = print):
        self.opts, self.log = opts, log
        self.out = os.path.abspath(opts.out)
        self.work = tempfile.mkdtemp(prefix="fleetbench-gpu-check-")
        self.started = time.time()
        self.deadline = time.monotonic() + DEADLINE_S[opts.device]
        self.results: dict[int, Phase] = {}
        self.facts: dict = {"device": opts.device, "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        self.interpreter: Interpreter | None = None
        self.driver: dict | None = None
        self.fatal: str | None = None  # phase 1's one line (exit 2)
        self.notes: list[str] = []
        os.makedirs(self.out, exist_ok=True)
        self._load_earlier()

    # -- environment and bounded commands ------------------------------------------------------------------------
    def env(self) -> dict:
        env = dict(os.environ, NCCL_DEBUG="WARN", MPLCONFIGDIR=os.path.join(self.work, "mpl"),
                   PYTHONPATH=self.opts.root + (os.pathsep + os.environ["PYTHONPATH"]
                                                if os.environ.get("PYTHONPATH") else ""))
        env.pop("CUDA_LAUNCH_BLOCKING", None)
        return env

    def bound(self, number: int) -> float:
        """The phase's own bound, shortened so the later phases keep 5 s each before the deadline."""
        later = sum(1 for n in PHASE_NAMES if n > number)
        left = self.deadline - time.monotonic() - 5.0 * later
        own = BOUNDS[self.opts.device][number]
        return max(min(own, 5.0), min(own, left))

    def command(self, number: int, cmd: list[str], timeout: float) -> Outcome:
        out = run_bounded(cmd, timeout, env=self.env(), cwd=self.opts.root)
        with open(os.path.join(self.out, "stderr.log"), "a") as fh:  # NCCL_DEBUG=WARN's lines land here too
            fh.write(f"==== phase {number} ({PHASE_NAMES[number]}): {' '.join(cmd)[:300]}\n"
                     f"==== exit {'killed at its bound' if out.timed_out else out.rc} after {out.seconds:.1f} s\n")
            fh.write(out.stderr[-(2 << 20):])  # the last 2 MiB of each: the files stay under 16 MiB
            fh.write("\n")
        return out

    def python(self) -> list[str]:
        assert self.interpreter is not None and self.interpreter.path
        return [self.interpreter.path]

    def fleetbench(self, *args: str) -> list[str]:
        return [*self.python(), "-m", "suite.cli.main", *args]

    # -- results -------------------------------------------------------------------------------------------------
    def _load_earlier(self) -> None:
        """With --only: the phases not rerun keep what the last check wrote (env.json)."""
        if not self.opts.only:
            for name in ("stderr.log",):
                path = os.path.join(self.out, name)
                if os.path.exists(path):
                    os.remove(path)
            return
        try:
            with open(os.path.join(self.out, "env.json")) as fh:
                earlier = json.load(fh)
        except (OSError, ValueError):
            return
        for p in earlier.get("phases", []):
            if p.get("number") not in self.opts.only:
                self.results[p["number"]] = Phase(**p)
        for key in ("host", "versions", "step_times", "plan"):
            if key in earlier:
                self.facts[key] = earlier[key]

    def write(self) -> None:
        self.facts["phases"] = [asdict(self.results[n]) for n in sorted(self.results)]
        self.facts["interpreter"] = self.interpreter.as_dict() if self.interpreter else None
        self.facts["notes"] = self.notes
        _write(os.path.join(self.out, "env.json"), json.dumps(self.facts, indent=1, default=str))
        write_summary(self)

    def exit_code(self) -> int:
        if self.fatal:
            return 2
        return 1 if any(p.status in (FAIL, TIMED_OUT, SKIPPED) for p in self.results.values()) else 0

    # -- the run -------------------------------------------------------------------------------------------------
    def run(self) -> int:
        try:
            self.driver = driver_facts()
            self.interpreter = choose(self.opts.root, self.opts.venv, self.opts.device, self.env(),
                                      self.opts.index_url, self.opts.index_timeout, log=self.log)
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


def _write(path: str, text: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


def _status(out: Outcome, ok: bool) -> str:
    return TIMED_OUT if out.timed_out else PASS if ok else FAIL


def _why(out: Outcome, bound: float) -> str:
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
    _write(os.path.join(c.out, "pip-freeze.txt"), "\n".join(v.pop("freeze", [])) + "\n")
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
    out = c.command(2, c.fleetbench("doctor", "--device", c.opts.device, "--nproc", "1", "--json"), bound)
    try:
        rep = json.loads(out.stdout)
    except ValueError:
        return _status(out, False), _why(out, bound) or "the doctor printed no report", {}
    _write(os.path.join(c.out, "doctor.json"), json.dumps(rep, indent=1))
    failed = [i["item"] for i in rep.get("items", []) if i.get("status") == "fail"]
    return (_status(out, out.rc == 0 and not failed),
            f"failed items: {', '.join(failed)} (their numbers: below and in doctor.json)" if failed else "", {})


def premises(c: Check, bound: float) -> tuple:
    out = c.command(3, [*c.python(), "-c", "from suite.gpucheck.premises import main; main()"], bound)
    rows = []
    for ln in out.stdout.splitlines():
        try:
            rows.append(json.loads(ln))
        except ValueError:
            continue
    _write(os.path.join(c.out, "premises.json"), json.dumps(rows, indent=1))
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
        shutil.copy(results, os.path.join(c.out, "runs.jsonl"))
        with open(results) as fh:
            records = [json.loads(ln) for ln in fh if ln.strip()]
        _archive_traces(os.path.dirname(results), os.path.join(c.out, "traces.tar.gz"))
    seen = {r["case"]: r for r in records}
    wanted = [n for names in chosen.values() for n in names]
    missing = [n for n in wanted if n not in seen]
    bad = [n for n in wanted if n in seen and (seen[n].get("status") != "ok" or seen[n].get("verdict") != "pass")]
    details = {"calls": calls, "wanted": wanted}
    if missing:
        return TIMED_OUT, (f"not reached within the {bound:.0f} s cap: {', '.join(missing)} (rerun with --only 4,5; "
                           f"each model's call got an equal share)"), details
    if bad:
        return FAIL, f"cases that did not pass: {', '.join(bad)} (verdicts and error tails below, runs.jsonl)", details
    if any(x.get("timed_out") or x.get("exit") not in (0, None) for x in calls):
        return FAIL, "every case recorded, but a call did not end cleanly (stderr.log)", details
    return PASS, "", details


def _archive_traces(results_dir: str, archive: str) -> None:
    """Every trace of phase 4 in one gzipped tar; only the first when all would pass the 15 MiB the lent machine
    brings back (16 MiB a file)."""
    traces = os.path.join(results_dir, "traces")
    files = sorted(os.path.join(d, f) for d, _, fs in os.walk(traces) for f in fs)
    for chosen in (files, files[:1]):
        if not chosen:
            return
        with tarfile.open(archive + ".tmp", "w:gz") as tar:
            for f in chosen:
                tar.add(f, arcname=os.path.relpath(f, results_dir))
        if os.path.getsize(archive + ".tmp") <= 15 << 20:
            os.replace(archive + ".tmp", archive)
            return
    os.remove(archive + ".tmp")


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


def plan(c: Check, bound: float) -> tuple:
    measured = step_times(os.path.join(c.out, "runs.jsonl"))
    c.facts["step_times"] = measured
    args = ["nightly", "--plan", "--device", c.opts.device, "--worlds", WORLDS[c.opts.device], "--size",
            RUN[c.opts.device][0], "--out", os.path.join(c.work, "nightly"), "--machine", "gpu-check"]
    if measured:
        path = os.path.join(c.work, "step-times.json")
        _write(path, json.dumps(measured))
        args += ["--step-times", path]
    out = c.command(5, c.fleetbench(*args), bound)
    c.facts["plan"] = out.stdout
    if out.timed_out or out.rc:
        return _status(out, False), _why(out, bound), {}
    return PASS, "" if measured else "no step times measured (phase 4): the plan used the rough table", {}


PHASES = ((0, host_facts), (1, versions), (2, doctor), (3, premises), (4, cases), (5, plan))
