"""`fleetbench run --resume`: the run to continue, and its specification, read from its records.

Every record of a run carries the run's specification (``CaseRecord.spec``, schema 4; ``suite/run_spec.py``):
the selection as given (--case, --tag, --model), --config and --set, the size and device the run used, and how
it measured (--batch, --steps, --rounds, --warmup, --check-steps, --no-check).  Resuming takes the spec of the
run's last record (``RunSpec.from_dict``, as the record was read) and its world size (:func:`resolve_resume`):
what it says of those options (:attr:`Resume.told`) is what the resumed run's spec is built from
(``suite/cli/run.py``); an option given again with another value is refused, naming the option and both values.
--trace-steps, --timeout, --pg-timeout and --no-utilization are the resume's own.

Records of schema 3 kept the options as the command line's names in ``metadata["run"]``: that is the legacy
path (:func:`legacy_options`), each value checked as the spec's field says.  Records written before runs kept
their options say only their size, device and world size: the rest is the command line's, and
:attr:`Resume.unknown` names it.

A user's own factory (``module:function``) is never imported because a record names it: the user gives
``--model`` again, and it must be the record's.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field

from ..config import ConfigError
from ..model_registry import is_user_ref
from ..outputs import name_problem
from ..results.records import ResultsFileError, read_records
from ..run_spec import RunOptions, RunSpec, Selection
from ..validate import Invalid, field_specs, show

__all__ = ["RECORDED", "Resume", "resolve_resume", "legacy_options"]

# What a run's records tell --resume: the option (its attribute) -> (part, field) of the run's spec.
RECORDED = {"case": ("selection", "cases"), "tag": ("selection", "tags"), "model": ("selection", "models"),
            "config": ("selection", "config"), "set": ("selection", "sets"), "size": ("selection", "size"),
            "device": ("selection", "device"), "batch": ("run", "per_rank_batch"), "steps": ("run", "steps"),
            "rounds": ("run", "rounds"), "warmup": ("run", "warmup"), "check_steps": ("run", "check_steps"),
            "no_check": ("run", "check")}
NAMES = ("case", "tag", "model")  # lists of names, compared as sets ('a,b' is --case a --case b)
_PARTS = {"selection": Selection, "run": RunOptions}


def _option(name: str) -> str:
    return "--" + name.replace("_", "-")


def option_value(spec: RunSpec, name: str):
    """What ``spec`` says for the option ``name``, as the option says it (lists; --no-check the opposite of check)."""
    part, fname = RECORDED[name]
    value = getattr(getattr(spec, part), fname)
    if name == "no_check":
        return not value
    return list(value) if isinstance(value, tuple) else value


def _normal(name: str, value):
    """A value as compared: names split at commas (each once), --set stripped, --config absolute."""
    if name in NAMES:
        return list(dict.fromkeys(p.strip() for v in value for p in v.split(",") if p.strip()))
    if name == "set":
        return [v.strip() for v in value]
    if name == "config" and value:
        return os.path.abspath(value)
    return value


def _shown(value) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, list):
        return ",".join(value) or "(none)"
    return "(not given)" if value is None else str(value)


@dataclass
class Resume:
    """The run being resumed: its id, the results file it is in, its world size, what its records tell of its
    options (``told``: option -> value, as the option says it), the cases recorded for it (an error is run again)
    and the options its records cannot tell."""

    run_id: str
    results: str
    world: int
    told: dict = field(default_factory=dict)
    done: set = field(default_factory=set)
    unknown: list = field(default_factory=list)


def legacy_options(kept: dict, where: str) -> dict:
    """A schema-3 record's ``metadata["run"]`` (the command line's names) as options, each value checked as the
    spec's field accepts it; a damaged one is one ConfigError naming the option, the value and what is allowed."""
    out = {}
    for name, (part, fname) in RECORDED.items():
        if name not in kept:
            continue
        value = kept[name]
        fs = dataclasses.replace(field_specs(_PARTS[part])[fname], name=fname)
        try:
            fs.check(value)
        except Invalid:
            raise ConfigError(f"{where}'s recorded {_option(name)} is {show(value)}, not a value of that option "
                              f"(expected {fs.expected()}); the results file is damaged") from None
        out[name] = value
    return out


def _told(mine: list, where: str) -> dict:
    """The options the run's records tell: the last record's spec; else (schema 3) its ``metadata["run"]``;
    else (older records) the size and device the records carry, when they agree."""
    last = next((r.spec for r in reversed(mine) if r.spec is not None), None)
    if last is not None:
        return {name: option_value(last, name) for name in RECORDED}
    kept = next((r.metadata["run"] for r in mine if isinstance(r.metadata.get("run"), dict)), None)
    if kept is not None:
        return legacy_options(kept, where)
    told = {}
    sizes = {r.size for r in mine}
    devices = {r.device.split(":")[0] for r in mine}
    if len(sizes) == 1 and None not in sizes:
        told["size"] = sizes.pop()
    if len(devices) == 1 and "" not in devices:
        told["device"] = devices.pop()
    return told


def resolve_resume(target: str, results: str, asked: dict, given: set[str], nproc: int | None,
                   world: int | None) -> Resume:
    """The run ``--resume TARGET`` names and what its records tell: ``asked`` is the command line's options (option ->
    value), ``given`` the ones it gave (each must agree with the run's), ``nproc`` its --nproc (None: not given)
    and ``world`` torchrun's world size.

    ``TARGET`` names a results file (its last run is resumed and new records go to it) or a run id in
    ``results``.  Every record is read through ``read_records``: a corrupt file is an error naming the file
    and line, and nothing in it is touched.  An option given with a value other than the run's is an error.
    """
    looks_like_path = os.sep in target or target.endswith((".jsonl", ".json"))
    if os.path.exists(target):
        results, run_id = target, None
    elif looks_like_path:
        raise ConfigError(f"--resume {target}: no such results file")
    else:
        run_id = target
    if not os.path.exists(results):
        raise ConfigError(f"--resume {target}: no results file {results} to resume from")
    try:
        records = read_records(results)
    except ResultsFileError as exc:
        raise ConfigError(f"--resume {target}: {exc}") from None
    if run_id is None:
        if not records:
            raise ConfigError(f"--resume {target}: the results file holds no record, nothing to resume")
        run_id = records[-1].run_id
    bad = name_problem(run_id)
    if bad:
        raise ConfigError(f"--resume {target}: run id {bad}; a run id names trace files, it cannot be a path")
    mine = [r for r in records if r.run_id == run_id]
    if not mine:
        ids = list(dict.fromkeys(r.run_id for r in records))[-5:]
        raise ConfigError(f"--resume {target}: run id {run_id!r} is not in {results}; its last runs: "
                          f"{', '.join(ids) or 'none'}")
    worlds = {r.world_size for r in mine}
    wanted = world or nproc
    if len(worlds) > 1 or (wanted is not None and worlds != {wanted}):
        raise ConfigError(f"--resume {target}: run {run_id} ran at world size {sorted(worlds)}, this one at "
                          f"{wanted}; resume with the same --nproc")
    told = _told(mine, f"--resume {target}: run {run_id}")
    models = told.get("model")
    factories = [m for m in models if isinstance(m, str) and is_user_ref(m)] if isinstance(models, list) else []
    if factories and "model" not in given:  # a results file never names code to run
        raise ConfigError(f"--resume {target}: run {run_id} ran your own factory "
                          f"{', '.join(repr(f[:200]) for f in factories[:5])}; a results file never names code to "
                          f"run: give --model {' --model '.join(f[:200] for f in factories[:5])} again (with the "
                          f"run's other --model options) to resume it")
    for name, theirs in told.items():
        theirs = _normal(name, theirs)
        mine_given = _normal(name, asked.get(name))
        same = sorted(mine_given) == sorted(theirs) if name in NAMES else mine_given == theirs
        if name in given and not same:
            raise ConfigError(f"--resume {target}: run {run_id} ran with {_option(name)} {_shown(theirs)}, this "
                              f"command gives {_option(name)} {_shown(mine_given)}; leave {_option(name)} out to "
                              f"resume with the run's own")
        told[name] = theirs
    # A case that ended in an error, or was not run (its timing interrupted), is run again; finished ones are kept.
    return Resume(run_id, results, worlds.pop(), told, {r.case for r in mine if r.status not in ("error", "not_run")},
                  [n for n in RECORDED if n not in told])
