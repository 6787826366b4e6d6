"""`fleetbench nightly`: the nightly pipeline (its --help, ``ABOUT``, lists the stages).

The selection is ``suite/selection.py``'s; the plan, estimates and state are ``suite/nightly.py``'s; this module
runs the stages as commands and keeps the state as each ends."""
from __future__ import annotations

import dataclasses
import json
import math
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import MISSING, dataclass

from .. import spec_options
from ..config import ConfigError
from ..measure.metadata import machine_name
from ..nightly import (
    PROFILES,
    SMOKE_GATE_BUDGET_S,
    SMOKE_LIMIT_S,
    STATE_FILE,
    WORKFLOWS,
    NightlyOptions,
    choose_profile,
    last_night,
    make_plan,
    overlap_variants,
    read_step_times,
    smoke_cases,
    smoke_green,
    stage_history,
)
from ..outputs import InputError, OutputDir, OutputError, output_problem, read_input, safe_name, write_atomic
from ..report import junit
from ..results import export
from ..results.gate import ratio_interval_text
from ..results.records import read_records
from ..run_spec import RunSpec
from ..runtime.child import INHERIT, run_child
from ..validate import check_options, spec
from . import GATE_CODES, ab, helps, unwind
from .checks import require_nproc
from .options import add_fields, add_spec
from .options import given as options_given

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# --help's description: what the command does, for its users (the docstring above is for developers)
ABOUT = """`fleetbench nightly`: the nightly pipeline, the same on GPU runners and on CPU (`make nightly-cpu`).

Stages, each a fleetbench (or asv) command over the one selection the options make:

1. run: `fleetbench run` of the selected cases at each world size (records, traces): the night's one
   measurement, each case x world size timed once, interleaved with its model's other cases;
2. pytest-benchmark: those measurements exported as pytest-benchmark's JSON (pytest-benchmark.json, and
   its storage folder pytest-benchmark/; `pytest-benchmark compare` reads them), nothing re-timed;
3. asv: the same measurements as asv results for this commit (with samples; the benchmark's version as
   asv discovers it in bench_cases, so the series continue), then `asv publish` (the dashboard);
4. report: `fleetbench report` (HTML page, Markdown summary, plots, traces);
5. gate: `fleetbench ab LAST_GOOD HEAD` over the selected cases tagged gate (every strategy family)
   at each world size, under one total budget; a night whose every stage is ok (exit 0) makes this commit
   the last good one: a gate whose every case is "not slower" by the threshold (or same, faster, identical);
   an inconclusive gate never does;
6. history: change-point alerts over asv's stored series (`fleetbench history`), reported, never the gate.

--plan prints the stages, the cases x world sizes, the gate's cases and budget and each stage's
estimated duration, and runs nothing; --device cuda is then declared, not probed (no GPU needed).
--limit MINUTES refuses (exit 2) a night whose estimate does not fit, naming the stage, before anything
runs; a night that still reaches the limit stops its running stage like a cancel (what it finished is
kept) and ends with exit 2.  The state (nightly.json in --out: each stage's duration and exit code, the
gate's verdict) is written as each stage ends, so a cancelled job keeps what it measured, and the next
night's estimates read it; so is the JUnit XML (--junit, default junit.xml in --out: a test case per stage,
then the run's cases and the gate's comparisons)."""


def add_parser(sub) -> None:
    p = sub.add_parser("nightly", help="the nightly pipeline: run, pytest-benchmark, asv, report, gate (ab against "
                                       "the last good commit), history alerts; --plan shows it with estimates",
                       **helps(ABOUT, """
                           fleetbench nightly --plan --device cuda --worlds 1,8 --limit 240
                           fleetbench nightly --device cpu --tag smoke
                           fleetbench nightly --worlds 1,8 --gate-budget 60 --out results/nightly""",
                               codes={**GATE_CODES,
                                      0: "ok: every stage ok (this commit becomes the last good one)",
                                      1: "regression: a case failed its check or errored, a benchmark failed, the "
                                         "gate found a case slower or a structure changed",
                                      2: "unusable input, a stage that could not run, or --limit reached",
                                      3: "undecided: the gate inconclusive, nothing worse (the last good commit "
                                         "stays)"}))
    # the run specification's options (suite/run_spec.py): its selection, rounds and steps
    add_spec(p, "nightly", tags="cases with this tag; repeatable (default: nightly-gpu on CUDA, smoke on CPU)",
             rounds=f"timed rounds (default {NightlyOptions().run.rounds}, the run specification's)",
             steps=f"steps per round (default {NightlyOptions().run.steps}, the run specification's)")
    p.add_argument("--worlds", help="world sizes, comma-separated (default one: 2 on CPU, every GPU on CUDA)")
    p.add_argument("--workflow", choices=sorted(WORKFLOWS),
                   help="a scheduled workflow's own options (suite/nightly.py WORKFLOWS: gpu is "
                        + " ".join(WORKFLOWS["gpu"].args()) + "); options given as well win")
    p.add_argument("--out", default=os.path.join("results", "nightly"), help="output directory (default "
                   "results/nightly; keep nightly.json in it between nights for the estimates)")
    p.add_argument("--last-good", default=os.path.join("results", "last-good", "commit"),
                   help="file holding the last good commit (default results/last-good/commit)")
    add_fields(p, Chosen, "gate_budget",
               gate_budget=f"the gate's timed trials, all cases and world sizes together (default "
                           f"{NightlyOptions().gate_budget_s / 60:g})")
    p.add_argument("--gate-case", action="append", default=[], metavar="GLOB",
                   help="narrows the gate to these of the selected cases tagged gate (default: all of them); "
                        "repeatable")
    p.add_argument("--ab-args", default="", help="more `fleetbench ab` options, e.g. \"--delta 0.03 --steps 10\"")
    p.add_argument("--junit", metavar="FILE",
                   help="the night's JUnit XML (CI systems' test view): a test case per stage, with the run's cases, "
                        "and the gate's comparisons, rewritten as each stage ends (default "
                        "OUT/junit.xml; the stages' own files are in OUT/junit/)")
    add_fields(p, Chosen, "persist")
    p.add_argument("--asv-config", default="asv.conf.json", help="asv config (default asv.conf.json)")
    p.add_argument("--machine", help="asv machine name (default: `fleetbench machine-name`)")
    p.add_argument("--quick", action="store_true", help="a smoke pass: no correctness checks")
    p.add_argument("--profile", choices=PROFILES,
                   help="full (default): every selected case; smoke: one case per strategy family at each world size "
                        "(an overlap case among them), `ab` on one gate case (against HEAD~1 before there is a last "
                        "good commit), within an hour; auto (the scheduled workflow's): smoke until one smoke night "
                        "is green in the state (nightly.json in --out), then full, or smoke again on a night full "
                        "does not fit --limit")
    p.add_argument("--plan", action="store_true", help="print the plan (stages, cases x world sizes, the gate, "
                   "estimated durations) and exit; --device cuda is declared, not probed")
    p.add_argument("--step-times", metavar="FILE",
                   help="seconds per step measured on this machine, for the plan's estimates instead of the rough "
                        "table: JSON {\"models\": {model: s}, \"cases\": {case: s}} (e.g. .ci/gpu-check's)")
    add_fields(p, Chosen, "limit")
    p.set_defaults(func=main)


def _worlds(text: str | None) -> tuple[int, ...]:
    out = []
    for w in (text or "").replace(" ", ",").split(","):
        if w.strip():
            if not w.strip().isdigit() or int(w) < 1:
                raise ConfigError(f"--worlds {text!r}: {w.strip()!r} is not a whole number >= 1")
            out.append(int(w))
    return tuple(dict.fromkeys(out))


MAX_WORLD = 4096  # a declared world size (--plan --device cuda: no GPU is probed) at most
LAST_GOOD_BYTES = 4096  # the last good commit's file: a commit hash and a newline
YEAR_MIN = 525_600  # --limit and --gate-budget at most (minutes): beyond, a number is no duration


def _path_problem(option: str, path: str, directory: bool) -> str | None:
    """Why ``path`` cannot take the night's output (a directory, or a file), in one line naming the option
    (``suite.outputs.output_problem``, the writer's own rule)."""
    if directory:
        return f"{option} {path!r}: {why}" if (why := output_problem(path, "directory")) else None
    if os.path.lexists(path):
        return f"{option} {path!r}: {why}" if (why := output_problem(path)) else None
    return None


def check_inputs(args, ch: Chosen) -> None:
    """Every input of the night checked before anything runs (a stage hours in never finds a bad one; the numbers
    are checked as the options are built: :class:`Chosen`, the run specification): one ConfigError naming the first
    bad option, its value and what is allowed."""
    problem = (_path_problem("--out", args.out, directory=True)
               or _path_problem("--last-good", args.last_good, directory=False)
               or junit.path_problem("--junit", junit_path(args), [os.path.join(args.out, "runs.jsonl"),
                                                                   os.path.join(args.out, "nightly.json")]))
    if problem:
        raise ConfigError(problem)
    worlds = _worlds(args.worlds)
    for w in worlds:
        if args.plan and ch.device == "cuda":  # no GPU is probed for a plan: bounded, not counted
            if w > MAX_WORLD:
                raise ConfigError(f"--worlds {w}: must be >= 1 and <= {MAX_WORLD}")
        else:
            require_nproc(w, ch.device or "cpu", "--worlds")
    if args.machine is not None:
        try:
            safe_name(args.machine, "--machine")
        except OutputError as exc:
            raise ConfigError(str(exc)) from None
    if os.path.lexists(args.last_good):
        try:
            read_input(args.last_good, "last good commit file", LAST_GOOD_BYTES)
        except InputError as exc:
            raise ConfigError(f"--last-good: {exc}") from None
    if not args.plan:  # a plan runs no stage: asv's config is read by the night's asv and history stages
        try:
            conf = json.loads(read_input(args.asv_config, "asv config (JSON)", 2**20))
        except (InputError, ValueError, RecursionError) as exc:
            raise ConfigError(f"--asv-config: {exc}") from None
        if not isinstance(conf, dict):
            raise ConfigError(f"--asv-config {args.asv_config!r}: expected a JSON object (asv.conf.json)")
    try:
        shlex.split(args.ab_args)
    except ValueError as exc:
        raise ConfigError(f"--ab-args {args.ab_args[:200]!r}: {exc}") from None


def check_ab_args(args, device: str | None) -> None:
    """--ab-args parsed and checked as `fleetbench ab` will (its parser, its option checks), with the options the
    gate adds itself: a ConfigError naming --ab-args and ab's complaint."""
    import contextlib
    import io

    from .main import build_parser  # at call time: main imports every command, this one included

    extra = shlex.split(args.ab_args)
    argv = ["ab", "BASE", "HEAD", "--nproc", str(_worlds(args.worlds)[0] if args.worlds else 1), "--total-budget",
            "60", *extra, "--json"]
    if device:
        argv[3:3] = ["--device", device]
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            ns = build_parser().parse_args(argv)
    except SystemExit:
        said = [ln for ln in err.getvalue().splitlines() if "error:" in ln]
        why = said[-1].split("error:", 1)[1].strip() if said else "not options of fleetbench ab"
        raise ConfigError(f"--ab-args {args.ab_args[:200]!r}: {why[:300]}") from None
    try:
        ab.options(ns)
    except ValueError as exc:
        raise ConfigError(f"--ab-args {args.ab_args[:200]!r}: {str(exc)[:300]}") from None


@dataclass(frozen=True)
class Chosen:
    """The night's options that ``--workflow`` fills where none was given (suite/nightly.py ``WORKFLOWS``), with
    the night's own defaults (and ``--persist``, which no workflow sets); the parsed options stay as they were
    given.  Each bound is its field's metadata, checked as it is built (``--limit 0: must be a finite number of
    minutes > 0 and <= 525600``); the run's steps are the run specification's, checked when it is built."""

    device: str | None
    tags: tuple[str, ...]
    steps: int | None
    gate_budget: float = spec(MISSING, "the gate's timed trials, all cases and world sizes together, minutes", gt=0.0,
                              le=YEAR_MIN, unit="minutes", metavar="MINUTES")
    gate_case: tuple[str, ...] = spec(MISSING, "")
    profile: str = spec(MISSING, "")
    limit: float | None = spec(MISSING, "the job's time limit: a plan whose estimate exceeds it is refused (exit 2) "
                               "before anything runs, naming the stage that does not fit", gt=0.0, le=YEAR_MIN,
                               unit="minutes", metavar="MINUTES")
    persist: int = spec(2, "nights a new level must last before a history alert", ge=1, le=10_000)

    def __post_init__(self) -> None:
        check_options(self, ConfigError)


def chosen(args) -> Chosen:
    wf = WORKFLOWS[args.workflow] if args.workflow else None
    return Chosen(
        device=args.device or (wf.device if wf else None),
        tags=tuple(args.tags or ()) or ((wf.tag,) if wf and not (args.cases or args.models) else ()),
        steps=args.steps if args.steps is not None or wf is None else wf.steps,
        gate_budget=args.gate_budget if args.gate_budget is not None else
        wf.gate_budget_min if wf else NightlyOptions().gate_budget_s / 60,
        gate_case=tuple(args.gate_case) or (wf.gate_cases if wf else ()),
        profile=args.profile or (wf.profile if wf else "full"),
        limit=args.limit if args.limit is not None or wf is None else wf.limit_min,
        persist=args.persist)


def plan_of(args, ch: Chosen):
    """(resolved selection, plan, last night, spec) of the options; nothing is run, and with --plan nothing probed.
    Under ``--profile auto`` a night whose full plan does not fit ``--limit`` is planned as a smoke night (said in
    its notes): the night chooses a profile that fits."""
    import fnmatch

    from ..selection import choose_platform, resolve

    # the night's run specification (the one builder: its options as given, what --workflow chose), every number
    # checked before anything else
    night = NightlyOptions().run  # the run specification's defaults, the night's traced steps
    asked = spec_options.spec_from(options_given(args, "nightly", selection__device=ch.device, run__steps=ch.steps,
                                                 run__check=False if args.quick else None,
                                                 run__trace_steps=night.trace_steps))
    check_inputs(args, ch)
    # the device first (a plan only declares it), for the default tag
    device = ch.device or (None if args.plan else choose_platform(None)[0])
    sel = asked.selection
    tags = ch.tags or sel.tags or (() if (sel.cases or sel.models) else ("nightly-gpu",) if device == "cuda" else
                                   ("smoke",))
    sel = dataclasses.replace(sel, tags=tags, worlds=_worlds(args.worlds), device=device)
    resolved = resolve(sel, probe=not args.plan)
    gate = [rc.case.name for rc in resolved.at[resolved.worlds[0]] if "gate" in rc.case.tags
            and any(fnmatch.fnmatchcase(rc.case.name, g) for g in ch.gate_case or ["*"])]
    if not gate:
        raise ConfigError("the gate has no case: none of the selected cases is tagged gate (`fleetbench run --list "
                          "--tag gate` lists them)" + (" and matches --gate-case" if ch.gate_case else ""))
    machine = args.machine or machine_name()
    last = last_night(args.out, machine)
    if not args.plan:  # the gate's options: `fleetbench ab`'s own checks, hours before the gate runs
        check_ab_args(args, device)
    run = asked.run
    try:
        measured = read_step_times(args.step_times) if args.step_times else None
    except ValueError as exc:
        raise ConfigError(str(exc)) from None

    def planned(profile: str):
        picked, cases, budget = resolved, gate, ch.gate_budget * 60.0
        if profile == "smoke":  # one case per strategy family at each world size, `ab` on one gate case
            names, one = smoke_cases(resolved, gate)
            picked = resolve(dataclasses.replace(sel, cases=tuple(names), tags=(), models=()), probe=not args.plan)
            cases, budget = [one], min(budget, SMOKE_GATE_BUDGET_S)
        opts = NightlyOptions(run=run, gate_budget_s=budget)
        return picked, make_plan(picked, cases, machine, opts, last, measured, profile), night_spec(picked, opts)

    profile = choose_profile(ch.profile, last)
    picked, plan, spec = planned(profile)
    if ch.profile == "auto" and profile == "full" and (why := does_not_fit(ch, plan)):
        picked, plan, spec = planned("smoke")
        plan = dataclasses.replace(plan, notes=plan.notes + (f"the full profile does not fit: {why}; a smoke night "
                                                             f"instead (--profile auto)",))
    return picked, plan, last, spec


def night_spec(resolved, opts: NightlyOptions) -> RunSpec:
    """What every stage runs: the resolved selection (its size, device and world sizes) and the night's options,
    one run specification (``suite/run_spec.py``) handed to each stage as it is (``run --spec``,
    ``--fleetbench-spec``, FLEETBENCH_BENCH_SPEC, ``ab --spec``), never spelled back into their options."""
    sel = dataclasses.replace(resolved.selection, size=resolved.size, device=resolved.device, worlds=resolved.worlds)
    return RunSpec(sel, opts.run)


def does_not_fit(ch: Chosen, plan) -> str | None:
    """Why ``plan`` does not fit the night's limit (``night_limit``), in words; None when it fits."""
    limit = night_limit(ch, plan)
    over = plan.over(limit * 60.0) if limit is not None else None
    if over is None:
        return None
    stage, end = over
    said = f"--limit {limit:g} min" if limit == ch.limit else f"the smoke profile's {limit:g} min"
    return (f"{said}: the plan does not fit: stage {stage.name!r} would end at {end / 60:.1f} min (the whole "
            f"night {plan.seconds / 60:.1f} min)")


def main(args) -> int:
    ch = chosen(args)
    resolved, plan, last, spec = plan_of(args, ch)
    if args.plan:
        print("\n".join(plan.lines()))
    why = does_not_fit(ch, plan)
    if why is not None:
        if not args.plan:
            record_refusal(args, ch, plan, why)
        raise ConfigError(f"{why}; select fewer cases or world sizes, or lower --rounds/--steps/--gate-budget")
    if args.plan:
        return 0
    return Night(args, ch, resolved, plan, spec, last).run()


def record_refusal(args, ch: Chosen, plan, why: str) -> None:
    """A night refused before anything ran says why in the state it would have written (nightly.json in --out):
    what was recorded stays, ``refused`` is added (the next night's plan and its reader see it)."""
    state = last_night(args.out, plan.machine) or {"machine": plan.machine, "stages": {}}
    state["refused"] = {"at": time.time(), "profile": plan.profile, "plan_s": round(plan.seconds, 1),
                        "limit_min": ch.limit, "why": why}
    try:
        with OutputDir(args.out) as out:
            out.write(STATE_FILE, json.dumps(state, indent=1))
    except OSError as exc:
        print(f"fleetbench nightly: the refusal could not be recorded in {args.out}/{STATE_FILE} ({exc})",
              file=sys.stderr, flush=True)


def night_limit(ch: Chosen, plan) -> float | None:
    """The night's limit in minutes: --limit, and for a smoke night at most an hour (``SMOKE_LIMIT_S``)."""
    if plan.profile != "smoke":
        return ch.limit
    return min(ch.limit if ch.limit is not None else math.inf, SMOKE_LIMIT_S / 60)


def junit_path(args) -> str:
    return args.junit if args.junit is not None else os.path.join(args.out, "junit.xml")


def _code(rc: int) -> int:
    """A stage's exit status on the shared table (anything unknown counts as a failure)."""
    return rc if rc in (0, 1, 2, 3) else 1


def _asv_html_dir(conf: str) -> str:
    """asv.conf.json's html_dir (relative to the config file's folder, as asv reads it)."""
    html = json.loads(read_input(conf, "asv config (JSON)", 2**20)).get("html_dir", "html")
    return os.path.join(os.path.dirname(os.path.abspath(conf)), html)


def _worst(codes) -> int:
    codes = set(codes)
    return next((c for c in (1, 2, 3) if c in codes), 0)


class Night:
    """One night: the stages in order, the state (``nightly.json``) saved as each ends."""

    def __init__(self, args, ch: Chosen, resolved, plan, spec: RunSpec, last: dict | None = None):
        self.args, self.ch, self.resolved, self.plan, self.spec = args, ch, resolved, plan, spec
        self.py = sys.executable
        self.out = os.path.abspath(args.out)  # the stages run in the checkout's root
        self.dir: OutputDir | None = None  # --out, held once the night starts (nothing written through a link)
        limit = night_limit(ch, plan)
        self.deadline = None if limit is None else time.monotonic() + limit * 60.0
        self.asv_config = os.path.abspath(args.asv_config)
        self.env = dict(os.environ, PYTHONPATH=ROOT + (os.pathsep + os.environ["PYTHONPATH"]
                                                       if os.environ.get("PYTHONPATH") else ""))
        self.commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                                     check=True).stdout.strip()
        self.junit = os.path.abspath(junit_path(args))
        self.junit_files: dict[str, list[str]] = {}  # stage -> the JUnit files its commands were given
        self.state: dict = {"machine": plan.machine, "commit": self.commit, "device": resolved.device,
                            "worlds": list(resolved.worlds), "started": time.time(), "stages": {},
                            "status": None, "earlier": stage_history(last), "profile": plan.profile,
                            "smoke_green": smoke_green(last)}

    # -- bookkeeping ------------------------------------------------------------------------------------
    def save(self) -> None:
        if self.dir is None:
            self.dir = OutputDir(self.out)
        self.dir.write("nightly.json", json.dumps(self.state, indent=1))

    def junit_file(self, stage: str, name: str) -> str:
        """Where a stage's command writes its own JUnit XML (OUT/junit/NAME.xml; last night's file removed first,
        so a command that wrote none is never reported with an old one)."""
        path = os.path.join(self.out, "junit", name + ".xml")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if os.path.lexists(path):
            os.unlink(path)
        self.junit_files.setdefault(stage, []).append(path)
        return path

    def write_junit(self) -> None:
        """The night's JUnit XML: a test case per stage that ended, then the suites its commands wrote."""
        stages, suites = [], []
        for name, entry in self.state["stages"].items():
            if entry.get("exit") is None:
                continue
            found, problems = junit.merge_files(self.junit_files.get(name, []))
            case = junit.stage_case(name, entry["exit"], entry.get("seconds") or 0.0)
            stages.append(dataclasses.replace(case, output="\n".join(problems)) if problems else case)
            suites += found
        night = junit.Suite(f"fleetbench nightly ({self.plan.machine}, commit {self.commit[:10]})", tuple(stages),
                            (("commit", self.commit), ("machine", self.plan.machine)))
        try:
            junit.write_junit(self.junit, [night, *suites], name="fleetbench nightly")
        except OSError as exc:
            print(f"fleetbench nightly: --junit {self.junit}: not written ({exc})", file=sys.stderr, flush=True)

    def call(self, cmd: list, stdout=INHERIT, env: dict | None = None) -> int:
        """A stage's command, bounded by --limit; on a cancel (SIGINT/SIGTERM) or at the limit the child gets
        SIGINT and a few seconds to clean up (what it finished is kept), then the night ends.  It dies with the
        night (SIGTERM from the kernel: a killed -9 night's stage unwinds like a cancel)."""
        left = None if self.deadline is None else max(1.0, self.deadline - time.monotonic())
        done = run_child(cmd, left, cwd=ROOT, env=env or self.env, stdout=stdout, stderr=INHERIT, stop=signal.SIGINT,
                         grace=6.0, death_signal=signal.SIGTERM)
        if done.timed_out:
            raise OverLimit
        return 127 if done.rc is None else done.rc

    def stage(self, name: str, fn, **facts) -> int:
        print(f"== {name}", flush=True)
        entry = {"started": time.time(), "exit": None, **facts}
        self.state["stages"][name] = entry
        t0 = time.monotonic()
        try:
            code = fn()
        except KeyboardInterrupt as exc:
            entry.update(seconds=time.monotonic() - t0, exit="cancelled")
            self.state["status"] = "over the limit" if isinstance(exc, OverLimit) else "cancelled"
            self.save()
            self.write_junit()
            raise
        entry.update(seconds=time.monotonic() - t0, exit=code)
        self.save()
        self.write_junit()
        return code

    # -- the stages -------------------------------------------------------------------------------------
    def spec_file(self, name: str, spec: RunSpec) -> str:
        """``spec`` written into the night's output as NAME (JSON), for a stage's command; its path."""
        assert self.dir is not None
        self.dir.write(name, json.dumps(spec.to_dict(), indent=1))
        return os.path.join(self.out, name)

    def fleetbench(self, *args: str) -> list:
        return [self.py, "-m", "suite.cli.main", *args]

    def run_stage(self) -> int:
        """Every case x world size timed once (``fleetbench run``, interleaved): the night's one measurement, which
        the pytest-benchmark and asv stages export; the run ids it appended are noted for them."""
        spec = self.spec_file("spec.json", self.spec)
        results = os.path.join(self.out, "runs.jsonl")
        before = {r.run_id for r in read_records(results)} if os.path.exists(results) else set()
        entry = self.state["stages"]["run"]
        try:
            codes = [self.call(self.fleetbench(
                "run", "--spec", spec, "--nproc", str(w), "--results", results, "--junit",
                self.junit_file("run", f"run-w{w}"))) for w in self.resolved.worlds]
        finally:
            after = read_records(results) if os.path.exists(results) else []
            entry["run_ids"] = sorted({r.run_id for r in after} - before)
        return _worst(_code(c) for c in codes)

    def tonight(self) -> list:
        """The records tonight's run stage appended (its run ids, noted as it ended)."""
        ids = set(self.state["stages"].get("run", {}).get("run_ids") or ())
        path = os.path.join(self.out, "runs.jsonl")
        return [r for r in read_records(path) if r.run_id in ids] if ids and os.path.exists(path) else []

    def pytest_stage(self) -> int:
        """The run stage's measurements as pytest-benchmark's JSON (``suite/results/export.py``): nothing re-timed,
        no check re-run; ``pytest-benchmark compare`` reads OUT/pytest-benchmark.json and the storage folder."""
        recs = export.measured(self.tonight())
        if not recs:
            print("pytest-benchmark: nothing measured tonight (the run stage timed no case): nothing exported")
            return 2
        doc = json.dumps(export.pytest_benchmark_doc(recs, self.commit, branch=self.branch()), indent=1)
        assert self.dir is not None
        self.dir.write("pytest-benchmark.json", doc)
        storage = self.dir.dir(os.path.join("pytest-benchmark", export.pytest_benchmark_machine_id()))
        with storage:
            taken = [int(n[:4]) for n in storage.entries() if n[:4].isdigit() and n.endswith(".json")]
            storage.write(f"{max(taken, default=0) + 1:04d}_{self.commit[:12]}.json", doc)
        print(f"pytest-benchmark: {len(recs)} benchmark(s) exported to {self.out}/pytest-benchmark.json")
        return 0

    def branch(self) -> str | None:
        got = subprocess.run(["git", "rev-parse", "--abbrev-ref", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        return got.stdout.strip() or None if got.returncode == 0 else None

    def asv_env(self) -> dict:
        """The spec for asv, in the one variable bench_cases/_matrix.py reads (asv passes its benchmarks no
        arguments); the hand-typed FLEETBENCH_BENCH_* variables of the night's own environment are left out."""
        env = {k: v for k, v in self.env.items() if not k.startswith("FLEETBENCH_BENCH_")}
        return dict(env, FLEETBENCH_BENCH_SPEC=self.spec.to_json(), HOME=self.asv_home())

    def asv_home(self) -> str:
        """asv's HOME: a folder of the night's output, where asv writes its machine file (~/.asv-machine.json):
        the user's own home is not written."""
        if self.dir is None:
            self.dir = OutputDir(self.out)
        self.dir.dir("asv-home").close()
        return os.path.join(self.out, "asv-home")

    def asv_stage(self) -> int:
        """The run stage's measurements as asv results for this commit (``suite/results/export.py``): asv discovers
        bench_cases/asv_cases.py under tonight's spec (``benchmarks.json``: the benchmark's params and version, so
        the series continue), then the results file is written from the records, nothing re-timed; then `asv
        publish` (the dashboard) and the offline copy."""
        asv, conf, env = os.path.join(os.path.dirname(self.py), "asv"), self.asv_config, self.asv_env()
        with open(os.devnull, "w") as null:
            if self.call([asv, "machine", "--machine", self.plan.machine, "--yes", "--config", conf], null, env):
                return 2
        if self.call([asv, "run", "--bench", "just-discover", "-E", f"existing:{self.py}", "--machine",
                      self.plan.machine, "--launch-method", "spawn", "--config", conf, "--show-stderr"], env=env):
            return 2
        conf_data = json.loads(read_input(conf, "asv config (JSON)", 2**20))
        results = os.path.join(os.path.dirname(conf), conf_data.get("results_dir", "results"))
        try:
            benchmarks = json.loads(read_input(os.path.join(results, "benchmarks.json"), "asv benchmarks.json",
                                               64 * 2**20))
            machine = json.loads(read_input(os.path.join(env["HOME"], ".asv-machine.json"), "asv machine file",
                                            2**20))[self.plan.machine]
            bench = benchmarks[export.ASV_BENCHMARK]
        except (InputError, ValueError, KeyError, TypeError) as exc:
            print(f"asv: discovery left no {export.ASV_BENCHMARK} ({exc}): nothing exported")
            return 2
        recs = export.measured(self.tonight())
        if not recs:
            print("asv: nothing measured tonight (the run stage timed no case): nothing exported")
            return 2
        date = subprocess.run(["git", "rev-list", "-n", "1", "--format=%at", self.commit], cwd=ROOT,
                              capture_output=True, text=True, check=True).stdout.split()[-1]
        doc = export.asv_results_doc(recs, bench, machine, self.commit, int(date) * 1000,
                                     f"{sys.version_info[0]}.{sys.version_info[1]}", export.asv_env_name(self.py))
        with OutputDir(results) as rd:
            rel = export.write_asv(rd, doc, machine)
        print(f"asv: {len(recs)} (case, world) pair(s) exported to {os.path.join(results, rel)}")
        published = self.call([asv, "publish", "--config", conf], env=env)
        offline = published or self.call(self.fleetbench("asv-offline", _asv_html_dir(conf)))  # offline dashboard
        return 2 if published or offline else 0

    def report_stage(self) -> int:
        return _code(self.call(self.fleetbench("report", os.path.join(self.out, "runs.jsonl"), "--out",
                                               os.path.join(self.out, "report"))))

    def last_good(self) -> str | None:
        try:
            good = read_input(self.args.last_good, "last good commit file", LAST_GOOD_BYTES).strip()
        except InputError as exc:
            if os.path.lexists(self.args.last_good):
                print(f"last good commit unreadable ({exc}): no gate tonight")
                return None
            print(f"no last good commit at {self.args.last_good}: this night's commit becomes the baseline")
            return None
        if not good or good.startswith("-") or len(good) > 256 or not all(c.isalnum() or c in "._/~^-" for c in good):
            print(f"last good commit {good[:64]!r} (from {self.args.last_good}) is not a revision: no gate tonight")
            return None
        ok = subprocess.run(["git", "cat-file", "-e", f"{good}^{{commit}}"], cwd=ROOT, capture_output=True)
        if ok.returncode:
            print(f"last good commit {good[:10]} (from {self.args.last_good}) is not in this repository: no gate "
                  f"tonight")
            return None
        return good

    def parent_commit(self) -> str | None:
        """HEAD~1, when this checkout has it (a first smoke night's gate compares against it)."""
        got = subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{self.commit}~1^{{commit}}"], cwd=ROOT,
                             capture_output=True, text=True)
        return got.stdout.strip() or None if got.returncode == 0 else None

    def gate_base(self, good: str | None) -> tuple[str | None, str]:
        """The commit the gate compares HEAD with, and why that one: ``good``, the last good commit; on a smoke night
        before there is one, HEAD~1 (a smoke night proves the gate runs; a full night without one makes this commit
        the baseline)."""
        if good is not None:
            return good, "the last good commit"
        if self.plan.profile == "smoke" and (parent := self.parent_commit()):
            print(f"smoke night without a last good commit: the gate compares HEAD with HEAD~1 ({parent[:10]})")
            return parent, "HEAD~1 (no last good commit yet)"
        return None, "no last good commit"

    def gate_stage(self) -> int:
        good = self.last_good()
        base, kind = self.gate_base(good)
        gate = self.state["gate"] = {"last_good": good, "base": base, "base_kind": kind, "worlds": {}}
        if base is None:  # no basis for the next plan's gate estimate (suite/nightly.py, stage_history)
            self.state["stages"]["gate"]["skipped"] = "no last good commit"
            return 0
        codes = []
        for w in self.resolved.worlds:
            names = [c for c, cw in self.plan.gate if cw == w]
            if not names:
                continue
            share = self.plan.gate_budget_s * len(names) / len(self.plan.gate)
            path = os.path.join(self.out, f"ab-w{w}.json")
            assert self.dir is not None
            gate_spec = self.spec.replace(selection={"cases": tuple(names), "tags": (), "models": (), "worlds": (w,)})
            spec = self.spec_file(f"gate-w{w}.spec.json", gate_spec)
            with self.dir.replacing(f"ab-w{w}.json") as fh:  # ab's --json document, never through a link
                code = self.call(self.fleetbench(
                    "ab", base, self.commit, "--spec", spec, "--total-budget", f"{share:.0f}",
                    *shlex.split(self.args.ab_args), "--junit", self.junit_file("gate", f"ab-w{w}"), "--json"),
                    stdout=fh)
            codes.append(_code(code))
            doc = _ab_doc(path)
            gate["worlds"][str(w)] = {"exit": code, "cases": names, "budget_s": share,
                                      "identical": bool(doc and doc.get("identical"))}
            lines = _gate_lines(doc, code)
            self.dir.append("gate.md", "\n".join(lines) + "\n")
            print("\n".join(lines), flush=True)
            self.save()  # the verdict of each world size is kept as it comes
        return _worst(codes)

    def history_stage(self) -> int:
        conf = self.asv_config
        conf_data = json.loads(read_input(conf, "asv config (JSON)", 2**20))
        results = os.path.join(os.path.dirname(conf), conf_data.get("results_dir", "results"))
        code = self.call(self.fleetbench("history", "--results", results, "--machine", self.plan.machine,
                                         "--persist", str(self.ch.persist), "--markdown",
                                         os.path.join(self.out, "history-alerts.md")))
        if code == 1:
            print(f"history alert: see {self.out}/history-alerts.md (an alert is reported, not the gate)")
        return 2 if code == 2 else 0

    def run(self) -> int:
        self.dir = OutputDir(self.out)
        print(f"== nightly: commit {self.commit[:10]}, device {self.resolved.device}, machine {self.plan.machine}, "
              f"worlds {' '.join(map(str, self.resolved.worlds))}, out {self.out}; plan "
              f"{self.plan.seconds / 60:.0f} min", flush=True)
        n_pairs = len(self.resolved.matrix(runnable=True))
        previous = signal.signal(signal.SIGTERM, unwind)  # a CI cancel unwinds like Ctrl-C: state saved
        self.save()
        try:
            codes = {
                "run": self.stage("run", self.run_stage, pairs=n_pairs),
                "pytest-benchmark": self.stage("pytest-benchmark", self.pytest_stage, pairs=n_pairs, exported=True),
                "asv": self.stage("asv", self.asv_stage, pairs=n_pairs, exported=True),
                "report": self.stage("report", self.report_stage),
                "gate": self.stage("gate", self.gate_stage, pairs=len(self.plan.gate),
                                   budget_s=self.plan.gate_budget_s),
            }
            status = _worst(codes.values())
            if status == 0:  # only a night with every stage ok (a decided gate) becomes the last good commit
                os.makedirs(os.path.dirname(os.path.abspath(self.args.last_good)), exist_ok=True)
                write_atomic(self.args.last_good, self.commit + "\n")
            codes["history"] = self.stage("history", self.history_stage)
        except KeyboardInterrupt as exc:
            over = isinstance(exc, OverLimit)
            said = f"over --limit {night_limit(self.ch, self.plan):g} min" if over else "cancelled"
            print(f"fleetbench nightly: {said}; what finished is kept in {self.out}", file=sys.stderr)
            return 2 if over else 130
        finally:
            signal.signal(signal.SIGTERM, previous)
        status = _worst(codes.values())
        self.state["status"] = status
        overlap = overlap_variants()
        self.state["overlap_cases"] = sorted({r.case for r in self.tonight() if r.case.rsplit("/", 1)[-1] in overlap
                                              and r.status == "ok" and r.verdict == "pass"})
        self.state["smoke_green"] = smoke_green(self.state)  # kept from night to night: auto then runs full
        self.save()
        print(f"== nightly: status {status} (" + ", ".join(f"{k} {v}" for k, v in codes.items()) + ")")
        return status


class OverLimit(KeyboardInterrupt):
    """The night reached --limit: the running stage is stopped like a cancel, and the night ends (exit 2)."""


def _ab_doc(path: str) -> dict | None:
    """`ab --json`'s document, or None when it wrote none."""
    try:
        doc = json.loads(read_input(path, "ab --json document", 256 * 2**20))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def _gate_lines(doc: dict | None, code: int) -> list[str]:
    """The gate's verdict in Markdown lines, from `ab --json`'s document."""
    if doc is None:
        return [f"ab gate: no result (exit {code}; the log above says why)"]
    lines = [f"- identical: {doc['identical']} (nothing timed)"] if doc.get("identical") else []
    for c in doc["cases"]:
        lo, hi = (float(x) for x in c["ci"])  # --json writes inf and nan as strings
        lines.append(f"- {c['case']}@{c['world']}: {c['verdict']} (HEAD/BASE {float(c['ratio']):.3f} "
                     f"{ratio_interval_text(lo, hi)}, "
                     f"{c['blocks']} blocks), structure {'CHANGED' if c['structure_diff'] else 'identical'}, "
                     f"check {c['check']}")
    lines += [f"  FAIL {f}" for f in doc["failures"]]
    word = {0: "ok", 1: "FAIL", 3: "UNDECIDED"}.get(code, "UNUSABLE")
    return lines + [f"ab gate: {word} (exit {code})"]
