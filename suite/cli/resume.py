"""`fleetbench run --resume`: the run to continue, and its specification, read from its records.

Every record of a run carries the run's specification (``CaseRecord.spec``, schema 4; ``suite/run_spec.py``):
the selection as given (--case, --tag, --model), --config and --set, the size and device the run used, and how
it measured (--batch, --steps, --rounds, --warmup, --check-steps, --no-check).  Resuming takes the spec of the
run's last record (``RunSpec.from_dict``, as the record was read) and its world size (:func:`resolve_resume`):
the one builder (``spec_options.spec_from``, given :class:`~suite.spec_options.Resumed`) builds the resumed run
from it, and an option given again with another value is refused, naming the option and both values.
--trace-steps, --timeout, --pg-timeout and --no-utilization are the resume's own (their metadata says
``invocation``).

Records of schema 3 kept the options as the command line's names in ``metadata["run"]``: those names are the
options' own (``--steps`` kept as ``steps``, ``--no-check`` as ``no_check``), so they go through the same builder
as the command line (:func:`_told`).  Records written before runs kept their options say only their size, device
and world size: the rest is the command line's, and :attr:`Resume.unknown` names it.

A user's own factory (``module:function``) or strategy is never imported because a record names it: the user gives
``--model`` (``--strategy``) again, and it must be the record's.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from .. import spec_options
from ..config import ConfigError
from ..model_registry import is_user_ref
from ..outputs import name_problem
from ..results.records import ResultsFileError, read_records
from ..spec_options import Given, OptionError, Resumed
from ..validate import show

__all__ = ["Resume", "resolve_resume"]


@dataclass
class Resume:
    """The run being resumed: its id, the results file it is in, its world size, what its records tell
    (``resumed``: their spec and the fields it tells), the cases recorded for it (an error is run again) and the
    options its records cannot tell."""

    run_id: str
    results: str
    world: int
    resumed: Resumed
    done: set = field(default_factory=set)
    unknown: list = field(default_factory=list)


def _recorded() -> list:
    """The options a run's records tell: run's, but the invocation's own."""
    return [o for o in spec_options.options("run") if not o.invocation]


def _told(mine: list, where: str) -> Resumed:
    """What the run's records tell: the last record's spec; else (schema 3) its ``metadata["run"]``, the options by
    their names, built as the command line's are; else (older records) the size and device the records carry,
    when they agree."""
    last = next((r.spec for r in reversed(mine) if r.spec is not None), None)
    if last is not None:
        return Resumed(last, frozenset(o.key for o in _recorded()), where)
    kept = next((r.metadata["run"] for r in mine if isinstance(r.metadata.get("run"), dict)), None)
    values: dict = {}
    if kept is not None:
        for o in _recorded():
            name = o.flag.removeprefix("--").replace("-", "_")  # as argparse kept it: --no-check as no_check
            if name in kept:
                value = kept[name]
                values[o.key] = (not value) if o.inverted and isinstance(value, bool) else value
    else:
        sizes = {r.size for r in mine}
        devices = {r.device.split(":")[0] for r in mine}
        if len(sizes) == 1 and None not in sizes:
            values[("selection", "size")] = sizes.pop()
        if len(devices) == 1 and "" not in devices:
            values[("selection", "device")] = devices.pop()
    try:
        spec = spec_options.spec_from(Given("run", values))
    except OptionError as exc:
        raise ConfigError(f"{where}'s recorded {exc.option} is {show(exc.invalid.value)}, not a value of that option "
                          f"(expected {exc.invalid.spec.expected()}); the results file is damaged") from None
    return Resumed(spec, frozenset(values), where)


def resolve_resume(target: str, results: str, given: Given, nproc: int | None, world: int | None) -> Resume:
    """The run ``--resume TARGET`` names and what its records tell: ``given`` is the command line's options (each
    must agree with the run's: ``spec_options.spec_from`` checks them), ``nproc`` its --nproc (None: not given) and
    ``world`` torchrun's world size.

    ``TARGET`` names a results file (its last run is resumed and new records go to it) or a run id in
    ``results``.  Every record is read through ``read_records``: a corrupt file is an error naming the file
    and line, and nothing in it is touched.
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
    resumed = _told(mine, f"--resume {target}: run {run_id}")
    models = resumed.spec.selection.models if ("selection", "models") in resumed.told else ()
    factories = [m for m in models if is_user_ref(m)]
    if factories and not given.gave("selection", "models"):  # a results file never names code to run
        raise ConfigError(f"--resume {target}: run {run_id} ran your own factory "
                          f"{', '.join(repr(f[:200]) for f in factories[:5])}; a results file never names code to "
                          f"run: give --model {' --model '.join(f[:200] for f in factories[:5])} again (with the "
                          f"run's other --model options) to resume it")
    strategies = resumed.spec.selection.strategies if ("selection", "strategies") in resumed.told else ()
    if strategies and not given.gave("selection", "strategies"):  # nor a strategy of the user's own
        raise ConfigError(f"--resume {target}: run {run_id} ran your own strategy "
                          f"{', '.join(repr(f[:200]) for f in strategies[:5])}; a results file never names code to "
                          f"run: give --strategy {' --strategy '.join(f[:200] for f in strategies[:5])} again to "
                          f"resume it")
    # A case that ended in an error, or was not run (its timing interrupted), is run again; finished ones are kept.
    return Resume(run_id, results, worlds.pop(), resumed,
                  {r.case for r in mine if r.status not in ("error", "not_run")},
                  [o.flag for o in _recorded() if o.key not in resumed.told])
