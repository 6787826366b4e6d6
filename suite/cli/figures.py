"""`fleetbench figures NAME`: the benchmark figures a strategy reports (Markdown tables).

Each figure set is a module ``suite.figures.NAME`` with ``DESCRIPTION`` and the figure contract

- ``Options``: a frozen dataclass of everything the figure takes (built here from the arguments: ``--nproc``,
  ``--rounds``, ``--steps`` and ``--timeout`` fill the fields of those names, each figure option below the field
  of its name; an option the figure has no field for is refused, naming the figures that take it);
- ``measure(options, pool) -> raw`` (JSON-able data; ``pool`` is None when the module sets ``USES_POOL = False``;
  ``--save FILE`` keeps it, ``--load FILE`` renders it again without measuring);
- ``render(raw, options) -> str`` (Markdown; statistics come from the package they belong to, e.g. the gate
  figure's from ``suite.ab.power``).

They measure variants interleaved in one process group (``suite.measure.timing``, or the runner), never one run
against another made minutes apart.
"""
from __future__ import annotations

import dataclasses
import importlib
import json
import os
import pkgutil
import sys

import suite.figures as figures_pkg

from ..measure.metadata import machine_line
from ..results.records import write_atomic
from . import error, helps, terminate_cleanly
from .checks import MAX_ROUNDS, MAX_STEPS, check_nproc, check_number, check_seconds, unwritable
from .options import add_shared


def _csv(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(float(x)) for x in _csv(text))


# Figure options: field -> (type, figures that take it, help).  Each fills the field of the same name in the
# figure's Options; an option left out keeps that figure's default.
FIGURE_OPTIONS: dict[str, tuple] = {
    "cases": (_csv, ("gate", "gate_sources"), "cases, comma-separated (default mlp/plain,resnet/plain)"),
    "blocks": (int, ("gate", "gate_sources"), "ABBA blocks per pair of servers (default 60)"),
    "regroup": (int, ("gate", "gate_sources"), "blocks per preparation (default 10; 0: one preparation per run)"),
    "pairs": (int, ("gate", "gate_sources"), "A/A pairs of servers per case (default 3)"),
    "slow_pairs": (int, ("gate",), "pairs per injected slowdown (default 2)"),
    "factors": (_csv, ("gate_sources",), "placement/layout factors, comma-separated (default: all of "
                "suite/ab/isolation.py's FACTORS)"),
    "calibration": (lambda t: tuple(float(x) for x in _csv(t)), ("gate_sources",),
                    "injected fractions to check against what the trials measure, comma-separated (e.g. 0.05,0.10); "
                    "measures only that"),
    "trials": (int, ("gate_sources",), "trials without and with the injection, for --calibration (default 60)"),
    "sims": (int, ("gate",), "simulated comparisons per measured pair (default 100)"),
    "rotate": (int, ("gate",), "the `ab --rotate` value simulated beside one preparation (default 5)"),
    "budget": (float, ("gate",), "ab's budget per simulated comparison, seconds (default 180)"),
    "size": (str, ("gate", "gate_sources", "workloads", "engine_cost"),
             "model size (gate: default tiny; workloads, engine_cost: default cpu)"),
    "memory_gb": (float, ("workloads",), "memory the ranks' engines may hold at once, GB (default: 60%% of the "
                  "available memory), which sets the timing groups"),
    "sizes": (_ints, ("cluster",), "allreduce sizes in bytes, comma-separated (default 1e6,4e6,16e6)"),
    "rates": (_csv, ("cluster",), "inter-node link rates, comma-separated (default 100mbit,1gbit)"),
    "shapes": (_csv, ("cluster",), "cluster shapes NxR, comma-separated (default 2x2,2x4)"),
    "models": (_csv, ("cluster", "engine_cost"), "models, comma-separated (cluster: default mlp,resnet,resnet50,gpt2; "
               "engine_cost: default mlp,resnet50,gpt2)"),
    "max_rounds": (int, ("engine_cost",), "the most rounds per model while the ratio's 95%% interval is wider than "
                   "0.05 (default 160)"),
    "profile_steps": (int, ("engine_cost",), "profiled steps of each side per model (default 5)"),
    "rechecks": (int, ("cluster",), "re-measurements of each row outside 15%% (default 2; with --load 0)"),
}
COMMON = ("nproc", "rounds", "steps", "timeout")
RAW = ("save", "load")  # every figure; a figure with fields of these names (gate, cluster) handles them itself


def available() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(figures_pkg.__path__) if not m.name.startswith("_"))


# --help's description: what the command does, for its users (the docstring above is for developers)
ABOUT = """`fleetbench figures NAME`: measure a strategy's benchmark figures and print them as Markdown tables.

Without NAME: the figure sets and what each shows.  --nproc, --rounds, --steps and --timeout apply to
every set; each figure option below names the sets that take it (another set refuses it).  --save FILE
keeps the measured data, --load FILE renders it again without measuring.  Variants are always measured
interleaved in the same ranks, never one run against another made minutes apart."""


def add_parser(sub) -> None:
    p = sub.add_parser("figures", help="produce a strategy's benchmark figures (Markdown)", **helps(ABOUT, """
        fleetbench figures
        fleetbench figures gate --out docs/figures/gate.md"""))
    p.add_argument("name", nargs="?", help="figure set; omit to list them")
    add_shared(p, nproc=dict(default=2, help="ranks (default 2)"),
               rounds=dict(default=7, help="interleaved rounds (default 7)"),
               steps=dict(default=5, help="steps per timed window (default 5)"))
    p.add_argument("--out", help="also write the Markdown here")
    add_shared(p, timeout=dict(default=1800.0, help="bound on each multi-rank call, seconds"))
    p.add_argument("--save", help="keep the figure's raw data here (JSON; gate and cluster rewrite it as they go)")
    p.add_argument("--load", help="render the raw data kept here instead of measuring (gate: measures the cases "
                   "the file lacks; cluster: with --rechecks N, measures its misses again)")
    g = p.add_argument_group("figure options (each taken only by the figures named)")
    for field, (kind, names, text) in FIGURE_OPTIONS.items():
        g.add_argument("--" + field.replace("_", "-"), dest=field, type=kind, default=None,
                       help=f"{', '.join(names)}: {text}")
    p.set_defaults(func=main)


def options_for(name: str, module, args):
    """The figure's ``Options`` from the arguments; a ValueError naming an option the figure does not take."""
    fields = {f.name for f in dataclasses.fields(module.Options)}
    given = {k: getattr(args, k) for k in FIGURE_OPTIONS if getattr(args, k, None) is not None}
    foreign = [k for k in given if k not in fields]
    if foreign:
        k = foreign[0]
        raise ValueError(f"--{k.replace('_', '-')} is an option of figures {', '.join(FIGURE_OPTIONS[k][1])}, "
                         f"not of figures {name}")
    return module.Options(**{k: getattr(args, k) for k in COMMON + RAW if k in fields}, **given)


def main(args) -> int:
    names = available()
    if not args.name:
        for n in names:
            print(f"{n:16s} {importlib.import_module('suite.figures.' + n).DESCRIPTION}")
        return 0
    if args.name not in names:
        return error("figures", f"figure set {args.name!r} is unknown; allowed: {', '.join(names)}")

    problem = (check_nproc(args.nproc) or check_number("--rounds", args.rounds, minimum=1, maximum=MAX_ROUNDS)
               or check_number("--steps", args.steps, minimum=1, maximum=MAX_STEPS)
               or check_seconds("--timeout", args.timeout)
               or (f"--out {args.out!r}: {unwritable(args.out)}" if args.out and unwritable(args.out) else None)
               or (f"--load {args.load!r}: no such file" if args.load and not os.path.isfile(args.load) else None))
    if problem:  # before any rank starts
        return error("figures", problem)
    from ..runtime import RankPool  # at call time: tests replace it

    module = importlib.import_module("suite.figures." + args.name)
    try:
        opts = options_for(args.name, module, args)
    except ValueError as exc:
        return error("figures", exc)

    own = {f.name for f in dataclasses.fields(module.Options)}
    terminate_cleanly()  # SIGTERM unwinds like Ctrl-C: pools and trial servers closed, their logs removed
    try:
        if args.load and "load" not in own:
            with open(args.load) as fh:
                raw = json.load(fh)
        elif not getattr(module, "USES_POOL", True):  # the figure starts its own processes (ab's trial servers)
            raw = module.measure(opts, None)
        else:
            with RankPool(args.nproc, timeout=args.timeout) as pool:
                raw = module.measure(opts, pool)
    except KeyboardInterrupt:
        kept = f"; what was measured is kept in {args.save}" if args.save and "save" in own else ""
        print(f"fleetbench figures {args.name}: interrupted{kept}", file=sys.stderr)
        return 130
    if args.save and "save" not in own:
        write_atomic(args.save, json.dumps(raw, default=str))  # a value JSON has no form for is kept as text
    text = module.render(raw, opts)
    text = f"{text}\n\n_{machine_line(args.nproc)}_\n"
    print(text)
    if args.out:
        write_atomic(args.out, text)
    return 0
