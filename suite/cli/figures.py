"""`fleetbench figures NAME`: the benchmark figures a strategy reports (Markdown tables).

Each figure set is a module ``suite.figures.NAME`` with ``DESCRIPTION`` and the figure contract

- ``Options``: a frozen dataclass of everything the figure takes, its defaults stated there only (built here from
  the arguments: ``--nproc``, ``--rounds``, ``--steps``, ``--timeout`` and each figure option below fill the field
  of their name when given, and an option left out keeps the figure's default; an option the figure has no field
  for is refused, naming the figures that take it; a figure that uses the pool has ``nproc`` and ``timeout``);
- ``measure(options, pool) -> raw`` (JSON-able data; ``pool`` has ``options.nproc`` ranks; ``--save FILE`` keeps
  it, ``--load FILE`` renders it again without measuring);
- ``render(raw, options) -> str`` (Markdown; statistics come from the package they belong to, e.g.
  ``suite.measure.stats``).

They measure variants interleaved in one process group (``suite.measure.timing``, or the runner), never one run
against another made minutes apart.
"""
from __future__ import annotations

import dataclasses
import importlib
import json
import pkgutil
import sys

import suite.figures as figures_pkg

from ..config import ConfigError
from ..figures import PoolOptions
from ..measure.metadata import machine_line
from ..outputs import read_input, write_atomic
from . import error, helps, terminate_cleanly
from .checks import require_nproc, require_writable
from .options import add_fields, check_given


def _csv(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


# Figure options: field -> (type, figures that take it, help).  Each fills the field of the same name in the
# figure's Options; an option left out keeps that figure's default (`fleetbench figures` lists the defaults).
FIGURE_OPTIONS: dict[str, tuple] = {
    "size": (str, ("workloads",), "model size"),
    "memory_gb": (float, ("workloads",), "memory the ranks' engines may hold at once, GB (default: 60%% of the "
                  "available memory), which sets the timing groups"),
    "models": (_csv, ("engine_cost",), "models, comma-separated"),
    "max_rounds": (int, ("engine_cost",), "the most rounds per model while the ratio's 95%% interval is wider than "
                   "0.05"),
    "profile_steps": (int, ("engine_cost",), "profiled steps of each side per model"),
}
COMMON = ("nproc", "rounds", "steps", "timeout")  # options of most figures, declared once below


def available() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(figures_pkg.__path__) if not m.name.startswith("_"))


# --help's description: what the command does, for its users (the docstring above is for developers)
ABOUT = """`fleetbench figures NAME`: measure a strategy's benchmark figures and print them as Markdown tables.

Without NAME: the figure sets, what each shows and its options' defaults.  Every option left out keeps
the set's own default; --nproc, --rounds, --steps and --timeout apply to the sets that have them, each
figure option below names the sets that take it (another set refuses it).  --save FILE keeps the measured
data, --load FILE renders it again without measuring.  Variants are always measured interleaved in the
same ranks, never one run against another made minutes apart."""


def add_parser(sub) -> None:
    p = sub.add_parser("figures", help="produce a strategy's benchmark figures (Markdown)", **helps(ABOUT, """
        fleetbench figures
        fleetbench figures comm --nproc 2 --out docs/figures/comm.md"""))
    p.add_argument("name", nargs="?", help="figure set; omit to list them")
    add_fields(p, PoolOptions, *COMMON[:3], unset=True)
    p.add_argument("--out", help="also write the Markdown here")
    add_fields(p, PoolOptions, "timeout", unset=True)
    p.add_argument("--save", help="keep the figure's raw data here (JSON)")
    p.add_argument("--load", help="render the raw data kept here instead of measuring")
    g = p.add_argument_group("figure options (each taken only by the figures named)")
    for field, (kind, names, text) in FIGURE_OPTIONS.items():
        g.add_argument("--" + field.replace("_", "-"), dest=field, type=kind, default=None,
                       help=f"{', '.join(names)}: {text}")
    p.set_defaults(func=main)


MAX_RAW_BYTES = 256 * 2**20  # a figure's raw data (a few MB at most)


def _load(path: str):
    """The JSON value kept in ``path`` (a regular file: a FIFO or device is refused without blocking); a
    ValueError saying what is wrong."""
    text = read_input(path, "file", MAX_RAW_BYTES)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON ({exc.msg} at line {exc.lineno} column {exc.colno}); expected the raw "
                         f"data a --save kept") from None
    except RecursionError:
        raise ValueError("JSON nested too deeply; not a figure's raw data") from None


def _load_problem(path: str) -> str | None:
    """Why ``path`` cannot be read as raw data (None when it can): read and parsed here, before anything runs."""
    try:
        _load(path)
    except ValueError as exc:
        return str(exc).removeprefix(f"{path}: ")
    return None


def takers(option: str) -> tuple[str, ...]:
    """The figure sets that take ``option`` (a field of their Options)."""
    if option in FIGURE_OPTIONS:
        return FIGURE_OPTIONS[option][1]
    modules = {n: importlib.import_module("suite.figures." + n) for n in available()}
    return tuple(n for n, m in modules.items() if option in {f.name for f in dataclasses.fields(m.Options)})


def options_for(name: str, module, args):
    """The figure's ``Options`` from the options given (the rest keep the figure's defaults); a ValueError naming
    an option the figure does not take."""
    fields = {f.name for f in dataclasses.fields(module.Options)}
    given = {k: getattr(args, k) for k in COMMON + tuple(FIGURE_OPTIONS) if getattr(args, k, None) is not None}
    foreign = [k for k in given if k not in fields]
    if foreign:
        k = foreign[0]
        raise ValueError(f"--{k.replace('_', '-')} is an option of figures {', '.join(takers(k))}, "
                         f"not of figures {name}")
    return module.Options(**given)


def defaults(module) -> str:
    """The figure's options with its defaults, as `fleetbench figures` lists them."""
    shown = [f"--{f.name.replace('_', '-')} {_default(f)}" for f in dataclasses.fields(module.Options)
             if f.name in COMMON or f.name in FIGURE_OPTIONS]
    return ", ".join(shown)


def _default(f: dataclasses.Field) -> str:
    value = f.default  # the figures' Options are frozen: every default is a value, no factory
    return ",".join(map(str, value)) if isinstance(value, tuple) else str(value)


def main(args) -> int:
    names = available()
    if not args.name:
        for n in names:
            module = importlib.import_module("suite.figures." + n)
            print(f"{n:16s} {module.DESCRIPTION}\n{'':16s} defaults: {defaults(module)}")
        return 0
    if args.name not in names:
        return error("figures", f"figure set {args.name!r} is unknown; allowed: {', '.join(names)}")

    try:  # before any rank starts
        require_nproc(args.nproc)
        check_given(PoolOptions, args)  # --rounds, --steps, --timeout: their bounds are PoolOptions' metadata
        require_writable("--out", args.out)
        require_writable("--save", args.save)
        if args.load and (why := _load_problem(args.load)):
            raise ConfigError(f"--load {args.load!r}: {why}")
    except ConfigError as exc:
        return error("figures", exc)
    from ..runtime import RankPool  # at call time: tests replace it

    module = importlib.import_module("suite.figures." + args.name)
    try:
        opts = options_for(args.name, module, args)
    except ValueError as exc:
        return error("figures", exc)

    terminate_cleanly()  # SIGTERM unwinds like Ctrl-C: pools and trial servers closed, their logs removed
    try:
        if args.load:
            raw = _load(args.load)
        else:
            with RankPool(opts.nproc, timeout=opts.timeout) as pool:
                raw = module.measure(opts, pool)
    except KeyboardInterrupt:
        print(f"fleetbench figures {args.name}: interrupted", file=sys.stderr)
        return 130
    if args.save:
        write_atomic(args.save, json.dumps(raw, default=str))  # a value JSON has no form for is kept as text
    try:
        text = module.render(raw, opts)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        if not args.load:
            raise
        return error("figures", f"--load {args.load!r}: not the raw data of figures {args.name} "
                                f"({type(exc).__name__}: {str(exc)[:200]})")
    text = f"{text}\n\n_{machine_line(getattr(opts, 'nproc', None))}_\n"
    print(text)
    if args.out:
        write_atomic(args.out, text)
    return 0
