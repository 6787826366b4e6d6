"""`fleetbench trial-server` (hidden): one revision's side of `fleetbench ab` (JSON lines on stdin/stdout).

Not for people: `fleetbench ab` starts it in each revision's worktree; see suite/ab/protocol.py.
"""
from __future__ import annotations

from ..ab.server import serve
from .options import default


def add_parser(sub) -> None:
    p = sub.add_parser("trial-server",  # no help=: argparse then leaves it out of `fleetbench --help`
                       description="JSON-lines trial server used by `fleetbench ab` (suite/ab/protocol.py)")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--timeout", type=float, default=default("timeout", "ab"))  # the spec's defaults, stated there
    p.add_argument("--pg-timeout", type=float, default=default("pg_timeout"))
    p.add_argument("--device", choices=("cpu", "cuda"), default=None)
    p.set_defaults(func=main)


def main(args) -> int:
    return serve(args.nproc, timeout=args.timeout, pg_timeout=args.pg_timeout, device=args.device)
