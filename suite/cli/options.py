"""The commands' options: those of the run specification made from its metadata, the others declared once.

The run specification's options (``suite/spec_options.py``: each field's name, help, bounds and choices are its
metadata in ``suite/run_spec.py``) are added to a command's parser by :func:`add_spec`, every default None (the
spec's own defaults fill what was not given, so each default is stated once), a command's own help text over the
metadata's where its use differs (run's ``--case`` help names the pattern, ab's is short).  :func:`given` reads
them back from the parsed arguments for ``spec_options.spec_from``, the one builder of a spec.

A command's options that are no field of the spec are fields of a small dataclass of its own with the same
``spec(...)`` metadata (``suite/validate.py``: their bounds, unit and help), declared by :func:`add_fields` and
built by :func:`from_args`: one error style for every option, ``--persist 0: must be >= 1 and <= 10000`` (a
ConfigError, exit 2).  :data:`SHARED` holds the few options several commands declare that are neither
(``--nproc``: local ranks, checked against the machine; ``--cluster``: parsed by suite/cluster).
"""
from __future__ import annotations

import dataclasses
from typing import Any

from .. import spec_options
from ..config import ConfigError
from ..validate import Invalid, check_options, field_specs, option_name

# --NAME (underscores for dashes) -> add_argument keywords; a command's help (and default) go over them
SHARED: dict[str, dict] = {
    "nproc": dict(type=int, default=None),
    "cluster": dict(metavar="NxR:inter=RATE[,intra=RATE]"),  # suite.cluster.spec.ClusterSpec.parse reads it
}


def default(name: str, part: str = "run"):
    """The run specification's default of one of its fields (``RunOptions().steps``), for a help text."""
    return spec_options.default((part, name))


def add_shared(p, **given) -> None:
    """Declare the shared options named (``nproc`` is ``--nproc``) on ``p``, in the order given; each value is the
    command's help text, None for the shared one, or a dict of keywords (a default and a help)."""
    for name, value in given.items():
        own = value if isinstance(value, dict) else {} if value is None else {"help": value}
        p.add_argument("--" + name.replace("_", "-"), **{**SHARED[name], **own})


def add_spec(p, surface: str, file: str | None = None, **helps) -> None:
    """The run specification's options of ``surface`` (run, ab, bisect, nightly) on ``p``, in the spec's order: a
    command's help text by field name (``cases="..."``; a dict: keywords over the generated ones), the metadata's
    otherwise; ``file``: the help of ``--spec FILE``, the whole spec given instead of them (none: no ``--spec``).
    Each argument made here is marked (``action.spec_option``: tests/test_spec_options.py finds the others)."""
    known = {o.name for o in spec_options.options(surface)}
    unknown = set(helps) - known
    if unknown:
        raise TypeError(f"add_spec({surface!r}): {sorted(unknown)} are not its options")
    for o in spec_options.options(surface):
        own = helps.get(o.name)
        kw = o.kwargs(surface)
        if isinstance(own, dict):
            kw.update(own)
        elif own is not None:
            kw["help"] = own
        action = p.add_argument(o.named(surface), **kw)
        action.spec_option = o.key
    if file is not None:
        action = p.add_argument(spec_options.SPEC_FILE[surface], metavar="FILE", help=file)
        action.spec_option = ("spec", "file")


def given(args, surface: str, besides: tuple[str, ...] = (), **values) -> spec_options.Given:
    """What the command line gave of ``surface``'s spec options (``values``: what the command decides itself, by
    ``part__field``, e.g. ``run__steps=10``), and its ``--spec FILE``, for ``spec_options.spec_from``."""
    mine = spec_options.parsed(surface, lambda dest: getattr(args, dest, None))
    for name, value in values.items():
        part, field = name.split("__")
        mine[(part, field)] = value
    return spec_options.Given(surface, mine, getattr(args, "spec", None), besides)


# ---- a command's own options: a dataclass with spec(...) metadata ----------------------------------------------
def add_fields(p, cls, *names: str, unset: bool = False, **helps) -> None:
    """``cls``'s fields ``names`` (all, in order, when none is named) as options of ``p``: the flag is the field's
    ``option`` (else ``--name``; ``short``: a one-letter alias), its type, choices, metavar and help from its
    metadata (a command's ``helps`` over them), its default the field's (``unset``: None, so what was given is
    known); a value is checked when :func:`from_args` builds ``cls`` (or by :func:`check_given`)."""
    specs = field_specs(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for name in names or tuple(fields):
        f, fs = fields[name], specs[name]
        kw: dict[str, Any] = {"dest": name, "help": fs.help.replace("%", "%%")}
        if unset:
            kw["default"] = None
        elif f.default is not dataclasses.MISSING:
            kw["default"] = f.default
        if fs.kind == "bool":
            kw["action"] = "store_true"
        elif fs.kind.startswith("tuple"):
            kw["action"], kw["default"] = "append", []
        else:
            kw["type"] = fs.type
        if fs.choices is not None:
            kw["choices"] = fs.choices
        if f.metadata.get("metavar"):
            kw["metavar"] = f.metadata["metavar"]
        own = helps.get(name)
        kw.update(own if isinstance(own, dict) else {} if own is None else {"help": own})
        flags = [f.metadata["short"]] if f.metadata.get("short") else []
        p.add_argument(*flags, option_name(f), **kw)


def from_args(cls, args, **values):
    """``cls`` built from the parsed arguments of its fields (``values``: what the command decides itself), every
    value checked by its metadata: a ConfigError naming the option, the value and what is allowed."""
    kw = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if hasattr(args, f.name)}
    obj = cls(**{**kw, **values})
    check_options(obj, ConfigError)
    return obj


def check_given(cls, args, *names: str) -> None:
    """The options given of ``cls``'s fields ``names`` (all that ``args`` has, when none is named) checked by the
    fields' metadata, for a command that builds ``cls`` later (or builds a subclass): a ConfigError naming the
    option, the value and what is allowed; an option not given (None) is fine."""
    specs = field_specs(cls)
    for f in dataclasses.fields(cls):
        if (names and f.name not in names) or getattr(args, f.name, None) is None:
            continue
        try:
            specs[f.name].check(getattr(args, f.name))
        except Invalid as exc:
            raise ConfigError(exc.option(option_name(f))) from None
