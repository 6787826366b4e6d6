"""`fleetbench`: one sub-command per module in this package (run, config, figures, …)."""
from __future__ import annotations

import argparse
import importlib
import sys

from .. import __version__
from ..config import ConfigError
from ..measure.metadata import git_info
from ..outputs import InputError, OutputError
from . import error

# Sub-commands: name -> module in suite.cli (each has add_parser(subparsers) and main(args) -> int).
COMMANDS = {
    "run": "suite.cli.run",
    "config": "suite.cli.config_cmd",
    "figures": "suite.cli.figures",
    "compare": "suite.cli.compare",
    "report": "suite.cli.report",
    "comm": "suite.cli.comm",
    "cluster": "suite.cli.cluster_cmd",
    "predict": "suite.cli.predict",
    "doctor": "suite.cli.doctor",
    "ab": "suite.cli.ab",
    "bisect": "suite.cli.bisect",
    "asv-offline": "suite.cli.asv_offline",
    "history": "suite.cli.history",
    "nightly": "suite.cli.nightly",
    "machine-name": "suite.cli.machine_name",
    "trial-server": "suite.cli.trial_server",  # hidden: one revision's side of `ab` (JSON lines)
}


def version_line() -> str:
    """``fleetbench 0.1.0, commit 0123456789ab`` (and whether the checkout has uncommitted changes)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        text = f"fleetbench {version('fleetbench')}"
    except PackageNotFoundError:
        text = f"fleetbench {__version__} (not installed)"
    git = git_info()
    commit = git.get("commit")
    if not commit:
        return text + ", commit unknown (not a git checkout)"
    return text + f", commit {commit[:12]}" + (" with uncommitted changes" if git.get("dirty") else "")


class _Version(argparse.Action):
    """``--version``: the line is computed only when asked (it runs git)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest, nargs=0, default=default, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(version_line())
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fleetbench",
        description="Benchmarks and correctness checks of Paddle Fleet's data-parallel strategies on PyTorch.",
    )
    parser.add_argument("--version", action=_Version, help="the package version and the git commit, then exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMANDS.values():
        importlib.import_module(module).add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 2

    try:
        return int(args.func(args) or 0)
    except (ConfigError, OutputError, InputError) as exc:  # an output or input found unusable late: one line too
        return error(args.command, exc)
    except KeyboardInterrupt:
        kept = "; finished cases are kept in the results file" if args.command == "run" else ""
        print(f"fleetbench {args.command}: interrupted{kept}", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
