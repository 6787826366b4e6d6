"""`fleetbench history`: the change-point alerts' command line (its --help: ``ABOUT``); the fit is
``suite.ab.history``'s."""
from __future__ import annotations

from ..ab.history import report
from . import helps

# --help's description: what the command does, for its users (the docstring above is for developers)
ABOUT = """`fleetbench history`: change-point alerts over each case's stored asv series.

Each case's nightly series (one point per commit) is fitted with asv's own step detection, each point
weighted by its interval, as the dashboard does; an alert is an upward step larger than --threshold whose
new level has lasted --persist nights.  Exit 0 no alert, 1 at least one alert (the nightly reports it; its
gate does not read it), 2 unusable input."""


def add_parser(sub) -> None:
    p = sub.add_parser("history", help="history alerts: asv's step detection over each case's nightly series "
                                       "(exit 1 on an alert; reported by the nightly, never its gate)",
                       **helps(ABOUT, """
                           fleetbench history --machine 4xNVIDIA-A100-SXM4-80GB
                           fleetbench history --machine cpu-2xAMD-EPYC --persist 3 --markdown alerts.md"""))
    p.add_argument("--results", default="results/asv", help="asv results directory (default results/asv)")
    p.add_argument("--machine", required=True, help="asv machine name (`fleetbench machine-name`)")
    p.add_argument("--persist", type=int, default=2, help="nights a new level must last before it alerts (default 2)")
    p.add_argument("--threshold", type=float, default=0.05, help="smallest relative step that alerts (default 0.05)")
    p.add_argument("--markdown", help="also write the alerts here")
    p.set_defaults(func=main)


def main(args) -> int:
    return report(args.results, args.machine, args.persist, args.threshold, args.markdown)
