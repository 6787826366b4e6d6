"""Reading one side of a comparison: the suite's records (JSON lines) or pytest-benchmark JSON.

Both become a :class:`Side`: per case (keyed ``model/variant@world``) its record, a
:class:`~suite.results.records.CaseRecord` (a records file's last record of the case; a pytest-benchmark
benchmark read into one by :func:`_benchmark_record`, the one adapter: its rounds as ``metrics.window_s``, its
steps, structure, verdict, status and throughput in the record's fields), where it came from, and what the
results were measured on (torch version, device).  :func:`windows` and :func:`samples` are the two kinds of
time sample every reader takes from a record: per window, seconds per step of each timed window (a record's
``metrics.window_s`` over its ``steps_per_window``; a pytest-benchmark round, which is one step, or in files
older than that unit a round over its ``steps_per_round``), and per step (``metrics.step_times_s``).  The
gate compares windows, not steps: the steps of one window are autocorrelated, and treating them as
independent samples made the test overconfident.  Anything that cannot be used raises
:class:`ResultsFileError` naming the file, the line or the benchmark, and what is wrong.
"""
from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field

from ..outputs import InputError, json_problem, loads_bounded, open_input
from ..run_spec import SIZES
from .records import (
    MAX_RESULTS_BYTES,
    STATUSES,
    VERDICTS,
    CaseRecord,
    Metrics,
    ResultsFileError,
    Structure,
    read_records,
    run_ids_held,
    runs_newest_first,
)

# Per case and kind (a real record has tens to a few thousand: rounds x steps x ranks).  The gate's bootstrap
# holds n_boot (1000) resamples of one side at once: 20,000 samples are 160 MB at most.
MAX_SAMPLES = 20_000

__all__ = ["Side", "load_side", "case_key", "windows", "samples", "PYTEST_BENCHMARK_RUN"]

PYTEST_BENCHMARK_RUN = "pytest-benchmark"  # the run id of a benchmark's record whose extra_info names none


def case_key(case: str, world_size: int) -> str:
    return f"{case}@{world_size}"


def windows(rec: CaseRecord) -> list[float]:
    """The record's per-window samples, the gate's: seconds per step of each timed window (``metrics.window_s``
    over ``steps_per_window``); none without a whole number of steps per window >= 1."""
    k = rec.metrics.steps_per_window
    if k is None or k < 1:
        return []
    return [w / k for w in rec.metrics.window_s or []]


def samples(rec: CaseRecord) -> list[float]:
    """The record's per-step samples: every rank's step times (``metrics.step_times_s``)."""
    return list(rec.metrics.step_times_s or [])


@dataclass
class Side:
    path: str
    kind: str  # "records" | "pytest-benchmark"
    cases: dict[str, CaseRecord]  # key -> its record (a records file's last of the case)
    where: dict[str, str] = field(default_factory=dict)  # key -> file:line or file: benchmark name
    torch: str | None = None
    device: str | None = None  # GPU names, or the CPU model
    run_ids: list[str] = field(default_factory=list)  # of the records read (after --base-run-id/--head-run-id)
    records: list[CaseRecord] = field(default_factory=list)  # every record read (records files only)
    runs_in_file: list[str] = field(default_factory=list)  # every run id of a records file, newest first
    run_id: str | None = None  # the run asked for, if one was

    @property
    def used_run_ids(self) -> list[str]:
        """The runs the compared cases' records came from (the last record of each case), newest first."""
        used = {c.run_id for c in self.cases.values()}
        return [r for r in self.runs_in_file if r in used]


def _device_of(meta: dict) -> str | None:
    gpu = meta.get("gpu") or {}
    if gpu.get("available"):
        return "GPU: " + ", ".join(gpu.get("names") or [])
    cpu = meta.get("cpu")
    return f"CPU: {cpu}" if cpu else None


def _show(value: object) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _floats(values: object, where: str, what: str) -> list[float]:
    if values is None:
        return []
    if not isinstance(values, list):
        raise ResultsFileError(f"{where}: {what} is {_show(values)}; expected a list of numbers (seconds)")
    if len(values) > MAX_SAMPLES:
        raise ResultsFileError(f"{where}: {what} holds {len(values)} values, more than the {MAX_SAMPLES} a case may "
                               f"have; not a fleetbench result")
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ResultsFileError(f"{where}: {what} holds {v!r}; expected numbers (seconds)")
        out.append(float(v))
    return out


EXPECTED = "expected records (.jsonl lines from fleetbench run) or a pytest-benchmark JSON"
NOT_RESULTS = "not a results file: " + EXPECTED


def _not_a_record(path: str, value: object) -> None:
    """Raises unless ``value`` (a JSON document, or a file's first line) is a fleetbench case record: JSON, but not
    a results file (a report's report_data.json, compare --json's output)."""
    kind = value.get("kind") if isinstance(value, dict) else None
    if kind != "fleetbench.case":
        raise ResultsFileError(f"{path}: {NOT_RESULTS}" + (f" (its kind is {_show(kind)})" if isinstance(kind, str)
                                                            else ""))


def load_side(path: str, run_id: str | None = None) -> Side:
    """Read ``path``: a pytest-benchmark JSON file, or a records file (last record per case wins)."""
    try:
        return _load_side(path, run_id)
    except InputError as exc:  # the file itself (suite.outputs): said as every results file's fault is
        raise ResultsFileError(str(exc)) from None


def _load_side(path: str, run_id: str | None) -> Side:
    if os.path.isdir(path):
        raise ResultsFileError(f"{path}: is a directory; give a results file (records .jsonl or pytest-benchmark "
                               f".json)")
    try:
        with open_input(path, "results file", MAX_RESULTS_BYTES) as fh:
            text = fh.read().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ResultsFileError(f"{path}: not a text file ({exc.reason} at byte {exc.start})") from None
    if not text.strip():
        raise ResultsFileError(f"{path}: the file is empty")
    data, whole = None, None  # the text as one JSON document; why it is not one
    if text.lstrip()[:1] == "{":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            whole = exc  # several lines: a records file (or a JSON document cut short)
        except (RecursionError, ValueError):
            data = loads_bounded(text, path)  # raises, naming the file
        if isinstance(data, dict) and "benchmarks" in data:
            loads_bounded(text, path)  # nesting within limits
            return _from_pytest_benchmark(path, data)
    if data is not None:
        _not_a_record(path, data)
    # the first line that is not blank, found without splitting the whole text (a file of blank lines would make a
    # list of millions), and split at "\n" only, as records are written and read: a U+2028 inside a record's text
    # is a character of that record, not a line break (str.splitlines would cut there)
    start = re.search(r"\S", text)
    assert start is not None  # the text is not blank (above)
    begin = text.rfind("\n", 0, start.start()) + 1
    end = text.find("\n", start.start())
    first = text[begin:] if end < 0 else text[begin:end]
    try:
        value = json.loads(first)
    except json.JSONDecodeError:
        if not first.lstrip().startswith("{"):  # not JSON at all (README.md)
            raise ResultsFileError(f"{path}: {NOT_RESULTS}") from None
        if whole is not None and whole.lineno > 1:  # a JSON document over several lines, cut short
            ends = whole.pos >= len(text.rstrip()) or whole.msg.startswith("Unterminated string")
            cut = " (truncated: the file ends mid-document)" if ends else ""
            raise ResultsFileError(f"{path}: not valid JSON{cut}: {json_problem(whole, line=True)}; "
                                   f"{EXPECTED}") from None
    except (RecursionError, ValueError):
        pass  # read as records, whose reader names what is wrong
    else:
        _not_a_record(path, value)
    return _from_records(path, run_id)


def _from_records(path: str, run_id: str | None) -> Side:
    records = read_records(path)  # errors name the file and line
    with open_input(path, "results file", MAX_RESULTS_BYTES) as fh:
        linenos = [i for i, line in enumerate(fh, 1) if line.strip()]
    pairs = list(zip(records, linenos))
    if run_id is not None:
        pairs = [(r, n) for r, n in pairs if r.run_id == run_id]
        if not pairs:
            raise ResultsFileError(f"{path}: no record of run id {run_id!r}; the file holds (newest first) "
                                   + run_ids_held(records))
    every = runs_newest_first(records)
    records = [r for r, _ in pairs]
    side = Side(path, "records", {}, records=records, runs_in_file=every, run_id=run_id)
    side.run_ids = list(dict.fromkeys(r.run_id for r in records))
    for rec, lineno in pairs:
        where = f"{path}:{lineno}"
        m = rec.metrics
        for values, what in ((m.step_times_s, "metrics.step_times_s"), (m.window_s, "metrics.window_s")):
            if values is not None and len(values) > MAX_SAMPLES:
                raise ResultsFileError(f"{where}: {what} holds {len(values)} values, more than the {MAX_SAMPLES} a "
                                       f"case may have; not a fleetbench result")
        key = case_key(rec.case, rec.world_size)
        side.cases[key], side.where[key] = rec, where  # the last record of a case wins
        side.torch = rec.metadata.get("torch") or side.torch
        side.device = _device_of(rec.metadata) or side.device
    return side


def _benchmark_record(extra: dict, case: str, world: int, window_s: list[float], steps_per_window: int,
                      step_times_s: list[float], where: str) -> CaseRecord:
    """One pytest-benchmark benchmark as the record compare reads (its fields from ``extra_info``, which the
    benchmarks write from their records: ``suite.results.export.extra_info``)."""
    sps = extra.get("samples_per_s")
    verdict, status = extra.get("verdict", "n/a"), extra.get("status", "ok")
    if verdict not in VERDICTS or status not in STATUSES:
        raise ResultsFileError(f"{where}: extra_info verdict={_show(verdict)}, status={_show(status)}; expected "
                               f"{'/'.join(VERDICTS)} and {'/'.join(STATUSES)}")
    structure = extra.get("structure")
    model, error, config = extra.get("model"), extra.get("error"), extra.get("config")
    run_id, size = extra.get("run_id"), extra.get("size")
    metrics = Metrics(window_s=window_s, steps_per_window=steps_per_window, step_times_s=step_times_s,
                      samples_per_s=float(sps) if isinstance(sps, (int, float)) and not isinstance(sps, bool)
                      else math.nan)
    return CaseRecord(case, model if isinstance(model, str) else case.split("/")[0], world,
                      config if isinstance(config, dict) else {},
                      run_id if isinstance(run_id, str) and run_id else PYTEST_BENCHMARK_RUN, status=status,
                      verdict=verdict, size=size if size in SIZES else None, metrics=metrics,
                      structure=Structure.from_dict(structure, where, "extra_info.structure.", strict=False)
                      if isinstance(structure, dict) else Structure(),
                      error=error if isinstance(error, str) else None)


def _from_pytest_benchmark(path: str, data: dict) -> Side:
    benches = data.get("benchmarks")
    if not isinstance(benches, list):
        raise ResultsFileError(f"{path}: 'benchmarks' is {type(benches).__name__}; expected a list (pytest-benchmark "
                               f"JSON)")
    machine = data.get("machine_info") or {}
    if not isinstance(machine, dict):
        raise ResultsFileError(f"{path}: 'machine_info' is {_show(machine)}; expected an object "
                               f"(pytest-benchmark JSON)")
    fb, cpu = machine.get("fleetbench") or {}, machine.get("cpu") or {}
    torch_version = machine.get("torch") if isinstance(machine.get("torch"), str) else None
    side = Side(path, "pytest-benchmark", {}, torch=torch_version,
                device=(_device_of(fb) if isinstance(fb, dict) else None)
                or (cpu.get("brand_raw") if isinstance(cpu, dict) else None))
    for i, b in enumerate(benches):
        name = b.get("name", f"#{i}") if isinstance(b, dict) else f"#{i}"
        where = f"{path}: benchmark {name}"
        if not isinstance(b, dict) or not isinstance(b.get("stats"), dict):
            raise ResultsFileError(f"{where}: no 'stats' object; not a pytest-benchmark result")
        extra = b.get("extra_info") or {}
        if not isinstance(extra, dict):
            raise ResultsFileError(f"{where}: 'extra_info' is {_show(extra)}; expected an object")
        case = extra.get("case") or name
        world = extra.get("world_size", 1)
        if not isinstance(case, str) or isinstance(world, bool) or not isinstance(world, int) or world < 1:
            raise ResultsFileError(f"{where}: extra_info case={_show(case)}, world_size={_show(world)}; expected a "
                                   f"case name and a whole number >= 1")
        window_s: list[float] = []  # as the record keeps them: each window's seconds, over steps_per_window
        k = 1
        if "data" in b["stats"] or "window_s" in extra:
            # Since the unit became a step, each round is one step (a window's mean, ``steps_per_window``);
            # before, a round was a window of ``steps_per_round`` steps plus the round trip to the ranks.
            per_round = "steps_per_round" in extra
            field_k = "steps_per_round" if per_round else "steps_per_window"
            k = extra.get(field_k, 1)
            if isinstance(k, bool) or not isinstance(k, int) or k < 1:
                raise ResultsFileError(f"{where}: extra_info.{field_k} is {_show(k)}; expected a whole "
                                       f"number >= 1")
            if "window_s" in extra:  # the ranks' own windows (the slowest rank's), without the round trip
                window_s = _floats(extra["window_s"], where, "extra_info.window_s")
            else:
                window_s = _floats(b["stats"]["data"], where, "stats.data")
                k = k if per_round else 1  # a round is one step: its own window
        if "step_times_s" in extra:
            steps = _floats(extra["step_times_s"], where, "extra_info.step_times_s")
        elif window_s:
            steps = [t / k for t in window_s]
        else:
            raise ResultsFileError(f"{where}: no per-round data; save results with --benchmark-save-data "
                                   f"(or --benchmark-json, which keeps it)")
        key = case_key(case, world)
        side.cases[key] = _benchmark_record(extra, case, world, window_s, k, steps, where)
        side.where[key] = where
    return side
