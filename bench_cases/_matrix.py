"""What both harnesses share: the selection (``suite/selection.py``) and the runner's options.

pytest-benchmark takes its selection as ``--fleetbench-*`` options (``conftest.py``); asv runs the
benchmarks in processes of its own and passes them no arguments, so for asv the selection comes
from the environment.  These are the only environment variables the benchmarks read (``fleetbench
nightly`` sets them for its asv stage):

==============================  ==================================================================
FLEETBENCH_BENCH_CASES          case names or globs, comma-separated
FLEETBENCH_BENCH_TAGS           case tags, comma-separated (default: ``smoke``)
FLEETBENCH_BENCH_MODELS         models, comma-separated (every case of each)
FLEETBENCH_BENCH_WORLDS         world sizes, comma-separated (default one: 2 on CPU, every GPU on CUDA)
FLEETBENCH_BENCH_DEVICE         cpu | cuda (default: cuda where torch sees a GPU)
FLEETBENCH_BENCH_SIZE           full | cpu | tiny (default: the device's)
FLEETBENCH_BENCH_CONFIG         a TOML file of strategy fields applied on top of every case
FLEETBENCH_BENCH_SET            ``KEY=VALUE`` strategy fields, separated by ``;``
FLEETBENCH_BENCH_ROUNDS/_STEPS  windows per process, steps per window (default: ``fleetbench run``'s, 6 / 5)
FLEETBENCH_BENCH_PROCESSES      asv: processes whose samples are pooled (default 2)
==============================  ==================================================================

An empty variable counts as unset.  A value that cannot be used is one :class:`ConfigError` naming the
variable, the value and what is allowed (:func:`env_resolved`); pytest's options are named the same way
(:func:`harness_message`), never as ``fleetbench run``'s ``--case``/``--set``.

The *setup* (:func:`setup_of`: size, steps, rounds, warm-up, the strategy overrides, device) is what makes
one benchmark's numbers comparable with another run's; the selection (which cases, which world sizes) is
not part of it.  pytest-benchmark records it in ``machine_info["fleetbench"]["setup"]`` and warns when a
compared run's differs; asv's benchmark ``version`` depends on it (``asv_cases.py``).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import replace

from suite.config import ConfigError, toml_fields
from suite.runner import RunOptions
from suite.selection import Resolved, Selection

__all__ = ["split_csv", "env_selection", "env_int", "env_resolved", "make_selection", "run_options", "setup_of",
           "setup_digest", "harness_message", "OPTION_NAMES", "STEPS", "ROUNDS", "PROCESSES"]

# Steps per timed window and windows: ``fleetbench run``'s defaults (tests/test_bench_conventions.py checks
# that run's command line says the same).
STEPS, ROUNDS = RunOptions.steps, RunOptions.rounds
PROCESSES = 2  # asv: processes whose samples are pooled

# The selection's options as ``fleetbench run`` (and suite/selection.py's messages) name them, and as each harness
# does: (pytest option, asv variable).
OPTION_NAMES = {
    "--case": ("--fleetbench-case", "FLEETBENCH_BENCH_CASES"),
    "--tag": ("--fleetbench-tag", "FLEETBENCH_BENCH_TAGS"),
    "--model": ("--fleetbench-model", "FLEETBENCH_BENCH_MODELS"),
    "--device": ("--fleetbench-device", "FLEETBENCH_BENCH_DEVICE"),
    "--size": ("--fleetbench-size", "FLEETBENCH_BENCH_SIZE"),
    "--config": ("--fleetbench-config", "FLEETBENCH_BENCH_CONFIG"),
    "--set": ("--fleetbench-set", "FLEETBENCH_BENCH_SET"),
}
_RUN_FLAG = re.compile(r"(?<![\w-])(" + "|".join(map(re.escape, OPTION_NAMES)) + r")(?![\w-])")


def harness_message(text: str, harness: str) -> str:
    """A selection error as the harness's user typed it: ``--case`` becomes ``--fleetbench-case`` (``harness``
    "pytest") or ``FLEETBENCH_BENCH_CASES`` ("asv").  Commands quoted in backticks (``fleetbench run --list``)
    are left as they are: they are commands to run."""
    col = {"pytest": 0, "asv": 1}[harness]
    parts = text.split("`")
    for i in range(0, len(parts), 2):  # outside backticks
        parts[i] = _RUN_FLAG.sub(lambda m: OPTION_NAMES[m.group(1)][col], parts[i])
    return "`".join(parts)


def split_csv(text: str | None, sep: str = ",") -> list[str]:
    return [t.strip() for t in (text or "").split(sep) if t.strip()]


def make_selection(cases=(), tags=(), worlds=(), device=None, size=None, config=None, sets=(), models=()) -> Selection:
    """The harnesses' selection: by default the smoke cases (a minute on a 2-core machine)."""
    return Selection(cases=tuple(cases), tags=tuple(tags), models=tuple(models), worlds=tuple(worlds),
                     device=device or None, size=size or None, config=config or None, sets=tuple(sets),
                     default_tag="smoke")


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


def env_selection(environ: Mapping[str, str] | None = None) -> Selection:
    """The selection the FLEETBENCH_BENCH_* variables state (see the table above)."""
    env = (os.environ if environ is None else environ).get
    worlds = [_whole("FLEETBENCH_BENCH_WORLDS", w) for w in split_csv(env("FLEETBENCH_BENCH_WORLDS"))]
    try:
        return make_selection(split_csv(env("FLEETBENCH_BENCH_CASES")), split_csv(env("FLEETBENCH_BENCH_TAGS")),
                              worlds, env("FLEETBENCH_BENCH_DEVICE"), env("FLEETBENCH_BENCH_SIZE"),
                              env("FLEETBENCH_BENCH_CONFIG"), split_csv(env("FLEETBENCH_BENCH_SET"), ";"),
                              split_csv(env("FLEETBENCH_BENCH_MODELS")))
    except ConfigError as exc:
        raise ConfigError(harness_message(str(exc), "asv")) from None


def env_resolved(environ: Mapping[str, str] | None = None) -> Resolved:
    """The FLEETBENCH_BENCH_* selection resolved; an error names the variable (never ``fleetbench run``'s
    ``--case``): asv shows it under its own "failed to import the benchmark suite"."""
    sel = env_selection(environ)
    try:
        return sel.resolve()
    except ConfigError as exc:
        raise ConfigError(harness_message(str(exc), "asv")) from None


def run_options(resolved: Resolved, steps: int, rounds: int, check: bool = True, timeout: float = 600.0):
    """The runner's options for a benchmark harness, on the selection's platform and size."""
    return RunOptions(size=resolved.size, steps=steps, rounds=rounds, check=check, timeout=timeout,
                      device=resolved.device, backend=resolved.backend, utilization=False,
                      baseline_overrides=resolved.selection.sets)


def setup_of(resolved: Resolved, steps: int, rounds: int, **more) -> dict:
    """What a benchmark's numbers depend on besides the code and the machine: device and backend, model size,
    steps per window, windows, the engine's warm-up steps, the strategy overrides (``--fleetbench-set`` /
    FLEETBENCH_BENCH_SET, in order) and the config file's fields (None without one); ``more`` adds the
    harness's own (asv: ``processes``).  Not the selection: which cases and world sizes ran is in each
    benchmark's name."""
    sel = resolved.selection
    return {"device": resolved.device, "backend": resolved.backend, "size": resolved.size, "steps": steps,
            "rounds": rounds, "warmup": run_options(resolved, steps, rounds).warmup, "sets": list(sel.sets),
            "config": json.loads(json.dumps(toml_fields(sel.config), default=str)) if sel.config else None,
            **more}


def default_setup(resolved: Resolved, **more) -> dict:
    """:func:`setup_of` with every default on the selection's device (its default size, no overrides)."""
    from suite.models import default_size

    base = replace(resolved, size=default_size(resolved.device), selection=Selection())
    return setup_of(base, STEPS, ROUNDS, **more)


def setup_digest(setup: dict) -> str:
    """A short stable digest of a setup (its canonical JSON)."""
    text = json.dumps(setup, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]
