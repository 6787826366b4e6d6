"""Every `fleetbench` sub-command's --help: a description, an example that is a real `fleetbench` invocation
(it parses), help text for every option; `ab`, `bisect`, `compare` and `nightly` list their exit codes 0-3."""
from __future__ import annotations

import argparse
import os
import re
import shlex
from pathlib import Path

import pytest

from suite.cli.main import COMMANDS, build_parser

HIDDEN = {"trial-server", "torchrun-probe"}  # protocol servers and a probe job, not for people
GATES = ("ab", "bisect", "compare", "nightly")


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


PARSER = build_parser()
SUBS = _subcommands(PARSER)
NAMES = sorted(set(SUBS) - HIDDEN)


def test_every_command_of_the_registry_is_checked():
    assert set(COMMANDS) - {"trial-server"} <= set(NAMES) and "torchrun-probe" in SUBS
    assert not {"ab", "report", "comm"} - set(NAMES)


def test_the_side_projects_commands_and_options_are_gone():
    """The cost model (`predict`, `cluster extrapolate`, `comm --calibrate`) and the gate's calibration (`figures
    gate`, the injected slowdown, one preparation per side) left the package (experiments/README.md): no command,
    action or option of theirs is left, nor named in a --help."""
    assert "predict" not in SUBS
    assert set(_subcommands(SUBS["cluster"])) == {"up", "down", "cleanup", "status"}
    texts = {name: SUBS[name].format_help() for name in NAMES}
    for name, text in texts.items():
        for gone in ("predict", "--calibrat", "extrapolat", "inject", "INJECT", "--min-blocks", "figures gate",
                     "figures cluster", "cost model"):
            assert gone not in text, (name, gone)
    assert "--rotate" in texts["ab"] and "--rotate" in texts["bisect"]  # ab's rotation stays, N >= 2
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
    assert len(readme.split()) < 2000, len(readme.split())  # as `wc -w` counts
    for gone in ("predict", "--calibrate", "extrapolate", "figures gate", "figures cluster", "INJECT", "experiments"):
        assert gone not in readme, gone


def _examples(text: str) -> list[str]:
    """The lines of the examples section of a --help: each a `fleetbench ...` command."""
    _, sep, tail = text.partition("examples:\n")
    assert sep, "no 'examples:' section"
    lines = []
    for line in tail.splitlines():
        if not line.strip():
            break
        lines.append(line.strip())
    return lines


@pytest.mark.parametrize("name", NAMES)
def test_help_has_a_description_an_example_that_parses_and_help_for_every_option(name):
    sub = SUBS[name]
    text = sub.format_help()
    assert sub.description and len(sub.description.split()) >= 5, f"{name}: no description"
    examples = _examples(text)
    assert examples, f"{name}: no example"
    commands = 0
    for line in examples:  # a line may chain commands with && (e.g. `asv publish && fleetbench asv-offline ...`)
        for part in line.split("&&"):
            argv = shlex.split(part)
            if argv[:1] != ["fleetbench"]:
                continue
            argv = argv[:next((i for i, t in enumerate(argv) if t in (">", "|")), len(argv))]
            assert argv[1:2] == [name], f"{name}: example {line!r} runs another command"
            try:
                args = PARSER.parse_args(argv[1:])
            except SystemExit as exc:  # argparse's error exit
                raise AssertionError(f"{name}: example {line!r} does not parse (exit {exc.code})") from None
            assert args.command == name
            commands += 1
    assert commands, f"{name}: no example is a `fleetbench {name}` command: {examples}"
    parsers = [(name, sub)] + [(f"{name} {n}", p) for n, p in _subcommands(sub).items()]
    for where, p in parsers:
        assert p.description, f"{where}: no description"
        for action in p._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            label = "/".join(action.option_strings) or action.dest
            assert action.help and action.help != argparse.SUPPRESS and action.help.strip(), \
                f"{where}: {label} has no help text"


@pytest.mark.parametrize("name", GATES)
def test_gate_commands_list_their_exit_codes(name):
    text = SUBS[name].format_help()
    section = text.partition("exit codes")[2]
    assert section, f"{name}: no exit-code table"
    for code in range(4):
        assert re.search(rf"^\s+{code}\s+\S", section, re.M), f"{name}: exit code {code} not listed:\n{section}"


@pytest.mark.parametrize("name", ("ab", "bisect", "compare"))
def test_the_comparing_commands_list_their_verdicts(name):
    text = SUBS[name].format_help()
    assert "verdicts" in text
    words = {"ab": ("not slower", "slower", "faster", "same", "inconclusive", "identical"),
             "bisect": ("bad", "good", "inconclusive"),
             "compare": ("not slower", "slower", "faster", "undecided", "identical")}
    for word in words[name]:
        assert re.search(rf"\b{word}\b", text.partition("verdicts")[2]), f"{name}: verdict {word!r} not listed"


DEVELOPER = re.compile(r"``|:(class|func|meth|mod):|\bsuite[./][a-z]|\bthis module\b|\bdataclass\b")


@pytest.mark.parametrize("name", NAMES)
def test_descriptions_are_for_users_not_developers(name):
    """A --help describes what the command does; which module or class implements it is the docstring's."""
    sub = SUBS[name]
    for where, p in [(name, sub)] + [(f"{name} {n}", p) for n, p in _subcommands(sub).items()]:
        found = DEVELOPER.search(p.description or "")
        assert not found, f"{where}: --help's description has {found.group()!r}:\n{p.description}"
    assert "speedup stated as speedup" not in sub.format_help()


def test_compare_threshold_help_quotes_the_figures_it_cites():
    """`compare --help` once said "10% gave 21% false alarms over unchanged reruns, 25% none", which no figure
    supports: the rates it quotes are those of docs/figures/gate.md section 1's `compare` tables, which it cites."""
    from pathlib import Path

    help_text = " ".join(next(a.help for a in SUBS["compare"]._actions if "--threshold" in a.option_strings)
                         .replace("%%", "%").split())
    assert "docs/figures/gate.md" in help_text and "section 1" in help_text, help_text
    doc = (Path(__file__).resolve().parent.parent / "docs" / "figures" / "gate.md").read_text()
    section = doc.partition("\n## 1.")[2].partition("\n## 2.")[0]
    tables = section.partition("#### `fleetbench compare` on separate runs")[2]
    assert tables, "docs/figures/gate.md section 1 has no compare table"
    quoted = 0
    for line in tables.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| 10% |") or line.startswith("| 25% |"):
            false_alarms = cells[1].split()[0]  # "1.2% (25/2000) [0.8, 1.8]" -> "1.2%"
            assert false_alarms in help_text, (line, help_text)
            quoted += 1
    assert quoted == 4, tables  # two cases, two thresholds
    assert "21%" not in help_text, help_text


def test_fleetbench_help_imports_no_torch():
    """`fleetbench --help` took 3-7 s because every command's module imported torch to build its parser (issue 46.9):
    every parser is built with torch unimported (it comes when a command runs); the time itself is a figure in the
    note, never asserted."""
    import subprocess
    import sys

    code = ("import sys\nfrom suite.cli.main import build_parser, main\nbuild_parser()\n"
            "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith('torch'))[:5]\n"
            "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\nassert 'torch' not in sys.modules\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "run" in proc.stdout and "nightly" in proc.stdout  # the commands listed
