"""`fleetbench doctor`: the self-check's command line (its --help: ``ABOUT``); the items are ``suite.doctor``'s."""
from __future__ import annotations

import os
import signal
import sys

from ..config import ConfigError
from ..report import junit
from ..runtime.spawn import set_parent_death_signal
from . import helps, terminate_cleanly
from .checks import require_nproc, require_seconds
from .options import add_shared

# --help's description: what the command does, for its users (the docstring above is for developers)
ABOUT = """`fleetbench doctor`: a first-run self-check of the CPU and GPU paths.

In under two minutes it exercises every path that differs between CPU and GPU (each communicator's
allreduce, half-precision allreduce, bucketed and hierarchical overlap, the reader's device copy, the
step clocks, NVML, the torchrun error path) with exact checks, and prints one row per item: pass, fail,
or "not applicable here" with the reason.  Exit 0 when nothing failed, 1 when an item failed, 2 on
unusable options."""


def add_parser(sub) -> None:
    p = sub.add_parser("doctor", help="self-check in under 2 minutes: every communication, reader, timing and "
                                      "error path with exact checks; a table of pass / fail / not applicable",
                       **helps(ABOUT, """
                           fleetbench doctor
                           fleetbench doctor --device cuda --nproc 8 --json"""))
    add_shared(p, nproc="ranks (default: every GPU torch sees on CUDA, 4 on CPU)", device=None)
    p.add_argument("--hang-timeout", type=float, default=30.0,
                   help="seconds the hierarchical-overlap item may take before it counts as a hang (default 30)")
    p.add_argument("--json", action="store_true", help="print the report as JSON instead of the table")
    p.add_argument("--junit", metavar="FILE", help="also write the items as JUnit XML (CI systems' test view): "
                                                   "pass, failure, or skipped with the reason it does not apply")
    p.set_defaults(func=main)
    # hidden (no help=): the job doctor's torchrun item starts under torchrun
    probe = sub.add_parser("torchrun-probe", description="the error-path job of doctor's torchrun item")
    probe.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    probe.set_defaults(func=_probe)


def main(args) -> int:
    from ..doctor import format_table, run_doctor, to_json
    from ..runtime.device import CudaUnavailable

    terminate_cleanly()  # SIGTERM (a CI cancel) unwinds like Ctrl-C: the pool and temp dirs are removed

    require_nproc(args.nproc, args.device)
    require_seconds("--hang-timeout", args.hang_timeout, 86400.0)
    if args.junit is not None and (why := junit.path_problem("--junit", args.junit)):
        raise ConfigError(why)
    progress = None if args.json else (lambda item: print(f"  {item.status:<20} {item.item}", file=sys.stderr,
                                                          flush=True))
    try:
        report = run_doctor(args.nproc, args.device, args.hang_timeout, on_item=progress)
    except CudaUnavailable as exc:
        raise ConfigError(str(exc)) from None
    print(to_json(report) if args.json else format_table(report), flush=True)
    if args.junit is not None:
        suite = junit.Suite(f"fleetbench doctor ({report.platform}, {report.nproc} ranks)",
                            tuple(junit.doctor_cases(report.items)),
                            tuple((k, str(v)) for k, v in report.versions.items()))
        try:
            junit.write_junit(args.junit, [suite], name="fleetbench doctor")
        except OSError as exc:
            print(f"fleetbench doctor: --junit {args.junit}: not written ({exc})", file=sys.stderr, flush=True)
            return 1
    return 0 if report.ok else 1


def _probe(args) -> int:
    # Dead with torchrun from the start: the parent-death signal set before suite.doctor's import of torch (seconds
    # on a loaded machine), so a killed doctor (whose torchrun dies with it) leaves no rank importing on its own.
    parent = os.getppid()
    set_parent_death_signal(signal.SIGKILL)
    if parent == 1 or os.getppid() != parent:  # torchrun is gone already
        os._exit(3)
    from ..doctor import torchrun_probe_main

    return torchrun_probe_main(args.device)
