"""`fleetbench bisect GOOD BAD --case X`: the first slow commit, found with the A/B harness.

1. GOOD and BAD each get a trial server, kept up for the whole bisection (each case prepared
   once).  BAD must be *slower* than GOOD by `ab`'s own rule (99%, the threshold δ, rotation), or
   there is nothing to bisect and the report says so.  That verdict comes from the first
   commit's blocks (step 2: each holds two trials of GOOD and two of BAD), which go on until both
   it and the commit are decided, and stop as soon as BAD is *not slower*, *same* or *faster*; with one commit
   after GOOD, `ab` itself (:func:`suite.ab.trials.compare_case`) decides.
2. The commits of BAD's first-parent line after GOOD are bisected.  A commit tested gets its
   own worktree and server, and its trials are interleaved with *both* GOOD's and BAD's in
   blocks of six (:mod:`suite.ab.blocks`), ``ABCCBA`` with the three roles drawn at random each block (a mirror
   sequence: a linear drift within the block hits the three alike).  The block statistic is
   where the commit lies between the two, at the same moment::

       x = log(commit) - (log(GOOD) + log(BAD)) / 2        (each the mean of its two trials)

   The whole interval of ``x`` at 95% (over all its looks, as `ab`'s) above 0 -> *bad* (like
   BAD), below 0 -> *good* (like GOOD).  Measured against both ends at once, the classification
   does not depend on how large the slowdown looks at any one moment (busy work costs more wall time on a loaded machine
   than on a quiet one).  As in `ab` (``--rotate N``) the case is prepared afresh on all three
   servers every N blocks, every ``--restart``-th time on fresh servers
   (:func:`suite.ab.trials.rotate`), and the groups' trimmed means are the samples of a Student
   t interval (``suite.ab.stats.pair_interval``): two preparations, and two processes, of the
   same code differ by a few percent for as long as they run, a bias that blocks of one
   preparation cannot average out.
3. An *inconclusive* commit (its interval still straddles 0 when the budget is spent) is tested
   again with twice the budget (``retries`` times); if it stays inconclusive the bisection
   stops and says so, with the range the first slow commit lies in (exit 3, undecided).
"""
from __future__ import annotations

import dataclasses
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..run_spec import RunSpec, SeqOptions
from . import blocks
from .client import ProtocolMismatch, TrialError
from .stats import Sequential, describe_verdict
from .trials import (
    AbInputError,
    Side,
    _prepare,
    _trial,
    close_case,
    compare_case,
    ready,
    rotate,
    select,
    start_side,
)
from .worktrees import Worktrees, first_parent_range

__all__ = ["BisectReport", "run_bisect", "classify", "CLASSIFY_CONFIDENCE"]

CLASSIFY_CONFIDENCE = 0.95  # of the interval that classifies a commit as good or bad
NOT_SLOWER = ("same", "faster", "not slower")  # BAD against GOOD: nothing to bisect


@dataclass
class BisectReport:
    case: str
    good: str
    bad: str
    commits: list  # [{"commit", "subject"}], oldest first (after GOOD, up to BAD)
    tests: list = field(default_factory=list)  # [{"commit", "subject", "class", "position", "ci", "blocks", ...}]
    first_slow: str | None = None
    undecided: str | None = None  # why no commit is named
    range: tuple = ()  # (last known good, first known bad)
    bad_ratio: float = math.nan  # BAD/GOOD step time, as ab measured it

    @property
    def exit_code(self) -> int:
        """0: the first slow commit is named, or BAD is not slower than GOOD (nothing to bisect); 3: undecided."""
        return 0 if self.first_slow or self.nothing_to_bisect else 3

    @property
    def nothing_to_bisect(self) -> bool:
        """BAD measured same as or faster than GOOD (inconclusive is undecided, not this)."""
        return any(t.get("against") == "GOOD" and t.get("class") in NOT_SLOWER for t in self.tests)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d.update(kind="fleetbench.bisect", exit_code=self.exit_code)
        return d


def classify(good: Side, bad: Side, cand: Side, case: str, opts: RunSpec, seq: SeqOptions,
             say: Callable[[str], None] = lambda m: None, ends: Sequential | None = None) -> dict:
    """Blocks of six trials until the candidate's position between GOOD and BAD is decided (see above).

    ``ends``: BAD against GOOD by `ab`'s own rule, not decided yet (the first commit tested).  Every block already
    holds two trials of each, so ``log(BAD) - log(GOOD)`` is fed to it from the same blocks, and the blocks go on
    until both have decided; they stop at once when BAD is *same* or *faster* (nothing to bisect)."""
    _prepare(cand, case, opts)
    # 95%, not ab's 99%: a bisection step chooses between two hypotheses; the blocks it saves are many on a loaded
    # machine.  Groups of seq.rotate = N blocks, each on fresh preparations of all three, are the samples.
    s = Sequential(dataclasses.replace(seq, split=0.0, confidence=min(seq.confidence, CLASSIFY_CONFIDENCE)))
    rng = random.Random(f"{seq.seed}:{cand.commit}")
    restarts = 0
    t0 = time.monotonic()

    def after(got: list[list[float]]) -> bool:
        """One block of GOOD, BAD and commit trials: the commit's position (and BAD against GOOD); True to stop."""
        nonlocal restarts
        lg, lb, lc = (math.log(float(np.mean(g))) for g in got)
        fed = []  # the sequentials still taking blocks (a decided one is left as it decided)
        progress = (time.monotonic() - t0) / seq.budget_s
        for seq_, x in ((s, lc - (lg + lb) / 2), (ends, lb - lg)):
            if seq_ is not None and seq_.verdict is None:
                seq_.add(x, progress=progress)
                fed.append(seq_)
        if ends is not None and ends.verdict in NOT_SLOWER:
            return True  # BAD is not slower than GOOD: the candidate's position means nothing
        if s.verdict is not None and (ends is None or ends.verdict is not None):
            return True
        lead = max(fed, key=lambda q: len(q.d))  # the one that has seen every block (both, until one decides)
        if time.monotonic() - t0 >= seq.budget_s or len(lead.d) >= seq.max_blocks:
            return True
        if lead.pair_done:
            restarts += rotate((good, bad, cand), case, opts, lead)
        return False

    blocks.run_blocks((good, bad, cand), lambda side: _trial(side, case, opts), rng, after)
    s.finish()
    seconds = time.monotonic() - t0
    if ends is not None:
        ends.finish()
    cls = {"slower": "bad", "same": "good"}.get(s.verdict or "", "inconclusive")
    lo, hi = s.ratio_ci
    groups = len(s.pairs)
    out = {"class": cls, "position": s.ratio, "ci": [lo, hi], "blocks": len(s.d), "groups": groups,
           "restarts": restarts, "seconds": seconds}
    if ends is not None:
        out["ends"] = {"verdict": ends.verdict, "ratio": ends.ratio, "ci": list(ends.ratio_ci),
                       "blocks": len(ends.d), "groups": len(ends.pairs)}
        say(f"  {case}: BAD against GOOD: " + describe_verdict(ends.verdict or "inconclusive", ends.ratio,
                                                                ends.ratio_ci, seq.delta, threshold=seq.threshold)
            + f" ({len(ends.d)} blocks, shared with the first commit's)")
    say(f"  {case}: {cls}: commit / midpoint(GOOD, BAD) step time {s.ratio:.3f} [{lo:.3f}, {hi:.3f}] "
        f"({len(s.d)} blocks in {groups} groups of fresh preparations, {seconds:.0f} s)")
    return out


def run_bisect(repo: str, good: str, bad: str, case: str, opts: RunSpec, retries: int = 1,
               say: Callable[[str], None] = lambda m: None) -> BisectReport:
    assert opts.ab is not None and opts.world is not None
    ab, world = opts.ab, opts.world
    with Worktrees(repo) as wt:
        gc, bc = wt.resolve(good), wt.resolve(bad)
        wt.check_protocol(gc, "GOOD")
        wt.check_protocol(bc, "BAD")
        if gc == bc:
            raise AbInputError(f"GOOD and BAD are the same commit ({gc[:10]}): nothing to bisect")
        commits = first_parent_range(wt.repo, gc, bc)
        report = BisectReport(case, gc, bc, [{"commit": c, "subject": wt.subject(c)} for c in commits],
                              range=(gc, bc))
        say(f"fleetbench bisect: {case}, {len(commits)} commit(s) after GOOD {gc[:10]} up to BAD {bc[:10]}")
        sides: list[Side] = []
        try:
            sides.append(start_side(wt, "GOOD", good, opts, wait=False, commit=gc))
            sides.append(start_side(wt, "BAD", bad, opts, wait=False, commit=bc))
            g, b = sides
            try:
                ready(g, b)
            except ProtocolMismatch as exc:
                raise AbInputError(str(exc)) from None
            names = [c.case for c in select(g, opts.replace(selection={"cases": (case,), "tags": (), "models": ()}))
                     if not c.skip]
            if case not in names:
                raise AbInputError(f"case {case} does not run on GOOD at world size {opts.world}")
            def ends_decided(verdict: str, ratio: float, ci: list, blocks: int, seconds: float) -> bool:
                """BAD against GOOD, first in the report; False (and why) when it is not slower."""
                report.bad_ratio = ratio
                report.tests.insert(0, {"commit": bc, "subject": wt.subject(bc), "class": "bad" if verdict == "slower"
                                        else verdict, "position": math.nan, "ratio": ratio, "ci": ci,
                                        "blocks": blocks, "seconds": seconds, "against": "GOOD"})
                if verdict != "slower":
                    report.undecided = f"BAD {bc[:10]} is {verdict} against GOOD, not slower: nothing to bisect"
                return verdict == "slower"

            if len(commits) == 1:  # BAD is the only commit after GOOD: ab's verdict is the whole answer
                o = compare_case(g, b, case, world, opts, say)
                if not ends_decided(o.verdict, o.ratio, list(o.ci), o.blocks, o.seconds):
                    return report
            else:  # BAD against GOOD is decided from the first commit's blocks (they hold both): see classify
                for side in (g, b):
                    _prepare(side, case, opts)
            ends: Sequential | None = None if len(commits) == 1 else Sequential(ab.seq)

            def test(i: int) -> str:
                nonlocal ends
                commit = commits[i]
                cand: Side | None = None
                seq = ab.seq
                res: dict = {}
                try:
                    wt.check_protocol(commit, f"commit {i + 1}/{len(commits)}")
                    cand = start_side(wt, commit[:10], commit, opts, commit=commit)
                    ready(cand)
                    for attempt in range(retries + 1):
                        say(f"  testing {commit[:10]} ({i + 1}/{len(commits)}: {wt.subject(commit)[:60]})"
                            + (f", again with a budget of {seq.budget_s:.0f} s" if attempt else ""))
                        res = classify(g, b, cand, case, opts, seq, say, ends=ends)
                        if ends is not None:  # the first commit tested: its blocks decided BAD against GOOD too
                            e, ends = res.pop("ends"), None
                            if not ends_decided(e["verdict"], e["ratio"], e["ci"], e["blocks"], res["seconds"]):
                                return "nothing"
                        if res["class"] != "inconclusive":
                            break
                        seq = dataclasses.replace(seq, budget_s=seq.budget_s * 2)
                except TrialError as exc:
                    res = {"class": "error", "error": str(exc).splitlines()[0][:300]}
                finally:
                    if cand is not None:
                        close_case(cand, case)
                        cand.server.close()
                        wt.drop(cand.root)
                report.tests.append({"commit": commit, "subject": wt.subject(commit), "against": "GOOD and BAD",
                                     **res})
                return res["class"]

            lo, hi = -1, len(commits) - 1  # commits[lo] good (-1: GOOD itself), commits[hi] bad
            while hi - lo > 1:
                mid = (lo + hi) // 2
                v = test(mid)
                if v == "nothing":
                    return report
                if v == "bad":
                    hi = mid
                elif v == "good":
                    lo = mid
                else:
                    report.undecided = (f"{commits[mid][:10]} stayed {v} after {retries + 1} attempt(s); the first "
                                        f"slow commit is after {(commits[lo] if lo >= 0 else gc)[:10]} and at or "
                                        f"before {commits[hi][:10]}")
                    break
            report.range = ((commits[lo] if lo >= 0 else gc), commits[hi])
            if report.undecided is None:
                report.first_slow = commits[hi]
            return report
        finally:
            for s in sides:
                close_case(s, case)
                s.server.close()
