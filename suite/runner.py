"""The parent-side case runner: correctness check and interleaved timing, folded into CaseRecords.

``fleetbench run``, pytest-benchmark (``bench_cases/test_cases.py``) and asv
(``bench_cases/asv_cases.py``) all run cases through :class:`CaseRunner`:

    runner = CaseRunner(launcher, world, RunOptions(size="cpu"))
    for records in runner.run(resolve_cases(...)):     # one model at a time
        ...                                           # check each case, time them interleaved with
                                                      # the model's baseline, one CaseRecord per case

- **check** (:meth:`CaseRunner.check`): the harness's verdict against the reference that fits
  the strategy (``suite.check.harness``);
- **timing** (:meth:`CaseRunner.measure`): every case of a model and the model's baseline
  (``plain``) interleaved in one process group, round by round; models too large for every
  engine to fit in memory at once are timed in groups, each with the baseline.  When the
  interleaved timing fails (a rank died), each case is timed alone with the baseline and the
  record says so (``fallback``);
- **records** (:meth:`CaseRunner.record`): a schema-versioned ``CaseRecord`` with the size,
  backend and device it ran on and its structure (``suite.results.structure``).

Harnesses that time rounds themselves (pytest-benchmark, asv) use :meth:`prepare` and
:class:`PreparedCase` instead of :meth:`measure`; the summary and the record are the same.

A display follows the run through ``on_progress``: called with a :class:`Progress` before and after
each check, each timing group and each trace (the runner itself prints only through ``say``).
"""
from __future__ import annotations

import datetime
import os
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from .cases import BASELINE, Case
from .check.harness import CheckResult
from .config import StrategyConfig
from .measure.summary import COMPUTE_ONLY, summarize
from .results.records import CaseRecord
from .results.structure import structure_of
from .workload import WorkloadSpec

__all__ = ["RunOptions", "ResolvedCase", "CaseRunner", "PreparedCase", "Progress", "new_run_id", "short_error"]

Checked = CheckResult | Exception | None  # a check's verdict, the error that stopped it, or no check
Outcome = dict | Exception | None  # a timing's metrics, the error that stopped it, or nothing (torchrun)


@dataclass(frozen=True)
class RunOptions:
    """How cases are run; the CLI's options, typed (argparse stays in ``suite.cli``)."""

    size: str = "cpu"
    per_rank_batch: int | None = None  # None: each model's own at ``size``
    steps: int = 5  # steps per timed window
    rounds: int = 5  # interleaved timed rounds
    warmup: int = 2  # warm-up steps per case, not recorded
    check: bool = True
    check_steps: int = 3
    timeout: float = 600.0  # bound on every multi-rank call, seconds
    trace_steps: int = 0  # traced steps per case after timing (0: no trace)
    utilization: bool = True
    device: str | None = None  # "cpu" | "cuda" (what the ranks run on; None: the platform's choice)
    backend: str = ""  # "gloo" | "nccl", recorded
    baseline_overrides: tuple = ()  # the run's --set assignments, applied to the baseline too
    results_dir: str = "results"  # traces go to results_dir/traces/RUN_ID/
    memory_budget: int | None = None  # bytes the ranks' engines may hold at once (None: from the machine)


@dataclass(frozen=True)
class ResolvedCase:
    """A selected case with its validated config; ``skip`` says why it cannot run at this world size."""

    case: Case
    config: StrategyConfig
    skip: str | None = None


@dataclass(frozen=True)
class Progress:
    """What the runner is about to do or has done, for a progress display.

    ``event``: "check" / "checked" (``case``; ``done`` of ``total`` runnable cases checked, ``detail`` the
    verdict line), "timing" / "timed" (one timing group of ``model``: group ``done`` of ``total``, its
    ``variants`` interleaved for ``rounds`` rounds of ``steps`` steps; on "timed", ``detail`` is "" or why
    it failed), "trace" (``case``).  ``seconds``: how long the step took ("checked", "timed")."""

    event: str
    model: str
    case: str = ""
    done: int = 0
    total: int = 0
    variants: tuple = ()
    rounds: int = 0
    steps: int = 0
    detail: str = ""
    seconds: float = 0.0


def new_run_id() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ-") + uuid.uuid4().hex[:6]


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def short_error(exc: BaseException, limit: int = 300) -> str:
    """One line for an error: its first line and the last lines of a rank's traceback."""
    text = f"{type(exc).__name__}: {exc}"
    lines = [ln for ln in text.splitlines() if ln.strip()]
    text = lines[0] if len(lines) < 3 else lines[0] + " … " + " | ".join(lines[-2:])
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _engine_bytes(model_ref: str, size: str) -> int:
    """A bound on one engine's memory on one rank: parameters, gradients, flat buckets, optimizer state."""
    from .models import model_info  # a user's factory is never called in this process

    elements = model_info(model_ref, size).parameter_elements
    return 4 * 4 * elements  # fp32; four copies (params, grads/buckets, momentum, scratch)


def _available_memory() -> int:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 * 2**30


@dataclass
class PreparedCase:
    """A case built and warmed up on the ranks, timed window by window by a harness that times rounds itself."""

    runner: CaseRunner
    rc: ResolvedCase
    key: str
    describe: dict
    windows: list = field(default_factory=list)  # per window: every rank's answer

    def window(self) -> list:
        """One window of ``steps`` steps on every rank (what a pytest-benchmark round or asv sample times)."""
        from .measure.timing import run_window

        answers = self.runner.launcher.run(run_window, dict(key=self.key, steps=self.runner.opts.steps),
                                           timeout=self.runner.opts.timeout)
        self.windows.append(answers)
        return answers

    def metrics(self) -> dict:
        """The summary of every window run so far, as ``fleetbench run`` would record it (no baseline)."""
        from .measure.timing import prepared_result

        answers = self.runner.launcher.run(prepared_result, dict(key=self.key), timeout=self.runner.opts.timeout)
        wl = self.runner.workload_spec(self.rc.case)
        batch = self.runner.per_rank_batch(self.rc.case)
        return summarize(answers, [self.key], batch * self.runner.world, self.runner.opts.steps, self.runner.world,
                         baseline=None)[self.key] | {"workload": wl.describe()}

    def close(self) -> None:
        from .measure.timing import drop_case

        self.runner.launcher.run(drop_case, dict(key=self.key), timeout=self.runner.opts.timeout)


class CaseRunner:
    def __init__(self, launcher: Any, world: int, opts: RunOptions, run_id: str | None = None,
                 metadata: dict | None = None, say: Callable[[str], None] | None = None,
                 reporter: bool = True, on_progress: Callable[[Progress], None] | None = None):
        self.launcher = launcher
        self.on_progress = on_progress
        self._checks = [0, 0]  # cases checked, cases to check (set by run())
        self.world = world
        self.opts = opts
        self.run_id = run_id or new_run_id()
        self.reporter = reporter
        self._say = say
        if metadata is None:
            from .measure.metadata import collect

            metadata = collect(world_size=world, backend=opts.backend or None)
        self.metadata = metadata
        self._batches: dict[str, int] = {}

    def say(self, msg: str) -> None:
        if self.reporter and self._say is not None:
            self._say(msg)

    def _progress(self, event: str, model: str, **kw: Any) -> None:
        if self.reporter and self.on_progress is not None:
            self.on_progress(Progress(event, model, **kw))

    # ---- what the ranks are sent ------------------------------------------------------------
    def per_rank_batch(self, case: Case) -> int:
        if self.opts.per_rank_batch or case.per_rank_batch:
            return int(self.opts.per_rank_batch or case.per_rank_batch)  # type: ignore[arg-type]
        if case.model not in self._batches:
            from .models import model_info

            self._batches[case.model] = model_info(case.model, self.opts.size).per_rank_batch
        return self._batches[case.model]

    def workload_spec(self, case: Case) -> WorkloadSpec:
        return WorkloadSpec(case.model, self.opts.size, self.per_rank_batch(case))

    def baseline_config(self) -> StrategyConfig:
        return StrategyConfig().with_overrides(list(self.opts.baseline_overrides))

    # ---- check ----------------------------------------------------------------------------
    def check(self, rc: ResolvedCase) -> Checked:
        """The case's CheckResult, the exception that stopped it, or None (no check asked)."""
        if not self.opts.check:
            return None
        from .check.harness import run_check

        try:
            return run_check(self.launcher, self.workload_spec(rc.case), rc.config, steps=self.opts.check_steps,
                             timeout=self.opts.timeout)
        except Exception as exc:  # noqa: BLE001 - a failed case is reported, the run goes on
            return exc

    # ---- timing -----------------------------------------------------------------------------
    def groups(self, rcs: list[ResolvedCase]) -> list[list[str]]:
        """Variants timed together (each group with the baseline), bounded by the ranks' memory."""
        names = [rc.case.variant for rc in rcs if rc.case.variant != BASELINE]
        budget = self.opts.memory_budget or int(0.6 * _available_memory())
        per_engine = _engine_bytes(rcs[0].case.model, self.opts.size) * self.world
        fit = max(2, budget // max(per_engine, 1))  # engines of one model that fit at once, baseline included
        size = max(1, int(fit) - 1)
        return [[BASELINE] + names[i:i + size] for i in range(0, len(names), size)] or [[BASELINE]]

    def _time(self, model_rcs: list[ResolvedCase], names: list[str]) -> dict[str, dict]:
        from .measure.timing import time_on_rank
        from .measure.utilization import UtilizationSampler

        configs = {rc.case.variant: rc.config for rc in model_rcs}
        configs.setdefault(BASELINE, self.baseline_config())
        case = model_rcs[0].case
        device = self.opts.device or "cpu"
        sampler = UtilizationSampler(device=device).start() if (self.opts.utilization and self.reporter) else None
        try:
            answers = self.launcher.run(
                time_on_rank,
                dict(workload_spec=self.workload_spec(case), warmup=self.opts.warmup, steps=self.opts.steps,
                     rounds=self.opts.rounds,
                     variants=[{"name": n, "config": configs[n].to_dict()} for n in names]),
                timeout=self.opts.timeout)
        finally:
            if sampler is not None:
                sampler.stop()
        if answers is None:  # a non-reporting torchrun rank
            return {}
        out = summarize(answers, names, self.per_rank_batch(case) * self.world, self.opts.steps, self.world,
                        baseline=BASELINE)
        if sampler is not None:
            util = sampler.summary()
            util["shared_by"] = names  # the variants ran interleaved: one sampling covers them all
            for s in out.values():
                s["utilization"] = util
        return out

    def _timed(self, model_rcs: list[ResolvedCase], names: list[str], group: int, groups: int) -> dict[str, dict]:
        """:meth:`_time`, with progress before and after."""
        kw = dict(done=group, total=groups, variants=tuple(names), rounds=self.opts.rounds, steps=self.opts.steps)
        model = model_rcs[0].case.model
        self._progress("timing", model, **kw)
        t0 = time.perf_counter()
        try:
            out = self._time(model_rcs, names)
        except Exception as exc:
            self._progress("timed", model, detail=short_error(exc), seconds=time.perf_counter() - t0, **kw)
            raise
        self._progress("timed", model, seconds=time.perf_counter() - t0, **kw)
        return out

    def measure(self, model_rcs: list[ResolvedCase]) -> tuple[dict[str, Outcome], dict[str, str]]:
        """Metrics per variant (or the exception that stopped it), and per variant why it was timed alone."""
        out: dict[str, Outcome] = {}
        fallback: dict[str, str] = {}
        compute_group = [COMPUTE_ONLY] if any(rc.case.variant == COMPUTE_ONLY for rc in model_rcs) else []
        groups = self.groups(model_rcs)
        for gi, group in enumerate(groups, 1):
            # exposed communication needs the compute-only variant in every group's timing
            names = list(dict.fromkeys(group + compute_group))
            try:
                got = self._timed(model_rcs, names, gi, len(groups))
                for n in group:
                    out.setdefault(n, got.get(n))
                if COMPUTE_ONLY in got:
                    out.setdefault(COMPUTE_ONLY, got[COMPUTE_ONLY])
                continue
            except Exception as exc:  # noqa: BLE001 - fall back to one case at a time
                why = f"interleaved timing of {len(names)} variants failed ({short_error(exc)})"
                self.say(f"      {why}; timing each case alone with the baseline")
            for n in names:
                if n == BASELINE and BASELINE in out:
                    continue
                try:
                    pair = self._timed(model_rcs, list(dict.fromkeys([BASELINE, n])), gi, len(groups))
                    out[n] = pair.get(n)
                    out.setdefault(BASELINE, pair.get(BASELINE))
                    fallback[n] = f"{why}; timed alone with the baseline"
                except Exception as exc:  # noqa: BLE001
                    out[n] = exc
                    fallback[n] = why
        return out, fallback

    # ---- records ------------------------------------------------------------------------------
    def _base_record(self, rc: ResolvedCase) -> CaseRecord:
        return CaseRecord(rc.case.name, rc.case.model, self.world, rc.config.to_dict(), self.run_id,
                          tags=list(rc.case.tags), timestamp=_now(), size=self.opts.size,
                          backend=self.opts.backend, device=_device_label(self.metadata, self.opts.device),
                          metadata=self.metadata)

    def skipped(self, rc: ResolvedCase) -> CaseRecord:
        rec = self._base_record(rc)
        rec.status, rec.verdict, rec.error = "skipped", "skipped", rc.skip
        return rec

    def record(self, rc: ResolvedCase, check: Checked, measured: Outcome, fallback: str | None = None) -> CaseRecord:
        """One case's record from its check and its timing (either may be an exception)."""
        rec = self._base_record(rc)
        rec.fallback = fallback
        if isinstance(check, Exception):
            rec.status, rec.verdict, rec.error = "error", "error", short_error(check, 2000)
        elif check is not None:
            rec.check = check.to_dict()
            rec.verdict = check.verdict
        if isinstance(measured, Exception):
            rec.status, rec.verdict = "error", "error"
            rec.error = (rec.error + "\n" if rec.error else "") + short_error(measured, 2000)
        elif isinstance(measured, dict):
            metrics = dict(measured)
            rec.describe = metrics.pop("describe", {}) or {}
            rec.metrics = metrics
            bad = metrics.get("nonfinite_loss")
            if bad and rec.verdict != "error":
                rec.verdict = "fail"
                rec.error = (f"non-finite loss at step {bad['step']} of the timed windows on rank {bad['rank']}")
        deterministic = (self.opts.backend in ("", "gloo") and not rc.config.straggler_ms
                         and rc.config.fusion_backend != "compile")
        if rec.status == "ok":
            rec.structure = structure_of(rec.describe, rec.metrics, rec.check, deterministic=deterministic)
        return rec

    # ---- one model, then the whole selection ------------------------------------------------------
    def run_model(self, model_rcs: list[ResolvedCase], progress: Callable[[ResolvedCase, str, float], None]
                  ) -> list[CaseRecord]:
        checks: dict[str, Checked] = {}
        for rc in model_rcs:
            t0 = time.perf_counter()
            self._progress("check", rc.case.model, case=rc.case.name, done=self._checks[0], total=self._checks[1])
            checks[rc.case.name] = res = self.check(rc)
            self._checks[0] += 1
            self._progress("checked", rc.case.model, case=rc.case.name, done=self._checks[0], total=self._checks[1],
                           detail=_check_line(res), seconds=time.perf_counter() - t0)
            progress(rc, _check_line(res), time.perf_counter() - t0)
        measured, fallback = self.measure(model_rcs)
        records = []
        for rc in model_rcs:
            rec = self.record(rc, checks.get(rc.case.name), measured.get(rc.case.variant),
                              fallback.get(rc.case.variant))
            if self.opts.trace_steps and rec.status == "ok":
                self._progress("trace", rc.case.model, case=rc.case.name, steps=self.opts.trace_steps)
                self.trace(rc, rec)
            records.append(rec)
        return records

    def run(self, selected: list[ResolvedCase],
            progress: Callable[[ResolvedCase, str, float], None] | None = None) -> Iterator[list[CaseRecord]]:
        """Skipped cases first, then each model's records as soon as its interleaved timing is done."""
        skipped = [rc for rc in selected if rc.skip is not None]
        if skipped:
            yield [self.skipped(rc) for rc in skipped]
        runnable = [rc for rc in selected if rc.skip is None]
        done = [0]
        self._checks = [0, len(runnable)]

        def _progress(rc: ResolvedCase, line: str, seconds: float) -> None:
            done[0] += 1
            if progress is not None:
                progress(rc, f"[{done[0]}/{len(runnable)}] {rc.case.name:28s} check {line} ({seconds:.1f}s)",
                         seconds)
            else:
                self.say(f"[{done[0]}/{len(runnable)}] {rc.case.name:28s} check {line} ({seconds:.1f}s)")

        for model in dict.fromkeys(rc.case.model for rc in runnable):
            yield self.run_model([rc for rc in runnable if rc.case.model == model], _progress)

    # ---- traces and prepared cases ---------------------------------------------------------------
    def trace(self, rc: ResolvedCase, rec: CaseRecord) -> None:
        """A few traced steps of the case on every rank, written as a Chrome/Perfetto trace file."""
        import json

        from .measure.trace import trace_on_rank
        from .report.trace import chrome_trace

        try:
            answers = self.launcher.run(trace_on_rank, dict(workload_spec=self.workload_spec(rc.case),
                                                            config=rc.config.to_dict(), steps=self.opts.trace_steps),
                                        timeout=self.opts.timeout)
        except Exception as exc:  # noqa: BLE001 - the timing stands; the trace is reported missing
            rec.metrics["trace_error"] = short_error(exc)
            return
        if answers is None or not self.reporter:
            return
        rel = os.path.join("traces", self.run_id, f"{rc.case.name.replace('/', '_')}@{self.world}.json")
        path = os.path.join(self.opts.results_dir, rel)
        root = os.path.join(os.path.realpath(self.opts.results_dir), "traces")
        try:  # the record stands whatever happens to its trace; nothing is written outside traces/
            os.makedirs(os.path.dirname(path), exist_ok=True)
            if os.path.commonpath([root, os.path.realpath(path)]) != root:  # a planted symlink, a crafted name
                raise OSError(f"{path} leads outside {root}")
            with open(path, "w", opener=lambda p, f: os.open(p, f | os.O_NOFOLLOW)) as fh:
                json.dump(chrome_trace(answers, title=f"{rc.case.name} at world size {self.world}, "
                                                      f"run {self.run_id}"), fh)
        except (OSError, ValueError) as exc:
            rec.metrics["trace_error"] = f"trace not written: {exc}"
            return
        rec.metrics["trace_file"] = rel

    def prepare(self, rc: ResolvedCase) -> PreparedCase:
        """Build and warm up the case's engine on every rank, for a harness that times windows itself."""
        from .measure.timing import prepare_case

        key = f"{rc.case.name}@{self.world}"
        answers = self.launcher.run(prepare_case, dict(key=key, workload_spec=self.workload_spec(rc.case),
                                                       config=rc.config.to_dict(), warmup=self.opts.warmup),
                                    timeout=self.opts.timeout)
        return PreparedCase(self, rc, key, (answers or [{}])[0].get("describe", {}))


def _check_line(res: Checked) -> str:
    if res is None:
        return "skipped (--no-check)"
    if isinstance(res, Exception):
        return f"error: {short_error(res)}"
    detail = ""
    if res.verdict in ("pass", "fail"):
        detail = f" (param err {res.param_error:.2g}, loss err {res.loss_error:.2g})"
    if res.verdict == "fail":
        detail += f": {res.message}"
    return f"{res.verdict}{detail}"


def _device_label(metadata: dict, device: str | None) -> str:
    """"cpu", or "cuda: <GPU names>" (what a record says it ran on)."""
    if device == "cuda":
        gpu = metadata.get("gpu") or {}
        return "cuda: " + ", ".join(dict.fromkeys(gpu.get("names") or ["unknown GPU"]))
    return "cpu"
