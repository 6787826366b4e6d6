"""`fleetbench ab BASE HEAD`: the A/B gate between two git revisions, trial by trial.

Both revisions are checked out as git worktrees (a temporary directory, removed afterwards)
and each runs in its own interpreter (`fleetbench trial-server`, PYTHONPATH=<worktree>).  Per
case: the structural gate (every exact fact of the case must be identical), the correctness
check, then timed trials of the two revisions alternating in randomised ABBA blocks until the
interval of the per-block log ratio decides (slower / faster / same within ±δ) or the budget
per case is spent (inconclusive).  See docs/benchmarks.md.

Exit 0: nothing slower; 1: a case slower, a structure changed, a check verdict pass -> fail,
or a case that errors on HEAD only; 2: input it cannot use.
"""
from __future__ import annotations

import json
import os
import signal
import sys

SIZES = ("full", "cpu", "tiny")


def add_selection(p) -> None:
    """The options `ab` and `bisect` share with `run` (selection, size, world) and their own timing ones."""
    p.add_argument("--case", action="append", default=[], metavar="NAME", help="case name or glob; repeatable")
    p.add_argument("--tag", action="append", default=[], help="cases with this tag; repeatable")
    p.add_argument("--model", action="append", default=[], metavar="MODEL", help="every case of this model")
    p.add_argument("--nproc", type=int, default=2, help="ranks of each revision (default 2)")
    p.add_argument("--device", choices=("cpu", "cuda"), help="the ranks' device (default: cpu unless CUDA is there)")
    p.add_argument("--size", choices=SIZES, help="model size (default: cpu on CPU, full on CUDA)")
    p.add_argument("--config", help="TOML file of strategy fields applied on top of every case")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a strategy field; repeatable")
    p.add_argument("--batch", type=int, default=None, help="per-rank batch size (default: the model's)")
    p.add_argument("--steps", type=int, default=5, help="steps per trial window (default 5)")
    p.add_argument("--trial-warmup", type=int, default=1, help="discarded steps before each trial (default 1)")
    p.add_argument("--warmup", type=int, default=2, help="warm-up steps when a case is prepared (default 2)")
    p.add_argument("--no-check", action="store_true", help="skip the correctness check (and the loss trajectory)")
    p.add_argument("--check-steps", type=int, default=3, help="steps of the correctness check (default 3)")
    p.add_argument("--delta", type=float, default=0.02,
                   help="equivalence margin on the step-time ratio (default 0.02: slower means the whole interval "
                        "above +2%%, same means inside ±2%%)")
    p.add_argument("--confidence", type=float, default=0.99, help="bootstrap interval level (default 0.99)")
    p.add_argument("--budget", type=float, default=180.0,
                   help="seconds of timed blocks per case before the verdict is inconclusive (default 180)")
    p.add_argument("--min-blocks", type=int, default=10, help="blocks before any verdict (default 10)")
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
    p.add_argument("--timeout", type=float, default=600.0, help="bound on each request to a trial server, seconds")
    p.add_argument("--json", action="store_true", help="print the result as JSON (for machines) instead of a table")


def add_parser(sub) -> None:
    p = sub.add_parser("ab", help="A/B gate between two git revisions: structure, check, interleaved timed trials")
    p.add_argument("base", help="BASE revision (commit, branch, tag, HEAD~3 …)")
    p.add_argument("head", help="HEAD revision")
    add_selection(p)
    p.set_defaults(func=main)


def options(args):
    """AbOptions from the command line; a ValueError (exit 2) for anything out of range."""
    from ..ab.stats import SeqOptions
    from ..ab.trials import AbOptions, inject_from_env
    from .checks import check_nproc, check_number

    for name in ("nproc", "steps", "check_steps"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} {getattr(args, name)}: must be >= 1")
    problem = (check_nproc(args.nproc, args.device)
               or (check_number("--batch", args.batch, minimum=1) if args.batch is not None else None)
               or check_number("--timeout", args.timeout, above=0.0, maximum=7 * 86400.0, unit="seconds")
               or check_number("--seed", args.seed, minimum=0, maximum=2**32 - 1)
               or check_number("--steps", args.steps, minimum=1, maximum=10**6))
    if problem:
        raise ValueError(problem)
    if args.python is not None and not (os.path.isfile(args.python) and os.access(args.python, os.X_OK)):
        raise ValueError(f"--python {args.python!r}: not an executable file; give the interpreter of the trial "
                         f"servers (e.g. {sys.executable})")
    for name in ("trial_warmup", "warmup"):
        if getattr(args, name) < 0:
            raise ValueError(f"--{name.replace('_', '-')} {getattr(args, name)}: must be >= 0")
    device = args.device
    if device is None:
        import torch

        device = "cuda" if torch.cuda.is_available() and torch.cuda.device_count() >= args.nproc else "cpu"
    size = args.size or ("full" if device == "cuda" else "cpu")
    seq = SeqOptions(delta=args.delta, confidence=args.confidence, min_blocks=args.min_blocks,
                     max_blocks=args.max_blocks, budget_s=args.budget, seed=args.seed, rotate=args.rotate,
                     restart=args.restart)
    cases = list(args.case)
    if not (cases or args.tag or args.model):
        args.tag = ["default"]
    opts = AbOptions(cases=cases, tags=list(args.tag), models=list(args.model), sets=list(args.set),
                     config=os.path.abspath(args.config) if args.config else None, size=size, batch=args.batch,
                     nproc=args.nproc, device=None if device == "cpu" else device, steps=args.steps,
                     trial_warmup=args.trial_warmup, warmup=args.warmup, check=not args.no_check,
                     check_steps=args.check_steps, timeout=args.timeout, seq=seq, python=args.python)
    return inject_from_env(opts)


def _terminate_cleanly() -> None:
    """SIGTERM (a CI job cancelled) unwinds like Ctrl-C, so worktrees and servers are removed."""
    def handler(signum, frame):
        raise KeyboardInterrupt

    try:
        signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        pass


def main(args) -> int:
    from ..ab.client import TrialError
    from ..ab.trials import AbInputError, format_table, run_ab
    from ..ab.worktrees import RevisionError

    _terminate_cleanly()
    say = (lambda m: print(m, file=sys.stderr, flush=True)) if args.json else (lambda m: print(m, flush=True))
    try:
        opts = options(args)
        report = run_ab(args.repo, args.base, args.head, opts, say)
    except (AbInputError, RevisionError, ValueError) as exc:
        print(f"fleetbench ab: error: {exc}", file=sys.stderr)
        return 2
    except TrialError as exc:
        print(f"fleetbench ab: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        from ..results.records import jsonable

        print(json.dumps(jsonable(report.to_dict()), indent=1, allow_nan=False))
    else:
        print()
        print(format_table(report))
        for w in report.warnings:
            print(f"warning: {w}", file=sys.stderr)
        if report.failures:
            print(f"\nab gate: FAIL ({len(report.failures)})")
            for f in report.failures:
                print(f"  {f}")
        else:
            print(f"\nab gate: ok (margin ±{opts.seq.delta:.0%}, {opts.seq.confidence:.0%} interval)")
    return report.exit_code
