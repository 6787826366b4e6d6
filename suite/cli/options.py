"""The options several sub-commands share, each declared once, and the conversions of their values.

:data:`SHARED` holds what an option is (its type, action, choices, metavar, and the help text the commands
that share it word for word); a command declares it with :func:`add_shared`, giving its own help text (and
default) where its use differs: run's ``--case`` help names the pattern, ab's is short.
"""
from __future__ import annotations

import argparse
import math
from typing import TYPE_CHECKING

from ..config import ConfigError
from ..model_registry import SIZES

if TYPE_CHECKING:
    from ..selection import Selection

# --NAME (underscores for dashes) -> add_argument keywords; a command's help (and default) go over them
SHARED: dict[str, dict] = {
    "nproc": dict(type=int, default=None),
    "device": dict(choices=("cpu", "cuda"), help="default: cuda where torch sees a GPU, else cpu"),
    "case": dict(action="append", default=[], metavar="NAME", help="case name or glob; repeatable or comma-separated"),
    "tag": dict(action="append", default=[], help="cases with this tag; repeatable"),
    "model": dict(action="append", default=[], metavar="MODEL", help="every case of this model"),
    "size": dict(choices=SIZES),
    "config": dict(help="TOML file of strategy fields applied on top of every case"),
    "set": dict(action="append", default=[], metavar="KEY=VALUE", help="a strategy field; repeatable"),
    "batch": dict(type=int, default=None),
    "steps": dict(type=int),
    "rounds": dict(type=int),
    "warmup": dict(type=int),
    "check_steps": dict(type=int, default=3, help="steps of the correctness check (default 3)"),
    "no_check": dict(action="store_true"),
    "timeout": dict(type=float),
    "pg_timeout": dict(type=float, default=120.0, help="bound on each collective wait, seconds"),
    "cluster": dict(metavar="NxR:inter=RATE[,intra=RATE]"),  # suite.cluster.spec.ClusterSpec.parse reads it
}


class Given(argparse.Action):
    """Stores the option's value and notes that the command line gave it (``args.given``, a set of names), so an
    option left at its default can be told from one given with the default's value (``run --resume``)."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        namespace.given = getattr(namespace, "given", set()) | {self.dest}


def add_shared(p, **given) -> None:
    """Declare the shared options named (``check_steps`` is ``--check-steps``) on ``p``, in the order given; each
    value is the command's help text, None for the shared one, or a dict of keywords (a default and a help)."""
    for name, value in given.items():
        own = value if isinstance(value, dict) else {} if value is None else {"help": value}
        p.add_argument("--" + name.replace("_", "-"), **{**SHARED[name], **own})


def selection(args, **fields) -> Selection:
    """The typed selection of the options --case, --tag, --model, --size, --device, --config and --set (not resolved:
    see :meth:`Selection.resolve`); ``fields`` replace what the command decides itself (e.g. its default tags)."""
    from ..selection import Selection  # at call time: it imports torch (the models); importing options stays light

    return Selection(**{"cases": tuple(args.case), "tags": tuple(args.tag), "models": tuple(args.model),
                        "size": args.size, "device": args.device, "config": args.config, "sets": tuple(args.set),
                        **fields})


def require_at_least(args, **lows: int) -> None:
    """A ConfigError (a ValueError) naming the first option (an attribute of ``args``; None: not given) below its
    lowest value in ``lows``: ``--check-steps 0: must be >= 1``."""
    for name, low in lows.items():
        value = getattr(args, name)
        if value is not None and value < low:
            raise ConfigError(f"--{name.replace('_', '-')} {value}: must be >= {low}")


def require_seconds(args, *names: str) -> None:
    """A ConfigError naming the first option (an attribute of ``args``; None or absent: not given) that is not a
    finite number of seconds > 0."""
    for name in names:
        value = getattr(args, name, None)
        if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
            raise ConfigError(f"--{name.replace('_', '-')} {value}: must be a finite number of seconds > 0")
