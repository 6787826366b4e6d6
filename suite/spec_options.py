"""The run specification's options, made from its fields' metadata, and the one builder of a spec from them.

Each field of the specification (``suite/run_spec.py``: ``Selection``, ``RunOptions``, ``AbOptions`` and its
``SeqOptions``) says in its metadata what its option is: the command line's name (``option``, else ``--name``),
its help, bounds and choices (``suite/validate.py``) and where it is one (``on``, of ``run_spec.SURFACES``: the
commands run, ab, bisect and nightly, pytest-benchmark and asv).  From that alone :func:`options` gives each place
its :class:`Option` s: the commands' arguments (``suite/cli/options.py`` adds them to argparse, the only place that
imports it), pytest's ``--fleetbench-NAME`` (``bench_cases/conftest.py``) and asv's ``FLEETBENCH_BENCH_NAME``
variables (``bench_cases/_matrix.py``).  A field added to the spec is an option everywhere its part is.

:func:`spec_from` is the one way back, whatever the place: what its user gave (:class:`Given`: parsed options,
pytest's, by :func:`parsed`; the environment's variables, by :func:`given_env`), or instead a spec file (``--spec
FILE``, ``--fleetbench-spec FILE``, ``FLEETBENCH_BENCH_SPEC``'s JSON: the file states the run, and an option
given beside it is refused, except the parts a command takes from its own options: ab's run options and its own),
or the spec a resumed run's records carry (:class:`Resumed`: ``run --resume`` is that spec, each option given
again checked against it).  Every refusal is one :class:`~suite.run_spec.SpecError` (a ConfigError: exit 2) naming
the option as that place spells it, the value and what is allowed: ``--steps 0: must be >= 1 and <= 1000000``,
``--fleetbench-rounds 0: ...``, ``FLEETBENCH_BENCH_STEPS='abc': must be a whole number ...``.

Torch-free and argparse-free (layer 1).
"""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .outputs import InputError, read_input
from .run_spec import AB, SURFACES, AbOptions, RunOptions, RunSpec, Selection, SeqOptions, SpecError, split_names
from .validate import FieldSpec, Invalid, field_specs, option_name

__all__ = ["Option", "Given", "Resumed", "OptionError", "options", "parsed", "given_env", "spec_from",
           "default_spec", "default", "SPEC_FILE", "PYTEST_PREFIX", "ENV_PREFIX", "HARNESS_TAG", "COMMANDS", "TABLE"]

PARTS = {"selection": Selection, "run": RunOptions, "ab": AbOptions, "seq": SeqOptions}
COMMANDS = ("run", "ab", "bisect", "nightly")  # argparse's (suite/cli); pytest and asv are the harnesses
PYTEST_PREFIX, ENV_PREFIX = "--fleetbench-", "FLEETBENCH_BENCH_"
# The spec given whole, instead of its options: a file (asv: the variable holds the JSON itself); nightly takes none.
SPEC_FILE = {"run": "--spec", "ab": "--spec", "bisect": "--spec", "pytest": "--fleetbench-spec",
             "asv": ENV_PREFIX + "SPEC"}
HARNESS_TAG = "smoke"  # the harnesses' selection when none is given (a minute on a 2-core machine)
SPEC_BYTES = 2**20  # a run specification file is at most this long (a real one is under 2 KB)
_BESIDE = {"ab": ("run", "ab", "seq"), "bisect": ("run", "ab", "seq")}  # parts a spec file leaves to the options
_EVERYWHERE = {"selection": SURFACES, "run": SURFACES, "ab": (), "seq": ()}  # where a field is an option by default


@dataclass(frozen=True)
class Option:
    """One field of the spec as an option: its part (``selection``, ``run``, ``ab``, ``seq``), what it accepts
    (:class:`~suite.validate.FieldSpec`), its command-line name and where it is one."""

    part: str
    field: FieldSpec
    flag: str  # the command line's: --steps, --no-check (a switch whose name says no sets the field False)
    on: tuple[str, ...]
    meta: Mapping = dataclasses.field(default_factory=dict, compare=False, repr=False)

    @property
    def name(self) -> str:
        return self.field.name

    @property
    def key(self) -> tuple[str, str]:
        return self.part, self.field.name

    @property
    def switch(self) -> bool:
        return self.field.kind == "bool"

    @property
    def inverted(self) -> bool:
        return self.switch and self.flag.startswith("--no-")

    @property
    def invocation(self) -> bool:
        """How this invocation runs (timeouts, traces, sampling), not what the run measures: ``--resume`` takes it
        from the command line, not from the records."""
        return bool(self.meta.get("invocation"))

    def named(self, surface: str) -> str:
        """The option as ``surface`` spells it: ``--steps``, ``--fleetbench-steps``, ``FLEETBENCH_BENCH_STEPS``."""
        if surface == "pytest":
            return self.meta.get("pytest") or PYTEST_PREFIX + self.flag.removeprefix("--")
        if surface == "asv":
            return ENV_PREFIX + (self.meta.get("env") or self.name.upper())
        return self.flag

    def dest(self, surface: str) -> str:
        """Where a parser keeps its value: the field's name (pytest's: ``fleetbench_`` before it)."""
        return "fleetbench_" + self.name if surface == "pytest" else self.name

    def help(self, surface: str) -> str:
        """The metadata's help, with the default where one is a number or a name (argparse's %% escaped)."""
        text = self.field.help
        value = default(self.key, surface)
        if not self.switch and value is not None and not isinstance(value, tuple):
            text += f" (default {value:g})" if isinstance(value, float) else f" (default {value})"
        return text.replace("%", "%%")

    def kwargs(self, surface: str, help: str | None = None) -> dict:
        """``add_argument`` / pytest's ``addoption`` keywords (the same for both): every default None, so what was
        given is known and the spec's own defaults fill the rest."""
        kind = self.field.kind
        kw: dict[str, Any] = {"dest": self.dest(surface), "default": None}
        if self.switch:
            kw["action"] = "store_false" if self.inverted else "store_true"
        elif kind.startswith("tuple"):
            kw["action"] = "append"
            if kind == "tuple[int, ...]":
                kw["type"] = int
        else:
            kw["type"] = self.field.type
        if self.field.choices is not None:
            kw["choices"] = self.field.choices
        if self.meta.get("metavar"):
            kw["metavar"] = self.meta["metavar"]
        elif not self.switch and self.field.choices is None:  # as argparse names the option's value: --batch BATCH
            kw["metavar"] = self.named(surface).removeprefix("--").replace("-", "_").upper()
        kw["help"] = self.help(surface) if help is None else help
        return kw

    def parse(self, text: str) -> Any:
        """A variable's text as the field's value (lists separated by ``sep``, default ","); a SpecError
        ``NAME='text': must be ...`` for text that is no value of it."""
        kind, sep = self.field.kind, self.meta.get("sep") or ","
        items = [t.strip() for t in text.split(sep) if t.strip()]
        if kind == "tuple[str, ...]":
            return tuple(items)
        if kind == "str":
            return text.strip()
        one = dataclasses.replace(self.field, kind="int") if kind == "tuple[int, ...]" else self.field
        out = []
        for t in items if kind.startswith("tuple") else [text.strip()]:
            try:
                out.append(_scalar(one.kind, t))
            except ValueError:
                raise SpecError(f"{self.named('asv')}={t!r}: must be "
                                f"{one.expected().removeprefix('null or ')}") from None
        return tuple(out) if kind.startswith("tuple") else out[0]


def _scalar(kind: str, text: str) -> Any:
    if kind == "int":
        return int(text)
    if kind == "float":
        return float(text)
    if kind == "bool" and text.lower() in ("1", "true", "yes", "on", "0", "false", "no", "off"):
        return text.lower() in ("1", "true", "yes", "on")
    raise ValueError(text)


def _table() -> dict[tuple[str, str], Option]:
    out = {}
    for part, cls in PARTS.items():
        specs = field_specs(cls)
        for f in dataclasses.fields(cls):
            if f.name == "seq":  # ab's statistics: a part of their own
                continue
            on = f.metadata.get("on", _EVERYWHERE[part])
            out[(part, f.name)] = Option(part, specs[f.name], option_name(f), tuple(on), f.metadata)
    for surface in SURFACES:  # each place's options have names and dests of their own
        mine = [o for o in out.values() if surface in o.on]
        for what in ("named", "dest"):
            names = [getattr(o, what)(surface) for o in mine]
            if len(set(names)) != len(names):
                raise TypeError(f"the run specification's options on {surface} share a {what}: {sorted(names)}")
    return out


TABLE = _table()


def options(surface: str) -> list[Option]:
    """The options of ``surface`` (one of ``run_spec.SURFACES``), in the spec's order."""
    if surface not in SURFACES:
        raise ValueError(f"{surface!r} is not one of {', '.join(SURFACES)}")
    return [o for o in TABLE.values() if surface in o.on]


def default_spec(surface: str) -> RunSpec:
    """The spec a place runs when nothing is given: the spec's defaults (the harnesses' selection: the smoke tag;
    ab's and bisect's: their trials and statistics too)."""
    sel = PARTS["selection"](default_tag=HARNESS_TAG) if surface in ("pytest", "asv") else PARTS["selection"]()
    return RunSpec(sel, PARTS["run"](), PARTS["ab"]() if surface in AB else None)


def default(key: tuple[str, str], surface: str = "run"):
    """A field's default where ``surface`` builds its spec (ab's ``--rotate``: ab's own, 5), for a help text."""
    spec = default_spec(surface if surface in AB or key[0] not in ("ab", "seq") else "ab")
    part = getattr(spec, key[0]) if key[0] != "seq" else spec.ab.seq if spec.ab is not None else None
    return getattr(part, key[1])


# ---- what was given ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Given:
    """What one place's user gave: ``values`` by (part, field), as parsed (None: not given; a place may add values
    it decides itself, e.g. nightly's workflow), and ``spec`` the spec file given instead (asv: its JSON);
    ``besides``: the place's own options given that a spec file leaves no room for (run's ``--resume``)."""

    surface: str
    values: Mapping[tuple[str, str], Any]
    spec: str | None = None
    besides: tuple[str, ...] = ()

    def gave(self, part: str, name: str) -> bool:
        return self.values.get((part, name)) is not None


def parsed(surface: str, get: Callable[[str], Any]) -> dict[tuple[str, str], Any]:
    """The values of ``surface``'s options from its parser: ``get(dest)`` (argparse's attributes, read in
    suite/cli; pytest's ``config.getoption``)."""
    return {o.key: get(o.dest(surface)) for o in options(surface)}


def given_env(environ: Mapping[str, str]) -> Given:
    """What asv's variables give (an empty one counts as unset): FLEETBENCH_BENCH_SPEC, or the per-field ones."""
    values = {}
    for o in options("asv"):
        text = (environ.get(o.named("asv")) or "").strip()
        if text:
            values[o.key] = o.parse(text)
    return Given("asv", values, (environ.get(SPEC_FILE["asv"]) or "").strip() or None)


@dataclass(frozen=True)
class Resumed:
    """The run ``--resume`` continues, as its records say it: their ``spec``, the fields they ``told`` (every option
    of run but this invocation's own, for a record that carries its spec), ``where`` it is named in a refusal
    ("--resume FILE: run ID")."""

    spec: RunSpec
    told: frozenset
    where: str


class OptionError(SpecError):
    """An option's value the spec's field does not accept: ``--steps 0: must be ...`` (the option as the place
    spells it); ``invalid`` holds the field, the value and what is allowed, for a reader that words it otherwise
    (``run --resume`` of a damaged record)."""

    def __init__(self, invalid: Invalid, option: str):
        self.invalid, self.option = invalid, option
        super().__init__(invalid.option(option))


def _name(key: tuple[str, str], surface: str) -> str:
    return TABLE[key].named(surface)


def _checked(surface: str, key: tuple[str, str], value: Any) -> Any:
    """``value`` as the field keeps it (a list as a tuple, a file as an absolute path), or a SpecError naming the
    option as ``surface`` spells it."""
    o = TABLE[key]
    if isinstance(value, list):
        value = tuple(value)
    try:
        value = o.field.check(value)
    except Invalid as exc:
        raise OptionError(exc, o.named(surface)) from None
    return os.path.abspath(value) if o.meta.get("path") and value else value


def _with(base: RunSpec, values: Mapping[tuple[str, str], Any], surface: str) -> RunSpec:
    """``base`` with ``values`` (checked) in place; ab's parts made where the place is ab's."""
    parts: dict[str, dict] = {p: {} for p in PARTS}
    for (part, name), value in values.items():
        parts[part][name] = value
    try:
        sel = dataclasses.replace(base.selection, **parts["selection"])
        run = dataclasses.replace(base.run, **parts["run"])
        ab = base.ab
        if surface in AB or parts["ab"] or parts["seq"]:
            ab = ab if ab is not None else PARTS["ab"]()
            ab = dataclasses.replace(ab, seq=dataclasses.replace(ab.seq, **parts["seq"]), **parts["ab"])
    except SpecError:
        raise
    except ValueError as exc:  # a combination of ab's statistics (--rotate 1)
        raise SpecError(str(exc)) from None
    return RunSpec(sel, run, ab)


def _read(given: Given, where: str) -> RunSpec:
    if given.surface == "asv":
        text = given.spec or ""
    else:
        try:
            text = read_input(given.spec or "", "run specification (JSON)", SPEC_BYTES)
        except InputError as exc:
            raise SpecError(f"{SPEC_FILE[given.surface]}: {exc}") from None
    return RunSpec.from_json(text, where)


def _compared(key: tuple[str, str], value: Any) -> Any:
    """A value as ``--resume`` compares it: names split at commas and taken as a set, --set stripped."""
    o = TABLE[key]
    if o.meta.get("names"):
        return sorted(set(split_names(value)))
    if isinstance(value, tuple):
        return [str(v).strip() for v in value]
    return value


def _shown(o: Option, value: Any) -> str:
    if o.switch:
        return "on" if (not value if o.inverted else value) else "off"
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, split_names(value) if o.meta.get("names") else value)) or "(none)"
    return "(not given)" if value is None else str(value)


def _resumed(resumed: Resumed, values: Mapping[tuple[str, str], Any], surface: str) -> RunSpec:
    """The resumed run's spec: each option given again must say what its records say; what they do not tell (this
    invocation's own, or what older records never kept) is this command's: given, or the spec's default."""
    for key, mine in values.items():
        if key not in resumed.told:
            continue
        theirs = getattr(getattr(resumed.spec, key[0]), key[1])
        if _compared(key, mine) != _compared(key, theirs):
            o, flag = TABLE[key], _name(key, surface)
            raise SpecError(f"{resumed.where} ran with {flag} {_shown(o, theirs)}, this command gives {flag} "
                            f"{_shown(o, mine)}; leave {flag} out to resume with the run's own")
    fresh = default_spec(surface)
    own = {o.key: getattr(getattr(fresh, o.part), o.name) for o in options(surface) if o.key not in resumed.told}
    return _with(resumed.spec, own, surface)


def spec_from(given: Given, resumed: Resumed | None = None) -> RunSpec:
    """The run specification of what ``given`` holds: the spec file it names (nothing else given beside it but the
    parts the place takes from its options), the resumed run's spec (each option given again agreeing with it),
    or the options given over the place's defaults (:func:`default_spec`).  One SpecError for anything it cannot
    use, naming the option as the place spells it."""
    surface = given.surface
    values = {k: _checked(surface, k, v) for k, v in given.values.items() if v is not None}
    if given.spec is not None:
        where = SPEC_FILE[surface] + ("" if surface == "asv" else f" {given.spec}")
        beside = _BESIDE.get(surface, ())
        clash = [_name(k, surface) for k in values if k[0] not in beside] + list(given.besides)
        if clash:
            what = "selection" if beside else "selection and options"
            raise SpecError(f"{where} states the {what}; {', '.join(clash)} given too: give one or the other")
        base = _read(given, where)
    elif resumed is not None:
        base = _resumed(resumed, values, surface)
        values = {k: v for k, v in values.items() if k not in resumed.told}  # the run's own, as it ran
    else:
        base = default_spec(surface)
    return _with(base, values, surface)
