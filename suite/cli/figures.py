"""`fleetbench figures NAME`: the benchmark figures a strategy reports (Markdown tables).

Each figure set is a module ``suite.figures.NAME`` with ``DESCRIPTION`` and
``run(pool, args) -> str`` (Markdown).  They measure variants interleaved in one process
group (``suite.measure.timing``), never one run against another made minutes apart.
"""
from __future__ import annotations

import importlib
import pkgutil
import sys


def available() -> list[str]:
    import suite.figures as pkg

    return sorted(m.name for m in pkgutil.iter_modules(pkg.__path__) if not m.name.startswith("_"))


def add_parser(sub) -> None:
    p = sub.add_parser("figures", help="produce a strategy's benchmark figures (Markdown)")
    p.add_argument("name", nargs="?", help="figure set; omit to list them")
    p.add_argument("--nproc", type=int, default=2, help="ranks (default 2)")
    p.add_argument("--rounds", type=int, default=7, help="interleaved rounds (default 7)")
    p.add_argument("--steps", type=int, default=5, help="steps per timed window (default 5)")
    p.add_argument("--out", help="also write the Markdown here")
    p.add_argument("--timeout", type=float, default=1800.0, help="bound on each multi-rank call, seconds")
    p.add_argument("--raw", metavar="FILE", help="render kept measurements (a figure's raw JSON) with the current "
                   "code instead of measuring (figures with render_kept: cluster)")
    p.add_argument("--recheck", action="store_true", help="with --raw: measure again the rows the figure "
                   "flags (cluster: outside 15%%; needs root) and add them to FILE")
    p.set_defaults(func=main)


def main(args) -> int:
    names = available()
    if not args.name:
        for n in names:
            print(f"{n:16s} {importlib.import_module('suite.figures.' + n).DESCRIPTION}")
        return 0
    if args.name not in names:
        print(f"fleetbench figures: error: figure set {args.name!r} is unknown; allowed: {', '.join(names)}",
              file=sys.stderr)
        return 2
    from .checks import check_nproc, check_number, unwritable

    problem = (check_nproc(args.nproc) or check_number("--rounds", args.rounds, minimum=1, maximum=10**5)
               or check_number("--steps", args.steps, minimum=1, maximum=10**6)
               or check_number("--timeout", args.timeout, above=0.0, maximum=7 * 86400.0, unit="seconds")
               or (f"--out {args.out!r}: {unwritable(args.out)}" if args.out and unwritable(args.out) else None))
    if problem:  # before any rank starts
        print(f"fleetbench figures: error: {problem}", file=sys.stderr)
        return 2
    module = importlib.import_module("suite.figures." + args.name)
    if args.raw:
        if not hasattr(module, "render_kept"):
            print(f"fleetbench figures: error: --raw: figure set {args.name!r} cannot render kept measurements",
                  file=sys.stderr)
            return 2
        print(module.render_kept(args.raw, args.recheck))
        return 0
    from ..measure.metadata import machine_line
    from ..runtime import RankPool

    if not getattr(module, "USES_POOL", True):  # the figure starts its own processes (e.g. ab's trial servers)
        text = module.run(None, args)
    else:
        with RankPool(args.nproc, timeout=args.timeout) as pool:
            text = module.run(pool, args)
    text = f"{text}\n\n_{machine_line(args.nproc)}_\n"
    print(text)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text)
    return 0
