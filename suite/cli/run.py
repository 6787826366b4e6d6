"""`fleetbench run`: the main job's command line (its --help: ``ABOUT``).

The work itself is :class:`suite.runner.CaseRunner`'s (a check, then every case of a model timed interleaved
with its baseline, one record per case); this module turns the command line into its options, resumes a run
from its records, appends the records as each model finishes and prints.  Everything the user typed is
validated before any rank starts.
"""
from __future__ import annotations

import math
import os
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

from .. import runtime, spec_options
from ..cases import ALL_TAGS, BASELINE
from ..cluster.launch import cluster_option, cluster_sets, start_cluster
from ..config import ConfigError, away_from_defaults, baseline_sets
from ..measure.metadata import collect
from ..measure.stats import speedup_unresolved
from ..measure.utilization import BUSY, BUSY_SHARE, LOAD_MARGIN, busy_reason
from ..model_registry import REGISTRY
from ..outputs import append_or_fallback, output_problem
from ..report import junit
from ..results.records import Metrics, ResultsFileError, read_records
from ..run_spec import RUN_ROUNDS_FOR_95, RunFacts, RunSpec
from . import helps
from .checks import oversubscribed, require_nproc
from .options import add_shared, add_spec, default
from .options import given as options_given
from .resume import Resume, resolve_resume

DEFAULT_RESULTS = os.path.join("results", "runs.jsonl")


# --help's description: what the command does, for its users (the docstring above is for developers)
ABOUT = """`fleetbench run`: check and time the selected cases.

For each case: a correctness verdict against a reference implementation, then its throughput, timed
interleaved with its model's baseline (plain data parallel) in the same ranks, and its speedup over
that baseline (> 1 is faster).  Each model's records are appended to the results file as soon as its
timing finishes; a table closes the run.

Every option is checked before any rank starts.  A case whose ranks die or hang is reported as an
error and the run goes on; an interrupted run keeps its finished cases, and --resume finishes it."""


def add_parser(sub) -> None:
    p = sub.add_parser("run", help="run cases: correctness verdict, throughput, speedup over plain data parallel",
                       **helps(ABOUT, """
                           fleetbench run --list --tag nightly-cpu
                           fleetbench run --tag smoke --nproc 2
                           fleetbench run --case 'mlp/*' --case resnet/ddp --nproc 4 --rounds 9
                           fleetbench run --set fuse_grad_size_in_MB=8 --config my.toml --trace-steps 2
                           fleetbench run --case mlp/overlap --vary fuse_grad_size_in_MB=8,32
                           fleetbench run --resume results/runs.jsonl
                           fleetbench run --spec results/nightly/spec.json --nproc 2"""))
    add_shared(p, nproc="local ranks to spawn, the world size (default: 2 on CPU, every GPU on CUDA; ignored under "
                        "torchrun)")
    # the options of the run's specification (suite/run_spec.py): None when not given, the spec's default then
    add_spec(p, "run",
             file="the run's specification as JSON (suite/run_spec.py's RunSpec; `fleetbench nightly` writes one): "
                  "its selection and options instead of those options; --nproc picks one of its world sizes",
             device="override the device (default: cuda where CUDA has a GPU for every local rank, else cpu; with "
                    "CUDA present, fewer GPUs than ranks is an error)",
             cases="case name or glob (model/variant, e.g. 'resnet/overlap', '*/local_sgd'); repeatable or "
                   "comma-separated",
             tags=f"cases with this tag ({', '.join(ALL_TAGS)}); repeatable. Without "
                  "--case/--tag/--model: the 'default' tag",
             models=f"a registry model ({', '.join(row.name for row in REGISTRY)}), hf:GPT2Config / "
                    "hf:BertConfig, or your own factory as module:function; alone, every case of that model",
             size="model size: full (published; default on CUDA), cpu (full parameters, smaller inputs; default on "
                  "CPU), tiny (tests)",
             sets="a knob applied to every case but the baseline, which takes only workload knobs (the optimizer, "
                  "threads, precision: `fleetbench config --list` marks them) unless --set-baseline; repeatable",
             steps=f"steps per timed window (default {default('steps')})",
             rounds=f"interleaved timed rounds (default {default('rounds')}: the fewest whose speedup interval can "
                    f"cover 95%%; fewer leave every speedup 'not resolved')",
             warmup=f"warm-up steps per case (default {default('warmup')})",
             timeout="bound on each multi-rank call, seconds (default: 600 s plus an allowance scaled by the "
                     "call's steps x variants x the model's size)",
             trace_steps="after timing, run N traced steps per case under torch.profiler and write, next to the "
                         "results, each rank's trace (Kineto's Chrome-trace JSON, the engine's phases as ranges) "
                         "and a timeline of every rank (traces/RUN_ID/CASE@WORLD/; docs/report.md; default "
                         f"{default('trace_steps')}: no trace)")
    p.add_argument("--results", default=DEFAULT_RESULTS, help=f"JSON-lines results file (default {DEFAULT_RESULTS})")
    p.add_argument("--list", action="store_true", help="list the selected cases and exit")
    p.add_argument("--resume", metavar="RESULTS_FILE_OR_RUN_ID",
                   help="continue an interrupted run (a results file: its last run; a run id: that run in "
                        "--results): the same cases, size, steps, rounds, warm-up, batch, --config and --set, taken "
                        "from its records (an option given with another value is an error), skipping the cases "
                        "already recorded for it")
    p.add_argument("--junit", metavar="FILE",
                   help="also write the verdicts as JUnit XML (CI systems' test view): one test case per case x world "
                        "size, pass / failure / error / skipped with its message and seconds")
    add_shared(p, cluster="run the ranks on an emulated cluster (network namespaces; root): N nodes of R ranks, "
                          "node links limited to RATE (e.g. 2x2:inter=200mbit); sets --nproc N*R")
    p.set_defaults(func=main)


def command_spec(args, env=None, resume: Resume | None = None) -> tuple[RunSpec, Resume | None, Any]:
    """The run's specification from its command line, with the run it resumes and the emulated cluster it runs on.

    The one builder (``spec_options.spec_from``) makes it: from the options given (the spec's defaults for the
    rest), from the spec the resumed run's records carry (``--resume``: :func:`~suite.cli.resume.resolve_resume`;
    ``resume``: rank 0's, under torchrun), or from ``--spec FILE`` (then none of them); ``--nproc`` and
    ``--cluster`` set the world size and the hierarchy.  Under torchrun (``env``) the world is torchrun's and
    --nproc is ignored."""
    given = options_given(args, "run", besides=("--resume",) if args.resume else ())
    nproc = None if env else args.nproc
    if nproc is not None:
        require_nproc(nproc, args.device)  # the local ranks this machine runs, before anything else
    if args.spec:
        spec = spec_options.spec_from(given)
    else:
        if resume is None and args.resume and not (env and env.rank):  # under torchrun rank 0 reads its host's file
            resume = resolve_resume(args.resume, args.results, given, nproc, env.world_size if env else None)
        spec = spec_options.spec_from(given, resume.resumed if resume is not None else None)
        if resume is not None:
            nproc = None if env else resume.world
    cluster = cluster_option(args.cluster, args.device, under_torchrun=env is not None) if args.cluster else None
    sets = spec.selection.sets
    if cluster is not None:
        if nproc is not None and nproc != cluster.world_size:
            raise ConfigError(f"--nproc {nproc}: --cluster {args.cluster} has {cluster.world_size} ranks")
        nproc = cluster.world_size
        sets = tuple(cluster_sets(cluster, sets))
    if not args.spec:
        return spec.replace(selection={"worlds": (nproc,) if nproc is not None else (), "sets": sets}), resume, cluster
    worlds = spec.selection.worlds
    if nproc is None and len(worlds) > 1:
        raise ConfigError(f"--spec {args.spec}: it names world sizes {', '.join(map(str, worlds))}; give --nproc to "
                          f"run one of them")
    if nproc is not None and worlds and nproc not in worlds and cluster is None:
        raise ConfigError(f"--nproc {nproc}: --spec {args.spec} names world sizes {', '.join(map(str, worlds))}")
    spec = spec.replace(selection={"worlds": (nproc,) if nproc is not None else worlds, "sets": sets})
    return spec, resume, cluster


def main(args) -> int:
    # torch comes with these: imported when a run starts, not for `fleetbench --help` (every command's parser)
    from ..runner import BASE_TIMEOUT_S, CaseRunner
    from ..runtime.launch import init_from_env, shutdown, torchrun_env
    from ..runtime.torchrun import TorchrunLauncher

    env = torchrun_env()
    spec, resume, cluster_spec = command_spec(args, env)
    results = resume.results if resume is not None else args.results
    selected, facts, ran = _prepare(spec, env, results)
    opts, device, backend, world = ran.run, facts.device, facts.backend, ran.selection.worlds[0]
    if args.list:
        rows = [(rc.case.name, ",".join(rc.case.tags), rc) for rc in selected]
        name_width, tags_width = (max(len(row[i]) for row in rows) for i in (0, 1))
        for name, tags, rc in rows:
            print(f"{name:{name_width}s}  {tags:{tags_width}s}  {rc.case.description}"
                  + (f"  [skip: {rc.skip}]" if rc.skip else ""))
        return 0
    _check_results_file(results)
    if args.junit and not (env and env.rank) and (why := junit.path_problem("--junit", args.junit, [results])):
        raise ConfigError(why)
    if opts.trace_steps:
        _check_traces_dir(os.path.join(facts.results_dir, "traces"))

    launcher: Any = None
    cluster: Any = None  # an emulated cluster, taken down after the launcher
    if env:
        try:
            ctx = init_from_env(device=device, pg_timeout=opts.pg_timeout)
        except (RuntimeError, OSError) as exc:  # the port taken, the rendezvous never met: said, not a traceback
            first = next((ln for ln in str(exc).splitlines() if ln.strip()), type(exc).__name__)
            raise ConfigError(f"cannot join torchrun's world at MASTER_ADDR={env.master_addr} MASTER_PORT="
                              f"{env.master_port} as rank {env.rank} of {env.world_size}: {first[:300]} (is the port "
                              f"taken by another job?)") from None
        launcher = TorchrunLauncher(ctx)
        reporter = ctx.rank == 0
        shared = launcher.share(resume)
        if shared is not None and ctx.rank:  # rank 0's run: what its records tell, its spec built from that
            spec, resume, _ = command_spec(args, env, shared)
            selected, facts, ran = _prepare(spec, env, results)
            opts = ran.run
    else:
        reporter = True
    todo = selected if resume is None else [rc for rc in selected if rc.case.name not in resume.done]
    if resume is not None and not todo:
        if reporter:
            print(f"nothing to resume: run {resume.run_id} is complete ({len(selected)} cases)")
        if env:
            launcher.close()
            shutdown()
        return 0
    coverage = 1 - 2.0 ** (1 - opts.rounds)  # of the rounds' range, about the median (measure/stats.py)
    if reporter and opts.rounds < RUN_ROUNDS_FOR_95:  # 5 rounds: 94%, said in docs/report.md
        print(f"fleetbench run: note: {opts.rounds} round(s): a speedup's 95% interval is about the range of the "
              f"rounds, which covers the median {coverage:.0%} of the time at best, so no speedup is called "
              f"resolved; --rounds {RUN_ROUNDS_FOR_95} or more for 95%", file=sys.stderr, flush=True)
    if not env:
        if crowded := oversubscribed(world, device):
            print(f"fleetbench run: warning: {crowded}", file=sys.stderr, flush=True)
        cluster_kw: dict = {}
        if cluster_spec is not None:
            cluster, cluster_kw = start_cluster(cluster_spec)
        launcher = runtime.RankPool(world, device=device, timeout=opts.timeout or BASE_TIMEOUT_S,
                                    pg_timeout=opts.pg_timeout, **cluster_kw)
    records: list = []
    written: dict = {}  # file -> records appended to it (the results file, or a fallback)
    display = RunDisplay(live=sys.stdout.isatty() and reporter)
    seconds = CaseSeconds(selected, display.event)  # each case's, for --junit
    try:
        runner = CaseRunner(launcher, world, opts, facts=facts, metadata=collect(world_size=world, backend=backend),
                            reporter=reporter, say=display.say, on_progress=seconds.event, spec=ran)
        if resume is not None:
            runner.run_id = resume.run_id
            kept = [rc.case.name for rc in selected if rc.case.name in resume.done]
            runner.say(f"resuming run {runner.run_id}: {len(kept)} case(s) already recorded, skipped: "
                       f"{', '.join(kept) or 'none'}; to run: {', '.join(rc.case.name for rc in todo)}")
            if resume.unknown:
                runner.say(f"  run {runner.run_id}'s records do not say its {', '.join(resume.unknown)} (written "
                           f"before runs kept their options): this command's are used")
            selected = todo
        runnable = sum(1 for rc in selected if rc.skip is None)
        skipped = f" ({len(selected) - runnable} more skipped)" if len(selected) > runnable else ""
        runner.say(f"fleetbench run {runner.run_id}: {runnable} case(s) on {world} rank(s){skipped}, size "
                   f"{ran.selection.size}, {device}/{backend}; results -> {results}")
        for line in knob_notes(ran.selection):
            runner.say(line)
        width = max((len(rc.case.name) for rc in selected), default=0)  # the case column, as the check lines'
        said_busy: set = set()
        display.start(runnable)
        for batch in runner.run(selected):
            for rec in batch:
                if rec.status == "skipped":
                    runner.say(f"  skip  {rec.case}: {rec.error}")
                elif not rec.metrics.empty and reporter:
                    sp = rec.metrics.speedup  # none without the baseline (it could not run)
                    sp_text = "no baseline" if sp is None else f"speedup {sp:.2f}x" + (
                        " (not resolved)" if "not resolved" in _record_speedup(rec) else "")
                    runner.say(f"      {rec.case:{width}s} {rec.samples_per_s:9.1f} samples/s   {sp_text}"
                               f"{_allreduce_counts(rec.describe.engine)}")
                    busy = busy_reason(rec.metrics)
                    if busy and busy not in said_busy:  # the variants timed together share one machine state
                        said_busy.add(busy)
                        runner.say(f"      {busy}")
                if reporter:
                    dest = _append(results, rec)
                    written[dest] = written.get(dest, 0) + 1
            records += batch
    except KeyboardInterrupt as exc:
        kept = list(getattr(exc, "records", None) or [])  # the interrupted group's finished checks and timings
        checked = 0
        for rec in kept if reporter else []:
            dest = _append(results, rec)
            written[dest] = written.get(dest, 0) + 1
            checked += rec.status == "not_run"
        if reporter and args.junit:
            _write_junit(args.junit, records + kept, seconds, world)
        saved = "; ".join(f"{n} record(s) of finished cases kept in {t}" for t, n in written.items())
        more = (f" ({checked} of them checked, their timing interrupted: status not_run, --resume times them)"
                if checked else "")
        print(f"fleetbench run: interrupted; {saved or 'no case had finished, nothing was written'}{more}",
              file=sys.stderr, flush=True)
        raise SystemExit(130) from None
    finally:
        display.stop()
        launcher.close()
        if cluster is not None:
            cluster.down()
        if env:
            shutdown()
    if reporter:
        print_table(records, knob_notes(ran.selection))
        busy = busy_summary(records)
        if busy:
            print("\n" + busy)
        appended = "; ".join(f"{n} record(s) appended to {t}" for t, n in written.items())
        print(("\n" + appended + (": " if len(written) == 1 else " (") + _tally(records)
               + ("" if len(written) == 1 else ")")) if written else "\nno record written")
        junit_written = not args.junit or _write_junit(args.junit, records, seconds, world)
        traces = [r.metrics.trace_file for r in records if r.metrics.trace_file]
        if traces:
            print("traces (each a directory: rank<R>.pt.trace.json per rank, timeline.json; open a file in "
                  "https://ui.perfetto.dev, it stays in the browser): "
                  + ", ".join(os.path.join(facts.results_dir, t) for t in traces))
        if any(r.verdict in ("fail", "error") for r in records) or not junit_written:
            return 1
    return 0


class CaseSeconds:
    """Each case's seconds, for --junit, from the runner's progress: its check, an equal share of each timing group
    it was timed in (the group's variants run interleaved), its trace; every event is passed on to ``forward``."""

    def __init__(self, selected: list, forward: Any) -> None:
        self.forward = forward
        self.names = {(rc.case.model, rc.case.variant): rc.case.name for rc in selected}
        self.seconds: dict[str, float] = {}

    def event(self, p) -> None:
        if p.event in ("checked", "traced"):
            self.seconds[p.case] = self.seconds.get(p.case, 0.0) + p.seconds
        elif p.event == "timed":
            for v in p.variants:
                if (name := self.names.get((p.model, v))) is not None:
                    self.seconds[name] = self.seconds.get(name, 0.0) + p.seconds / len(p.variants)
        self.forward(p)


def _write_junit(path: str, records, seconds: CaseSeconds, world: int) -> bool:
    """--junit: the records of this command as JUnit XML; False (said) when it could not be written (the records
    stand, the command then exits 1)."""
    run_id = records[0].run_id if records else ""
    suite = junit.Suite(f"fleetbench run at world size {world}", tuple(junit.record_cases(records, seconds.seconds)),
                        (("run_id", run_id), ("world_size", str(world))))
    try:
        junit.write_junit(path, [suite], name="fleetbench run")
        return True
    except OSError as exc:
        print(f"fleetbench run: --junit {path}: not written ({exc})", file=sys.stderr, flush=True)
        return False


HEARTBEAT_S = 60.0  # a phase that runs longer says so this often (not on a terminal: its live display ticks)


class RunDisplay:
    """What a run is doing while it runs (the runner's ``say`` lines and its :class:`~suite.runner.Progress`).

    On a terminal (``live``): a rich progress display under the printed lines: cases checked out of all,
    and the current step (the case being checked, or the model group being timed: its variants, rounds and
    steps, with the time elapsed; the ranks time their rounds without reporting each, so rounds are counted
    done when the group's timing returns).  Otherwise one plain line as each phase starts (a check, a timing group,
    a trace: what it waits on and the bound on that wait) and ends, and every ``heartbeat_s`` while it runs a
    "still ..." line with the time so far, so a CI log is never silent for minutes (a CPU resnet50 case spends
    95 s in its check and 137 s in its timing).
    """

    def __init__(self, live: bool = False, console=None, heartbeat_s: float = HEARTBEAT_S):
        self.live = live
        self.console = console
        self.heartbeat_s = heartbeat_s
        self._progress: Any = None
        self._cases: Any = None
        self._step: Any = None
        self._beat: Any = None  # the running phase's heartbeat: (its stop event, its thread)
        self._lock = threading.Lock()  # the heartbeat's lines and the run's never interleave

    def start(self, cases: int) -> None:
        if not self.live:
            return
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self._progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                                  MofNCompleteColumn(), TimeElapsedColumn(),
                                  console=self.console or Console(), transient=True)
        self._cases = self._progress.add_task("cases checked", total=max(cases, 1))
        self._step = self._progress.add_task("starting the ranks", total=None)
        self._progress.start()

    def stop(self) -> None:
        self._quiet()
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def say(self, msg: str) -> None:
        with self._lock:
            if self._progress is not None:
                self._progress.console.print(msg, markup=False, highlight=False, soft_wrap=True)
            else:
                print(msg, flush=True)

    def _heartbeat(self, doing: str, p) -> None:
        """Every ``heartbeat_s`` until the phase ends (:meth:`_quiet`): "still DOING after N s (waiting on ...)"."""
        self._quiet()
        if self.live or not self.heartbeat_s > 0:
            return
        stop, t0 = threading.Event(), time.monotonic()
        bound = f"; at most {p.bound_s:.0f} s" if p.bound_s else ""

        def beat() -> None:
            while not stop.wait(self.heartbeat_s):
                self.say(f"      still {doing} after {time.monotonic() - t0:.0f} s (waiting on {p.waits}{bound})")

        thread = threading.Thread(target=beat, name="fleetbench-heartbeat", daemon=True)
        thread.start()
        self._beat = (stop, thread)

    def _quiet(self) -> None:
        if self._beat is not None:
            stop, thread = self._beat
            stop.set()
            thread.join(timeout=5)
            self._beat = None

    def event(self, p) -> None:
        group = f"group {p.done}/{p.total}" if p.total > 1 else "one group"
        what = (f"{p.model}, {group}: {len(p.variants)} variant(s) interleaved ({', '.join(p.variants)}), "
                f"{p.rounds} round(s) x {p.steps} step(s)")
        waits = f": waiting on {p.waits}" + (f" (at most {p.bound_s:.0f} s)" if p.bound_s else "") if p.waits else ""
        if p.event in ("checked", "timed", "traced"):
            self._quiet()
        elif p.event == "check":
            self._heartbeat(f"checking {p.case}", p)
        elif p.event == "timing":
            self._heartbeat(f"timing {p.model} {group}", p)
        elif p.event == "trace":
            self._heartbeat(f"tracing {p.case}", p)
        if p.event == "timed":  # a line on a terminal too
            self.say(f"      timed {p.model} {group} in {p.seconds:.1f}s: "
                     + (f"failed ({p.detail})" if p.detail else f"{p.rounds}/{p.rounds} rounds done"))
        bar = self._progress
        if bar is None:
            if p.event == "check" and p.bound_s:  # a check that runs (not --no-check, nor one said above)
                self.say(f"      checking {p.case}{waits}")
            elif p.event == "timing":
                self.say(f"      timing {what}{waits}")
            elif p.event == "trace":
                self.say(f"      tracing {p.case} ({p.steps} step(s)){waits}")
            return
        if p.event == "check":
            bar.update(self._step, description=f"checking {p.case}" + (f" ({p.waits})" if p.bound_s else ""),
                       total=None, completed=0)
        elif p.event == "checked":
            bar.update(self._cases, completed=p.done)
        elif p.event == "timing":
            bar.update(self._step, description=f"timing {what}", total=p.rounds, completed=0)
        elif p.event == "timed":
            bar.update(self._step, completed=p.rounds if not p.detail else 0)
        elif p.event == "trace":
            bar.update(self._step, description=f"tracing {p.case} ({p.steps} step(s))", total=None, completed=0)


def _allreduce_counts(describe: Mapping) -> str:
    """Paddle's log line in short: the allreduces a step issues before and after fusion (as fleetbench counts them)."""
    before, after = describe.get("allreduce_ops_before_fusion"), describe.get("allreduce_ops")
    if not isinstance(before, int) or not before:
        return ""
    early = describe.get("launched_in_backward")
    during = f", {early} launched before backward ended" if describe.get("overlap") and isinstance(early, int) else ""
    return f"   allreduce ops {before} before fusion, {after} after{during}"


_FALLBACK: dict = {}  # results file -> where its records go instead (a fallback file, or STDERR)


def _append(path: str, rec) -> str:
    """Append a record and return where it went: the results file, else a fallback file, else stderr
    (``suite.outputs.append_or_fallback``).  Never raises: the run's records are also kept in memory (its table)."""
    from ..results.records import append_record  # at call time: tests replace it

    return append_or_fallback(path, lambda target: append_record(target, rec), rec.to_json, _FALLBACK, _say)


def _say(line: str) -> None:
    """A line on stderr that never raises (a closed or full stderr loses the line, not the run)."""
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def _prepare(spec: RunSpec, env, results: str) -> tuple[list, RunFacts, RunSpec]:
    from ..selection import resolve  # torch comes with it (the models): at run time

    """The cases to run at this world size, what the runner is told besides its options (the resolved size and
    platform, where traces go) and the spec as it runs (its size, device and world size resolved: what the records
    keep; its ``run``, the runner's options), from ``spec`` (every option and config validated, no rank started)."""
    if not env:
        require_nproc(spec.world, spec.selection.device)
    # every config validated before any rank starts
    resolved = resolve(spec.selection, env.world_size if env else spec.world, env.local_world_size if env else None)
    device, backend, world = resolved.device, resolved.backend, resolved.worlds[0]
    ran = spec.replace(selection={"size": resolved.size, "device": device, "worlds": (world,)})
    facts = spec.facts(resolved.size, device, backend, os.path.dirname(os.path.abspath(results)))
    return resolved.at[world], facts, ran


def _check_results_file(path: str) -> None:
    """Before any rank starts: the file must take records as the writer appends them (``suite.outputs``' rule,
    tried for real), and a corrupt results file is refused (nothing in it is touched)."""
    if why := output_problem(path, probe=True):
        raise ConfigError(f"--results {path}: {why}")
    if os.path.exists(path) and os.path.getsize(path):
        try:
            read_records(path)
        except ResultsFileError as exc:
            raise ConfigError(f"--results {path}: {exc}; move it aside or pick another --results file") from None


def _check_traces_dir(traces: str) -> None:
    """Before any rank starts: traces go to ``traces`` (a real directory, writable, or creatable)."""
    if why := output_problem(traces, "directory"):
        raise ConfigError(f"--trace-steps: {traces}: {why}; traces are written into a directory of that name")


def _tally(records) -> str:
    """The records by status: "2 measured, 1 error, 1 skipped (why)" (each reason once)."""
    parts = [f"{sum(r.status == 'ok' for r in records)} measured"]
    for status in ("error", "skipped", "not_run"):
        mine = [r for r in records if r.status == status]
        why = "; ".join(dict.fromkeys(r.error.splitlines()[0] for r in mine if r.error)) if status != "error" else ""
        if mine:
            parts.append(f"{len(mine)} {status.replace('_', ' ')}" + (f" ({why})" if why else ""))
    return ", ".join(parts)


def _count(x) -> str:
    """A per-step count: whole numbers as they are, others to 3 significant digits (Local SGD's 1.33)."""
    return f"{x:.0f}" if float(x).is_integer() or abs(x) >= 100 else f"{x:.3g}"


def _unwrap(text: str) -> str:
    """"(why (over 10%))" -> "why (over 10%)": the one pair of parentheses around a busy reason, no more."""
    return text[1:-1] if text.startswith("(") and text.endswith(")") else text


def busy_summary(records) -> str | None:
    """The line under run's table when timings were taken on a busy machine (``busy_reason``), or None."""
    busy = [r for r in records if not r.metrics.empty and busy_reason(r.metrics)]
    if not busy:
        return None
    why = "; ".join(dict.fromkeys(_unwrap(str(busy_reason(r.metrics)).removeprefix(BUSY).strip()) for r in busy))
    timed = sum(1 for r in records if not r.metrics.empty)
    return (f"{BUSY} for {len(busy)} of {timed} timed case(s): {why} (the rule: "
            f"others' CPU time over {BUSY_SHARE:.0%} of the machine's during the windows, or a load average above "
            f"the cores by more than {LOAD_MARGIN:g})")


def _rounds(rec) -> int | None:
    """The timed rounds a record's speedup is paired over (its windows), or None where not recorded."""
    windows = rec.metrics.window_s
    return len(windows) if isinstance(windows, list) else None


def _speedup_cell(sp, ci, baseline: bool | list = False, rounds: int | None = None, consistent: bool | None = None
                  ) -> str:
    """The speedup with its interval, and why it is not resolved where it is not (``suite.measure.stats``'s
    ``speedup_unresolved``, the rule the report states too): "not resolved" where the interval spans 1 (neither
    faster nor slower), "not resolved (N rounds)" where it comes from fewer than RUN_ROUNDS_FOR_95 rounds (such an
    interval covers less than 95%), "not resolved (rounds disagree)" where its rounds disagree (``consistent``
    False: the record's ``speedup_consistent``)."""
    if baseline:  # True, or the knobs it ran with beyond plain data parallel
        return "1 (the baseline" + (f"; {', '.join(baseline)})" if isinstance(baseline, list) else ")")
    if not (isinstance(sp, float) and math.isfinite(sp)):
        return "-"
    why = speedup_unresolved(Metrics(speedup=sp, speedup_ci=list(ci), speedup_consistent=consistent,
                                     window_s=[math.nan] * rounds if rounds is not None else None))
    if why == "no interval":
        return f"{sp:.2f} (no interval)"  # one round, or a faulty one
    return f"{sp:.2f} [{ci[0]:.2f}, {ci[1]:.2f}]" + (f" {why}" if why else "")


def _record_speedup(r) -> str:
    """A record's speedup cell (:func:`_speedup_cell` of its metrics)."""
    m = r.metrics
    baseline = r.case.endswith("/" + BASELINE) and r.status == "ok"
    return _speedup_cell(m.speedup, m.speedup_ci or [None, None], rounds=_rounds(r), consistent=m.speedup_consistent,
                         baseline=(away_from_defaults(r.config) or True) if baseline else False)


def busy_marks(records) -> tuple[list[str], list[str]]:
    """Each record's mark in the table's machine column ("busy [N]" where its windows were busy, ``busy_reason``;
    "" elsewhere), and the footnotes, one per reason: "[N] machine busy: timings unreliable (why)"."""
    reasons: dict[str, int] = {}
    marks = []
    for r in records:
        why = busy_reason(r.metrics) if not r.metrics.empty else None
        if why:
            marks.append(f"busy [{reasons.setdefault(why, len(reasons) + 1)}]")
        else:
            marks.append("")
    return marks, [f"[{n}] {why}" for why, n in reasons.items()]


def knob_notes(sel) -> list[str]:
    """What the selection's ``--config`` and ``--set`` knobs applied to, a line for each kind: those every case
    took, the baseline too (workload knobs; all with ``--set-baseline``), and those every case but the baseline
    took (it stays plain data parallel: ``suite.config.baseline_sets``).  Empty when none was given."""
    given = baseline_sets(sel.config, sel.sets, everything=True)
    plain = set(baseline_sets(sel.config, sel.sets, sel.set_baseline))
    to_all = [item for item in given if item in plain]
    others = [item for item in given if item not in plain]
    lines = []
    if to_all:
        lines.append(f"knobs applied to every case, the baseline ({BASELINE}) too: {', '.join(to_all)}"
                     + (" (--set-baseline)" if sel.set_baseline else " (workload knobs)"))
    if others:
        lines.append(f"knobs applied to every case but the baseline: {', '.join(others)}; {BASELINE} stays plain "
                     f"data parallel (--set-baseline applies them to it too)")
    return lines


def print_table(records, notes: list[str] | tuple[str, ...] = ()) -> None:
    """The run's table; ``notes`` (:func:`knob_notes`) under it, after the busy rows' reasons."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title="fleetbench run", show_lines=False)
    for col in ("case", "verdict", "samples/s", "speedup vs plain", "step ms (median, IQR)", "collectives/step",
                "machine"):
        table.add_column(col, justify="left" if col in ("case", "verdict", "machine") else "right", no_wrap=True)
    marks, busy_notes = busy_marks(records)
    for r, mark in zip(records, marks):
        m = r.metrics
        sps = m.samples_per_s
        st = m.step_time_s
        calls = m.comm_calls_per_step or {}
        ar = sum(calls.values())  # every collective fleetbench issued (DDP's own are not counted)
        table.add_row(
            r.case,
            r.verdict,
            f"{sps:.1f}" if isinstance(sps, float) else "-",
            _record_speedup(r),
            f"{st.median * 1e3:.1f} ({st.iqr * 1e3:.1f})" if st is not None and st.n and st.median is not None
            and st.iqr is not None else "-",
            _count(ar) if not m.empty else "-",
            mark,
        )
    from rich.measure import Measurement

    # on a terminal, its width (at least 160); in a log, as wide as the table needs, never a cell cut to "…"
    wide = Measurement.get(Console(width=1000), Console(width=1000).options, table).maximum
    console = Console(width=max(160, os.get_terminal_size(sys.stdout.fileno()).columns if sys.stdout.isatty()
                                else wide))
    console.print(table)
    for line in [*busy_notes, *notes]:  # the busy rows' reasons, under the table they mark; what the knobs reached
        console.print(line, markup=False, highlight=False, soft_wrap=True)


__all__ = ["add_parser", "main", "command_spec", "print_table", "DEFAULT_RESULTS", "RunDisplay", "busy_summary",
           "knob_notes",
           "busy_marks"]
