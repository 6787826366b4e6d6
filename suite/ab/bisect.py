"""`fleetbench bisect GOOD BAD --case X`: the first slow commit, found with the A/B harness.

1. BAD is compared with GOOD by `ab`'s own rule (:func:`suite.ab.trials.compare_case`), over at
   least :data:`MEASURE_BLOCKS` blocks; unless it is *slower*, there is nothing to bisect and the
   report says so.
2. The slowdown measured there (the trimmed mean ``e`` of the block log ratios) sets the
   *split*, half-way in log scale (``e/2``: half of a 10% slowdown is about 4.9%).  Each commit
   between GOOD and BAD (first-parent line) is compared with GOOD and classified: the whole
   interval above the split is *bad* (it has the slowdown), the whole interval below it *good*.
   Two regions, not three: a commit is either like GOOD or like BAD, so "same within ±δ" is
   not needed, and both kinds of commit decide in a few blocks.
3. An *inconclusive* commit (its interval still straddles the split when the budget is spent)
   is tested again with twice the budget (``retries`` times); if it stays inconclusive the
   bisection stops and says so, with the range the first slow commit lies in.

GOOD's trial server stays up for the whole bisection (its case prepared once); each commit
tested gets its own worktree and server, removed after its comparison.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from .client import ProtocolMismatch
from .trials import AbInputError, AbOptions, CaseOutcome, Side, close_case, compare_case, ready, select, start_side
from .worktrees import Worktrees, first_parent_range

__all__ = ["BisectReport", "run_bisect", "MEASURE_BLOCKS"]

MEASURE_BLOCKS = 24  # blocks at least for BAD against GOOD, whose slowdown sets the split


@dataclass
class BisectReport:
    case: str
    good: str
    bad: str
    commits: list  # [{"commit", "subject"}], oldest first (after GOOD, up to BAD)
    tests: list = field(default_factory=list)  # [{"commit", "subject", "verdict", "ratio", "ci", "blocks", ...}]
    first_slow: str | None = None
    undecided: str | None = None  # why no commit is named
    range: tuple = ()  # (last known good, first known bad)
    split: float = math.nan  # the HEAD/GOOD step-time ratio that separates good from bad

    @property
    def exit_code(self) -> int:
        return 0 if self.first_slow else 1

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d.update(kind="fleetbench.bisect", exit_code=self.exit_code)
        return d


def run_bisect(repo: str, good: str, bad: str, case: str, opts: AbOptions, retries: int = 1,
               say: Callable[[str], None] = lambda m: None) -> BisectReport:
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
        base = start_side(wt, "GOOD", good, opts, opts.inject_base, commit=gc)
        try:
            try:
                ready(base)
            except ProtocolMismatch as exc:
                raise AbInputError(str(exc)) from None
            names = [c["case"] for c in select(base, dataclasses.replace(opts, cases=[case], tags=[], models=[]))
                     if not c["skip"]]
            if case not in names:
                raise AbInputError(f"case {case} does not run on GOOD at world size {opts.nproc}")

            def test(i: int, split: float | None, min_blocks: int | None = None) -> CaseOutcome:
                commit = commits[i]
                head: Side | None = None
                seq = dataclasses.replace(opts.seq, split=split, min_blocks=min_blocks or opts.seq.min_blocks,
                                          max_blocks=max(opts.seq.max_blocks, min_blocks or 0))
                try:
                    wt.check_protocol(commit, f"commit {i + 1}/{len(commits)}")
                    head = start_side(wt, commit[:10], commit, opts, opts.inject_head, commit=commit)
                    ready(head)
                    for attempt in range(retries + 1):
                        say(f"  testing {commit[:10]} ({i + 1}/{len(commits)}: {wt.subject(commit)[:60]})"
                            + (f", again with a budget of {seq.budget_s:.0f} s" if attempt else ""))
                        o = compare_case(base, head, case, opts.nproc, opts, say, seq=seq)
                        if o.verdict != "inconclusive":
                            break
                        seq = dataclasses.replace(seq, budget_s=seq.budget_s * 2)
                finally:
                    if head is not None:
                        close_case(head, case)
                        head.server.close()
                        wt.drop(head.root)
                kind = {"slower": "bad", "same": "good", "faster": "good"}.get(o.verdict, o.verdict) \
                    if split is not None else o.verdict
                report.tests.append({"commit": commit, "subject": wt.subject(commit), "verdict": o.verdict,
                                     "class": kind, "ratio": o.ratio, "ci": list(o.ci), "blocks": o.blocks,
                                     "seconds": o.seconds, "structure_diff": o.structure_diff, "error": o.error})
                return o

            last = len(commits) - 1
            # BAD against GOOD, by ab's own rule, with enough blocks that the slowdown (hence the split) is
            # measured, not just detected: a sequential stop at the first look overstates it.
            o = test(last, None, max(MEASURE_BLOCKS, opts.seq.min_blocks))
            if o.verdict != "slower":
                report.undecided = f"BAD {bc[:10]} is {o.verdict} against GOOD, not slower: nothing to bisect"
                return report
            split = o.estimate / 2
            report.split = math.exp(split)
            say(f"  BAD is slower ({o.ratio:.3f}); commits are bad above a HEAD/GOOD ratio of {report.split:.3f}")
            lo, hi = -1, last  # commits[lo] good (-1: GOOD itself), commits[hi] bad
            while hi - lo > 1:
                mid = (lo + hi) // 2
                v = test(mid, split).verdict
                if v == "slower":
                    hi = mid
                elif v in ("same", "faster"):
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
            close_case(base, case)
            base.server.close()
