"""`fleetbench doctor`: the self-check's command line (its --help: ``ABOUT``); the items are ``suite.doctor``'s."""
from __future__ import annotations

import os
import signal
import sys
from dataclasses import dataclass

from ..config import ConfigError
from ..doctor_report import Item, Report, end_line, format_table, head_line, item_line
from ..outputs import OutputDir, claimed_stdout, output_problem
from ..report import junit
from ..run_spec import DEVICES
from ..runtime.spawn import set_parent_death_signal
from ..validate import spec
from . import helps, terminate_cleanly
from .checks import require_nproc
from .options import add_fields, add_shared, from_args


@dataclass(frozen=True)
class DoctorOptions:
    """doctor's own options, each declared once (flag, default, help and bounds: checked by ``from_args``)."""

    device: str | None = spec(None, "default: cuda where torch sees a GPU, else cpu", choices=DEVICES)
    hang_timeout: float = spec(30.0, "seconds the hierarchical-overlap item may take before it counts as a hang "
                               "(default 30)", gt=0.0, le=86400.0, unit="seconds")

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
    add_shared(p, nproc="ranks (default: every GPU torch sees on CUDA, 4 on CPU)")
    add_fields(p, DoctorOptions)
    p.add_argument("--json", nargs="?", const="-", metavar="FILE",
                   help="the report as JSON lines instead of the table, one line per item as it ends (a doctor "
                        "stopped half-way keeps what ended): into FILE, or on stdout without one; the ranks' and "
                        "NCCL's output goes to stderr, never into it")
    p.add_argument("--junit", metavar="FILE", help="also write the items as JUnit XML (CI systems' test view): "
                                                   "pass, failure, or skipped with the reason it does not apply")
    p.set_defaults(func=main)
    # hidden (no help=): the job doctor's torchrun item starts under torchrun
    probe = sub.add_parser("torchrun-probe", description="the error-path job of doctor's torchrun item")
    probe.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    probe.set_defaults(func=_probe)


def main(args) -> int:
    from ..doctor import run_doctor
    from ..runtime.device import CudaUnavailable

    terminate_cleanly()  # SIGTERM (a CI cancel) unwinds like Ctrl-C: the pool and temp dirs are removed

    opts = from_args(DoctorOptions, args)
    require_nproc(args.nproc, opts.device)
    if args.junit is not None and (why := junit.path_problem("--junit", args.junit)):
        raise ConfigError(why)
    if args.json not in (None, "-") and (why := output_problem(args.json)):
        raise ConfigError(f"--json {args.json}: {why}")
    # stdout is the result's alone: the ranks (started below) and NCCL in them print on stderr
    with claimed_stdout() as result:
        sink = JsonLines(args.json, result) if args.json is not None else None

        def ended(item: Item) -> None:
            print(f"  {item.status:<20} {item.item}", file=sys.stderr, flush=True)
            if sink is not None:
                sink.item(item)

        try:
            report = run_doctor(args.nproc, opts.device, opts.hang_timeout, on_item=ended,
                                on_start=sink.start if sink else None)
        except CudaUnavailable as exc:
            raise ConfigError(str(exc)) from None
        if sink is not None:
            sink.end(report)
        else:
            print(format_table(report), file=result, flush=True)
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


class JsonLines:
    """``--json``'s stream: each line written as it is known, into FILE (written whole line by line through
    suite.outputs, never through a link) or onto the claimed stdout."""

    def __init__(self, path: str, stdout):
        self.path, self.stdout = path, stdout

    def _write(self, text: str, first: bool = False) -> None:
        if self.path == "-":
            self.stdout.write(text)
            self.stdout.flush()
            return
        folder, name = os.path.split(os.path.abspath(self.path))
        with OutputDir(folder) as out:
            if first:
                out.write(name, text)  # last run's report replaced by this one's head
            else:
                out.append(name, text)

    def start(self, report: Report) -> None:
        self._write(head_line(report), first=True)

    def item(self, item: Item) -> None:
        self._write(item_line(item))

    def end(self, report: Report) -> None:
        self._write(end_line(report))


def _probe(args) -> int:
    # Dead with torchrun from the start: the parent-death signal set before suite.doctor's import of torch (seconds
    # on a loaded machine), so a killed doctor (whose torchrun dies with it) leaves no rank importing on its own.
    parent = os.getppid()
    set_parent_death_signal(signal.SIGKILL)
    if parent == 1 or os.getppid() != parent:  # torchrun is gone already
        os._exit(3)
    from ..doctor import torchrun_probe_main

    return torchrun_probe_main(args.device)
