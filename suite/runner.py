"""The parent-side case runner: correctness check and interleaved timing, folded into CaseRecords.

``fleetbench run``, pytest-benchmark (``bench_cases/test_cases.py``) and asv
(``bench_cases/asv_cases.py``) all run cases through :class:`CaseRunner`:

    runner = CaseRunner(launcher, world, spec.run, facts=spec.facts(size, device, backend))  # suite/run_spec.py
    for records in runner.run(resolved.at[world]):     # one model at a time (suite/selection.py)
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
  backend and device it ran on and its structure (``suite.results.structure``); its metrics and
  describe are the summary's objects (``suite.measure.summary.Timed``), its check the harness's
  ``CheckSummary``, each taken as it is (no conversion to a dict and back).

pytest-benchmark times each model through :meth:`run_model` as ``fleetbench run`` does (one interleaved timing,
each benchmark then reporting its own case's windows; ``on_answers`` hands it every rank's windows); harnesses
that time rounds themselves (asv, `ab`'s trials) use :meth:`prepare` and :class:`PreparedCase` instead of
:meth:`measure`; the summary and the record are the same.

A display follows the run through ``on_progress``: called with a :class:`Progress` before and after
each check, each timing group and each trace (the runner itself prints only through ``say``).
"""
from __future__ import annotations

import dataclasses
import datetime
import os
import re
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from .cases import BASELINE, Case
from .check.harness import CANNOT_JUDGE, run_check
from .check.tolerances import tolerance_key
from .comm.agree import MISMATCH
from .config import StrategyConfig
from .measure.metadata import collect
from .measure.summary import COMPUTE_ONLY, Timed, summarize
from .measure.timeline import chrome_trace
from .measure.timing import drop_case, prepare_case, prepared_result, rebuild_on_rank, run_window, time_on_rank
from .measure.trace import trace_on_rank
from .measure.utilization import UtilizationSampler
from .models import count_parameters, get_model, model_info
from .outputs import OutputDir, safe_name
from .results.records import CaseRecord, CheckSummary
from .run_spec import ResolvedCase, RunFacts, RunOptions, RunSpec
from .runtime.context import current
from .runtime.pool import RankError, RankFailure
from .workload import WorkloadSpec

__all__ = ["CaseRunner", "PreparedCase", "StaleCase", "Progress", "new_run_id", "short_error",
           "Interrupted", "backend_lacks", "unused_parameters", "structure_mismatch"]

Checked = CheckSummary | Exception | None  # a check's verdict, the error that stopped it, or no check
Outcome = Timed | Exception | None  # a timing's metrics and describe, the error that stopped it, or nothing


@dataclass(frozen=True)
class Progress:
    """What the runner is about to do or has done, for a progress display.

    ``event``: "check" / "checked" (``case``; ``done`` of ``total`` runnable cases checked, ``detail`` the
    verdict line), "timing" / "timed" (one timing group of ``model``: group ``done`` of ``total``, its
    ``variants`` interleaved for ``rounds`` rounds of ``steps`` steps; on "timed", ``detail`` is "" or why
    it failed), "trace" / "traced" (``case``).  ``seconds``: how long the step took ("checked", "timed", "traced").
    On "check", "timing" and "trace": ``waits``, what the phase waits on, in words ("2 rank(s): 3 step(s)
    each, then the single-process reference's 3 step(s) over every rank's shard"), and ``bound_s``, the bound on
    that wait (its call's timeout)."""

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
    waits: str = ""
    bound_s: float = 0.0


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


def _raised(exc: BaseException) -> list[tuple[str, str]]:
    """Per rank that raised (or for ``exc`` itself): the file of the innermost frame and the error's first line."""
    if not getattr(exc, "tracebacks", None):  # raised here, not on a rank (its message may quote a rank's)
        stack = traceback.extract_tb(exc.__traceback__)
        return [(stack[-1].filename if stack else "", "".join(traceback.format_exception_only(exc)).split("\n")[0])]
    out = []
    for text in exc.tracebacks.values():  # type: ignore[attr-defined]
        lines = text.splitlines()
        frames = [i for i, ln in enumerate(lines) if ln.startswith('  File "')]
        last = frames[-1] if frames else -1
        first = next((ln for ln in lines[last + 1:] if ln.strip() and not ln.startswith(" ")), "")
        out.append((lines[last].split('"')[1] if frames else "", first))
    return out


# Errors that mean the device's backend has no kernel for what the case asks (not a bug in the case or
# the model), matched on the first line of the error; anything else stays an error.
BACKEND_LACKS = (
    re.compile(r"RuntimeError: could not create a primitive descriptor"),  # oneDNN: e.g. a bf16 LSTM on CPU
    re.compile(r"(RuntimeError|NotImplementedError): .*not implemented for '(BFloat16|Half|ComplexHalf|Float8\w*)'"),
    re.compile(r"NotImplementedError: Could not run 'aten::\S+' with arguments from the '\w+' backend"),
)


def backend_lacks(exc: BaseException, device: str) -> str | None:
    """Why the case cannot run on ``device`` when every rank's error says its backend lacks a kernel, else None.

    Narrow on purpose, so a real bug is never recorded as skipped: a pattern of :data:`BACKEND_LACKS`, or a
    NotImplementedError raised inside torch (not a model's own, nor a module without ``forward``)."""
    import torch

    torch_dir = os.path.dirname(torch.__file__) + os.sep
    reasons = []
    for where, first in _raised(exc):
        inside_torch = where.startswith(torch_dir) and 'missing the required "forward"' not in first
        if any(p.match(first) for p in BACKEND_LACKS) or (first.startswith("NotImplementedError:") and inside_torch):
            reasons.append(first.split(": ", 1)[1].split(". ")[0].strip())  # its first sentence
        else:
            return None
    return f"the {device} backend cannot run this: {reasons[0]}" if reasons else None


def _said(exc: BaseException) -> list[str]:
    """The first line of every error the ranks raised: :func:`_raised`'s, and for a pool torn down because ranks were
    stuck after another raised (``RankFailure``), the errors of the ranks that raised, quoted in its message."""
    lines = [first for _, first in _raised(exc)]
    if isinstance(exc, RankFailure):
        for section in str(exc).split("\n--- rank ")[1:]:
            body = section.splitlines()
            frames = [i for i, ln in enumerate(body) if ln.startswith('  File "')]
            after = body[frames[-1] + 1:] if frames else body[1:]
            lines += [ln for ln in after if ln.strip() and not ln.startswith(" ")][:1]
    return lines


def unused_parameters(exc: BaseException) -> str | None:
    """The message for parameters that got no gradient (fleetbench's or torch DDP's), the fix first; else None."""
    for first in _said(exc):
        msg = first.split(": ", 1)[-1]
        if msg.startswith("set find_unused_parameters"):
            return msg
        if "find_unused_parameters" in msg:
            return f"set find_unused_parameters=true: torch DDP says {msg}"
    return None


def structure_mismatch(exc: BaseException) -> str | None:
    """The message for ranks that built different models (``suite.comm.agree.StructureMismatch``, raised on every
    rank alike), else None."""
    for first in _said(exc):
        msg = first.split(": ", 1)[-1]
        if msg.startswith(MISMATCH):
            return msg
    return None


def _engine_bytes(model_ref: str, size: str) -> int:
    """A bound on one engine's memory on one rank: parameters, gradients, flat buckets, optimizer state."""
    elements = model_info(model_ref, size).parameter_elements
    return 4 * 4 * elements  # fp32; four copies (params, grads/buckets, momentum, scratch)


BASE_TIMEOUT_S = 600.0  # a multi-rank call's bound before its steps: ranks, engines, data
SIZE_STEP_FACTOR = {"tiny": 0.25, "cpu": 1.0, "full": 4.0}  # longer inputs and batches per step at each size


def step_allowance_s(model_ref: str, size: str, device: str | None = None) -> float:
    """A generous bound on one training step of one engine: on CPU 1 s per 10 M parameters (at least 1 s),
    times the size's factor; a tenth of that on a GPU.  Rough on purpose: it only has to keep a slow but
    healthy call from being killed (a hang in a collective ends sooner, at the process-group timeout)."""
    _, elements = count_parameters(get_model(model_ref, size))
    return max(1.0, elements / 1e7) * SIZE_STEP_FACTOR.get(size, 1.0) * (0.1 if device == "cuda" else 1.0)


def free_memory_on_rank() -> int:
    """A rank function: the bytes this rank's engines may fill (its GPU's free memory on CUDA, its share of
    its host's available RAM on CPU; ``Platform.free_memory``)."""
    ctx = current()
    return ctx.platform.free_memory(ctx.local_world_size)


@dataclass
class PreparedCase:
    """A case built and warmed up on the ranks, timed window by window by a harness that times rounds itself.

    A rank error in any of its calls rebuilds the world (:meth:`CaseRunner.recover`), which drops every prepared
    case on the ranks: this one is then *stale* (``generation`` behind the runner's), its further calls refused
    with one clear error, its ``close`` a no-op; the next case is prepared afresh on the new world."""

    runner: CaseRunner
    rc: ResolvedCase
    key: str
    describe: dict
    windows: list = field(default_factory=list)  # per window: every rank's answer
    generation: int = 0  # the runner's world (CaseRunner.generation) it was prepared on

    @property
    def stale(self) -> bool:
        return self.generation != self.runner.generation

    def _run(self, fn: Callable, kwargs: dict, steps: int) -> Any:
        if self.stale:
            raise StaleCase(f"{self.key}: its world was rebuilt after a rank error (its engine went with it); "
                            f"prepare the case again")
        try:
            return self.runner.launcher.run(fn, kwargs, timeout=self.runner.call_timeout(self.rc.case.model, steps))
        except Exception as exc:
            self.runner.recover(exc)
            raise

    def window(self, steps: int | None = None, warmup: int = 0) -> list:
        """One window of ``steps`` steps (default: the options') on every rank, after ``warmup`` steps not recorded
        (what a pytest-benchmark round, an asv sample or an `ab` trial times)."""
        steps = self.runner.opts.steps if steps is None else steps
        answers = self._run(run_window, dict(key=self.key, steps=steps, warmup=warmup), warmup + steps)
        self.windows.append(answers)
        return answers

    def metrics(self) -> Timed:
        """The summary of every window run so far, as ``fleetbench run`` would record it (no baseline)."""
        answers = self._run(prepared_result, dict(key=self.key), 0)
        wl = self.runner.workload_spec(self.rc.case)
        batch = self.runner.per_rank_batch(self.rc.case)
        timed = summarize(answers, [self.key], batch * self.runner.world, self.runner.opts.steps, self.runner.world,
                          baseline=None)[self.key]
        return dataclasses.replace(timed, metrics=dataclasses.replace(timed.metrics, workload=wl.describe()))

    def close(self) -> None:
        """The case dropped on the ranks (nothing to do for a stale one: its world dropped it)."""
        if not self.stale:
            self._run(drop_case, dict(key=self.key), 0)


class StaleCase(RuntimeError):
    """A prepared case whose world was rebuilt after a rank error: it must be prepared again."""


def check_numbers(res: CheckSummary) -> str:
    """Which check ran and its numbers, in words (a strategy declares its check: suite/strategies/user.py)."""
    if res.kind == "bounded error":
        return (f"bounded error: averaged gradients within {res.param_error:.2g} of their exact average, declared "
                f"<= {res.param_tol:g}; ranks identical: {res.ranks_identical}")
    if res.kind == "convergence":
        return (f"convergence over {res.steps} steps: loss within {res.loss_error:.2g} of the exact reference's, "
                f"declared <= {res.loss_tol:g}; parameters {res.param_error:.2g} apart")
    return f"param err {res.param_error:.2g}, loss err {res.loss_error:.2g}"


class CaseRunner:
    def __init__(self, launcher: Any, world: int, opts: RunOptions, run_id: str | None = None,
                 metadata: dict | None = None, say: Callable[[str], None] | None = None,
                 reporter: bool = True, on_progress: Callable[[Progress], None] | None = None,
                 spec: RunSpec | None = None, facts: RunFacts | None = None):
        self.launcher = launcher
        self.facts = facts if facts is not None else RunFacts()  # what the command resolved: size, platform ...
        self.spec = spec  # the run's specification as it runs, kept in every record (schema 4; `run --resume`)
        self.on_progress = on_progress
        self._checks = [0, 0]  # cases checked, cases to check (set by run())
        self.world = world
        self.opts = opts
        self.run_id = run_id or new_run_id()
        self.reporter = reporter
        self._say = say
        if metadata is None:
            metadata = collect(world_size=world, backend=self.facts.backend or None)
        self.metadata = metadata
        self._batches: dict[str, int] = {}
        self._unused_said = False  # the unused-parameter message is said once per run, then named
        self._mismatch_said: set[str] = set()  # each structure-mismatch message likewise
        # (model, tolerance key) -> its "cannot judge" answer, said once, then reused for the cases checked alike
        self._unjudged: dict[tuple[str, str], CheckSummary] = {}
        self._allowance: dict[str, float] = {}
        # a harness that reports each rank's windows (pytest-benchmark's extra_info) sees every interleaved timing's
        # answers: called with the variants timed together and every rank's RankTiming
        self.on_answers: Callable[[list[str], list], None] | None = None
        self.generation = 0  # worlds rebuilt (or pools restarted) after rank errors: see recover()

    def brief(self, exc: BaseException) -> str:
        """:func:`short_error`; the unused-parameter and the structure-mismatch messages, said in full once per run,
        are named after that."""
        msg = unused_parameters(exc)
        if msg is not None:
            if not self._unused_said:
                self._unused_said = True
                self.say(msg)
            return "parameters without a gradient: find_unused_parameters (see above)"
        msg = structure_mismatch(exc)
        if msg is not None:
            if msg not in self._mismatch_said:
                self._mismatch_said.add(msg)
                self.say(msg)
            return f"{MISMATCH} (see above)"
        return short_error(exc)

    def _not_timed(self, check: Checked) -> bool:
        """A check that stopped where timing would stop too: a kernel missing, parameters without a gradient, ranks
        that built different models."""
        return isinstance(check, Exception) and bool(
            backend_lacks(check, self.facts.device or "cpu") or unused_parameters(check) or structure_mismatch(check))

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
            self._batches[case.model] = model_info(case.model, self.facts.size).per_rank_batch
        return self._batches[case.model]

    def workload_spec(self, case: Case) -> WorkloadSpec:
        return WorkloadSpec(case.model, self.facts.size, self.per_rank_batch(case))

    def call_timeout(self, model: str, steps: int, variants: int = 1) -> float:
        """The bound on one multi-rank call: ``--timeout`` when given, else 600 s plus ``steps`` x ``variants``
        x the model's step allowance (:func:`step_allowance_s`), so GPT-2 ``full`` with every variant fits."""
        if self.opts.timeout is not None:
            return self.opts.timeout
        if model not in self._allowance:
            self._allowance[model] = step_allowance_s(model, self.facts.size, self.facts.device)
        return BASE_TIMEOUT_S + steps * variants * self._allowance[model]

    @property
    def baseline(self) -> str:
        """The variant every timing group carries, the speedups' reference: the options' (figures: "ddp"), else the
        model's baseline case (``suite.cases.BASELINE``)."""
        return self.opts.baseline or BASELINE

    def baseline_config(self, model: str | None = None) -> StrategyConfig:
        """The baseline's config when no case of it was selected: the defaults, what ``model``'s factory declares
        (``find_unused_parameters``, as its cases get it), then what the baseline takes of the selection's
        ``--config`` and ``--set`` (``suite.config.baseline_sets``: its workload knobs, as a selected baseline)."""
        declared = model is not None and model_info(model, self.facts.size).find_unused_parameters
        base = StrategyConfig(find_unused_parameters=True) if declared else StrategyConfig()
        return base.with_overrides(list(self.facts.baseline_overrides))

    def recover(self, exc: BaseException) -> None:
        """After a rank error, under NCCL and gloo alike: a peer of the failing rank may hold a collective it
        launched (an overlapped bucket's allreduce, NCCL's queued kernel) that the next case's first collective
        would pair with: wrong numbers when the shapes match, else a wait until the process-group timeout, and
        under gloo a world broken for every later call (``tests/test_recover.py``).  So every rank drops its
        prepared cases and joins a new world before the next call (``rebuild_on_rank``; the torchrun launcher
        rebuilds by itself); if that fails, the pool is closed and its next call starts fresh ranks.  A pool
        torn down (``RankFailure``) starts fresh ranks by itself.  Either way ``generation`` moves on, so a
        :class:`PreparedCase` of the old world is known stale."""
        if isinstance(exc, RankFailure):
            self.generation += 1
            return
        if not isinstance(exc, RankError):
            return
        self.generation += 1
        if hasattr(self.launcher, "rebuild"):
            return
        try:
            self.launcher.run(rebuild_on_rank, dict(tag=uuid.uuid4().hex), timeout=BASE_TIMEOUT_S)
        except Exception as again:  # noqa: BLE001 - fresh ranks instead
            self.say(f"      rebuilding the process group after a rank error failed ({short_error(again)}); "
                     f"restarting the ranks")
            self.launcher.close()

    # ---- check ----------------------------------------------------------------------------
    def _check_timeout(self, rc: ResolvedCase) -> float:
        """The bound on a case's check: its ranks' steps, then the reference's (every rank's shard in one process)."""
        return self.call_timeout(rc.case.model, self.opts.check_steps, variants=self.world + 1)

    @staticmethod
    def _unjudged_key(rc: ResolvedCase) -> tuple[str, str]:
        """A model found unjudgeable is so for the cases checked in its precision and tolerance (an AMP case's
        noise says nothing of an fp32 case's)."""
        return rc.case.model, tolerance_key(rc.config)

    def _check_waits(self, rc: ResolvedCase) -> dict:
        """What a case's check waits on, and its bound (:class:`Progress`'s ``waits`` and ``bound_s``)."""
        if not self.opts.check:
            return dict(waits="nothing (--no-check)")
        if self._unjudged_key(rc) in self._unjudged and rc.config.data_parallel != "none":
            return dict(waits="nothing (the model's check cannot judge it, said above)")
        return dict(waits=f"{self.world} rank(s): {self.opts.check_steps} step(s) each, then the single-process "
                          f"reference's {self.opts.check_steps} step(s) over every rank's shard",
                    bound_s=self._check_timeout(rc))

    def check(self, rc: ResolvedCase) -> Checked:
        """The case's CheckSummary, the exception that stopped it, or None (no check asked)."""
        if not self.opts.check:
            return None
        unjudged = self._unjudged.get(self._unjudged_key(rc)) if rc.config.data_parallel != "none" else None
        if unjudged is not None:
            return unjudged  # two identical runs of this model differ, checked alike: said already

        try:
            # every rank's steps, then the reference's (every rank's shard in one process)
            timeout = self._check_timeout(rc)
            # what the engine built and did in the check's steps is compared with the case's plan there, so the
            # check never passes a case that its own steps show does not do what its name says
            res = run_check(self.launcher, self.workload_spec(rc.case), rc.config, steps=self.opts.check_steps,
                            timeout=timeout, observe=lambda describe: rc.case.observed_unmet(rc.plan, describe))
        except Exception as exc:  # noqa: BLE001 - a failed case is reported, the run goes on
            self.recover(exc)
            return exc
        if res is not None and res.verdict == "n/a" and res.message.startswith(CANNOT_JUDGE):
            self._unjudged[self._unjudged_key(rc)] = res
            self.say(f"      {rc.case.model}: {res.message}")
        return res

    # ---- timing -----------------------------------------------------------------------------
    def groups(self, rcs: list[ResolvedCase]) -> list[list[str]]:
        """Variants timed together (each group with the baseline, and with the compute-only variant when it is
        among the cases: exposed communication needs it in every group), bounded by the ranks' memory.

        Decided once and the same on every rank: the budget is the least any rank may fill (every rank
        probed, on every host: GPU memory on CUDA, host RAM shared by the local ranks on CPU), and under
        torchrun rank 0's plan is sent to every rank (``TorchrunLauncher.share``), so ranks on hosts with
        different free memory still build the same engines and issue collectives in the same order."""
        head = [self.baseline] + [COMPUTE_ONLY for rc in rcs if rc.case.variant == COMPUTE_ONLY][:1]
        names = [rc.case.variant for rc in rcs if rc.case.variant not in head]
        if self.opts.memory_budget:
            budget = self.opts.memory_budget // self.world
        else:
            free = self.launcher.run(free_memory_on_rank, timeout=self.call_timeout(rcs[0].case.model, 0))
            budget = int(0.6 * min(free)) if free else 0  # None: a torchrun rank other than 0 (gets rank 0's plan)
        fit = max(2, budget // max(_engine_bytes(rcs[0].case.model, self.facts.size), 1))  # baseline included
        size = max(1, int(fit) - len(head))
        plan = [head + names[i:i + size] for i in range(0, len(names), size)] or [head]
        share = getattr(self.launcher, "share", None)
        return share(plan) if share is not None else plan

    def _time(self, model_rcs: list[ResolvedCase], names: list[str]) -> dict[str, Timed]:
        configs = {rc.case.variant: rc.config for rc in model_rcs}
        configs.setdefault(BASELINE, self.baseline_config(model_rcs[0].case.model))
        case = model_rcs[0].case
        device = self.facts.device or "cpu"
        # every node's local rank 0 samples (UtilizationSampler.active); under torchrun that is not only rank 0
        sampler = UtilizationSampler(device=device).start() if self.opts.utilization else None
        load_start = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
        try:
            answers = self.launcher.run(
                time_on_rank,
                dict(workload_spec=self.workload_spec(case), warmup=self.opts.warmup, steps=self.opts.steps,
                     rounds=self.opts.rounds,
                     variants=[{"name": n, "config": configs[n].to_dict()} for n in names]),
                timeout=self._timing_timeout(case.model, len(names)))
        finally:
            if sampler is not None:
                sampler.stop()
        load_end = os.getloadavg()[0] if load_start is not None else None
        util = sampler.summary() if sampler is not None else None
        gather = getattr(self.launcher, "gather", None)  # torchrun: every node's sampler, to rank 0
        nodes = gather(util if sampler is not None and sampler.active else None) if gather and util else None
        if answers is None:  # a non-reporting torchrun rank
            return {}
        if self.on_answers is not None:
            self.on_answers(list(names), answers)
        out = summarize(answers, names, self.per_rank_batch(case) * self.world, self.opts.steps, self.world,
                        baseline=self.baseline)
        # the machine's state beside the timing (busy_reason), and the utilization the variants shared
        extra: dict[str, Any] = dict(load_avg_start=load_start, load_avg_end=load_end, cpu_cores=os.cpu_count())
        if util is not None and self.reporter:
            if nodes is not None:
                util["nodes"] = [{k: v for k, v in u.items() if k != "samples"} for u in nodes if u is not None]
            util["shared_by"] = names  # the variants ran interleaved: one sampling covers them all
            extra["utilization"] = util
        return {n: dataclasses.replace(t, metrics=dataclasses.replace(t.metrics, **extra)) for n, t in out.items()}

    def _timing_timeout(self, model: str, variants: int) -> float:
        """The bound on one interleaved timing call: every variant's warm-up and rounds of steps."""
        return self.call_timeout(model, self.opts.warmup + self.opts.rounds * self.opts.steps, variants)

    def _timed(self, model_rcs: list[ResolvedCase], names: list[str], group: int, groups: int) -> dict[str, Timed]:
        """:meth:`_time`, with progress before and after."""
        kw = dict(done=group, total=groups, variants=tuple(names), rounds=self.opts.rounds, steps=self.opts.steps)
        model = model_rcs[0].case.model
        o = self.opts
        self._progress("timing", model, bound_s=self._timing_timeout(model, len(names)),
                       waits=f"{self.world} rank(s): {o.warmup} warm-up step(s) per variant, then {o.rounds} round(s) "
                             f"x {len(names)} variant(s) x {o.steps} step(s)", **kw)
        t0 = time.perf_counter()
        try:
            out = self._time(model_rcs, names)
        except Exception as exc:
            self._progress("timed", model, detail=self.brief(exc), seconds=time.perf_counter() - t0, **kw)
            raise
        self._progress("timed", model, seconds=time.perf_counter() - t0, **kw)
        return out

    def measure(self, model_rcs: list[ResolvedCase], drop: frozenset = frozenset()
                ) -> tuple[dict[str, Outcome], dict[str, str]]:
        """Metrics per variant (or the exception that stopped it), and per variant why it was timed alone.

        Variants in ``drop`` are not timed; without the baseline (dropped, or failing alone) the others
        are timed without it (no speedup)."""
        out: dict[str, Outcome] = {}
        fallback: dict[str, str] = {}
        model_rcs = [rc for rc in model_rcs if rc.case.variant not in drop]
        if not model_rcs:
            return out, fallback
        compute_group = [COMPUTE_ONLY] if any(rc.case.variant == COMPUTE_ONLY for rc in model_rcs) else []
        groups = [g for g in ([n for n in g if n not in drop] for g in self.groups(model_rcs)) if g]
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
                self.recover(exc)
                if structure_mismatch(exc):  # the model, not a variant: every case of it stops alike
                    for n in names:
                        out.setdefault(n, exc)
                    self.brief(exc)
                    continue
                why = f"interleaved timing of {len(names)} variants failed ({self.brief(exc)})"
                self.say(f"      {why}; timing each case alone with the baseline")
            baseline = self.baseline
            for n in names:
                if n == baseline and baseline in out:
                    continue
                base = [] if baseline in drop or isinstance(out.get(baseline), Exception) else [baseline]
                try:
                    pair = self._timed(model_rcs, list(dict.fromkeys(base + [n])), gi, len(groups))
                    out[n] = pair.get(n)
                    out.setdefault(baseline, pair.get(baseline))
                    fallback[n] = f"{why}; timed alone " + ("with the baseline" if base else "(no baseline: it failed)")
                except Exception as exc:  # noqa: BLE001
                    self.recover(exc)
                    out[n] = exc
                    fallback[n] = why
        return out, fallback

    def _check_line(self, res: Checked) -> str:
        if res is None:
            return "skipped (--no-check)"
        if isinstance(res, Exception):
            lacks = backend_lacks(res, self.facts.device or "cpu")
            return f"skipped: {lacks}" if lacks else f"error: {self.brief(res)}"
        if res.message.startswith(CANNOT_JUDGE):
            return f"n/a: {CANNOT_JUDGE} (why: above)"
        detail = ""
        if res.verdict in ("pass", "fail"):
            detail = f" ({check_numbers(res)})"
        if res.verdict == "fail":
            detail += f": {res.message}"
        return f"{res.verdict}{detail}"

    # ---- records ------------------------------------------------------------------------------
    def _base_record(self, rc: ResolvedCase) -> CaseRecord:
        return CaseRecord(rc.case.name, rc.case.model, self.world, rc.config.to_dict(), self.run_id,
                          tags=list(rc.case.tags), timestamp=_now(), size=self.facts.size,
                          backend=self.facts.backend, device=_device_label(self.metadata, self.facts.device),
                          metadata=self.metadata, spec=self.spec)

    def skipped(self, rc: ResolvedCase) -> CaseRecord:
        rec = self._base_record(rc)
        rec.status, rec.verdict, rec.error = "skipped", "skipped", rc.skip
        return rec

    def record(self, rc: ResolvedCase, check: Checked, measured: Outcome, fallback: str | None = None) -> CaseRecord:
        """One case's record from its check and its timing (either may be an exception)."""
        rec = self._base_record(rc)
        rec.fallback = fallback
        device = self.facts.device or "cpu"
        if isinstance(check, Exception):
            lacks = backend_lacks(check, device)
            rec.status = rec.verdict = "skipped" if lacks else "error"
            rec.error = lacks or unused_parameters(check) or structure_mismatch(check) or short_error(check, 2000)
        elif check is not None:
            rec.check = check
            rec.verdict = check.verdict
        if isinstance(measured, Exception) and rec.verdict not in ("error", "fail") and backend_lacks(measured, device):
            rec.status = rec.verdict = "skipped"  # the check passed or did not run; the timing met the gap
            rec.error = backend_lacks(measured, device)
        elif isinstance(measured, Exception):
            rec.status, rec.verdict = "error", "error"
            said = unused_parameters(measured) or structure_mismatch(measured) or short_error(measured, 2000)
            rec.error = rec.error if rec.error == said else (rec.error + "\n" if rec.error else "") + said
        elif isinstance(measured, Timed):
            rec.metrics, rec.describe = measured.metrics, measured.describe
            bad = rec.metrics.nonfinite_loss
            if bad is not None and rec.verdict != "error":
                rec.verdict = "fail"
                rec.error = (f"non-finite loss at step {bad.step} of the timed windows on rank {bad.rank}")
            differs = rc.case.observed_unmet(rc.plan, rec.describe.engine)  # the case did what its name says?
            if differs and rec.verdict != "error":
                rec.verdict = "fail"
                rec.error = (rec.error + "\n" if rec.error else "") + differs
        deterministic = (self.facts.backend in ("", "gloo") and not rc.config.straggler_ms
                         and rc.config.fusion_backend != "compile")
        if rec.status == "ok":
            rec.structure = rec.derived_structure(deterministic=deterministic)
        return rec

    # ---- one model, then the whole selection ------------------------------------------------------
    def run_model(self, model_rcs: list[ResolvedCase], progress: Callable[[ResolvedCase, str, float], None]
                  ) -> list[CaseRecord]:
        """The model group's records: each case checked, then all timed interleaved, then traced.  Ctrl-C (or
        SIGTERM turned into it) raises :class:`Interrupted` holding what finished: a timed case's record, and for
        a case checked but not yet timed a ``not_run`` record keeping its check (``--resume`` times it)."""
        checks: dict[str, Checked] = {}
        try:
            for rc in model_rcs:
                t0 = time.perf_counter()
                self._progress("check", rc.case.model, case=rc.case.name, done=self._checks[0],
                               total=self._checks[1], **self._check_waits(rc))
                checks[rc.case.name] = res = self.check(rc)
                self._checks[0] += 1
                line = self._check_line(res)
                self._progress("checked", rc.case.model, case=rc.case.name, done=self._checks[0],
                               total=self._checks[1], detail=line, seconds=time.perf_counter() - t0)
                progress(rc, line, time.perf_counter() - t0)
            drop = frozenset(rc.case.variant for rc in model_rcs if self._not_timed(checks.get(rc.case.name)))
            measured, fallback = self.measure(model_rcs, drop)
        except KeyboardInterrupt:
            raise Interrupted([self.not_timed(rc, c) for rc in model_rcs
                               if isinstance(c := checks.get(rc.case.name), CheckSummary)]) from None
        records: list[CaseRecord] = []
        for rc in model_rcs:
            check = checks.get(rc.case.name)
            rec = self.record(rc, check, measured.get(rc.case.variant), fallback.get(rc.case.variant))
            records.append(rec)
            if isinstance(check, CheckSummary) and check.verdict == "pass" and rec.verdict in ("fail", "error"):
                # its check line said pass: the case's outcome is said too, never left to the table alone
                self.say(f"      {rc.case.name}: {rec.verdict} after its check passed: "
                         f"{(rec.error or '').splitlines()[0] if rec.error else 'see its record'}")
            if self.opts.trace_steps and rec.status == "ok":
                try:
                    self._progress("trace", rc.case.model, case=rc.case.name, steps=self.opts.trace_steps,
                                   waits=f"{self.world} rank(s): {self.opts.trace_steps} traced step(s) each under "
                                         f"torch.profiler, then their traces", bound_s=self._trace_timeout(rc))
                    self.trace(rc, rec)
                except KeyboardInterrupt:  # the timings stand: every record of the group, without further traces
                    rec.metrics = dataclasses.replace(rec.metrics, trace_error="interrupted while tracing")
                    raise Interrupted(records + [
                        self.record(o, checks.get(o.case.name), measured.get(o.case.variant),
                                    fallback.get(o.case.variant)) for o in model_rcs[len(records):]]) from None
        return records

    def not_timed(self, rc: ResolvedCase, check: CheckSummary) -> CaseRecord:
        """The record of a case whose check finished and whose timing was interrupted: status ``not_run``, the
        check's verdict and summary kept."""
        rec = self._base_record(rc)
        rec.check = check
        rec.status, rec.verdict = "not_run", check.verdict
        rec.error = "interrupted before its timing; its check is kept (--resume times it)"
        return rec

    def run(self, selected: list[ResolvedCase],
            progress: Callable[[ResolvedCase, str, float], None] | None = None) -> Iterator[list[CaseRecord]]:
        """Skipped cases first, then each model's records as soon as its interleaved timing is done."""
        skipped = [rc for rc in selected if rc.skip is not None]
        if skipped:
            yield [self.skipped(rc) for rc in skipped]
        runnable = [rc for rc in selected if rc.skip is None]
        done = [0]
        self._checks = [0, len(runnable)]
        # columns as wide as their widest entry: the counter padded to the total's digits, the longest name
        digits, width = len(str(len(runnable))), max((len(rc.case.name) for rc in runnable), default=0)

        def _progress(rc: ResolvedCase, line: str, seconds: float) -> None:
            done[0] += 1
            text = f"[{done[0]:>{digits}}/{len(runnable)}] {rc.case.name:{width}s} check {line} ({seconds:.1f}s)"
            if progress is not None:
                progress(rc, text, seconds)
            else:
                self.say(text)

        for model in dict.fromkeys(rc.case.model for rc in runnable):
            yield self.run_model([rc for rc in runnable if rc.case.model == model], _progress)

    # ---- traces and prepared cases ---------------------------------------------------------------
    def _trace_timeout(self, rc: ResolvedCase) -> float:
        return self.call_timeout(rc.case.model, self.opts.trace_steps + 1)

    def trace(self, rc: ResolvedCase, rec: CaseRecord) -> None:
        """A few traced steps of the case on every rank, written into ``traces/RUN_ID/CASE@WORLD/`` (the record's
        ``trace_file``): each rank's torch.profiler trace (``rank<R>.pt.trace.json``, gzipped over
        :data:`GZIP_TRACE_OVER` bytes) and ``timeline.json``, every rank on one clock (``suite.measure.timeline``)."""
        t0 = time.perf_counter()
        try:
            answers = self.launcher.run(trace_on_rank, dict(workload_spec=self.workload_spec(rc.case),
                                                            config=rc.config.to_dict(), steps=self.opts.trace_steps),
                                        timeout=self._trace_timeout(rc))
        except Exception as exc:  # noqa: BLE001 - the timing stands; the trace is reported missing
            self.recover(exc)
            rec.metrics = dataclasses.replace(rec.metrics, trace_error=short_error(exc))
            return
        finally:
            self._progress("traced", rc.case.model, case=rc.case.name, seconds=time.perf_counter() - t0)
        if answers is None or not self.reporter:
            return
        rel = "/".join(("traces", self.run_id, f"{rc.case.name.replace('/', '_')}@{self.world}"))
        try:  # the record stands whatever happens to its trace; nothing is written outside traces/
            safe_name(self.run_id, "run id")
            safe_name(rel.rsplit("/", 1)[1], "trace directory name")
            _write_traces(self.facts.results_dir, rel, answers,
                          f"{rc.case.name} at world size {self.world}, run {self.run_id}")
        except (OSError, ValueError) as exc:
            rec.metrics = dataclasses.replace(rec.metrics, trace_error=f"trace not written: {exc}")
            return
        rec.metrics = dataclasses.replace(rec.metrics, trace_file=rel)

    def prepare(self, rc: ResolvedCase) -> PreparedCase:
        """Build and warm up the case's engine on every rank, for a harness that times windows itself.  A rank
        error rebuilds the world (:meth:`recover`) before it is raised."""
        key = f"{rc.case.name}@{self.world}"
        try:
            answers = self.launcher.run(
                prepare_case, dict(key=key, workload_spec=self.workload_spec(rc.case), config=rc.config.to_dict(),
                                   warmup=self.opts.warmup),
                timeout=self.call_timeout(rc.case.model, self.opts.warmup))
        except Exception as exc:
            self.recover(exc)
            raise
        return PreparedCase(self, rc, key, answers[0].describe if answers else {}, generation=self.generation)


GZIP_TRACE_OVER = 4 * 2**20  # a rank's torch.profiler trace larger than this (unzipped) is written gzipped
TRACE_MODE = 0o644  # traces are data: readable, never executable


def _write_traces(results_dir: str, rel: str, answers: list[dict], title: str) -> None:
    """The traced steps' files into ``results_dir/rel`` (see :meth:`CaseRunner.trace`), each whole or not at all,
    mode 0644, through :class:`~suite.outputs.OutputDir`: no component under the results directory is a link."""
    import gzip
    import json

    with OutputDir(results_dir) as results, results.dir(rel) as where:
        for a in answers:
            packed = a.pop("kineto", None)
            if packed is None:
                continue
            big = a.pop("kineto_bytes", 0) > GZIP_TRACE_OVER
            name = f"rank{int(a['rank'])}.pt.trace.json" + (".gz" if big else "")
            where.write(name, packed if big else gzip.decompress(packed), mode=TRACE_MODE)
        where.write("timeline.json", json.dumps(chrome_trace(answers, title=title)), mode=TRACE_MODE)


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during a model group: ``records`` holds what the group finished (see :meth:`CaseRunner.run_model`)."""

    def __init__(self, records: list[CaseRecord]):
        super().__init__()
        self.records = records


def _device_label(metadata: dict, device: str | None) -> str:
    """"cpu", or "cuda: <GPU names>" (what a record says it ran on)."""
    if device == "cuda":
        gpu = metadata.get("gpu") or {}
        return "cuda: " + ", ".join(dict.fromkeys(gpu.get("names") or ["unknown GPU"]))
    return "cpu"
