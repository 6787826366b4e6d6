"""One A/B comparison: two revisions' trial servers, case by case, trials in randomised ABBA blocks.

:func:`run_ab` is `fleetbench ab`: both revisions as worktrees, one trial server each, the
cases both revisions have, and per case (:func:`compare_case`):

1. the case prepared on both servers (engine built and warmed up on each revision's ranks);
2. the **structural gate**: one window on each side, then each revision's correctness check
   and record; the records' structures (``suite.results.structure``) must be identical, any
   difference is "structure changed" (exit 1) whatever the timings say, and a check verdict
   that went pass -> fail fails too;
3. the **timing**: blocks of four trials (``ABBA`` or ``BAAB``, at random: :mod:`suite.ab.blocks`), each trial a
   discarded warm-up step then one timed window of ``steps`` steps; the case is prepared afresh on
   both servers every ``SeqOptions.rotate`` = N blocks (:func:`fresh_preparations`), every
   ``restart``-th time on fresh servers (:func:`fresh_servers`);
   the sequential statistics of :mod:`suite.ab.stats` decide slower / not slower (by the threshold) /
   faster / same, or inconclusive when the budget is spent.

Exit status (as `fleetbench compare`): 0 nothing worse; 1 a case slower, a structure changed,
a check verdict pass -> fail, or a case that runs on BASE and errors on HEAD; 2 input that
cannot be used (a revision unknown or older than the trial protocol, a selection that matches
nothing).
"""
from __future__ import annotations

import math
import os
import random
import re
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import TypeVar

from ..measure.utilization import busy_reason
from ..results.records import CaseRecord, Metrics, ResultsFileError
from ..results.structure import ACK_FILE, acknowledged, read_acks, structure_diff, structure_new
from ..run_spec import RunSpec, SeqOptions
from ..runtime.pool import remove_stale
from . import blocks
from .client import ProtocolMismatch, TrialError, TrialServer
from .protocol import (
    PROTOCOL,
    VERSION,
    Prepared,
    ProtocolError,
    RankOrigin,
    RecordAnswer,
    SelectedCase,
    TrialAnswer,
    _Answer,
)
from .stats import Sequential, block_log_ratio, describe_verdict, fmt_span, lag1, power_sentence
from .worktrees import Worktrees

__all__ = ["CaseOutcome", "AbReport", "NotCompared", "Side", "compare_case", "run_ab", "start_side", "AbInputError",
           "fresh_preparations", "fresh_servers", "rotate"]

GOOD = ("pass", "n/a")


class AbInputError(ValueError):
    """Input `ab` cannot use (exit status 2)."""


@dataclass
class Side:
    """One revision: its label, commit, worktree and trial server."""

    label: str  # BASE | HEAD | a commit label in bisection
    rev: str
    commit: str
    subject: str
    root: str
    server: TrialServer
    prepared: dict = field(default_factory=dict)  # case -> key
    records: dict[str, CaseRecord] = field(default_factory=dict)  # case -> its record (structure, verdict)

    origins: list = field(default_factory=list)  # where the server and each rank imported suite from
    others_cpu: list = field(default_factory=lambda: [0.0, 0.0])  # others' CPU s, the machine's CPU s: its trials

    def describe(self) -> dict:
        return {"rev": self.rev, "commit": self.commit, "subject": self.subject,
                "worktree": self.root, "imported_from": self.origins}


@dataclass
class CaseOutcome:
    case: str
    world: int
    verdict: str = "inconclusive"  # timing: slower | not slower | faster | same | inconclusive | error | identical
    status: str = "ok"  # ok | structure changed | check worse | error
    ratio: float = math.nan  # HEAD / BASE step time (> 1: HEAD slower)
    ci: tuple = (math.nan, math.nan)
    base_ms: float = math.nan  # median trial step time
    head_ms: float = math.nan
    blocks: int = 0
    pairs: int = 1  # pairs of preparations the blocks came from (fresh ones every --rotate blocks)
    servers: int = 1  # pairs of trial servers they ran on (fresh ones every --restart-th time)
    seconds: float = 0.0  # timed blocks, and the fresh preparations
    lag1: float = math.nan
    estimate: float = math.nan  # mean of the pairs' trimmed means of the block log ratios
    # the smallest slowdown (a fraction) this comparison would have called "slower" at 95% (None: none below 100%)
    detectable_slowdown: float | None = None
    power: str = ""  # the sentence beside the verdict (stats.power_sentence: what it caught, rules out or could catch)
    machine: dict = field(default_factory=dict)  # load_avg_start/end, cpu_cores, others_cpu_s/share (busy_reason)
    busy: str | None = None  # "machine busy: timings unreliable (...)", or None
    log_ratios: list = field(default_factory=list)
    structure_diff: list = field(default_factory=list)
    structure_new: list = field(default_factory=list)  # facts one side does not record: new, not changed
    check: str = ""
    error: str | None = None
    failures: list = field(default_factory=list)
    summary: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class NotCompared:
    """A case of the selection not compared: on one side only, or skipped on a side (``why``)."""

    case: str
    why: str


@dataclass
class AbReport:
    base: dict
    head: dict
    options: dict
    cases: list[CaseOutcome] = field(default_factory=list)
    only: list[NotCompared] = field(default_factory=list)  # cases on one side only, or skipped
    warnings: list = field(default_factory=list)
    errors: list = field(default_factory=list)  # failures not tied to one case (HEAD's server would not start)

    @property
    def failures(self) -> list:
        return list(self.errors) + [f for c in self.cases for f in c.failures]

    @property
    def inconclusive(self) -> list:
        return [c for c in self.cases if c.verdict == "inconclusive"]

    @property
    def exit_code(self) -> int:
        """0 ok (not slower, same or faster), 1 regression (slower, a check that got worse, structure changed, HEAD
        errors),
        3 undecided (a case inconclusive when its budget was spent); 2 (unusable input) is raised earlier."""
        return 1 if self.failures else 3 if self.inconclusive else 0

    def to_dict(self) -> dict:
        return {"kind": "fleetbench.ab", "protocol": f"{PROTOCOL}/{VERSION}", "base": self.base, "head": self.head,
                "options": self.options, "cases": [c.to_dict() for c in self.cases],
                "only": [asdict(o) for o in self.only],
                "warnings": self.warnings, "failures": self.failures, "exit_code": self.exit_code}


# ---- one case ---------------------------------------------------------------------------------------
A = TypeVar("A", bound=_Answer)


def _answer(kind: type[A], data: dict, side: Side, what: str) -> A:
    """A server's answer read once into its type (``suite.ab.protocol``); one that does not hold it is a failed
    request of that side."""
    try:
        return kind.from_dict(data, f"the {what} answer")
    except ProtocolError as exc:
        raise TrialError(f"{side.label}: {exc}", kind="ProtocolError") from None


def _prepare(side: Side, case: str, opts: RunSpec, check: bool | None = None) -> str:
    if case not in side.prepared:
        spec = opts.replace(run={"check": opts.run.check if check is None else check})
        ans = _answer(Prepared, side.server.request("prepare", case=case, spec=spec.to_dict()), side, f"prepare {case}")
        trial = _answer(TrialAnswer, side.server.request("trial", key=ans.key, steps=opts.run.steps, warmup=0),
                        side, f"trial {case}")  # the structure's window
        _finite_losses(trial, side, case)
        got = _answer(RecordAnswer, side.server.request("structure", key=ans.key), side, f"structure {case}")
        side.records[case] = _record(side, case, got.record)
        side.prepared[case] = ans.key
    return side.prepared[case]


def _record(side: Side, case: str, data: dict) -> CaseRecord:
    """The server's record of the case, read once into the typed record (any schema this fleetbench reads).  The
    ``ab`` part of its run specification is left out: the comparison's options are this process's, and a revision
    of another time spells them otherwise."""
    spec = data.get("spec") if isinstance(data, dict) else None
    if isinstance(spec, dict) and spec.get("ab") is not None:
        data = {**data, "spec": {**spec, "ab": None}}
    try:
        return CaseRecord.from_dict(data, f"{side.label}'s record of {case}")
    except ResultsFileError as exc:
        raise TrialError(f"{side.label}: {case}: the trial server's record cannot be read: {exc}",
                         kind="BadRecord") from None


def _finite_losses(ans: TrialAnswer, side: Side, case: str) -> None:
    for i, v in enumerate(ans.losses, 1):
        if not math.isfinite(v):
            raise TrialError(f"{side.label}: {case}: non-finite loss {v!r} at step {i} of a trial window",
                             kind="NonFiniteLoss")


def close_case(side: Side, case: str) -> None:
    key = side.prepared.pop(case, None)
    side.records.pop(case, None)
    if key is not None and side.server.proc.poll() is None:
        try:
            side.server.request("close", key=key)
        except TrialError:
            pass


def fresh_servers(sides: tuple[Side, ...], case: str, opts: RunSpec, n: int) -> None:
    """Rotation's restart: each side's trial server replaced by a fresh process (new interpreter and rank pool)
    and the case prepared on it without the check; the first preparation's structure records stay the gate's."""
    records = {s.label: s.records.get(case) for s in sides}
    for side in sides:
        close_case(side, case)
        side.server.close()
        log = re.sub(r"(-servers\d+)?\.log$", f"-servers{n}.log", side.server.log_path)
        side.server = _server(side.root, side.label, opts, log, wait=False)
    ready(*sides)
    for side in sides:
        _prepare_again(side, case, opts, records[side.label])


def rotate(sides: tuple[Side, ...], case: str, opts: RunSpec, s: Sequential) -> int:
    """After a pair (group) of preparations: fresh servers when the restart is due, else fresh preparations.
    Returns 1 for a restart, 0 otherwise."""
    if s.restart_due:
        fresh_servers(sides, case, opts, len(s.pairs) // max(1, s.opts.restart) + 1)
        return 1
    fresh_preparations(sides, case, opts)
    return 0


def fresh_preparations(sides: tuple[Side, ...], case: str, opts: RunSpec) -> None:
    """Rotation: the case closed and prepared again on each side's server (a new engine, model, buffers and data
    in the same processes), without a second check: the first preparation's structure records and verdicts stay
    the ones the gate compared."""
    for side in sides:
        record = side.records.get(case)
        close_case(side, case)
        _prepare_again(side, case, opts, record)


def _prepare_again(side: Side, case: str, opts: RunSpec, record: CaseRecord | None) -> None:
    """The case prepared without the check; the structure record the gate compared (``record``) is kept."""
    _prepare(side, case, opts, check=False)
    side.records[case] = record or side.records[case]


def _trial(side: Side, case: str, opts: RunSpec) -> float:
    assert opts.ab is not None
    ans = _answer(TrialAnswer, side.server.request("trial", key=side.prepared[case], steps=opts.run.steps,
                                                   warmup=opts.ab.trial_warmup), side, f"trial {case}")
    _finite_losses(ans, side, case)
    t = ans.step_s
    if not (math.isfinite(t) and t > 0):
        raise TrialError(f"{side.label}: {case}: trial time {t!r} is not a finite positive number", kind="BadTime")
    if ans.machine is not None:  # a trial server older than the machine's state leaves it out
        side.others_cpu[0] += ans.machine.others_cpu_s
        side.others_cpu[1] += ans.machine.host_total_s
    return float(t)


def compare_case(base: Side, head: Side, case: str, world: int, opts: RunSpec,
                 say: Callable[[str], None] = lambda m: None, seq: SeqOptions | None = None) -> CaseOutcome:
    """Structure, check and timing of one case on both sides (see the module docstring)."""
    assert opts.ab is not None
    seq = seq or opts.ab.seq
    out = CaseOutcome(case, world)
    # -- prepare and the structural gate
    errors = {}
    for side in (base, head):
        try:
            _prepare(side, case, opts)
        except TrialError as exc:
            errors[side.label] = exc
    if errors:
        out.verdict, out.status = "error", "error"
        out.error = "; ".join(f"{k}: {str(e).splitlines()[0][:300]}" for k, e in errors.items())
        if head.label in errors and base.label not in errors:
            out.failures.append(f"{case}@{world}: runs on {base.label}, errors on {head.label} ({out.error})")
        out.summary = out.error
        return out
    brec, hrec = base.records[case], head.records[case]
    bfacts, hfacts = brec.structure.to_dict(), hrec.structure.to_dict()
    out.structure_diff = structure_diff(bfacts, hfacts)
    out.structure_new = structure_new(bfacts, hfacts)
    out.check = f"{brec.verdict} -> {hrec.verdict}"
    if out.structure_diff and acknowledged(case, out.structure_diff, read_acks(os.path.join(head.root, ACK_FILE))):
        out.status = "structure changed (acknowledged)"
    elif out.structure_diff:
        out.status = "structure changed"
        out.failures.append(f"{case}@{world}: structure changed ({len(out.structure_diff)} difference(s)): "
                            + "; ".join(out.structure_diff[:6]) + (" …" if len(out.structure_diff) > 6 else ""))
    if brec.verdict in GOOD and hrec.verdict in ("fail", "error"):
        out.status = "check worse" if out.status == "ok" else out.status + ", check worse"
        out.failures.append(f"{case}@{world}: correctness verdict went from {brec.verdict} to {hrec.verdict}")
    say(f"  {case}@{world}: structure {'identical' if not out.structure_diff else 'CHANGED'}, check {out.check}")

    # -- the timing: randomised ABBA blocks until the interval decides or the budget is spent
    rng = random.Random(f"{seq.seed}:{case}:{world}")
    s = Sequential(seq)
    load_start = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    for side in (base, head):
        side.others_cpu = [0.0, 0.0]
    times: dict[str, list[float]] = {base.label: [], head.label: []}
    t0 = time.monotonic()
    last_say = t0

    def after(got: list[list[float]]) -> bool:
        """One block of BASE and HEAD trials: its log ratio to the sequential rule; True to stop."""
        nonlocal last_say
        times[base.label] += got[0]
        times[head.label] += got[1]
        elapsed = time.monotonic() - t0
        verdict = s.add(block_log_ratio(got[0], got[1]), progress=elapsed / seq.budget_s)
        if verdict is not None or elapsed >= seq.budget_s or len(s.d) >= seq.max_blocks:
            return True
        if s.pair_done:
            out.servers += rotate((base, head), case, opts, s)
        if time.monotonic() - last_say > 15:
            last_say = time.monotonic()
            say(f"    {len(s.d)} blocks from {len(s.pairs)} pairs, {elapsed:.0f} s: " + (
                f"HEAD/BASE {fmt_span(s.ratio, s.ratio_ci)}" if math.isfinite(s.estimate)
                else f"no verdict before {seq.min_pairs} pairs"))
        return False

    try:
        blocks.run_blocks((base, head), lambda side: _trial(side, case, opts), rng, after)
    except TrialError as exc:
        out.verdict, out.status = "error", ("error" if out.status == "ok" else out.status + ", error")
        out.error = str(exc).splitlines()[0][:500]
        out.failures.append(f"{case}@{world}: timing failed: {out.error}")
    out.seconds = time.monotonic() - t0
    others, total = (sum(x) for x in zip(base.others_cpu, head.others_cpu))
    machine = Metrics(load_avg_start=load_start, load_avg_end=os.getloadavg()[0] if load_start is not None else None,
                      cpu_cores=os.cpu_count(), others_cpu_s=others if total > 0 else None,
                      others_cpu_share=others / total if total > 0 else None)  # the machine's state, as a record's
    out.machine = machine.to_dict()
    out.busy = busy_reason(machine)
    if out.verdict != "error":
        out.verdict = s.finish()
    out.blocks = len(s.d)
    out.pairs = max(1, len(s.pairs))
    out.log_ratios = list(s.d)
    out.lag1 = lag1(s.d)
    out.ratio, out.ci, out.estimate = s.ratio, s.ratio_ci, s.estimate
    power = s.detectable
    out.detectable_slowdown = power if math.isfinite(power) and power < 1 else None
    out.power = s.power_statement() if out.verdict != "error" else ""  # an error decided nothing
    if times[base.label]:
        out.base_ms = statistics.median(times[base.label]) * 1e3
        out.head_ms = statistics.median(times[head.label]) * 1e3
    if out.verdict == "slower" and seq.split is None:
        out.failures.append(f"{case}@{world}: slower: HEAD/BASE step time {fmt_span(out.ratio, out.ci)} over "
                            f"{out.blocks} blocks (the whole interval above 1; threshold {seq.threshold:.0%})")
    if out.verdict != "error" and seq.split is not None:
        kind = out.verdict if out.verdict == "inconclusive" else ("bad" if out.verdict == "slower" else "good")
        out.summary = (f"{kind}: HEAD/GOOD step time {fmt_span(out.ratio, out.ci)} against the split "
                       f"{math.exp(seq.split):.3f} ({out.blocks} blocks, {out.seconds:.0f} s)")
    elif out.verdict != "error":
        out.summary = describe_verdict(out.verdict, out.ratio, out.ci, seq.delta, threshold=seq.threshold,
                                       power=out.power) + (f" ({out.blocks} blocks from {out.pairs} pairs of "
                                                           f"preparations on {out.servers} pairs of servers, "
                                                           f"{out.seconds:.0f} s)")
    if out.busy and out.summary:
        out.summary += f"; {out.busy}"
    say(f"  {case}@{world}: {out.summary or out.error}")
    return out


# ---- a whole comparison -------------------------------------------------------------------------------
def _server(root: str, label: str, opts: RunSpec, log: str, wait: bool) -> TrialServer:
    assert opts.ab is not None
    return TrialServer(root, label, nproc=opts.world or 1, python=opts.ab.python, timeout=opts.ab.timeout,
                       device=opts.selection.device, log_path=log, wait=wait)


def start_side(wt: Worktrees, label: str, rev: str, opts: RunSpec, wait: bool = True,
               commit: str | None = None) -> Side:
    commit = commit or wt.resolve(rev)
    wt.check_protocol(commit, label)
    root = wt.add(commit, label.lower())
    assert wt.dir is not None  # made by add()
    log = os.path.join(wt.dir, f"{label.lower()}-{commit[:10]}-{len(wt.paths)}.log")
    server = _server(root, label, opts, log, wait)
    return Side(label, rev, commit, wt.subject(commit), root, server)


def ready(*sides: Side) -> None:
    """Hellos, then the rank pools started at once, then where every rank imported suite from."""
    errors = start_all(*sides)
    if errors:
        raise next(iter(errors.values()))


def start_all(*sides: Side) -> dict:
    """Like :func:`ready`, but each side's failure is returned ({label: TrialError}), not raised."""
    errors: dict = {}
    for s in sides:
        try:
            s.server.ready()
        except TrialError as exc:
            errors[s.label] = exc
    sent = []
    for s in sides:
        if s.label not in errors:
            try:
                sent.append((s, s.server.send("start")))
            except TrialError as exc:
                errors[s.label] = exc
    for s, rid in sent:
        try:
            s.server.receive(rid, "starting the rank pool")
            s.origins = [{"process": "server", "suite": s.server.hello.suite if s.server.hello is not None else None}]
            ranks = s.server.request("origin").get("ranks")
            if not isinstance(ranks, list):
                raise TrialError(f"{s.label}: the origin answer holds no list of ranks", kind="ProtocolError")
            for r in (_answer(RankOrigin, one, s, "origin") for one in ranks):
                s.origins.append({"process": f"rank {r.rank}", "suite": r.suite})
                if not os.path.realpath(r.suite).startswith(os.path.realpath(s.root) + os.sep):
                    raise TrialError(f"{s.label}: rank {r.rank} imported suite from {r.suite}, not from the "
                                     f"revision's worktree {s.root}", kind="ImportPath")
        except TrialError as exc:
            errors[s.label] = exc
    return errors


def select(side: Side, opts: RunSpec) -> list[SelectedCase]:
    """The revision's own cases for the run specification (its ``select`` answer)."""
    try:
        cases = side.server.request("select", spec=opts.to_dict()).get("cases")
        if not isinstance(cases, list):
            raise TrialError(f"{side.label}: the select answer holds no list of cases", kind="ProtocolError")
        return [_answer(SelectedCase, c, side, "select") for c in cases]
    except TrialError as exc:
        raise AbInputError(f"{side.label} ({side.commit[:10]}): {str(exc).split(': ', 1)[-1]}") from None


def common_cases(base: Side, head: Side, opts: RunSpec, report: AbReport) -> list[str]:
    bsel, hsel = select(base, opts), select(head, opts)
    bnames = {c.case: c for c in bsel}
    hnames = {c.case: c for c in hsel}
    names = []
    for name in dict.fromkeys(list(bnames) + list(hnames)):
        if name not in bnames or name not in hnames:
            report.only.append(NotCompared(name, f"only in {'HEAD' if name not in bnames else 'BASE'}"))
            continue
        b, h = bnames[name], hnames[name]
        if b.skip or h.skip:
            report.only.append(NotCompared(name, f"skipped: {b.skip or h.skip}"))
        else:
            if b.config != h.config:
                diff = sorted(k for k in set(b.config) | set(h.config) if b.config.get(k) != h.config.get(k))
                report.warnings.append(f"{name}: configs differ between the revisions in {', '.join(diff)}")
            names.append(name)
    if not names:
        raise AbInputError("no case of the selection runs on both revisions at world size "
                           f"{opts.world}" + (f" ({'; '.join(o.case + ': ' + o.why for o in report.only)})"
                                              if report.only else ""))
    return names


def run_ab(repo: str, base_rev: str, head_rev: str, opts: RunSpec,
           say: Callable[[str], None] = lambda m: None) -> AbReport:
    """`fleetbench ab BASE HEAD` (see the module docstring); raises AbInputError/RevisionError for exit 2."""
    assert opts.ab is not None and opts.world is not None
    ab, world = opts.ab, opts.world
    with Worktrees(repo) as wt:
        bc, hc = wt.resolve(base_rev), wt.resolve(head_rev)
        wt.check_clean({"BASE": (base_rev, bc), "HEAD": (head_rev, hc)})
        wt.check_protocol(bc, "BASE")
        wt.check_protocol(hc, "HEAD")
        sides: list[Side] = []
        try:
            sides.append(start_side(wt, "BASE", base_rev, opts, wait=False, commit=bc))
            sides.append(start_side(wt, "HEAD", head_rev, opts, wait=False, commit=hc))
            base, head = sides
            say(f"fleetbench ab: BASE {base_rev} ({bc[:10]} {base.subject[:60]})\n"
                f"               HEAD {head_rev} ({hc[:10]} {head.subject[:60]})")
            errors = start_all(base, head)
            for exc in errors.values():
                if isinstance(exc, ProtocolMismatch):
                    raise AbInputError(str(exc))
            if "BASE" in errors:
                raise AbInputError(f"BASE cannot be measured: {errors['BASE']}")
            report = AbReport(base.describe(), head.describe(), _options_dict(opts))
            if "HEAD" in errors:  # BASE runs, HEAD does not even start: HEAD is broken, a failure
                report.errors.append(f"HEAD's trial server failed: {errors['HEAD']}")
                return report
            names = common_cases(base, head, opts, report)
            total = ab.total_budget_s
            say(f"  {len(names)} case(s) at world size {opts.world}, size {opts.selection.size}; trials of "
                f"{opts.run.steps} steps, threshold {ab.seq.threshold:.0%}, margin ±{ab.seq.delta:.0%}, "
                f"{ab.seq.confidence:.0%} over all looks, budget "
                + (f"{total:.0f} s in total" if total else f"{ab.seq.budget_s:.0f} s per case"))

            def one(name: str, seq: SeqOptions) -> CaseOutcome:
                try:
                    return compare_case(base, head, name, world, opts, say, seq)
                finally:
                    for s in sides:
                        close_case(s, name)

            report.cases = compare_all(names, one, ab.seq, total, say)
            return report
        finally:
            interrupted = isinstance(sys.exc_info()[1], (KeyboardInterrupt, SystemExit))
            for s in sides:  # interrupted (Ctrl-C, a CI cancel's SIGINT/SIGTERM): at once, not in order
                s.server.kill() if interrupted else s.server.close()
            if interrupted:  # ranks killed in their rendezvous leave their store: its owner, the server, is dead

                remove_stale()


def compare_all(names: list[str], compare: Callable[[str, SeqOptions], CaseOutcome], seq: SeqOptions,
                total: float | None = None, say: Callable[[str], None] = lambda m: None) -> list[CaseOutcome]:
    """Every case compared with ``seq``'s budget each, or under one ``total`` budget: each case gets an equal share
    of what is left, then the time left over goes to the cases that came out inconclusive, each compared again (a
    fresh sequential comparison with its own interval) with an equal share of the rest, while a share is at least a
    quarter of the first one."""
    if not total:
        return [compare(n, seq) for n in names]
    out: list[CaseOutcome] = []
    spent = 0.0
    for i, name in enumerate(names):
        out.append(compare(name, replace(seq, budget_s=max(1.0, (total - spent) / (len(names) - i)))))
        spent += out[-1].seconds
    again = [i for i, c in enumerate(out) if c.verdict == "inconclusive" and not c.failures]
    while again and (total - spent) / len(again) >= 0.25 * total / len(names):
        i = again.pop(0)
        say(f"  {names[i]}: inconclusive; compared again with the time left over ({total - spent:.0f} s)")
        out[i] = compare(names[i], replace(seq, budget_s=(total - spent) / (len(again) + 1)))
        spent += out[i].seconds
    return out


def _options_dict(opts: RunSpec) -> dict:
    """The comparison's specification as the report keeps it (``RunSpec.to_dict``)."""
    return opts.to_dict()


def format_table(report: AbReport) -> str:
    """The people's table: one line per case, then the structure diffs and why the gate fails."""
    rows = [("case", "verdict", "HEAD/BASE [interval]", "slowdown", "BASE ms", "HEAD ms", "blocks", "s",
             "structure", "check")]
    for c in report.cases:
        ci = fmt_span(c.ratio, c.ci) if math.isfinite(c.ratio) else "-"
        # what the verdict's interval caught or rules out; inconclusive: what it could have caught (power_sentence)
        power = power_sentence(c.verdict, c.ci, c.detectable_slowdown if c.detectable_slowdown is not None
                               else math.inf)[0] if c.blocks else "-"
        rows.append((f"{c.case}@{c.world}", c.verdict, ci, power, _ms(c.base_ms), _ms(c.head_ms), str(c.blocks),
                     f"{c.seconds:.0f}", "changed" if c.structure_diff else ("identical" if c.check else "-"),
                     c.check or "-"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows]
    for c in report.cases:
        if c.structure_diff:
            lines.append(f"\n{c.status}: {c.case}@{c.world}")
            lines += [f"  {d}" for d in c.structure_diff]
        if c.structure_new:
            lines.append(f"\nnew structural facts (not compared): {c.case}@{c.world}")
            lines += [f"  {d}" for d in c.structure_new]
        if c.error:
            lines.append(f"\nerror: {c.case}@{c.world}: {c.error}")
        if c.busy:
            lines.append(f"\n{c.case}@{c.world}: {c.busy}")
    for o in report.only:
        lines.append(f"not compared: {o.case}: {o.why}")
    for e in report.errors:
        lines.append(f"\nerror: {e}")
    return "\n".join(lines)


def _ms(x: float) -> str:
    return f"{x:.2f}" if isinstance(x, float) and math.isfinite(x) else "-"
