"""`fleetbench ab BASE HEAD`: the A/B gate between two git revisions, trial by trial.

Both revisions are checked out as git worktrees (a temporary directory, removed afterwards)
and each runs in its own interpreter (`fleetbench trial-server`, PYTHONPATH=<worktree>).  Per
case: the structural gate (every exact fact of the case must be identical), the correctness
check, then timed trials of the two revisions alternating in randomised ABBA blocks until the
interval of the per-block log ratio answers the gate's question, is HEAD slower by the threshold
or more? (not slower by it / slower / same within ±delta / faster) or the budget per case is
spent (inconclusive).  Two revisions that are the same commit, or have the same tree, are
identical: said at once, nothing timed.  See docs/benchmarks.md.

Every verdict says, in words that agree with it, what its interval caught or rules out ("caught a slowdown of
at least 5.6%", "rules out a slowdown of 3.1% or more"), or, inconclusive, the smallest slowdown it could have
caught at 95% ("could have caught ≥ 4.1%"; `detectable_slowdown` per case in --json, a fraction, for every
verdict).
"""
from __future__ import annotations

import os
import sys

from .. import spec_options
from ..ab.client import TrialError
from ..ab.worktrees import RevisionError, Worktrees, git
from ..config import ConfigError
from ..report import junit
from ..run_spec import RunSpec
from . import GATE_CODES, error, helps, print_json, terminate_cleanly
from .checks import require_nproc
from .options import add_shared, add_spec, default
from .options import given as options_given


def _ab_default(name: str):
    """A default of ab's own options (``AbOptions``; its statistics' ``SeqOptions``), for a help text."""
    return default(name, "ab" if name in ("trial_warmup", "timeout", "python", "total_budget_s") else "seq")


def add_selection(p, surface: str = "ab") -> None:
    """The options `ab` and `bisect` share with `run` (selection, size, world) and their own timing ones: the run
    specification's options of ``surface`` (suite/run_spec.py's metadata), with ab's help texts."""
    add_shared(p, nproc="ranks of each revision, the world size (default: 2 on CPU, every GPU on CUDA)")
    d = _ab_default
    add_spec(p, surface,
             file="the selection (and the run options) as a run specification (JSON, suite/run_spec.py's RunSpec; "
                  "`fleetbench nightly` writes one for its gate) instead of the selection's options; --steps, "
                  "--warmup ... given beside it replace the file's, and ab's own options (--threshold, --budget ...) "
                  "come from the command line",
             device="the ranks' device (default: cuda where torch sees a GPU, then one for every rank or an error; "
                    "else cpu)",
             size="model size (default: cpu on CPU, full on CUDA)",
             per_rank_batch="per-rank batch size (default: the model's)",
             steps=f"steps per trial window (default {default('steps')})",
             trial_warmup=f"discarded steps before each trial (default {d('trial_warmup')})",
             warmup=f"warm-up steps when a case is prepared (default {default('warmup')})",
             check="skip the correctness check (and the loss trajectory)",
             threshold=f"the gate's question: is HEAD slower by this fraction or more? (default {d('threshold'):g}: "
                       f"not slower means the whole interval below +{d('threshold'):.0%}%; slower means the whole "
                       f"interval above 1)",
             delta=f"equivalence margin on the step-time ratio, at most --threshold (default {d('delta'):g}: same "
                   f"means the whole interval inside ±{d('delta'):.0%}%)",
             confidence=f"level of the intervals over all the looks of one comparison (default {d('confidence'):g})",
             budget_s=f"seconds of timed blocks per case before the verdict is inconclusive (default "
                      f"{d('budget_s'):g})",
             max_blocks=f"blocks at most per case (default {d('max_blocks')})",
             rotate=dict(metavar="N", help="the case prepared afresh on both servers every N blocks (N >= 2), the "
                         "pairs of preparations being the samples (t interval over pairs): two preparations of the "
                         "same code can differ in speed for as long as they run, so one preparation per comparison "
                         "cannot earn a verdict and is refused (docs/figures/gate.md: an unchanged mlp/plain was "
                         f"called slower in 26.7%% of such comparisons) (default {d('rotate')})"),
             restart=dict(metavar="K", help="with --rotate: every K-th fresh preparation is on fresh trial servers "
                          "(new processes), whose own few percent of bias then change too; 1 = fresh servers every "
                          f"time, 0 = never (default {d('restart')})"),
             seed=f"seed of the block orders and the bootstrap (default {d('seed')})",
             python="interpreter of the trial servers (default: this one)",
             timeout=f"bound on each request to a trial server, seconds (default {d('timeout'):g})",
             **({"total_budget_s": "one budget of timed blocks for all cases (instead of --budget per case): each "
                                   "case gets an equal share of what is left, and time left over goes to the "
                                   "inconclusive cases"} if surface == "ab" else {}))
    p.add_argument("--repo", default=".", help="the git repository of the revisions (default: the current one)")
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
                                        "verdict pass -> fail, an error on HEAD only. Each verdict states what "
                                        "it caught or rules out, or (inconclusive) what it could have caught.",
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
    p.add_argument("--junit", metavar="FILE",
                   help="also write the verdicts as JUnit XML (CI systems' test view): one test case per comparison; "
                        "a gate failure is a failure, inconclusive is skipped with its interval")
    p.set_defaults(func=main)


def options(args) -> RunSpec:
    """The comparison's run specification from the command line (selection, run options, ab's own), built by the
    one builder (``spec_options.spec_from``: ``--spec FILE`` states the selection, the options given beside it
    replace the file's); a ValueError (exit 2) naming the option for anything out of range."""
    from ..models import default_size  # torch comes with the models: at run time, not for --help
    from ..selection import choose_platform, default_worlds

    if args.rotate == 0:  # said here with why; SeqOptions refuses any N < 2 too
        raise ValueError("--rotate 0: one preparation per side cannot earn a verdict: its own speed (a few percent "
                         "here) is shared by every block, not in their spread, and an unchanged mlp/plain was called "
                         "slower in 26.7% of such comparisons (docs/figures/gate.md, section 0); give --rotate N >= 2 "
                         f"(default {_ab_default('rotate')})")
    if args.python is not None and not (os.path.isfile(args.python) and os.access(args.python, os.X_OK)):
        raise ValueError(f"--python {args.python!r}: not an executable file; give the interpreter of the trial "
                         f"servers (e.g. {sys.executable})")
    spec = spec_options.spec_from(options_given(args, args.command))
    sel, nproc = spec.selection, args.nproc
    if args.spec and nproc is None and len(sel.worlds) == 1:
        nproc = sel.worlds[0]
    elif args.spec and nproc is not None and sel.worlds and nproc not in sel.worlds:
        raise ValueError(f"--nproc {nproc}: --spec {args.spec} names world sizes {', '.join(map(str, sel.worlds))}")
    require_nproc(nproc, sel.device)
    try:
        device = choose_platform(sel.device, nproc or 1)[0]
        nproc = nproc or default_worlds(device)[0]
    except ConfigError as exc:  # e.g. fewer GPUs than --nproc: never a silent CPU run
        raise ValueError(f"--nproc {nproc}: {exc}" if nproc else str(exc)) from None
    tags = sel.tags if sel.cases or sel.tags or sel.models else (sel.default_tag,)
    return spec.replace(selection={"tags": tags, "size": sel.size or default_size(device), "worlds": (nproc,),
                                   "device": None if device == "cpu" else device})


def progress(args):
    """Where the progress lines go: stderr under --json (stdout is the document), else stdout."""
    return lambda m: print(m, file=sys.stderr if args.json else sys.stdout, flush=True)


def identical(repo: str, base_rev: str, head_rev: str) -> dict | None:
    """When BASE and HEAD are the same commit, or commits with the same tree (the same code), what they are; else
    None.  Decided here, before any worktree or server: the ABBA driver itself (suite.ab.trials) always times."""
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
        assert opts.ab is not None
        if args.junit is not None and (why := junit.path_problem("--junit", args.junit)):
            raise ValueError(why)
        same = identical(args.repo, args.base, args.head)
        if same is not None:
            if args.json:
                print_json(same | {"options": {"threshold": opts.ab.seq.threshold, "delta": opts.ab.seq.delta}})
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
                  f"threshold {opts.ab.seq.threshold:.0%})")
            for c in report.inconclusive:
                print(f"  {c.case}@{c.world}: {c.summary}")
        else:
            seq = opts.ab.seq
            print(f"\nab gate: ok (no case slower; threshold {seq.threshold:.0%}, margin ±{seq.delta:.0%}, "
                  f"{seq.confidence:.0%} over all looks)")
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
