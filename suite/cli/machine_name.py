"""`fleetbench machine-name`: asv's machine name for this host (the GPU model and count, or the CPU's)."""
from __future__ import annotations

from ..measure.metadata import machine_name
from . import helps


def add_parser(sub) -> None:
    p = sub.add_parser("machine-name", help="print asv's machine name for this host (GPU model and count, or CPU)",
                       **helps(__doc__, """
                           fleetbench machine-name
                           asv machine --machine "$(fleetbench machine-name)" --yes"""))
    p.set_defaults(func=main)


def main(args) -> int:
    print(machine_name())
    return 0
