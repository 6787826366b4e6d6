"""One way to say what a field accepts and to check a value against it.

Three kinds of input are checked here, and only here: the strategy knobs (``suite/config.py``'s
``StrategyConfig``), the run specification (``suite/run_spec.py``) and the records
(``suite/results/records.py``).  Each is a dataclass whose fields say what they accept:

- the **type** is the field's annotation: ``bool``, ``int``, ``float``, ``str``, a ``Literal[...]`` of choices,
  ``tuple[str, ...]``, ``tuple[int, ...]``, ``list[float]``, ``list[str]``, ``Interval`` (two numbers),
  ``dict[str, float]``, ``list``, ``dict`` or a nested dataclass (an object), each optionally ``| None``;
- the **range**, choices, unit and one line of help are the field's metadata (:func:`spec`).

:func:`field_specs` reads them once per class; :meth:`FieldSpec.check` returns a value it accepts (an int given
to a float field as a float, a list given to a tuple field as a tuple) or raises :class:`Invalid`, which holds
the three facts every refusal names: the field, the value and what is allowed.  Where the value came from
decides only how the refusal reads:

- an assignment (a knob, a ``--set``): ``nccl_comm_num=-1: out of range, allowed >= 1 and <= 16``
  (:meth:`Invalid.assignment`, also its ``str``);
- a JSON document (a results file, a spec): ``FILE:LINE: field 'run.steps' is 0; expected a whole number >= 1
  and <= 1000000`` (:meth:`Invalid.field`);
- a command-line option: ``--steps 0: must be >= 1 and <= 1000000`` (:meth:`Invalid.option`).

Numbers read from records are *lenient* (``field_specs(cls, lenient=True)``): JSON has no nan or inf, so the
strings ``"nan"``, ``"inf"``, ``"-inf"`` are read as floats, and whole numbers stay whole.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["Invalid", "FieldSpec", "spec", "field_specs", "check_fields", "check_options", "option_name", "show",
           "KINDS"]

_NON_FINITE = ("nan", "inf", "-inf")


def show(value: Any, limit: int = 60) -> str:
    """A value as a refusal quotes it: JSON (a string in quotes), cut to ``limit`` characters."""
    try:
        text = json.dumps(_plain(value)) if not isinstance(value, str) else repr(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _plain(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if value != value else ("inf" if value > 0 else "-inf")
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any, lenient: bool) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool)) or (lenient and v in _NON_FINITE)


def _number(v: Any, lenient: bool) -> Any:
    if isinstance(v, str):
        return float(v)
    return v if lenient or isinstance(v, float) else float(v)


@dataclass(frozen=True)
class Kind:
    """A type a field may have: its name in an annotation, what it is in words, and its check and conversion."""

    name: str
    words: str
    check: Any  # (value, lenient) -> bool
    convert: Any = None  # (value, lenient) -> value; None: as given
    scalar: type | None = None  # the Python type of a scalar kind (bool, int, float, str)
    numeric: bool = False  # ranges apply (to each element of a tuple of numbers)


KINDS: dict[str, Kind] = {k.name: k for k in (
    Kind("bool", "true or false", lambda v, _: isinstance(v, bool), scalar=bool),
    Kind("int", "a whole number", lambda v, _: _is_int(v), scalar=int, numeric=True),
    Kind("float", "a number", _is_number, _number, scalar=float, numeric=True),
    Kind("str", "a string", lambda v, _: isinstance(v, str), scalar=str),
    Kind("tuple[str, ...]", "a list of strings",
         lambda v, _: isinstance(v, (list, tuple)) and all(isinstance(x, str) for x in v), lambda v, _: tuple(v)),
    Kind("tuple[int, ...]", "a list of whole numbers",
         lambda v, _: isinstance(v, (list, tuple)) and all(map(_is_int, v)), lambda v, _: tuple(v), numeric=True),
    Kind("list[str]", "a list of strings", lambda v, _: isinstance(v, list) and all(isinstance(x, str) for x in v)),
    Kind("list[float]", "a list of numbers", lambda v, le: isinstance(v, list) and all(_is_number(x, le) for x in v),
         lambda v, le: [_number(x, le) for x in v]),
    Kind("Interval", "a list of two numbers [lo, hi]",
         lambda v, le: isinstance(v, list) and len(v) == 2 and all(_is_number(x, le) for x in v),
         lambda v, le: [_number(x, le) for x in v]),
    Kind("dict[str, float]", "an object of numbers",
         lambda v, le: isinstance(v, dict) and all(_is_number(x, le) for x in v.values()),
         lambda v, le: {k: _number(x, le) for k, x in v.items()}),
    Kind("list", "a list", lambda v, _: isinstance(v, list)),
    Kind("dict", "an object", lambda v, _: isinstance(v, Mapping)),
)}


def spec(default: Any = dataclasses.MISSING, help: str = "", *, ge: float | None = None, gt: float | None = None,
         le: float | None = None, lt: float | None = None, allow_inf: bool = False, choices: tuple | None = None,
         unit: str = "", nonempty: bool = False, note: str = "", default_factory: Any = dataclasses.MISSING,
         **more: Any) -> Any:
    """A dataclass field with what it accepts: ``ge``/``gt`` the lower bound (inclusive/exclusive), ``le``/``lt``
    the upper one (inclusive/exclusive; on each element of a tuple of numbers), ``allow_inf`` (else inf is out of
    range), ``choices`` (for a field whose annotation is not a ``Literal``), ``unit`` (said with a number:
    "seconds"), ``nonempty`` (a string or list that may not be empty), ``note`` (said after the range: "a week");
    ``more`` is kept in the metadata for the owner (the command-line option's name, ``option``: see
    :func:`option_name`; the run specification's options, ``suite/spec_options.py``)."""
    meta = {"help": help, "ge": ge, "gt": gt, "le": le, "lt": lt, "allow_inf": allow_inf, "choices": choices,
            "unit": unit, "nonempty": nonempty, "note": note, **more}
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b  # False is not 0, 1 is not True


def _num(x: float) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


@dataclass(frozen=True)
class FieldSpec:
    """What one field accepts, read from its annotation and its :func:`spec` metadata."""

    name: str
    kind: str  # a key of KINDS
    optional: bool  # None allowed
    choices: tuple | None
    default: Any
    help: str = ""
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    allow_inf: bool = False
    unit: str = ""
    nonempty: bool = False
    lenient: bool = False  # a record's numbers: "nan"/"inf" strings read as floats, whole numbers kept
    nested: Any = None  # a nested dataclass: an instance of it, or an object (read by its own class)
    note: str = ""  # said after the range ("a week")
    lt: float | None = None  # the exclusive upper bound

    @property
    def type(self) -> type:
        """The Python type of a scalar field (``bool``, ``int``, ``float``, ``str``; a Literal's choices' type)."""
        scalar = KINDS[self.kind].scalar
        if scalar is None:
            raise TypeError(f"field {self.name}: {self.kind} is not a scalar type")
        return scalar

    def bounds(self) -> list[str]:
        out = []
        if self.ge is not None:
            out.append(f">= {self.ge}")
        if self.gt is not None:
            out.append(f"> {self.gt}")
        if self.le is not None:
            out.append(f"<= {self.le}")
        if self.lt is not None:
            out.append(f"< {self.lt}")
        return out

    def allowed(self) -> str:
        """Compact, as `fleetbench config --list` shows it: ``'off' | 'bf16'``, ``int >= 1, <= 16``, ``bool | None``."""
        if self.choices is not None:
            text = " | ".join(map(repr, self.choices))
        else:
            text = " ".join([self.type.__name__, ", ".join(self.bounds())]).strip()
            if self.allow_inf:
                text += ", inf"
        return text + (" | None" if self.optional else "")

    def _range_words(self) -> str:
        bounds = ((">=", self.ge), (">", self.gt), ("<=", self.le), ("<", self.lt))
        return " and ".join(f"{op} {_num(x)}" for op, x in bounds if x is not None)

    def expected(self) -> str:
        """In words, as a JSON reader's refusal says it: ``a whole number >= 1 and <= 16``, ``one of ok, error``,
        ``null or a string``."""
        if self.choices is not None:
            text = "one of " + ", ".join(map(str, self.choices))
        else:
            text = ("a non-empty string" if self.nonempty and self.kind == "str" else KINDS[self.kind].words)
            rng = self._range_words()
            text += f" {rng}" if rng else ""
            text += f" ({', '.join(x for x in (self.unit, self.note) if x)})" if self.unit or self.note else ""
        return ("null or " if self.optional else "") + text

    def must(self) -> str:
        """What follows "must be" in a command-line refusal: ``>= 1 and <= 1000000`` for a whole number (the parser
        already made it one), ``a finite number of seconds > 0 and <= 604800``, ``one of cpu, cuda``."""
        if self.choices is not None:
            return "one of " + ", ".join(map(str, self.choices))
        rng = self._range_words()
        note = f" ({self.note})" if self.note else ""
        if self.kind == "int":
            return (rng or "a whole number") + note
        if self.kind == "tuple[int, ...]":  # said of one element (Invalid.option names it)
            return "a whole number" + (f" {rng}" if rng else "") + note
        if self.kind == "float":
            return f"a finite number{' of ' + self.unit if self.unit else ''}" + (f" {rng}" if rng else "") + note
        return KINDS[self.kind].words

    def check(self, value: Any) -> Any:
        """``value`` as the field keeps it, or :class:`Invalid`."""
        if value is None:
            if self.optional:
                return None
            raise Invalid(self, value, "required")
        kind = KINDS[self.kind]
        if self.nested is not None and isinstance(value, self.nested):
            return value
        if self.choices is not None:
            if not any(_same(value, c) for c in self.choices):
                raise Invalid(self, value, "choice")
            return value
        if not kind.check(value, self.lenient):
            raise Invalid(self, value, "type")
        given = value  # refusals quote the value as given, not as converted
        if kind.convert is not None:
            value = kind.convert(value, self.lenient)
        if self.nonempty and not value:
            raise Invalid(self, given, "empty")
        if kind.numeric:
            for x in (value if isinstance(value, tuple) else (value,)):
                if isinstance(x, float) and math.isnan(x):
                    if self.lenient:
                        continue
                    raise Invalid(self, given, "nan")
                below = (self.ge is not None and x < self.ge) or (self.gt is not None and x <= self.gt)
                above = (self.le is not None and x > self.le) or (self.lt is not None and x >= self.lt)
                infinite = isinstance(x, float) and math.isinf(x) and not (self.allow_inf or self.lenient)
                if below or above or infinite:
                    raise Invalid(self, given, "range", item=x if isinstance(value, tuple) else None)
        return value


class Invalid(ValueError):
    """A value a field does not accept: :attr:`spec` (the field and what it allows), :attr:`value` and ``why``
    ("required", "type", "nan", "choice", "range", "empty").  ``str()`` reads as an assignment."""

    def __init__(self, field: FieldSpec, value: Any, why: str, item: Any = None):
        self.spec, self.value, self.why = field, value, why
        self.item = item  # the element of a list that is refused (a world size of several)
        super().__init__(self.assignment())

    @property
    def name(self) -> str:
        return self.spec.name

    def assignment(self) -> str:
        """``name=value: ...``, as a knob or a ``--set`` is refused."""
        s, v = self.spec, self.value
        if self.why == "required":
            scalar = KINDS[s.kind].scalar
            return f"{s.name}=None: a value is required ({scalar.__name__ if scalar else KINDS[s.kind].words})"
        if self.why == "nan":
            return f"{s.name}=nan: a number is required"
        if self.why == "choice":
            return f"{s.name}={v!r}: allowed values are {', '.join(map(repr, s.choices or ()))}"
        if self.why == "range":
            return f"{s.name}={v!r}: out of range, allowed {' and '.join(s.bounds())}"
        if self.why == "empty":
            return f"{s.name}={v!r}: may not be empty"
        scalar = KINDS[s.kind].scalar
        return (f"{s.name}={v!r}: expected {scalar.__name__}, got {type(v).__name__}" if scalar is not None
                else f"{s.name}={v!r}: expected {KINDS[s.kind].words}")

    def field(self, where: str = "", prefix: str = "") -> str:
        """``WHERE: field 'PREFIXname' is VALUE; expected ...``, as a JSON document (a record, a spec) is refused."""
        return (f"{where}: " if where else "") + f"field '{prefix}{self.name}' is {show(self.value)}; expected " \
            f"{self.spec.expected()}"

    def option(self, option: str) -> str:
        """``--option VALUE: must be ...``, as a command-line option is refused (a list's refused element alone;
        a choice: ``--size 'huge': allowed values are full, cpu, tiny``)."""
        v = self.value if self.item is None else self.item
        if self.why == "choice":
            return f"{option} {v!r}: allowed values are {', '.join(map(str, self.spec.choices or ()))}"
        shown = ",".join(map(str, v)) if isinstance(v, (list, tuple)) else str(v)
        return f"{option} {shown}: must be {self.spec.must()}"


def _annotation(f: dataclasses.Field) -> str:
    text = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", repr(f.type))
    return text.replace("typing.", "").replace("Optional[", "").strip()


@functools.cache
def field_specs(cls: Any, lenient: bool = False) -> dict[str, FieldSpec]:
    """Each dataclass field's :class:`FieldSpec` (types read from the annotations; a nested dataclass is an object)."""
    hints = typing.get_type_hints(cls)
    out = {}
    for f in dataclasses.fields(cls):
        text, hint = _annotation(f), hints[f.name]
        optional = False
        if typing.get_origin(hint) in (typing.Union, types.UnionType):
            members = typing.get_args(hint)
            rest = [m for m in members if m is not type(None)]
            optional = len(rest) < len(members)
            if len(rest) != 1:
                raise TypeError(f"{cls.__name__}.{f.name}: {hint} is not one type (or one type | None)")
            hint = rest[0]
        parts = [p.strip() for p in text.split("|")]
        text = next((p for p in parts if p != "None"), text)
        meta = f.metadata
        choices = meta.get("choices")
        if typing.get_origin(hint) is Literal:
            choices = typing.get_args(hint)
            if any(type(c) is not type(choices[0]) for c in choices):
                raise TypeError(f"{cls.__name__}.{f.name}: the choices of a Literal must be of one type")
            text = type(choices[0]).__name__
        nested = None
        if text not in KINDS:
            if not (isinstance(hint, type) and dataclasses.is_dataclass(hint)):
                raise TypeError(f"{cls.__name__}.{f.name}: type {text!r}; fields are {', '.join(KINDS)}, a Literal or "
                                f"a dataclass")
            text, nested = "dict", hint  # a nested part: an object, read by its own class
        default = f.default if f.default is not dataclasses.MISSING else None
        out[f.name] = FieldSpec(f.name, text, optional, tuple(choices) if choices is not None else None, default,
                                meta.get("help", ""), meta.get("ge"), meta.get("gt"), meta.get("le"),
                                bool(meta.get("allow_inf")), meta.get("unit", ""), bool(meta.get("nonempty")),
                                lenient, nested, meta.get("note", ""), meta.get("lt"))
    return out


def option_name(f: dataclasses.Field) -> str:
    """The command-line option of a field: its metadata's ``option``, else ``--name`` (dashes for underscores)."""
    return f.metadata.get("option") or "--" + f.name.replace("_", "-")


def check_options(obj: Any, error: type[Exception]) -> None:
    """Every field of the (frozen) dataclass ``obj`` checked, as :func:`check_fields`; a refusal raised as ``error``
    naming the field's command-line option (:func:`option_name`), the value and what is allowed: ``--steps 0: must
    be >= 1 and <= 1000000`` (the one style of a command's options, whichever dataclass holds them)."""
    cls: Any = type(obj)
    names = {f.name: option_name(f) for f in dataclasses.fields(cls)}
    for name, fs in field_specs(cls).items():
        value = getattr(obj, name)
        try:
            checked = fs.check(value)
        except Invalid as exc:
            raise error(exc.option(names[name])) from None
        if checked is not value:
            object.__setattr__(obj, name, checked)


def check_fields(obj: Any) -> None:
    """Every field of the (frozen) dataclass ``obj`` checked, in order; accepted values set as converted (for a
    ``__post_init__``); the first refusal raised as :class:`Invalid`."""
    cls: Any = type(obj)
    for name, fs in field_specs(cls).items():
        value = getattr(obj, name)
        checked = fs.check(value)
        if checked is not value:
            object.__setattr__(obj, name, checked)
