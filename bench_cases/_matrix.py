"""What both harnesses share: the run specification (``suite/run_spec.py``), resolved by ``suite/selection.py``.

A harness receives a ``RunSpec``: pytest-benchmark as a file (``--fleetbench-spec FILE``), asv (which runs the
benchmarks in processes of its own and passes them no arguments) as one variable holding its JSON,
``FLEETBENCH_BENCH_SPEC``; ``fleetbench nightly`` hands both the spec its other stages run.  A person typing by
hand may give the spec's options instead, pytest's ``--fleetbench-*`` (``conftest.py``) or asv's variables
(below): both are made from the spec's metadata and built into the same ``RunSpec`` by the one builder
(``suite.spec_options.spec_from``); given with a spec they are an error (one or the other states the run).  The
variables the benchmarks read: FLEETBENCH_BENCH_SPEC, one ``FLEETBENCH_BENCH_NAME`` per option of the spec on
asv (``spec_options.options("asv")``: the name is the field's, upper case):

==============================  ==================================================================
FLEETBENCH_BENCH_SPEC           the run specification as JSON (``RunSpec.to_json``); or the options:
FLEETBENCH_BENCH_CASES          case names or globs, comma-separated
FLEETBENCH_BENCH_TAGS           case tags, comma-separated (default: ``smoke``)
FLEETBENCH_BENCH_MODELS         models, comma-separated (every case of each)
FLEETBENCH_BENCH_WORLDS         world sizes, comma-separated (default one: 2 on CPU, every GPU on CUDA)
FLEETBENCH_BENCH_DEVICE         cpu | cuda (default: cuda where torch sees a GPU)
FLEETBENCH_BENCH_SIZE           full | cpu | tiny (default: the device's)
FLEETBENCH_BENCH_CONFIG         a TOML file of strategy fields applied on top of every case
FLEETBENCH_BENCH_SET            ``KEY=VALUE`` strategy fields, separated by ``;``
FLEETBENCH_BENCH_ROUNDS/_STEPS  windows per process, steps per window (default: the spec's, ``fleetbench run``'s)
FLEETBENCH_BENCH_PROCESSES      asv: processes whose samples are pooled (default 2; asv's own, not the spec's)
==============================  ==================================================================

An empty variable counts as unset.  A value that cannot be used is one :class:`ConfigError` naming the
variable, the value and what is allowed (:func:`env_spec`, :func:`resolved_of`); pytest's options are named the
same way (:func:`harness_message`), never as ``fleetbench run``'s ``--case``/``--set``.

The *setup* (:func:`setup_of`, ``suite.run_spec.run_setup``'s fields: size, steps, rounds, warm-up, the strategy
overrides, device) is what makes one benchmark's numbers comparable with another run's; the selection (which
cases, which world sizes) is not part of it.  pytest-benchmark records it in
``machine_info["fleetbench"]["setup"]`` and warns when a compared run's differs; asv's benchmark ``version``
depends on it (``asv_cases.py``).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import replace

from suite import spec_options
from suite.config import ConfigError, toml_fields
from suite.run_spec import RunFacts, RunOptions, RunSpec, Selection, run_setup
from suite.selection import Resolved, resolve

__all__ = ["split_csv", "env_spec", "env_int", "resolved_of", "facts_of", "setup_of", "default_setup", "setup_digest",
           "harness_message", "OPTION_NAMES", "PROCESSES", "SPEC_VAR", "OPTION_VARS"]

PROCESSES = 2  # asv: processes whose samples are pooled
SPEC_VAR = spec_options.SPEC_FILE["asv"]
OPTION_VARS = tuple(o.named("asv") for o in spec_options.options("asv"))

# The spec's options as ``fleetbench run`` (and suite/selection.py's messages) name them, and as each harness
# does: (pytest option, asv variable; pytest's where asv has none).
_HARNESSES = [o for o in spec_options.TABLE.values() if "pytest" in o.on or "asv" in o.on]
OPTION_NAMES = {o.flag: (o.named("pytest"), o.named("asv") if "asv" in o.on else o.named("pytest"))
                for o in _HARNESSES if o.flag.startswith("--")}
_LABELS = {o.flag: (o.named("pytest"), o.named("asv")) for o in _HARNESSES if not o.flag.startswith("--")}
_RUN_FLAG = re.compile(r"(?<![\w-])(" + "|".join(map(re.escape, OPTION_NAMES)) + r")(?![\w-])")


def harness_message(text: str, harness: str) -> str:
    """An error as the harness's user typed it: ``--case`` becomes ``--fleetbench-case`` (``harness``
    "pytest") or ``FLEETBENCH_BENCH_CASES`` ("asv"); a spec's refusal of a world size ("world size 0: must be")
    names the harness's option too.  Commands quoted in backticks (``fleetbench run --list``) are left as they
    are: they are commands to run."""
    col = {"pytest": 0, "asv": 1}[harness]
    for label, names in _LABELS.items():
        if text.startswith(label + " ") and ": must be" in text:
            text = names[col] + text.removeprefix(label)
    parts = text.split("`")
    for i in range(0, len(parts), 2):  # outside backticks
        parts[i] = _RUN_FLAG.sub(lambda m: OPTION_NAMES[m.group(1)][col], parts[i])
    return "`".join(parts)


def split_csv(text: str | None, sep: str = ",") -> list[str]:
    return [t.strip() for t in (text or "").split(sep) if t.strip()]


def _whole(name: str, text: str, minimum: int = 1) -> int:
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < minimum:
        raise ConfigError(f"{name}={text!r}: must be a whole number >= {minimum}")
    return value


def env_int(name: str, default: int, environ: Mapping[str, str] | None = None) -> int:
    """A whole number >= 1 from the variable ``name`` (``default`` when unset or empty); else a ConfigError
    naming the variable, its value and what is allowed."""
    text = (os.environ if environ is None else environ).get(name, "").strip()
    return _whole(name, text) if text else default


def env_spec(environ: Mapping[str, str] | None = None) -> RunSpec:
    """The run specification of the environment: FLEETBENCH_BENCH_SPEC, or the options' variables (see the table),
    built by the one builder (``spec_options.spec_from``)."""
    environ = os.environ if environ is None else environ
    try:
        return spec_options.spec_from(spec_options.given_env(environ))
    except ConfigError as exc:
        raise ConfigError(harness_message(str(exc), "asv")) from None


def resolved_of(spec: RunSpec, harness: str) -> Resolved:
    """The spec's selection resolved; an error names the harness's option or variable (never ``fleetbench run``'s
    ``--case``): asv shows it under its own "failed to import the benchmark suite", pytest as a usage error."""
    try:
        return resolve(spec.selection)
    except ConfigError as exc:
        raise ConfigError(harness_message(str(exc), harness)) from None


def facts_of(resolved: Resolved, spec: RunSpec) -> RunFacts:
    """What a benchmark harness's runner is told besides the spec's options: the selection's platform and size."""
    return spec.facts(resolved.size, resolved.device, resolved.backend)


def setup_of(resolved: Resolved, run: RunOptions, **more) -> dict:
    """The setup (``suite.run_spec.run_setup``: what a benchmark's numbers depend on besides the code and the
    machine) of a harness's session: the resolved selection's device, backend, size, overrides and config file's
    fields, ``run``'s steps, rounds and warm-up; ``more``: the harness's own (asv: ``processes``)."""
    sel = resolved.selection
    return run_setup(device=resolved.device, backend=resolved.backend, size=resolved.size, steps=run.steps,
                     rounds=run.rounds, warmup=run.warmup, sets=sel.sets,
                     config=toml_fields(sel.config) if sel.config else None, **more)


def default_setup(resolved: Resolved, **more) -> dict:
    """:func:`setup_of` with every default on the selection's device (its default size, no overrides)."""
    from suite.models import default_size

    base = replace(resolved, size=default_size(resolved.device), selection=Selection())
    return setup_of(base, RunOptions(), **more)


def setup_digest(setup: dict) -> str:
    """A short stable digest of a setup (its canonical JSON)."""
    text = json.dumps(setup, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]
