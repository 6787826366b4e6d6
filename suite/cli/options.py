"""The options several sub-commands share, each declared once, and the conversions of their values.

:data:`SHARED` holds what an option is (its type, action, choices, metavar, and the help text the commands
that share it word for word); a command declares it with :func:`add_shared`, giving its own help text (and
default) where its use differs: run's ``--case`` help names the pattern, ab's is short.

The options of a run specification (``suite/run_spec.py``) default to None here: a command builds its spec
from what was given (:func:`selection`, :func:`given`), and the spec's own defaults fill the rest, so each
default is stated once (:func:`default` reads one for a help text).
"""
from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from ..run_spec import SIZES, RunOptions, Selection

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
    "check_steps": dict(type=int, default=None),
    "no_check": dict(action="store_true"),
    "timeout": dict(type=float),
    "pg_timeout": dict(type=float, default=None),
    "cluster": dict(metavar="NxR:inter=RATE[,intra=RATE]"),  # suite.cluster.spec.ClusterSpec.parse reads it
    "spec": dict(metavar="FILE"),  # a RunSpec as JSON (suite/run_spec.py): its selection (and options) instead
}


def default(name: str):
    """The run specification's default of a run option (``RunOptions().steps``), for a help text."""
    return getattr(RunOptions(), name)


def _shared_help() -> None:
    SHARED["check_steps"]["help"] = f"steps of the correctness check (default {default('check_steps')})"
    SHARED["pg_timeout"]["help"] = f"bound on each collective wait, seconds (default {default('pg_timeout'):g})"


_shared_help()


def add_shared(p, **given) -> None:
    """Declare the shared options named (``check_steps`` is ``--check-steps``) on ``p``, in the order given; each
    value is the command's help text, None for the shared one, or a dict of keywords (a default and a help)."""
    for name, value in given.items():
        own = value if isinstance(value, dict) else {} if value is None else {"help": value}
        p.add_argument("--" + name.replace("_", "-"), **{**SHARED[name], **own})


def given(args, *names: str) -> set[str]:
    """Which of the options ``names`` the command line gave: a value (the options of a spec default to None, so
    ``--steps 5`` is given even where 5 is the default), a list with an element, a switch that is on."""
    return {n for n in names if (value := getattr(args, n, None)) is not None and value is not False and value != []}


def _getter(options):
    """The options' values by name: from a command's parsed arguments, or from a mapping of them (``run``'s, with
    what a resumed run's records tell)."""
    return options.__getitem__ if isinstance(options, Mapping) else functools.partial(getattr, options)


def selection(options, **fields) -> Selection:
    """The typed selection of the options --case, --tag, --model, --size, --device, --config and --set (not resolved:
    ``suite.selection.resolve``); ``fields`` replace what the command decides itself (e.g. its default tags)."""
    o = _getter(options)
    return Selection(**{"cases": tuple(o("case")), "tags": tuple(o("tag")), "models": tuple(o("model")),
                        "size": o("size"), "device": o("device"), "config": o("config"), "sets": tuple(o("set")),
                        **fields})


def run_options(options, names: dict[str, str], **fields) -> RunOptions:
    """The run options of the options given: ``names`` maps a RunOptions field to its option's attribute
    (``{"per_rank_batch": "batch"}``; ``check`` from a ``no_check`` switch); an option left at None takes the
    spec's default; ``fields`` are the command's own."""
    o = _getter(options)
    kw: dict[str, Any] = {}
    for field, attr in names.items():
        value = o(attr)
        if field in ("check", "utilization") and attr.startswith("no_"):
            kw[field] = not value
        elif value is not None:
            kw[field] = value
    return RunOptions(**kw, **fields)

