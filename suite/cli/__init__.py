"""cli: one module per `fleetbench` sub-command (suite/cli/main.py lists them)."""
from __future__ import annotations

import argparse
import json
import signal
import sys
import textwrap

from ..results.records import jsonable

# The one exit-code table of compare, ab, bisect and nightly (each command says what each code means for it).
GATE_CODES = {0: "ok: nothing slower (not slower by the threshold, same, faster or identical)", 1: "regression",
              2: "unusable input (named: file, line, option)",
              3: "undecided: inconclusive, and nothing worse"}


def helps(doc: str | None, examples: str, verdicts: str = "", codes: dict[int, str] | None = None) -> dict:
    """``add_parser`` keywords for a sub-command's --help: ``doc`` as the description, then its verdicts, exit
    codes and ``examples`` (one ``fleetbench ...`` command a line) as the epilog, line breaks kept
    (tests/test_help.py reads them).  ``doc`` is for the command's users: what it does, in their terms; a
    module whose docstring is for developers (names modules, classes) gives its own ``ABOUT`` instead."""
    parts = []
    if verdicts:
        parts.append("verdicts:\n" + textwrap.indent(textwrap.fill(verdicts, 100), "  "))
    if codes:
        parts.append("exit codes (the table compare, ab, bisect and nightly share):\n"
                     + "\n".join(textwrap.fill(v, 100, initial_indent=f"  {k}  ", subsequent_indent="     ")
                                 for k, v in sorted(codes.items())))
    parts.append("examples:\n" + textwrap.indent(textwrap.dedent(examples).strip(), "  "))
    return dict(description=textwrap.dedent(doc or "").strip(), epilog="\n\n".join(parts),
                formatter_class=argparse.RawDescriptionHelpFormatter)


MAX_ERROR_CHARS = 1000  # a refusal names the input; it does not echo a megabyte of it


def shorten(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    """``text`` cut to about ``limit`` characters, saying how many were left out (its start and end kept)."""
    text = str(text)
    if len(text) <= limit:
        return text
    keep = limit - 80
    return f"{text[: keep * 3 // 4]} … [{len(text) - keep} characters left out] … {text[-(keep // 4):]}"


def error(command: str, message) -> int:
    """``fleetbench COMMAND: error: MESSAGE`` on stderr (one line; a huge message shortened, :func:`shorten`);
    returns 2, the exit code of unusable input."""
    print(f"fleetbench {command}: error: {shorten(message)}", file=sys.stderr)
    return 2


def print_json(doc) -> None:
    """A --json document on stdout: strict JSON (no NaN), one level of indentation."""
    print(json.dumps(jsonable(doc), indent=1, allow_nan=False))


def unwind(signum, frame):
    """A signal handler: the signal (SIGTERM, a CI job cancelled) unwinds like Ctrl-C."""
    raise KeyboardInterrupt


def terminate_cleanly() -> None:
    """SIGTERM (a CI job cancelled) unwinds like Ctrl-C, so worktrees, pools and servers are removed."""
    try:
        signal.signal(signal.SIGTERM, unwind)
    except ValueError:  # not the main thread
        pass
