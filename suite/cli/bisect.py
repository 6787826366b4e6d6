"""`fleetbench bisect GOOD BAD --case X`: the first slow commit between two revisions, by `ab` comparisons.

Each commit tested is compared with GOOD by the A/B harness of `fleetbench ab` (same options);
BAD must be slower than GOOD (not slower, same or faster: nothing to bisect); a commit like BAD is bad,
one like GOOD good; inconclusive is tested again with twice the budget (--retries), then reported.
Each commit is measured against both ends at once (docs/benchmarks.md).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..ab.client import TrialError
from ..ab.worktrees import RevisionError
from ..validate import spec
from . import error, helps, print_json, terminate_cleanly
from .ab import add_selection, options, progress
from .options import add_fields, from_args


@dataclass(frozen=True)
class BisectOptions:
    """bisect's own option beside ab's (its bound: suite/validate.py's metadata, checked by ``from_args``)."""

    retries: int = spec(1, "times an inconclusive commit is tested again, each with twice the budget (default 1)",
                        ge=0)


def add_parser(sub) -> None:
    p = sub.add_parser("bisect", help="find the first slow commit between GOOD and BAD with `ab` comparisons",
                       **helps(__doc__, """
                           fleetbench bisect v0.3 HEAD --case mlp/overlap --nproc 2
                           fleetbench bisect HEAD~20 HEAD --case resnet/plain --size tiny --budget 120 --json""",
                               verdicts="first BAD against GOOD: slower (then bisect), not slower by the threshold, "
                                        "same or faster (nothing to bisect), inconclusive; then each commit tested, "
                                        "against both ends: bad (like BAD), good (like GOOD), inconclusive "
                                        "(tested again with twice the budget, --retries, then reported with the "
                                        "range the first slow commit lies in).",
                               codes={0: "ok: the first slow commit is named, or BAD is not slower than GOOD (not "
                                         "slower by the threshold, same or faster: nothing to bisect)",
                                      1: "not used: a regression is what bisect looks for; naming it is exit 0",
                                      2: "unusable input: a revision, option or case it cannot use (named)",
                                      3: "undecided: BAD inconclusive against GOOD, or a commit stayed inconclusive"}))
    p.add_argument("good", help="a revision where the case is fast")
    p.add_argument("bad", help="a later revision where it is slow")
    add_selection(p, "bisect")
    add_fields(p, BisectOptions)
    p.set_defaults(func=main)


def main(args) -> int:
    from ..ab.bisect import run_bisect
    from ..ab.trials import AbInputError

    terminate_cleanly()
    cases = args.cases or []
    if len(cases) != 1 or any(ch in cases[0] for ch in "*?[,"):
        return error("bisect", "name exactly one case with --case (e.g. --case mlp/plain)")
    try:
        own = from_args(BisectOptions, args)
        opts = options(args)
        report = run_bisect(args.repo, args.good, args.bad, cases[0], opts, retries=own.retries,
                            say=progress(args))
    except (AbInputError, RevisionError, ValueError, TrialError) as exc:
        return error("bisect", exc)
    if args.json:
        print_json(report.to_dict())
        return report.exit_code
    print()
    for t in report.tests:
        if t.get("against") == "GOOD":
            what = f"BAD/GOOD {t['ratio']:.3f} [{t['ci'][0]:.3f}, {t['ci'][1]:.3f}]"
        elif "position" in t and math.isfinite(t["position"]):
            what = f"commit/midpoint {t['position']:.3f} [{t['ci'][0]:.3f}, {t['ci'][1]:.3f}]"
        else:
            what = t.get("error", "-")
        print(f"  {t['commit'][:10]}  {t['class']:12s}  {what}  {t.get('blocks', 0)} blocks  {t['subject'][:60]}")
    if report.first_slow:
        subject = next(c["subject"] for c in report.commits if c["commit"] == report.first_slow)
        print(f"\nfirst slow commit: {report.first_slow} {subject}")
    else:
        print(f"\nno commit named: {report.undecided}")
    return report.exit_code
