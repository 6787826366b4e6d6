"""`fleetbench run --resume`: the run to continue, and its selection and options, read from its records.

A run keeps what it was asked in every record's ``metadata["run"]`` (:func:`recorded`; the metadata is a free
object of the record, so the schema is unchanged): the selection as given (--case, --tag, --model), --config and
--set, and how it measured (size, device, --batch, --steps, --rounds, --warmup, --check-steps, --no-check).
Resuming takes those and the world size from the records (:func:`resolve_resume`); an option given again with
another value is refused, naming the option and both values.  Records written before runs kept their options say
only their size, device and world size: the rest is the command line's, and :attr:`Resume.unknown` names it.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from ..config import ConfigError
from ..model_registry import is_user_ref
from ..results.records import ResultsFileError, name_problem, read_records

__all__ = ["RECORDED", "Resume", "recorded", "resolve_resume"]

# What a run's records keep of its command line (args attributes): what --resume takes from them.
RECORDED = ("case", "tag", "model", "config", "set", "size", "device", "batch", "steps", "rounds", "warmup",
            "check_steps", "no_check")
NAMES = ("case", "tag", "model")  # lists of names, compared as sets ('a,b' is --case a --case b)


def _is_names(v) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


def _is_count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


# what a recorded value must be (a results file is input like any other)
_KINDS = {"case": _is_names, "tag": _is_names, "model": _is_names, "set": _is_names,
          "config": lambda v: v is None or isinstance(v, str), "size": lambda v: v is None or isinstance(v, str),
          "device": lambda v: v is None or isinstance(v, str), "batch": lambda v: v is None or _is_count(v),
          "steps": _is_count, "rounds": _is_count, "warmup": _is_count, "check_steps": _is_count,
          "no_check": lambda v: isinstance(v, bool)}


def _option(name: str) -> str:
    return "--" + name.replace("_", "-")


def _normal(name: str, value):
    """A value as recorded and compared: names split at commas (each once), --set stripped, --config absolute."""
    if name in NAMES:
        return list(dict.fromkeys(p.strip() for v in value for p in v.split(",") if p.strip()))
    if name == "set":
        return [v.strip() for v in value]
    if name == "config" and value:
        return os.path.abspath(value)
    return value


def _given(args, name: str) -> bool:
    """Whether the command line gave the option (``args.given``: :class:`~suite.cli.options.Given`'s note)."""
    value = getattr(args, name)
    return name in getattr(args, "given", ()) or value is True or (isinstance(value, list) and bool(value))


def _shown(value) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, list):
        return ",".join(value) or "(none)"
    return "(not given)" if value is None else str(value)


def recorded(args) -> dict:
    """What the records keep of this run's command line (``metadata["run"]``): ``args`` once resolved (its
    size and device the ones the run uses)."""
    return {name: _normal(name, getattr(args, name)) for name in RECORDED}


@dataclass
class Resume:
    """The run being resumed: its id, the cases recorded for it (an error is run again), and the options its
    records cannot tell (left to the command line)."""

    run_id: str
    done: set = field(default_factory=set)
    unknown: list = field(default_factory=list)


def _told(mine: list) -> dict:
    """The options the run's records tell: its ``metadata["run"]``, else (older records) the size and device
    the records carry, when they agree."""
    kept = next((r.metadata["run"] for r in mine if isinstance(r.metadata.get("run"), dict)), None)
    if kept is not None:
        return {k: v for k, v in kept.items() if k in RECORDED}
    told = {}
    sizes = {r.size for r in mine}
    devices = {r.device.split(":")[0] for r in mine}
    if len(sizes) == 1 and None not in sizes:
        told["size"] = sizes.pop()
    if len(devices) == 1 and "" not in devices:
        told["device"] = devices.pop()
    return told


def resolve_resume(args, world: int | None) -> Resume:
    """The run ``--resume`` names, its options set on ``args`` from its records (and ``args.results``, and
    ``args.nproc`` when not given; ``world``: torchrun's world size, else None).

    ``--resume`` names a results file (its last run is resumed and new records go to it) or a run id in
    ``--results``.  Every record is read through ``read_records``: a corrupt file is an error naming the file
    and line, and nothing in it is touched.  An option given with a value other than the run's is an error.
    """
    target = args.resume
    looks_like_path = os.sep in target or target.endswith((".jsonl", ".json"))
    if os.path.exists(target):
        args.results, run_id = target, None
    elif looks_like_path:
        raise ConfigError(f"--resume {target}: no such results file")
    else:
        run_id = target
    if not os.path.exists(args.results):
        raise ConfigError(f"--resume {target}: no results file {args.results} to resume from")
    try:
        records = read_records(args.results)
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
        raise ConfigError(f"--resume {target}: run id {run_id!r} is not in {args.results}; its last runs: "
                          f"{', '.join(ids) or 'none'}")
    worlds = {r.world_size for r in mine}
    asked = world or args.nproc
    if len(worlds) > 1 or (asked is not None and worlds != {asked}):
        raise ConfigError(f"--resume {target}: run {run_id} ran at world size {sorted(worlds)}, this one at "
                          f"{asked}; resume with the same --nproc")
    if world is None:
        args.nproc = worlds.pop()
    told = _told(mine)
    models = told.get("model")
    factories = [m for m in models if isinstance(m, str) and is_user_ref(m)] if isinstance(models, list) else []
    if factories and not _given(args, "model"):  # a results file never names code to run
        raise ConfigError(f"--resume {target}: run {run_id} ran your own factory "
                          f"{', '.join(repr(f[:200]) for f in factories[:5])}; a results file never names code to "
                          f"run: give --model {' --model '.join(f[:200] for f in factories[:5])} again (with the "
                          f"run's other --model options) to resume it")
    for name, value in told.items():
        if not _KINDS[name](value):
            raise ConfigError(f"--resume {target}: run {run_id}'s recorded {_option(name)} is {value!r}, not a value "
                              f"of that option; the results file is damaged")
        mine_given, theirs = _normal(name, getattr(args, name)), value
        same = sorted(mine_given) == sorted(theirs) if name in NAMES else mine_given == theirs
        if _given(args, name) and not same:
            raise ConfigError(f"--resume {target}: run {run_id} ran with {_option(name)} {_shown(theirs)}, this "
                              f"command gives {_option(name)} {_shown(mine_given)}; leave {_option(name)} out to "
                              f"resume with the run's own")
        setattr(args, name, list(value) if isinstance(value, list) else value)
    # A case that ended in an error, or was not run (its timing interrupted), is run again; finished ones are kept.
    return Resume(run_id, {r.case for r in mine if r.status not in ("error", "not_run")},
                  [n for n in RECORDED if n not in told])
