"""`fleetbench ab BASE HEAD`: the A/B gate between two git revisions, trial by trial.

Both revisions are checked out as git worktrees (a temporary directory, removed afterwards)
and each runs in its own interpreter (`fleetbench trial-server`, PYTHONPATH=<worktree>).  Per
case: the structural gate (every exact fact of the case must be identical), the correctness
check, then timed trials of the two revisions alternating in randomised ABBA blocks until the
interval of the per-block log ratio answers the gate's question, is HEAD slower by the threshold
or more? (not slower by it / slower / same within ±delta / faster) or the budget per case is
spent (inconclusive).  Two revisions that are the same commit, or have the same tree, are
identical: said at once, nothing timed.  See docs/benchmarks.md.

Every verdict states its power: the smallest slowdown the comparison would have caught at 95%
("could have caught ≥ 4.1%"; `detectable_slowdown` per case in --json, a fraction).
"""
from __future__ import annotations

import os
import sys

from ..ab.client import TrialError
from ..ab.worktrees import RevisionError, Worktrees, git
from ..config import ConfigError
from ..models import default_size
from ..report import junit
from ..selection import choose_platform, default_worlds
from . import GATE_CODES, error, helps, print_json, terminate_cleanly
from .checks import MAX_STEPS, check_nproc, check_number, check_seconds
from .options import add_shared, require_at_least, require_seconds, selection


def add_selection(p) -> None:
    """The options `ab` and `bisect` share with `run` (selection, size, world) and their own timing ones."""
    add_shared(p, case=None, tag=None, model=None,
               nproc="ranks of each revision, the world size (default: 2 on CPU, every GPU on CUDA)",
               device="the ranks' device (default: cuda where torch sees a GPU, then one for every rank or an error; "
                      "else cpu)",
               size="model size (default: cpu on CPU, full on CUDA)", config=None, set=None,
               batch="per-rank batch size (default: the model's)",
               steps=dict(default=5, help="steps per trial window (default 5)"))
    p.add_argument("--trial-warmup", type=int, default=1, help="discarded steps before each trial (default 1)")
    add_shared(p, warmup=dict(default=2, help="warm-up steps when a case is prepared (default 2)"),
               no_check="skip the correctness check (and the loss trajectory)", check_steps=None)
    p.add_argument("--threshold", type=float, default=0.05,
                   help="the gate's question: is HEAD slower by this fraction or more? (default 0.05: not slower "
                        "means the whole interval below +5%%; slower means the whole interval above 1)")
    p.add_argument("--delta", type=float, default=0.02,
                   help="equivalence margin on the step-time ratio, at most --threshold (default 0.02: same means "
                        "the whole interval inside ±2%%)")
    p.add_argument("--confidence", type=float, default=0.99,
                   help="level of the intervals over all the looks of one comparison (default 0.99)")
    p.add_argument("--budget", type=float, default=180.0,
                   help="seconds of timed blocks per case before the verdict is inconclusive (default 180)")
    p.add_argument("--min-blocks", type=int, default=10, help="with --rotate 0: blocks before any verdict (default 10)")
    p.add_argument("--max-blocks", type=int, default=2000, help="blocks at most per case (default 2000)")
    p.add_argument("--rotate", type=int, default=5, metavar="N",
                   help="the case prepared afresh on both servers every N blocks, the pairs of preparations being "
                        "the samples (t interval over pairs): two preparations of the same code can differ in "
                        "speed for as long as they run (docs/figures/gate.md measures it); 0 = one preparation "
                        "per comparison, blocks as samples (default 5)")
    p.add_argument("--restart", type=int, default=2, metavar="K",
                   help="with --rotate: every K-th fresh preparation is on fresh trial servers (new processes), whose "
                        "own few percent of bias then change too; 1 = fresh servers every time, 0 = never (default 2)")
    p.add_argument("--seed", type=int, default=0, help="seed of the block orders and the bootstrap")
    p.add_argument("--repo", default=".", help="the git repository of the revisions (default: the current one)")
    p.add_argument("--python", help="interpreter of the trial servers (default: this one)")
    add_shared(p, timeout=dict(default=600.0, help="bound on each request to a trial server, seconds"))
    p.add_argument("--json", action="store_true", help="print the result as JSON (for machines) instead of a table")


def add_parser(sub) -> None:
    p = sub.add_parser("ab", help="A/B gate between two git revisions: structure, check, interleaved timed trials",
                       **helps(__doc__, """
                           fleetbench ab main HEAD --case mlp/plain --nproc 2
                           fleetbench ab v0.3 HEAD --tag smoke --json > ab.json
                           fleetbench ab HEAD~1 HEAD --case 'resnet/*' --size tiny --budget 60 --delta 0.03""",
                               verdicts="per case, the timing: not slower by the threshold (the interval of the "
                                        "per-block log ratio lies below +threshold), slower (above 1), same (within "
                                        "±delta), faster (below -delta), inconclusive (the budget was spent first; "
                                        "what would decide it is said); identical (the same commit or tree: nothing "
                                        "timed); besides: structure changed (an exact fact "
                                        "differs; acknowledged when HEAD's structure-changes.toml names it), a check "
                                        "verdict pass -> fail, an error on HEAD only. Each verdict states the "
                                        "smallest slowdown it could have caught.",
                               codes={**GATE_CODES,
                                      0: "ok: no case slower (not slower by the threshold, same, faster; or the "
                                         "revisions identical)",
                                      1: "regression: a case slower, a structure change not acknowledged, a check "
                                         "verdict pass -> fail, or a case that errors on HEAD only",
                                      2: "unusable input: a revision, option or case it cannot use (named), a "
                                         "revision without a trial server",
                                      3: "undecided: a case inconclusive, and nothing worse"}))
    p.add_argument("base", help="BASE revision (commit, branch, tag, HEAD~3 …)")
    p.add_argument("head", help="HEAD revision")
    add_selection(p)
    p.add_argument("--total-budget", type=float, default=None, metavar="SECONDS",
                   help="one budget of timed blocks for all cases (instead of --budget per case): each case gets an "
                        "equal share of what is left, and time left over goes to the inconclusive cases")
    p.add_argument("--junit", metavar="FILE",
                   help="also write the verdicts as JUnit XML (CI systems' test view): one test case per comparison; "
                        "a gate failure is a failure, inconclusive is skipped with its interval")
    p.set_defaults(func=main)


def options(args):
    """AbOptions from the command line; a ValueError (exit 2) for anything out of range."""
    from ..ab.stats import SeqOptions
    from ..ab.trials import AbOptions, inject_from_env

    require_at_least(args, nproc=1, steps=1, check_steps=1)
    problem = (check_nproc(args.nproc, args.device) or check_number("--batch", args.batch, minimum=1)
               or check_seconds("--timeout", args.timeout)
               or check_number("--seed", args.seed, minimum=0, maximum=2**32 - 1)
               or check_number("--steps", args.steps, minimum=1, maximum=MAX_STEPS))
    if problem:
        raise ValueError(problem)
    if args.python is not None and not (os.path.isfile(args.python) and os.access(args.python, os.X_OK)):
        raise ValueError(f"--python {args.python!r}: not an executable file; give the interpreter of the trial "
                         f"servers (e.g. {sys.executable})")
    require_at_least(args, trial_warmup=0, warmup=0)
    try:
        device = choose_platform(args.device, args.nproc or 1)[0]
        args.nproc = args.nproc or default_worlds(device)[0]
    except ConfigError as exc:  # e.g. fewer GPUs than --nproc: never a silent CPU run
        raise ValueError(f"--nproc {args.nproc}: {exc}" if args.nproc else str(exc)) from None
    size = args.size or default_size(device)
    seq = SeqOptions(delta=args.delta, threshold=args.threshold, confidence=args.confidence, min_blocks=args.min_blocks,
                     max_blocks=args.max_blocks, budget_s=args.budget, seed=args.seed, rotate=args.rotate,
                     restart=args.restart)
    # "a,b" is two (split here, by the selection: a BASE's trial server may be older than the selection layer)
    sel = selection(args)
    cases, tags, models = list(sel.cases), list(sel.tags), list(sel.models)
    if not (cases or tags or models):
        tags = [sel.default_tag]
    opts = AbOptions(cases=cases, tags=tags, models=models, sets=list(args.set),
                     config=os.path.abspath(args.config) if args.config else None, size=size, batch=args.batch,
                     nproc=args.nproc, device=None if device == "cpu" else device, steps=args.steps,
                     trial_warmup=args.trial_warmup, warmup=args.warmup, check=not args.no_check,
                     check_steps=args.check_steps, timeout=args.timeout, seq=seq, python=args.python,
                     total_budget_s=getattr(args, "total_budget", None))
    require_seconds(args, "total_budget")  # bisect has none
    return inject_from_env(opts)


def progress(args):
    """Where the progress lines go: stderr under --json (stdout is the document), else stdout."""
    return lambda m: print(m, file=sys.stderr if args.json else sys.stdout, flush=True)


def identical(repo: str, base_rev: str, head_rev: str) -> dict | None:
    """When BASE and HEAD are the same commit, or commits with the same tree (the same code), what they are; else
    None.  Decided here, before any worktree or server: the ABBA driver itself (suite.ab.trials) always times, so
    that A/A measurements through it (the gate figure) are never short-circuited."""
    wt = Worktrees(repo)  # resolves the repository; makes nothing until a worktree is added
    bc, hc = wt.resolve(base_rev), wt.resolve(head_rev)
    wt.check_clean({"BASE": (base_rev, bc), "HEAD": (head_rev, hc)})
    bt, ht = (git(wt.repo, "rev-parse", f"{c}^{{tree}}") for c in (bc, hc))
    if bc != hc and bt != ht:
        return None
    why = (f"the same commit {bc[:10]}" if bc == hc else
           f"commits {bc[:10]} and {hc[:10]} with the same tree {bt[:10]} (the same code)")
    return {"kind": "fleetbench.ab", "verdict": "identical", "identical": why,
            "base": {"rev": base_rev, "commit": bc, "tree": bt, "subject": wt.subject(bc)},
            "head": {"rev": head_rev, "commit": hc, "tree": ht, "subject": wt.subject(hc)},
            "cases": [], "only": [], "warnings": [], "failures": [], "exit_code": 0}


def main(args) -> int:
    from ..ab.trials import AbInputError, format_table, run_ab

    terminate_cleanly()
    try:
        opts = options(args)
        if args.junit is not None and (why := junit.path_problem("--junit", args.junit)):
            raise ValueError(why)
        # busy work injected into one side (FLEETBENCH_AB_INJECT, a calibration run) makes one commit two sides
        same = None if opts.inject_base or opts.inject_head else identical(args.repo, args.base, args.head)
        if same is not None:
            if args.json:
                print_json(same | {"options": {"threshold": opts.seq.threshold, "delta": opts.seq.delta}})
            else:
                print(f"ab: BASE {args.base} and HEAD {args.head} are {same['identical']}: identical, nothing "
                      f"timed\n\nab gate: ok (identical)")
            if args.junit is not None:
                case = junit.TestCase(f"{args.base} vs {args.head}", "fleetbench.ab", "passed",
                                      output=f"identical ({same['identical']}): nothing timed")
                try:
                    junit.write_junit(args.junit, [junit.Suite(f"fleetbench ab {args.base} {args.head}", (case,))],
                                      name="fleetbench ab")
                except OSError as exc:
                    print(f"fleetbench ab: --junit {args.junit}: not written ({exc})", file=sys.stderr, flush=True)
                    return 2
            return 0
        if opts.seq.rotate == 0:
            print("ab: note: --rotate 0 times one preparation per side: its own bias (a few percent on this machine, "
                  "docs/figures/gate.md) is not in the blocks' spread, so a verdict may be the preparation's, not the "
                  "code's", file=sys.stderr, flush=True)
        report = run_ab(args.repo, args.base, args.head, opts, progress(args))
    except (AbInputError, RevisionError, ValueError, TrialError) as exc:
        return error("ab", exc)
    if args.json:
        print_json(report.to_dict())
    else:
        print()
        print(format_table(report))
        for w in report.warnings:
            print(f"warning: {w}", file=sys.stderr)
        if report.failures:
            print(f"\nab gate: FAIL ({len(report.failures)})")
            for f in report.failures:
                print(f"  {f}")
        elif report.inconclusive:
            print(f"\nab gate: UNDECIDED ({len(report.inconclusive)} case(s) inconclusive; "
                  f"threshold {opts.seq.threshold:.0%})")
            for c in report.inconclusive:
                print(f"  {c.case}@{c.world}: {c.summary}")
        else:
            print(f"\nab gate: ok (no case slower; threshold {opts.seq.threshold:.0%}, margin ±{opts.seq.delta:.0%}, "
                  f"{opts.seq.confidence:.0%} over all looks)")
    if args.junit is not None:
        suite = junit.Suite(f"fleetbench ab {args.base} {args.head}",
                            tuple(junit.ab_cases(report.cases, report.only, report.errors)),
                            (("base", str(report.base.get("commit"))), ("head", str(report.head.get("commit")))))
        try:
            junit.write_junit(args.junit, [suite], name="fleetbench ab")
        except OSError as exc:
            print(f"fleetbench ab: --junit {args.junit}: not written ({exc})", file=sys.stderr, flush=True)
            return 1 if report.exit_code == 1 else 2  # a regression still says so; else: an output is missing
    return report.exit_code
