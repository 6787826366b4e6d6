"""`fleetbench`: one sub-command per module in this package (run, config, figures, …)."""
from __future__ import annotations

import argparse
import contextlib
import errno
import importlib
import os
import signal
import sys
import uuid

from .. import __version__
from ..config import ConfigError
from ..measure.metadata import git_info
from ..outputs import InputError, OutputError
from ..results.records import plain
from ..runtime.pool import remove_stale
from ..runtime.spawn import RUN_TOKEN, sweep
from . import error, shorten, terminate_cleanly

# Sub-commands: name -> module in suite.cli (each has add_parser(subparsers) and main(args) -> int).
COMMANDS = {
    "run": "suite.cli.run",
    "config": "suite.cli.config_cmd",
    "figures": "suite.cli.figures",
    "compare": "suite.cli.compare",
    "report": "suite.cli.report",
    "comm": "suite.cli.comm",
    "cluster": "suite.cli.cluster_cmd",
    "doctor": "suite.cli.doctor",
    "ab": "suite.cli.ab",
    "bisect": "suite.cli.bisect",
    "asv-offline": "suite.cli.asv_offline",
    "history": "suite.cli.history",
    "nightly": "suite.cli.nightly",
    "machine-name": "suite.cli.machine_name",
    "trial-server": "suite.cli.trial_server",  # hidden: one revision's side of `ab` (JSON lines)
    "gpu-check": "suite.cli.gpu_check",
}
# Commands that must start without torch, so main() builds only their parser (no other command module imported):
# the command -> the COMMANDS entry that declares it.  The GPU check picks the interpreter the others then run
# under; torchrun-probe (doctor's torchrun job) sets its parent-death signal first thing, not after seconds of
# imports (a killed doctor leaves no rank importing on its own).
TORCH_FREE = {"gpu-check": "gpu-check", "torchrun-probe": "doctor"}


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


class _Parser(argparse.ArgumentParser):
    """argparse's parser whose errors (exit 2) quote at most :data:`MAX_ERROR_CHARS` of the input."""

    def error(self, message: str):
        super().error(shorten(message))


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """Every sub-command's parser (``only``: that one alone, its module the only one imported)."""
    parser = _Parser(
        prog="fleetbench",
        description="Benchmarks and correctness checks of Paddle Fleet's data-parallel strategies on PyTorch.",
    )
    parser.add_argument("--version", action=_Version, help="the package version and the git commit, then exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module in COMMANDS.items():
        if only is None or name == only:
            importlib.import_module(module).add_parser(sub)
    return parser


# commands that start processes (ranks, servers, stages): each needs files for its pipes, queues and libraries
STARTS_PROCESSES = {"run", "figures", "comm", "cluster", "doctor", "ab", "bisect", "nightly",
                    "trial-server"}
MIN_OPEN_FILES = 256


def _nofile() -> tuple[int, int]:
    import resource

    return resource.getrlimit(resource.RLIMIT_NOFILE)


def enough_open_files(command: str) -> None:
    """The open-file limit raised to what the command needs where the hard limit allows (:data:`MIN_OPEN_FILES`),
    else a ConfigError saying so, before anything starts (a rank or a pipe failing half-way is a traceback)."""
    import resource

    soft, hard = _nofile()
    if soft == resource.RLIM_INFINITY or soft >= MIN_OPEN_FILES:
        return
    want = MIN_OPEN_FILES if hard == resource.RLIM_INFINITY else min(hard, 4096)
    if want > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (ValueError, OSError):
            pass
    if soft < MIN_OPEN_FILES:
        raise ConfigError(f"the open-file limit is {soft} (`ulimit -n`, hard limit {hard}); fleetbench {command} needs "
                          f"at least {MIN_OPEN_FILES} (its ranks' pipes, queues and libraries): `ulimit -n "
                          f"{MIN_OPEN_FILES}` first")


def _drop_stdout() -> None:
    """stdout pointed at /dev/null: the interpreter's last flush at exit finds no closed pipe to complain about."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # not a real file (a test's capture)
        pass


def _quiet_interrupts(unraisable) -> None:
    """``sys.unraisablehook`` while a command runs: a Ctrl-C that lands in a callback the interpreter cannot raise
    from (importlib's module-lock callback) is the one line main() prints, not "Exception ignored in …"."""
    if not issubclass(unraisable.exc_type, KeyboardInterrupt):
        sys.__unraisablehook__(unraisable)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    sys.unraisablehook = _quiet_interrupts
    try:  # a Ctrl-C while the command's modules import (torch: seconds) is one line too
        parser = build_parser(TORCH_FREE.get(argv[0]) if argv else None)
        args = parser.parse_args(argv)
    except KeyboardInterrupt:
        print(f"fleetbench{' ' + argv[0] if argv and not argv[0].startswith('-') else ''}: interrupted",
              file=sys.stderr)
        return 130
    if not args.command:
        parser.print_help()
        return 2

    ours = args.command in STARTS_PROCESSES
    saved_token, saved_term = os.environ.get(RUN_TOKEN), signal.getsignal(signal.SIGTERM)
    token = uuid.uuid4().hex
    try:
        if ours:
            enough_open_files(args.command)
            os.environ[RUN_TOKEN] = token  # every process this command starts, and theirs, carry it (sweep below)
            if args.command != "trial-server":  # ab stops its servers itself
                terminate_cleanly()  # SIGTERM unwinds like Ctrl-C: pools, servers, temp dirs removed, records kept
            remove_stale()  # temp directories of dead runs (their owner's lock is free) in TMPDIR
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # a reader gone (`| head`) is found here, not in the interpreter's exit
        return code
    except (ConfigError, OutputError, InputError) as exc:  # an output or input found unusable late: one line too
        return error(args.command, exc)
    except BrokenPipeError:  # `fleetbench run --list | head -3`: the reader is gone, there is no one to tell
        _drop_stdout()
        return 141  # 128 + SIGPIPE, as a shell reports a command a closed pipe stopped
    except OSError as exc:
        if exc.errno != errno.EMFILE:
            raise
        return error(args.command, f"too many open files ({exc.strerror}): the limit is {_nofile()[0]} (`ulimit -n`); "
                                   f"raise it to at least {MIN_OPEN_FILES}")
    except KeyboardInterrupt:
        kept = "; finished cases are kept in the results file" if args.command == "run" else ""
        print(f"fleetbench {args.command}: interrupted{kept}", file=sys.stderr)
        return 130
    finally:
        if ours:
            _sweep(args.command, token)
            if saved_token is None:
                os.environ.pop(RUN_TOKEN, None)
            else:
                os.environ[RUN_TOKEN] = saved_token
            with contextlib.suppress(ValueError, TypeError):  # not the main thread; a handler set from C
                signal.signal(signal.SIGTERM, saved_term)


def _sweep(command: str, token: str) -> None:
    """What the command started and left running: killed where it is below this process; what went off into a
    session of its own (a daemon a user's code started) named on stderr, with how to stop it."""
    try:
        away = sweep(token)
    except Exception:  # noqa: BLE001 - the sweep never turns a finished command into a failure
        return
    if away:
        shown = ", ".join(f"{plain(name)} (pid {pid})" for pid, name in away[:20])
        print(f"fleetbench {command}: warning: {len(away)} process(es) started during this command outlived it in a "
              f"session of their own (started by your code, e.g. a daemon): {shown}; `kill "
              f"{' '.join(str(p) for p, _ in away[:20])}` stops them", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
