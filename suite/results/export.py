"""The nightly's one measurement, exported: the records of its `run` stage (each case x world size timed once,
interleaved as ``fleetbench run`` times them) written besides as pytest-benchmark JSON and as asv results, so that
neither harness times the same pairs again (issue 32 item 4).

pytest-benchmark: the document ``--benchmark-json`` writes (``pytest_benchmark.plugin.pytest_benchmark_generate_json``:
``machine_info``, ``commit_info``, ``benchmarks``, ``datetime``, ``version``), one benchmark per measured (case, world)
in the shape bench_cases' plugin gives its own (``bench_cases/test_cases.py``): name ``test_step[CASE@WORLD]``, group
``MODEL@WORLD``, params ``{"case", "world"}``, one round = one timed window's mean step (the slowest rank's window /
steps per window), ``extra_info`` with the unit and the record's numbers (:func:`extra_info`, which the live
harness calls too); the statistics are pytest-benchmark's own (``pytest_benchmark.stats.Stats``), so
``pytest-benchmark compare`` reads the file as one of its own.

asv: the results file ``asv run`` writes for a commit (``asv/results.py``, ``Results.save``, api version 2:
``results/<machine>/<commit[:8]>-<env>.json``) for the benchmark ``asv_cases.StepTime.time_step`` as asv discovered
it (its ``params`` and ``version`` from ``benchmarks.json``, so the series continue), each pair's samples (one per
timed window, seconds per step), its statistic and spread computed by asv's own ``compute_stats``
(``asv_runner.statistics``), ``number`` 1; and the machine's ``machine.json`` (``asv.machine.Machine.save``).  A
pair not measured tonight (skipped, failed, not selected) is ``null``, asv's "no result".

Every file goes through ``suite.outputs`` (``OutputDir``): nothing is written through a link.
"""
from __future__ import annotations

import datetime
import itertools
import math
import os
import platform
import re
import sys
from collections.abc import Iterable
from typing import Any

from ..outputs import OutputDir
from ..run_spec import run_setup
from .records import METRIC_UNITS, CaseRecord, jsonable

__all__ = ["UNIT", "UNITS", "what_a_round_is", "extra_info", "MEASURED_BY", "measured", "round_samples",
           "pytest_benchmark_doc", "pytest_benchmark_machine_id", "asv_env_name", "asv_results_doc", "asv_results_path",
           "write_asv", "ASV_BENCHMARK", "ASV_API_VERSION", "ASV_MACHINE_API_VERSION"]

UNIT = "s per training step"  # what the benchmarks' numbers (stats) are
UNITS = {  # what each number in a benchmark's extra_info is: the record's metrics, and two of the harness's own
    "stats": "s: per round, one training step (the slowest rank's window / steps_per_window)",
    "rank_window_s": "s: per window, each rank's window between its two barriers",
    **METRIC_UNITS,
}
ASV_BENCHMARK = "asv_cases.StepTime.time_step"
ASV_API_VERSION = 2  # asv.results.Results.api_version
ASV_MACHINE_API_VERSION = 1  # asv.machine.Machine.api_version
ASV_COLUMNS = ["result", "params", "version", "started_at", "duration", "stats_ci_99_a", "stats_ci_99_b", "stats_q_25",
               "stats_q_75", "stats_number", "stats_repeat", "samples", "profile"]  # Results.save's all_keys


def what_a_round_is(k: int | str) -> str:
    return (f"one training step: the mean step of one timed window of {k} steps on every rank between two "
            f"barriers (the slowest rank's window / {k}), timed by the ranks' own clocks, without the round trip "
            f"from pytest to the ranks; the model's cases and its baseline timed interleaved, window by window in "
            f"the same rounds, as `fleetbench run` times them")


def round_samples(rec: CaseRecord) -> list[float]:
    """The record's timed windows as seconds per step (one sample per window), or [] when it has none usable."""
    m = rec.metrics
    k = m.steps_per_window
    if not m.window_s or not k:
        return []
    out = [float(w) / k for w in m.window_s]
    return out if all(math.isfinite(x) and x > 0 for x in out) else []


def measured(records: Iterable[CaseRecord]) -> list[CaseRecord]:
    """The records with timings (status ok, finite windows), the last one of each (case, world size)."""
    last: dict[tuple[str, int], CaseRecord] = {}
    for rec in records:
        if rec.status == "ok" and round_samples(rec):
            last[(rec.case, rec.world_size)] = rec
    return list(last.values())


# ---- pytest-benchmark ------------------------------------------------------------------------------------
def pytest_benchmark_machine_id() -> str:
    """pytest-benchmark's storage folder for this interpreter (``pytest_benchmark.utils.get_machine_id``)."""
    return (f"{platform.system()}-{platform.python_implementation()}-"
            f"{'.'.join(platform.python_version_tuple()[:2])}-{'64' if sys.maxsize > 2**32 else '32'}bit")


def _stats(samples: list[float]) -> dict:
    from pytest_benchmark.stats import Stats  # pytest-benchmark's own statistics: its compare reads them

    s = Stats()
    for x in samples:
        s.update(x)
    out = s.as_dict()
    out.update(data=list(samples), iterations=1)
    return out


def _setup(rec: CaseRecord) -> dict:
    """The setup (``suite.run_spec.run_setup``) the record ran: its platform and size, the steps and windows it timed,
    its spec's warm-up and overrides.  ``config`` is None: a record keeps each case's whole config, not the config
    file's fields."""
    run = rec.spec.run if rec.spec is not None else None
    sel = rec.spec.selection if rec.spec is not None else None
    return run_setup(device=rec.device.split()[0] if rec.device else None, backend=rec.backend, size=rec.size,
                     steps=rec.metrics.steps_per_window, rounds=len(rec.metrics.window_s or ()),
                     warmup=run.warmup if run else None, sets=sel.sets if sel else (), config=None)


def extra_info(rec: CaseRecord, measured_by: str, **more: Any) -> dict:
    """A benchmark's ``extra_info`` from its record: the one shape both pytest-benchmark writers give, the nightly's
    export (:func:`pytest_benchmark_doc`) and the live harness (``bench_cases/test_cases.py``), JSON-able
    (:func:`~suite.results.records.jsonable`: nan and inf as strings).

    The case (``case``, ``model``, ``variant``, ``world_size``, ``tags``, ``size``, ``config``: its whole resolved
    strategy config), the unit (``unit``, ``units``: what each number is, ``steps_per_window``, ``round``: what one
    round is), how it went (``status``, ``verdict``, ``message``: the check's message or the error, ``fallback``: why
    it was timed alone, else None), the record's numbers (``samples_per_s``, ``throughput_per_round``, ``window_s``,
    ``step_times_s``, ``rank_median_step_s``, ``peak_memory_bytes``, ``threads_per_rank``, ``speedup``,
    ``speedup_ci``, ``baseline``), its ``describe`` and ``structure``, ``backend``, ``device``, ``run_id`` and
    ``measured_by`` (which harness timed it, how).  ``more``: what a harness knows beyond the record (the live
    one: ``rank_window_s``, each rank's windows, and ``interleaved_with``, the variants timed in the same rounds);
    it may not replace a key of the record's."""
    m, k = rec.metrics, rec.metrics.steps_per_window
    info = dict(case=rec.case, model=rec.model, variant=rec.case.rsplit("/", 1)[-1], world_size=rec.world_size,
                unit=UNIT, steps_per_window=k, round=what_a_round_is(k or "?"), units=UNITS, size=rec.size,
                config=rec.config, tags=list(rec.tags), status=rec.status, verdict=rec.verdict,
                message=(rec.check.message if rec.check else None) or rec.error, fallback=rec.fallback,
                samples_per_s=m.samples_per_s, throughput_per_round=m.throughput_per_round,
                step_times_s=m.step_times_s, rank_median_step_s=m.rank_median_step_s,
                peak_memory_bytes=m.peak_memory_bytes, window_s=m.window_s, threads_per_rank=m.threads,
                speedup=m.speedup, speedup_ci=m.speedup_ci, baseline=m.baseline, describe=rec.describe,
                structure=rec.structure, backend=rec.backend, device=rec.device, run_id=rec.run_id,
                measured_by=measured_by)
    clash = sorted(set(more) & set(info))
    if clash:
        raise ValueError(f"extra_info: {', '.join(clash)} are the record's, not a harness's own")
    return jsonable({**info, **more})


MEASURED_BY = "fleetbench run (the nightly's run stage, interleaved with the model's other cases)"


def _benchmark(rec: CaseRecord) -> dict:
    m = rec.metrics
    param = f"{rec.case}@{rec.world_size}"
    return {"group": f"{rec.model}@{rec.world_size}", "name": f"test_step[{param}]",
            "fullname": f"bench_cases/test_cases.py::test_step[{param}]", "params": {"case": rec.case,
                                                                                     "world": rec.world_size},
            "param": param, "extra_info": extra_info(rec, MEASURED_BY),
            "options": {"disable_gc": False, "timer": "rank_clock", "min_rounds": len(m.window_s or ()),
                        "max_time": None, "min_time": None, "warmup": False},
            "stats": _stats(round_samples(rec))}


def pytest_benchmark_doc(records: Iterable[CaseRecord], commit: str, when: datetime.datetime | None = None,
                         metadata: dict | None = None, branch: str | None = None) -> dict:
    """The ``--benchmark-json`` document of the measured records (:func:`measured`)."""
    recs = measured(records)
    when = when or datetime.datetime.now(datetime.UTC)
    meta = dict(metadata if metadata is not None else (recs[0].metadata if recs else {}))
    meta["setup"] = _setup(recs[0]) if recs else None
    meta["worlds"] = sorted({r.world_size for r in recs})
    try:
        from pytest_benchmark import __version__ as version
    except ImportError:  # pragma: no cover - the stats need it anyway
        version = "unknown"
    machine_info = {"node": platform.node(), "processor": platform.processor(), "machine": platform.machine(),
                    "python_compiler": platform.python_compiler(),
                    "python_implementation": platform.python_implementation(),
                    "python_implementation_version": platform.python_version(),
                    "python_version": platform.python_version(), "python_build": list(platform.python_build()),
                    "release": platform.release(), "system": platform.system(), "cpu": {},
                    "torch": meta.get("torch"), "cuda": meta.get("cuda"), "nccl": meta.get("nccl"),
                    "gpu": meta.get("gpu"), "fleetbench": jsonable(meta)}
    commit_info = {"id": commit, "time": when.isoformat(), "author_time": when.isoformat(), "dirty": False,
                   "project": "fleetbench", "branch": branch or "(unknown)"}
    return {"machine_info": machine_info, "commit_info": commit_info,
            "benchmarks": [_benchmark(r) for r in sorted(recs, key=lambda r: (r.world_size, r.model, r.case))],
            "datetime": when.isoformat(), "version": version}


# ---- asv -------------------------------------------------------------------------------------------------
def asv_env_name(executable: str) -> str:
    """The name asv gives ``-E existing:EXECUTABLE`` (``ExistingEnvironment.name``: ``get_env_name("existing",
    executable with separators as _, {}, {})``, ``util.sanitize_filename``)."""
    name = "existing-py" + os.path.abspath(executable).replace(os.path.sep, "_")
    return re.sub('[<>:"/\\\\^|?*\x00-\x1f]', "_", name)


def asv_results_path(machine: str, commit: str, env_name: str) -> str:
    """``asv.results.get_filename``: MACHINE/COMMIT[:8]-ENV.json (a long env name as its md5)."""
    if env_name and len(env_name) >= 128:
        import hashlib

        env_name = "env-" + hashlib.md5(env_name.encode("utf-8")).hexdigest()
    return os.path.join(machine, f"{commit[:8]}-{env_name}.json")


def _literal(text: str) -> Any:
    import ast

    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def asv_results_doc(records: Iterable[CaseRecord], benchmark: dict, machine: dict, commit: str, date_ms: int,
                    python: str, env_name: str, started_at_ms: int | None = None) -> dict:
    """The results file of ``asv run --record-samples`` for ``commit``: ``benchmark`` is the entry of
    ``benchmarks.json`` (asv's discovery of ``bench_cases/asv_cases.py``: its ``params`` in asv's repr strings and
    its ``version``); ``machine`` the machine's asv parameters (``~/.asv-machine.json``'s entry)."""
    from asv_runner.statistics import compute_stats  # asv's own statistic and spread

    params = benchmark.get("params") or []
    by_pair = {(r.case, r.world_size): r for r in measured(records)}
    result: list = []
    samples: list = []
    stats: list = []
    for combo in itertools.product(*params):
        values = [_literal(v) for v in combo]
        rec = by_pair.get((values[0], values[1])) if len(values) == 2 else None
        got = round_samples(rec) if rec is not None else []
        value, st = compute_stats(got, 1) if got else (None, None)
        result.append(value)
        samples.append(got or None)
        stats.append(st)
    started = started_at_ms if started_at_ms is not None else int(datetime.datetime.now(
        datetime.UTC).timestamp() * 1000)
    columns: dict = {"result": result if any(v is not None for v in result) else None, "params": params,
               "version": benchmark.get("version"), "started_at": started, "duration": None,
               "samples": samples if any(s is not None for s in samples) else None, "profile": None}
    row: list = []
    for key in ASV_COLUMNS:
        if key.startswith("stats_"):
            vals = [s.get(key[6:]) if s is not None else None for s in stats]
            row.append(vals if any(v is not None for v in vals) else None)
        else:
            row.append(columns[key])
    while row and row[-1] is None:
        row.pop()
    env_params = dict(machine, python=python)
    return {"commit_hash": commit, "env_name": env_name, "date": int(date_ms), "params": env_params,
            "python": python, "requirements": {}, "env_vars": {}, "result_columns": ASV_COLUMNS,
            "results": {ASV_BENCHMARK: row}, "durations": {}, "version": ASV_API_VERSION}


def write_asv(results_dir: OutputDir, doc: dict, machine: dict) -> str:
    """The results file and the machine's ``machine.json`` written under asv's results directory; the file's path
    relative to it.  An earlier file of the same commit and environment is replaced (``asv run`` does the same)."""
    import json

    name = machine["machine"]
    results_dir.write(os.path.join(name, "machine.json"), json.dumps(dict(machine, version=ASV_MACHINE_API_VERSION),
                                                                     indent=4, sort_keys=True))
    rel = asv_results_path(name, doc["commit_hash"], doc["env_name"])
    results_dir.write(rel, json.dumps(doc))  # as asv.util.write_json (inf where asv has no interval)
    return rel
