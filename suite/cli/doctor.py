"""`fleetbench doctor`: a first-run self-check of the CPU/GPU paths (see ``suite.doctor``)."""
from __future__ import annotations

import sys


def add_parser(sub) -> None:
    p = sub.add_parser("doctor", help="self-check in under 2 minutes: every communication, reader, timing and "
                                      "error path with exact checks; a table of pass / fail / not applicable")
    p.add_argument("--nproc", type=int, default=None,
                   help="ranks (default: every GPU torch sees on CUDA, 4 on CPU)")
    p.add_argument("--device", choices=["cpu", "cuda"], default=None,
                   help="default: cuda where torch sees a GPU, else cpu")
    p.add_argument("--hang-timeout", type=float, default=30.0,
                   help="seconds the hierarchical-overlap item may take before it counts as a hang (default 30)")
    p.add_argument("--json", action="store_true", help="print the report as JSON instead of the table")
    p.set_defaults(func=main)


def main(args) -> int:
    from ..config import ConfigError
    from ..doctor import format_table, run_doctor, to_json
    from ..runtime.device import CudaUnavailable
    from .ab import _terminate_cleanly
    from .checks import check_nproc, check_number

    _terminate_cleanly()  # SIGTERM (a CI cancel) unwinds like Ctrl-C: the pool and temp dirs are removed

    problem = ((check_nproc(args.nproc, args.device) if args.nproc is not None else None)
               or check_number("--hang-timeout", args.hang_timeout, above=0.0, maximum=86400.0, unit="seconds"))
    if problem:
        raise ConfigError(problem)
    progress = None if args.json else (lambda item: print(f"  {item.status:<20} {item.item}", file=sys.stderr,
                                                          flush=True))
    try:
        report = run_doctor(args.nproc, args.device, args.hang_timeout, on_item=progress)
    except CudaUnavailable as exc:
        raise ConfigError(str(exc)) from None
    print(to_json(report) if args.json else format_table(report), flush=True)
    return 0 if report.ok else 1
