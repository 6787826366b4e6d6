"""The report page: an HTML file and a Markdown summary, with the plots as SVG files beside them.

``build_report(records, out_dir, results_dir)`` writes ``index.html``, ``summary.md``, the
SVGs, ``report_data.json`` (the numbers every plot was drawn from) and copies the runs'
Perfetto traces into ``traces/``.  The last record of each (case, world size) is reported, with its
trend over the runs the records hold (``trend.py``).

The page, top to bottom (``docs/report.md`` explains how to read it):

1. the first screen: the summary table, one row per case (its speedup over plain with its 95% interval and
   "not resolved" as ``fleetbench run`` says it, verdict, "busy [N]" where its windows ran on a busy machine,
   the reasons as footnotes, samples/s), and beside it (under it in a narrow window) the failures and errors, in
   colour, each with its messages (the check's, the record's error, why the case was timed alone, a trace that
   could not be taken); cases that did not run; cases with the same messages share one box, each message's full
   text one click away (``<details>``);
2. run metadata: commit (and whether the tree was dirty), torch, CUDA, NCCL, device, backend,
   host, size, world size, run id, date: one column per run;
3. a short "how to read this";
4. per model: a table (the case and its speedup over plain with its 95% interval first; verdict, busy mark,
   throughput with its interval and its trend over runs, step time,
   exposed communication where it is communication, collectives per step, busbw where it means something,
   footprint and transient peak memory, "no rise" told from "not measured") and a speedup chart centred on 1;
   tables scroll sideways in their own box, the case column staying in view, and at 420 px the case and its
   speedup fit without scrolling;
5. throughput per model, the step breakdown (only where a ``none`` case ran), scaling (only with
   world size 1 and another), the Local SGD trade-off (only where its differences exceed their noise),
   traces.

The HTML comes from the Jinja2 templates in ``templates/`` (autoescaping on; every text also through
:func:`plain`); the Markdown is written here, each text through :func:`md_text`.

A chart without data is not drawn; the page says why.  Plots are SVG, ``figures.WIDTH_IN`` wide (about 500 px:
legible in a 420 px window) and scale down with the window.

Records are untrusted input (a results file can be edited or crafted): only trace files inside
the results directory's own ``traces/`` folder are copied (symlinks resolved), and every text
from a record is escaped for the page it goes into (:func:`md_text` for Markdown).
"""
from __future__ import annotations

import collections
import hashlib
import html
import json
import math
import os
import re
import sys
import urllib.parse
from collections.abc import Iterable, Sequence
from typing import Any

from ..config import away_from_defaults
from ..measure.stats import ROUNDS_DISAGREE, RUN_ROUNDS_FOR_95
from ..measure.utilization import BUSY, busy_reason
from ..outputs import OutputDir
from ..results.records import NUMERIC_METRICS, CaseRecord, allreduce_total, jsonable
from ..results.records import plain as _plain
from .trend import MAX_TREND_RUNS, sparkline_svg, sparkline_text, trends

__all__ = ["build_report", "md_text", "trace_source", "svg_size", "out_problem"]

Final = dict[tuple[str, int], CaseRecord]  # (case, world) -> its last record

_MD_PUNCT = re.compile(r"([\\`*~\[\]|])")


def md_text(value: object) -> str:
    """Untrusted text as one Markdown table cell or list line: HTML-escaped (no tags, entities or
    autolinks; quotes stay as they are, Markdown text has no attributes to break out of), the characters
    of links, code spans, emphasis and table cells backslash-escaped, line breaks as ``<br>``."""
    text = html.escape(_plain(value, keep="\r\n"), quote=False)
    text = _MD_PUNCT.sub(r"\\\1", text)
    return re.sub(r"\r\n|\r|\n", "<br>", text)


def _md_link_target(path: str) -> str:
    return urllib.parse.quote(path, safe="/@")


def trace_source(results_dir: str, rel: object, directory: bool = False) -> tuple[str | None, str]:
    """(the file to copy, "") when ``rel`` names a regular file inside ``results_dir/traces`` (after
    resolving symlinks), else (None, why); with ``directory``, a directory there is taken too (a run's
    traces of one case: :func:`trace_files`)."""
    if not isinstance(rel, str) or not rel:
        return None, "is not a path"
    if os.path.isabs(rel):
        return None, "is an absolute path; only files under the results directory's traces/ are copied"
    root = os.path.join(os.path.realpath(results_dir), "traces")
    try:
        src = os.path.realpath(os.path.join(results_dir, rel))
    except ValueError as exc:  # an embedded NUL byte
        return None, f"is not a usable path ({exc})"
    if os.path.commonpath([root, src]) != root:
        return None, f"resolves to {src!r}, outside {root}; only files under the results directory's traces/ " \
                     "are copied"
    if directory and os.path.isdir(src):
        return src, ""
    if not os.path.isfile(src):
        return None, "does not exist" if not os.path.exists(src) else "is not a regular file"
    links = os.stat(src).st_nlink
    if links > 1:  # a hard link is the same file as one elsewhere: it may be anything
        return None, f"has {links} hard links (the same file is elsewhere too); only a file of traces/'s own is copied"
    return src, ""


MAX_TRACE_BYTES = 512 * 2**20
MAX_TRACE_FILES = 1024  # files of one case's trace directory (one per rank, and the timeline)


def trace_files(results_dir: str, rel: str) -> tuple[list[tuple[str, str]], list[str]]:
    """The files of a record's ``trace_file`` to copy, as (source, name in the report's traces/), and why any other
    was left: the file itself, or each regular file of the directory (``CaseRunner.trace``: one torch.profiler
    trace per rank and ``timeline.json``), every one checked by :func:`trace_source`."""
    src, why = trace_source(results_dir, rel, directory=True)
    if src is None:
        return [], [why]
    if not os.path.isdir(src):
        return [(src, os.path.basename(src))], []
    out, left = [], []
    for name in sorted(os.listdir(src))[:MAX_TRACE_FILES]:
        one, why = trace_source(results_dir, os.path.join(rel, name))
        if one is None:
            left.append(f"{name} {why}")
        else:
            out.append((one, os.path.join(os.path.basename(src), name)))
    return out, left


def _copy_trace(src: str, out: OutputDir, dst: str) -> None:
    """Copy ``src`` (checked by :func:`trace_source`) to ``dst`` under ``out``: neither end is followed if it
    is (or turned into) a link, every folder on the way under ``out`` included; the source must still be one
    regular file of traces/'s own."""
    out.copy_in(src, dst, limit=MAX_TRACE_BYTES, links=False)


MAX_MODEL_PLOTS = 24  # speedup plots (one per model) drawn at most
MAX_BARS = 80  # cases in one throughput or breakdown plot at most
MAX_WORLD_PLOTS = 8  # world sizes given throughput and breakdown plots at most (those with the most cases)
MAX_TABLE_ROWS = 5000  # (case, world) rows the page's and the summary's tables list at most (report_data.json: all)
MAX_PROBLEM_GROUPS = 200  # boxes of failures, errors and notes at most

REPORT_FILES = ("index.html", "summary.md", "report_data.json")
SHOWN_SCALE = 1.25  # a plot's width on the page over its own (figures.WIDTH_IN: 480 px shown 600 px wide)


def out_problem(out_dir: str, results_dirs: Iterable[str], force: bool = False) -> str | None:
    """Why ``out_dir`` cannot take a report (None when it can): it must be a directory of its own (not
    a file, not a results directory), writable, and empty or holding a previous report (``force``
    allows any directory); no link inside may lead a write elsewhere."""
    if os.path.lexists(out_dir) and not os.path.isdir(out_dir):
        return "exists and is not a directory"
    if os.path.islink(out_dir):
        return "is a symbolic link; give the directory itself"
    real = os.path.realpath(out_dir)
    for d in results_dirs:
        if real == os.path.realpath(d):
            return "is the results directory itself; give a directory for the report, e.g. " \
                   + os.path.join(d, "reports", "latest")
    if not os.path.isdir(out_dir):
        parent = os.path.dirname(os.path.abspath(out_dir))
        while not os.path.isdir(parent):
            parent = os.path.dirname(parent)
        return None if os.access(parent, os.W_OK | os.X_OK) else f"cannot be created ({parent} is not writable)"
    if not os.access(out_dir, os.W_OK | os.X_OK):
        return "is not writable"
    entries = os.listdir(out_dir)
    if entries and not force and "report_data.json" not in entries:
        return (f"is not empty ({len(entries)} entries) and holds no previous report; pick an empty or new "
                f"directory, or pass --force to write the report into it (index.html, summary.md, the plots, traces/ "
                f"there are replaced)")
    for name in entries:
        if os.path.islink(os.path.join(out_dir, name)):
            return f"holds a symbolic link {name!r}; a report is not written through links"
    return None


_SVG_SIZE = re.compile(rb"<svg\b[^>]*?\bwidth=\"([0-9.]+)pt\"[^>]*?\bheight=\"([0-9.]+)pt\"")


def svg_size(path: str) -> tuple[int, int]:
    """(width, height) in the page's pixels (96 to the inch) of an SVG file matplotlib wrote (its size in pt)."""
    with open(path, "rb") as fh:
        found = _SVG_SIZE.search(fh.read(4096))
    if found is None:
        raise ValueError(f"{path}: not an SVG file with its size in pt")
    return round(float(found[1]) * 96 / 72), round(float(found[2]) * 96 / 72)


# ---- numbers as text ------------------------------------------------------------------------------
def _fmt(x: object, spec: str = ".1f") -> str:
    from .charts import num

    v = num(x)
    return format(v, spec) if math.isfinite(v) else "-"


def _ci(value: object, ci: object, spec: str, suffix: str = "") -> str:
    from .charts import num

    v = num(value)
    if not math.isfinite(v):
        return "-"
    text = format(v, spec) + suffix
    if isinstance(ci, list) and len(ci) == 2 and all(math.isfinite(num(c)) for c in ci):
        text += f" [{format(num(ci[0]), spec)}, {format(num(ci[1]), spec)}]"
    return text


def _first_line(text: object) -> str:
    lines = [ln for ln in str(text or "").splitlines() if ln.strip()]
    return lines[0] if lines else ""


def _slug(text: str) -> str:
    """A file-name- and id-safe form of an untrusted name (with a short hash: distinct names stay distinct)."""
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", str(text)).strip("._")[:40] or "x"
    return f"{safe}-{hashlib.sha1(str(text).encode()).hexdigest()[:6]}"


# ---- what the page is made of -----------------------------------------------------------------------
def _final(records: Iterable[CaseRecord]) -> Final:
    """(case, world) -> the last record of it, whatever its status."""
    out: Final = {}
    for r in records:
        out[(r.case, r.world_size)] = r
    return out


def _verdicts(final: Final) -> str:
    """How many of ``final``'s records have each verdict, e.g. "2 pass, 1 n/a" (verdicts in order)."""
    return ", ".join(f"{n} {v}" for v, n in sorted(collections.Counter(r.verdict for r in final.values()).items()))


def _problems(final: Final) -> list[dict]:
    """Failures and errors first (with every message the record carries), then notes on passing cases
    (timed alone, a trace that could not be taken), then cases that did not run."""
    out = []
    for (case, w), r in sorted(final.items()):
        messages = []
        if r.check is not None and r.check.message:
            messages.append(("check", r.check.message))
        skipped = r.status in ("skipped", "not_run") or r.verdict in ("skipped", "not_run")
        if r.error:
            messages.append(("error" if r.status == "error" else "why" if skipped else "timing", str(r.error)))
        if r.fallback:
            messages.append(("timed alone", str(r.fallback)))
        if r.metrics.trace_error:
            messages.append(("trace", r.metrics.trace_error))
        if skipped:
            kind = "skipped"
        elif r.status == "error" or r.verdict == "error":
            kind = "error"
        elif r.verdict == "fail":
            kind = "fail"
        elif r.fallback or r.metrics.trace_error:
            kind = "note"
        else:
            continue
        if kind in ("fail", "error") and not messages:
            messages.append(("record", "no message recorded"))
        if kind == "note":
            messages = [m for m in messages if m[0] != "check"]
        out.append({"case": case, "world": w, "run_id": r.run_id, "kind": kind, "verdict": r.verdict,
                    "messages": messages})
    rank = {"fail": 0, "error": 0, "note": 1, "skipped": 2}
    return sorted(out, key=lambda p: rank[p["kind"]])


def _runs(records: Iterable[CaseRecord]) -> list[dict]:
    """One entry per run id (in order of appearance): what it ran on, from its records' metadata."""
    by: dict[str, list[CaseRecord]] = {}
    for r in records:
        by.setdefault(r.run_id, []).append(r)
    out = []
    for run_id, rs in by.items():
        meta: dict = next((r.metadata for r in rs if r.metadata), {}) or {}
        git = meta.get("git") or {}
        gpu = meta.get("gpu") or {}
        stamps = sorted(r.timestamp for r in rs if r.timestamp)
        commit = git.get("commit")
        dirty = git.get("dirty")
        final = _final(rs)
        cpu = meta.get("cpu") or ""
        if meta.get("cpu_count"):
            cpu = f"{cpu} ({meta['cpu_count']} cores)"
        out.append({
            "run id": run_id,
            "date": stamps[0] + (f" to {stamps[-1]}" if stamps and stamps[-1] != stamps[0] else "") if stamps else "-",
            "commit": (commit[:12] if isinstance(commit, str) else "unknown")
                      + (f" ({git['branch']})" if git.get("branch") else ""),
            "dirty": "yes: uncommitted changes" if dirty is True else "no" if dirty is False else "unknown",
            "torch": meta.get("torch") or "-",
            "CUDA / NCCL": f"{meta.get('cuda') or 'none'} / {meta.get('nccl') or 'none'}",
            "device": ", ".join(sorted({r.device for r in rs if r.device})) or "-",
            "backend": ", ".join(sorted({r.backend for r in rs if r.backend})) or (meta.get("backend") or "-"),
            "GPU": ", ".join(gpu.get("names") or []) if gpu.get("available") else (gpu.get("reason") or "-"),
            "host": meta.get("host") or "-",
            "CPU": cpu or "-",
            "python": meta.get("python") or "-",
            "size": ", ".join(sorted({str(r.size) for r in rs if r.size})) or "unknown",
            "world size": ", ".join(str(w) for w in sorted({r.world_size for r in rs})),
            "cases": f"{len(final)}: " + _verdicts(final),
            "machine": _machine(final.values()),
        })
    return out


def _machine(records: Iterable[CaseRecord]) -> str:
    """A run's machine state: busy (timings unreliable) in how many of its timed cases, quiet, or not recorded
    (records from before the load average and others' CPU time were kept)."""
    timed = [r for r in records if r.metrics.others_cpu_share is not None or r.metrics.load_avg_start is not None]
    busy = [r for r in timed if busy_reason(r.metrics)]
    if busy:
        why = "; ".join(dict.fromkeys(str(busy_reason(r.metrics)).removeprefix(BUSY).strip()
                                      for r in busy))
        return (f"BUSY: timings unreliable in {len(busy)} of {len(timed)} timed cases: "
                + ", ".join(r.case for r in busy[:6]) + (" …" if len(busy) > 6 else "") + f" {why}")
    return f"quiet in its {len(timed)} timed cases" if timed else "not recorded"


# the key columns first: in a 420 px window the case and its speedup show without scrolling (the case column stays
# in view when the table scrolls sideways)
SPEEDUP, TREND, MACHINE = "speedup vs plain [95% CI]", "samples/s over runs", "machine"
HEAD = ["case", "world", SPEEDUP, "verdict", MACHINE, "samples/s [95% CI]", TREND, "step ms median (IQR)",
        "exposed comm ms", "collectives/step", "allreduce MB/step", "busbw GB/s", "footprint MB", "transient peak MB"]
# the page's first table: every case in one row (the model tables below hold the rest)
SUMMARY_HEAD = ["case", "world", SPEEDUP, "verdict", MACHINE, "samples/s [95% CI]"]  # the model tables' first four
MEMORY = ("footprint MB", "transient peak MB")  # a table leaves these out where no row has them
NO_RISE = "no rise"  # a transient peak measured, and under PEAK_SHOWN: not "-", which is "not measured"
PEAK_SHOWN = 0.05 * 2**20  # bytes: RSS moves by pages, a rise under this is none


def _speedup_text(r: CaseRecord) -> tuple[str, str]:
    """A record's speedup cell ("1.07× [0.73, 2.64] not resolved", as ``fleetbench run`` decides it:
    ``suite.measure.stats.speedup_unresolved``) and why it is not resolved, in words for its hover ("" where it
    is, or where it has none)."""
    from . import charts as F

    m = r.metrics
    if m.empty:
        return "-", ""
    if F.variant_of(r.case) == F.BASELINE_VARIANT and math.isfinite(F.num(m.speedup)):
        knobs = away_from_defaults(r.config)  # what it ran with beyond plain data parallel: workload knobs
        return ("1 (the baseline" + (f"; {', '.join(knobs)})" if knobs else ")"),
                f"plain data parallel, with {', '.join(knobs)}" if knobs else "")
    unresolved = F.speedup_unresolved(m)
    text = _ci(m.speedup, m.speedup_ci, ".2f", "×") + (f" {unresolved}" if unresolved else "")
    if not unresolved:
        return text, ""
    if unresolved == F.NOT_RESOLVED:
        return text, "the 95% interval contains 1: no measured difference"
    if unresolved == "no interval":
        return text, "one round: no interval"
    if unresolved.endswith(f"({ROUNDS_DISAGREE})"):
        return text, m.speedup_disagreement or f"{ROUNDS_DISAGREE}: the interval rests on one round"
    return text, f"fewer rounds than give a 95% interval ({RUN_ROUNDS_FOR_95}): this one covers the median less often"


class BusyMarks:
    """The page's "busy [N]" marks: one number per reason a case's windows were busy (``busy_reason``), the same
    in every table of the page, the reasons as footnotes under the summary table (and on hover)."""

    def __init__(self) -> None:
        self.reasons: dict[str, int] = {}

    def mark(self, r: CaseRecord) -> tuple[str, str]:
        """("busy [N]", the reason) where the record's windows were busy, else ("", "")."""
        why = busy_reason(r.metrics) if not r.metrics.empty else None
        if not why:
            return "", ""
        return f"busy [{self.reasons.setdefault(why, len(self.reasons) + 1)}]", why

    @property
    def notes(self) -> list[str]:
        return [f"[{n}] {why}" for why, n in self.reasons.items()]


def _summary_rows(rows: list[CaseRecord], busy: BusyMarks) -> dict:
    """The first table of the page: one row per (case, world), in the model tables' order: its speedup with its
    interval and whether it is resolved, its verdict, its machine (busy or not; the column left out where no row is)
    and its samples/s."""
    out = []
    for r in rows:
        speedup, speedup_why = _speedup_text(r)
        mark, mark_why = busy.mark(r)
        cells = [r.case, str(r.world_size), speedup, r.verdict, mark,
                 _ci(r.metrics.samples_per_s, r.metrics.samples_per_s_ci, ".1f") if not r.metrics.empty else "-"]
        out.append((r, cells, {SPEEDUP: speedup_why, MACHINE: mark_why}))
    col = SUMMARY_HEAD.index(MACHINE)  # left out where no row is busy, as in the model tables
    if not any(cells[col] for _, cells, _ in out):
        out = [(r, cells[:col] + cells[col + 1:], why) for r, cells, why in out]
        return {"head": SUMMARY_HEAD[:col] + SUMMARY_HEAD[col + 1:], "rows": out, "notes": []}
    return {"head": SUMMARY_HEAD, "rows": out, "notes": []}


def _row(r: CaseRecord, trend: dict | None = None, busy: BusyMarks | None = None) -> tuple[list[str], dict[str, str]]:
    """The table's cells for one record, and the reasons behind cells left empty (by column); ``trend``: its
    samples/s over runs (:func:`trend.trends`), or None with one run; ``busy``: the page's busy marks."""
    from . import charts as F

    m = r.metrics
    measured = not m.empty
    st = m.step_time_s
    why: dict[str, str] = {}
    step = F.median_step(m)
    iqr = F.num(st.iqr) if st is not None else math.nan
    step_txt = f"{1e3 * step:.1f} ({1e3 * iqr:.1f})" if math.isfinite(step) else "-"
    speedup, speedup_why = _speedup_text(r)
    if speedup_why:
        why[SPEEDUP] = speedup_why
    exposed = F.num(m.exposed_comm_s)
    split = F.splits_step(r.case)
    exposed_txt = f"{1e3 * exposed:.1f}" if math.isfinite(exposed) and split else "-"
    if measured and not math.isfinite(exposed):
        why["exposed comm ms"] = "no none case ran with this model: compute alone was not measured"
    elif measured and not split:
        why["exposed comm ms"] = ("the strategy changes compute, not only communication: its step minus the none "
                                  "case's is not communication")
    calls = m.comm_calls_per_step or {}
    ncalls = sum(F.num(v) for v in calls.values() if math.isfinite(F.num(v)))
    ar_bytes = allreduce_total(m.comm_bytes_per_step)
    per_op: collections.defaultdict = collections.defaultdict(float)
    for k, v in (m.comm_bytes_per_step or {}).items():
        per_op[k.rpartition("/")[2]] += F.num(v) if math.isfinite(F.num(v)) else 0.0
    if per_op.get("reduce_scatter"):  # a two-level allreduce: its gradients counted once, and what each step moved
        why["allreduce MB/step"] = (
            f"the gradients the two-level allreduce averages; its steps moved: intra-node reduce-scatter "
            f"{per_op['reduce_scatter'] / 1e6:.2f} MB, inter-node allreduce of the shards "
            f"{per_op['all_reduce'] / 1e6:.2f} MB, intra-node all-gather {per_op['all_gather'] / 1e6:.2f} MB")
    ok, reason = F.busbw_measurable(m) if measured else (False, "")
    if ok and not split:
        ok, reason = False, "the strategy changes compute: its exposed communication is not known"
    if not ok and reason and math.isfinite(F.num(m.busbw_GBps)):
        why["busbw GB/s"] = reason
    foot, peak = F.num(m.footprint_bytes), F.num(m.peak_memory_bytes)
    probe = m.peak_memory_kind  # a number without the probe that took it: a record from before the probes
    if math.isfinite(peak) and probe and peak >= PEAK_SHOWN:
        peak_txt = f"{peak / 2**20:.1f}"
        why["transient peak MB"] = f"the largest rise above a window's start, measured by {probe}"
    elif math.isfinite(peak) and probe:  # measured: no rise (0 is a measurement, not a missing one)
        peak_txt = NO_RISE
        why["transient peak MB"] = (f"measured by {probe}: no rise above the window's start of 0.05 MB or more "
                                    f"({peak / 2**10:.0f} kB)")
    else:
        peak_txt = "-"
        if measured:
            why["transient peak MB"] = "not measured (no peak memory in the record, or no probe named)"
    trend_txt = sparkline_text(trend) if trend else "-"
    if measured and not trend:
        why[TREND] = "one run measured this case (at this size and device)"
    mark, mark_why = (busy or BusyMarks()).mark(r)
    if mark_why:
        why[MACHINE] = mark_why
    cells = [r.case, str(r.world_size), speedup if measured else "-", r.verdict, mark,
             _ci(m.samples_per_s, m.samples_per_s_ci, ".1f"), trend_txt, step_txt, exposed_txt,
             f"{ncalls:.3g}" if measured else "-",
             f"{ar_bytes / 1e6:.2f}" if measured and ar_bytes else ("0" if measured else "-"),
             _fmt(m.busbw_GBps, ".3f") if ok else "-", f"{foot / 2**20:.1f}" if foot > 0 else "-", peak_txt]
    if calls:
        why["collectives/step"] = ", ".join(f"{k}: {F.num(v):g}" for k, v in sorted(calls.items()))
    label = fusion_kernels(r)
    if label:
        why["case"] = f"{label[0]}: {label[1]}"
    return cells, why


def fusion_kernels(r: CaseRecord) -> tuple[str, str] | None:
    """A compute-fusion case's kernels on CUDA as its record states them (``describe.compute_fusion``: "eager
    composition" or "torch.compile", and why it matters), or None (another case, or the CPU)."""
    fusion = r.describe.engine.get("compute_fusion")
    if not str(r.device).startswith("cuda") or not isinstance(fusion, dict) or not fusion.get("kernels"):
        return None
    return str(fusion["kernels"]), str(fusion.get("kernels_note") or "")


def _table(rows: list[tuple[CaseRecord, list[str], dict[str, str]]]) -> dict:
    """A model's table from its (record, cells, why) rows: a memory column no row measured is left out (said in a
    note), and so is the trend where no case was measured in several runs."""
    drop = {i for i, h in enumerate(HEAD) if (h in (*MEMORY, TREND) and all(cells[i] == "-" for _, cells, _ in rows))
            or (h == MACHINE and not any(cells[i] for _, cells, _ in rows))}
    head = [h for i, h in enumerate(HEAD) if i not in drop]
    notes = [f"{HEAD[i]}: not measured in this run's records." for i in sorted(drop) if HEAD[i] in MEMORY]
    for r, _, _ in rows:  # what a fused case's kernels are on a GPU (issue 32.6)
        label = fusion_kernels(r)
        if label:
            notes.append(f"{r.case}@{r.world_size}: {label[0]}: {label[1]}.")
    return {"head": head, "notes": notes,
            "rows": [(r, [c for i, c in enumerate(cells) if i not in drop], why) for r, cells, why in rows]}


HOW_TO_READ = [
    "Every case is timed interleaved with its model's baseline, plain data parallel (one allreduce per "
    "gradient after backward), round by round in one process group. <strong>Speedup</strong> is the "
    "baseline's window time over the case's, paired round by round: above 1 is faster than plain. The "
    "bracket is its 95% bootstrap interval: an interval that contains 1 is no measured difference, and with fewer "
    "than 6 rounds the interval covers less than 95%: both say <em>not resolved</em>, as <code>fleetbench run</code> "
    "does; so does a speedup whose <em>rounds disagree</em> (leaving one round out, the others' interval contains 1: "
    "the verdict rests on that round; hover for which). The chart under each table draws the same: a dot and its "
    "interval on a log scale centred on 1, hollow and dashed where not resolved.",
    "<strong>busy [N]</strong> marks a case whose timed windows ran on a busy machine (other processes took over 10% "
    "of the CPU, or the load average was above the cores by more than 1): its timings are unreliable, whatever "
    "their interval says; footnote N under the summary table (and hover) says why.",
    "<strong>samples/s</strong> is the global batch times the steps of a window over the slowest rank's "
    "window, median over rounds, with its 95% interval. Throughputs of different models are not comparable; "
    "each model has its own table and plots.",
    "<strong>Exposed communication</strong> is the case's median step minus the step of the model's "
    "<code>none</code> case (the same step with no gradient communication); it needs a <code>none</code> case "
    "in the run, and a strategy that changes communication only: one that changes compute (AMP, compute fusion, "
    "a fused optimizer, Local SGD, fewer host syncs) shows no exposed communication and is drawn as its whole "
    "step in grey in the breakdown. Negative: a measured difference within noise.",
    "<strong>footprint</strong> is what the engine holds between steps (parameters, gradients, buckets, optimizer "
    "state) on the largest rank; <strong>transient peak</strong> the largest rise above a window's start "
    "(activations, temporaries): <em>no rise</em> where it was measured and stayed under 0.05 MB, <code>-</code> "
    "where it was not measured.",
    "<strong>samples/s over runs</strong> (where the results hold several runs of a case at the same size and "
    "device): the case's samples/s in each run, oldest first, the last point larger, a run whose machine was busy "
    "hollow and grey; hover for the values.",
    "<strong>Collectives/step</strong> counts the collectives fleetbench issued per step (torch DDP's own are "
    "not counted). <strong>busbw</strong> (nccl-tests' bus bandwidth over the exposed time) is shown only "
    "where it is a bandwidth: exposed communication positive, measurable, and allreduce messages of 256 kB "
    "or more on average; elsewhere the cell says why on hover.",
    "A verdict is the correctness check against the reference that fits the strategy: <em>pass</em>, "
    "<em>fail</em> (message at the top), <em>error</em> (the case did not finish), <em>n/a</em> (nothing to "
    "check, e.g. <code>none</code>). The last record of each case and world size is the one shown.",
]


def build_report(records: Sequence[CaseRecord], out_dir: str, results_dir: str = ".",
                 record_dirs: dict[int, str] | None = None) -> dict:
    """``record_dirs`` maps ``id(record)`` to the results directory its traces are under (several
    results files: each file's own); others use ``results_dir``."""
    from . import charts as F  # first: matplotlib imported through .mpl, nothing written under ~

    plt = F.plt

    with OutputDir(out_dir) as out:  # every file below it written without following a link
        return _build(records, out, results_dir, record_dirs, plt, F)


def _build(records: Sequence[CaseRecord], out: OutputDir, results_dir: str, record_dirs: dict[int, str] | None,
           plt: Any, F: Any) -> dict:
    final = _final(records)
    # what is drawn: the final record of each (case, world), where it has numbers
    recs = {k: r for k, r in final.items() if r.status == "ok" and not r.metrics.empty}
    worlds = sorted({w for _, w in recs})
    models = list(dict.fromkeys(r.model for _, r in sorted(final.items())))
    data: dict = {"cases": {}, "scaling": {}, "plots": [], "models": {}, "warnings": []}
    trend = trends(records, final)  # (case, world) -> samples/s over the runs, where several measured it
    for (case, w), r in sorted(final.items()):
        m = r.metrics
        data["cases"][f"{case}@{w}"] = {k: getattr(m, k) for k in NUMERIC_METRICS}
        data["cases"][f"{case}@{w}"].update(verdict=r.verdict, status=r.status, model=r.model, run_id=r.run_id,
                                             step_median_s=m.step_time_s.median if m.step_time_s is not None
                                             else None,
                                             busbw_shown=F.busbw_measurable(m)[0] if not m.empty else False,
                                             exposed_is_comm=F.splits_step(case),
                                             speedup_unresolved=F.speedup_unresolved(m) if not m.empty else None,
                                             speedup_consistent=m.speedup_consistent,
                                             speedup_disagreement=m.speedup_disagreement,
                                             busy=busy_reason(m) if not m.empty else None,
                                             trend=trend.get((case, w)))

    images: dict = {}  # file -> (width, height)

    def save(fig: Any, name: str) -> str | None:
        if fig is None:
            return None
        svg, size = F.svg_bytes(fig)
        plt.close(fig)
        out.write(name, svg)
        images[name] = size
        data["plots"].append(name)
        return name

    notes: list[str] = []
    # Drawing is what costs (about a second a plot): a report of thousands of cases draws a bounded number of
    # plots, the tables stay complete, and the page says what was not drawn.
    speedup_plot: dict = {}
    for model in models[:MAX_MODEL_PLOTS]:
        speedup_plot[model] = save(F.speedup_figure(recs, model), f"speedup_{_slug(model)}.svg")
    speedup_plot.update({m: None for m in models[MAX_MODEL_PLOTS:]})
    if len(models) > MAX_MODEL_PLOTS:
        notes.append(f"Speedup plots for the first {MAX_MODEL_PLOTS} of {len(models)} models only; the tables "
                     f"list every case.")
    per_world = {w: sum(1 for _, cw in recs if cw == w) for w in worlds}
    crowded = [w for w in worlds if per_world[w] > MAX_BARS]
    if crowded:
        notes.append(f"No throughput or breakdown plot at world size {', '.join(map(str, crowded))}: more than "
                     f"{MAX_BARS} cases to draw; the tables list them.")
    drawable = [w for w in worlds if w not in crowded]
    plotted = sorted(sorted(drawable, key=lambda w: -per_world[w])[:MAX_WORLD_PLOTS])
    if len(drawable) > MAX_WORLD_PLOTS:
        notes.append(f"Throughput and breakdown plots at {MAX_WORLD_PLOTS} of {len(drawable)} world sizes only "
                     f"(those with the most cases: {', '.join(map(str, plotted))}); the tables list every case.")
    throughput_plots = [(w, save(F.throughput_figure(recs, w), f"throughput_w{w}.svg") if w in plotted
                         else None) for w in worlds]
    breakdown_plots = [(w, save(F.breakdown_figure(recs, w), f"breakdown_w{w}.svg") if w in plotted
                        else None) for w in worlds]
    with_none = {r.model for r in recs.values() if math.isfinite(F.num(r.metrics.compute_s))}
    no_none = [m for m in models if m not in with_none]
    if no_none:
        notes.append(f"No step breakdown for {', '.join(no_none[:20])}{' …' if len(no_none) > 20 else ''}: no none "
                     f"case (compute alone) ran with {'it' if len(no_none) == 1 else 'them'}, so compute and "
                     f"communication cannot be told apart.")
    data["scaling"] = {c: rows for c, rows in F.scaling_table(recs).items()}
    few = len(recs) <= MAX_BARS * 4
    scaling = save(F.scaling_figure(recs), "scaling.svg") if few else None
    if scaling is None:
        notes.append("No scaling plot: no case was recorded both at world size 1 and at another world size."
                     if few else f"No scaling plot: more than {MAX_BARS * 4} cases to draw.")
    lsgd_why = F.local_sgd_unresolved(recs) if few else f"No Local SGD plot: more than {MAX_BARS * 4} cases to draw."
    lsgd = save(F.local_sgd_figure(recs), "local_sgd.svg") if lsgd_why is None else None
    if lsgd_why is not None:
        notes.append(lsgd_why)
    data["images"] = {k: list(v) for k, v in images.items()}

    traces: dict = {}  # (case, world) -> the copied file a link goes to (a directory's timeline.json)
    copied: list = []
    dirs = record_dirs or {}
    roots = sorted({os.path.realpath(d) for d in dirs.values()} | {os.path.realpath(results_dir)})
    for (case, w), r in sorted(final.items()):
        rel = r.metrics.trace_file
        if rel:
            where = dirs.get(id(r), results_dir)
            files, left = trace_files(where, rel)
            for why in left:
                msg = f"record {case}@{w} (run {r.run_id}): trace_file {rel!r} {why}; not copied"
                print(f"fleetbench report: warning: {_plain(msg)}", file=sys.stderr)
                data["warnings"].append(msg)
            # one trace per (case, world); each results directory's stay apart (traces/1/… for the second)
            k = roots.index(os.path.realpath(where))
            for src, name in files:
                dst = os.path.join("traces", *([str(k)] if len(roots) > 1 else []), name)
                try:
                    _copy_trace(src, out, dst)
                except OSError as exc:
                    data["warnings"].append(f"record {case}@{w}: trace {rel!r} not copied: {exc}")
                    continue
                copied.append(dst)
                if (case, w) not in traces or os.path.basename(dst) == "timeline.json":
                    traces[(case, w)] = dst
    data["traces"] = copied

    problems = _problems(final)
    runs = _runs(records)
    data["problems"] = problems
    data["runs"] = runs
    tables: dict = {}
    by_model: dict = {}
    for (c, w), r in final.items():
        by_model.setdefault(r.model, []).append(((c, w), r))
    listed = 0
    busy = BusyMarks()  # numbered in the summary's order, the same numbers in the model tables
    first: list[CaseRecord] = []  # the summary table's rows, in the model tables' order
    for model in models:
        rows = sorted(by_model.get(model, []))
        rows.sort(key=lambda kr: (kr[0][1], F.order_key(kr[0][0])))
        data["models"][model] = {"cases": [f"{r.case}@{r.world_size}" for _, r in rows],
                                 "speedup_plot": speedup_plot[model]}
        rows = rows[: MAX_TABLE_ROWS - listed]  # over the page's budget: in report_data.json only (said below)
        first += [r for _, r in rows]
        listed += len(rows)
    summary_table = _summary_rows(first, busy)
    for model in models:
        rows = [r for r in first if r.model == model]
        if rows:
            tables[model] = _table([(r, *_row(r, trend.get((r.case, r.world_size)), busy)) for r in rows])
    summary_table["notes"] = busy.notes
    cut = sum(1 for t in trend.values() if t["runs"] > MAX_TREND_RUNS)
    if cut:
        notes.append(f"Trends over runs show the last {MAX_TREND_RUNS} runs of each case ({cut} case(s) have more); "
                     f"report_data.json's trend says how many runs measured each.")
    if listed < len(final):
        notes.append(f"Tables of {listed} of {len(final)} cases ({len(tables)} of {len(models)} models) only: a page "
                     f"lists at most {MAX_TABLE_ROWS} cases; report_data.json holds every case's numbers.")
    bad = [p for p in problems if p["kind"] in ("fail", "error")]
    summary = f"{len(final)} case(s) over {len(runs)} run(s): " + _verdicts(final)

    groups = _groups(problems)
    if len(groups) > MAX_PROBLEM_GROUPS:
        notes.append(f"The first {MAX_PROBLEM_GROUPS} of {len(groups)} boxes of failures, errors and notes only; "
                     f"report_data.json's problems list every one.")
        groups = groups[:MAX_PROBLEM_GROUPS]
    _write_markdown(out, summary, summary_table, groups, runs, tables, images, traces, notes)
    # shown at 1.25 times their size where the window has room (12 pt text), scaled down to the window elsewhere
    img = {n: {"src": n, "w": round(SHOWN_SCALE * w), "h": round(SHOWN_SCALE * h)} for n, (w, h) in images.items()}

    def shown(name: str | None, alt: str) -> dict | None:
        return {**img[name], "alt": alt} if name else None
    plots = [(f"Throughput at world size {w}", shown(n, f"throughput at world size {w}, one panel per model"))
             for w, n in throughput_plots if n]
    plots += [(f"Step breakdown at world size {w}", shown(n, f"step breakdown at world size {w}"))
              for w, n in breakdown_plots if n]
    plots += [(title, shown(n, alt)) for title, n, alt in [
        ("Scaling over world sizes", scaling, "scaling efficiency"),
        ("Local SGD trade-off", lsgd, "Local SGD: throughput against loss")] if n]
    page = _templates().get_template("index.html.j2").render(
        summary=summary, n_bad=len(bad), groups=groups, runs=runs, run_keys=list(runs[0]) if runs else [],
        first=_html_table("", summary_table, traces, None, trend, summary=True),
        models=[(model, _slug(model)) for model in tables],
        how_to_read=[_markup(t) for t in HOW_TO_READ], plots=plots, notes=notes,
        traces=[(f"{c}@{w}", t) for (c, w), t in traces.items()],
        tables=[_html_table(model, t, traces, shown(speedup_plot.get(model), f"{model}: speedup over plain"), trend)
                for model, t in tables.items()])
    out.write("index.html", page)
    out.write("report_data.json",  # strict JSON: nan/inf as strings, as in records
              json.dumps(jsonable(data), indent=1, default=str, allow_nan=False))
    return data


_CARETS = re.compile(r"\s*\|?\s*[\^~]{3,}(?=\s*\||\s*$|\))")  # a traceback's ^^^^ markers, joined with " | "


def _headline(text: str) -> str:
    """A message's first line without traceback markers, at most 240 characters: what a problem box shows
    before its full message."""
    line = _CARETS.sub("", _first_line(text))
    return line if len(line) <= 240 else line[:239] + "…"


def _groups(problems: list[dict]) -> list[dict]:
    """Problems with the same kind, verdict and messages as one entry naming every case (in order of first
    appearance): a crash that hit twelve cases is one box, not twelve."""
    by: dict = {}
    for p in problems:
        key = (p["kind"], p["verdict"], tuple(p["messages"]))
        g = by.setdefault(key, {"kind": p["kind"], "verdict": p["verdict"], "cases": [], "runs": [],
                                "case": p["case"], "world": p["world"],
                                "messages": [(k, _headline(v), v if v.strip() != _headline(v).strip() else "")
                                             for k, v in p["messages"]]})
        g["cases"].append(f"{p['case']}@{p['world']}")
        if p["run_id"] not in g["runs"]:
            g["runs"].append(p["run_id"])
    out = list(by.values())
    for g in out:
        g["names"], g["run_names"] = ", ".join(g["cases"]), ", ".join(g["runs"])
    headings = {"note": "Notes", "skipped": "Not run"}
    for i, g in enumerate(out):
        g["heading"] = headings.get(g["kind"]) if i == 0 or out[i - 1]["kind"] != g["kind"] else None
    return out


def _write_markdown(out: OutputDir, summary: str, first: dict, groups: list[dict], runs: list[dict],
                    tables: dict[str, dict], images: dict, traces: dict, notes: list[str]) -> None:
    m = md_text
    md = ["# fleetbench report", "", m(summary), "", "## Summary", ""]
    md += ["| " + " | ".join(first["head"]) + " |", "|" + "---|" * len(first["head"])]
    md += ["| " + " | ".join(m(c) for c in cells) + " |" for _, cells, _ in first["rows"]]
    md += [""] + [f"_{m(n)}_" for n in first["notes"]]
    bad = [g for g in groups if g["kind"] in ("fail", "error")]
    md += ["", "## Failures and errors", ""] if bad else ["", "No failures or errors.", ""]
    for g in groups:
        label = {"fail": "fail", "error": "error", "note": "note", "skipped": "not run"}[g["kind"]]
        text = "; ".join(head if k == label else f"{k}: {head}" for k, head, _ in g["messages"])
        md.append(f"- {label}: {m(g['names'])} (run {m(g['run_names'])}): {m(text)}")
    md += ["", "## Runs", ""]
    for run in runs:
        md.append("- " + "; ".join(f"{k}: {m(v)}" for k, v in run.items()))
    for model, t in tables.items():
        md += ["", f"## {m(model)}", "", "| " + " | ".join(t["head"]) + " |", "|" + "---|" * len(t["head"])]
        md += ["| " + " | ".join(m(c) for c in cells) + " |" for _, cells, _ in t["rows"]]
        md += [""] + [f"_{m(n)}_" for n in t["notes"]]  # a line right below a table would be one more row
    md += [""] + [f"![{f}]({f})" for f in images]
    md += [""] + [f"- trace {m(c)}@{m(w)}: [{m(t)}]({_md_link_target(t)}) (every rank; each rank's torch.profiler "
                  f"trace beside it; open as a local file in https://ui.perfetto.dev)" for (c, w), t in traces.items()]
    md += [""] + [f"_{m(n)}_" for n in notes]
    out.write("summary.md", "\n".join(md) + "\n")


def _templates() -> Any:
    """The Jinja2 environment of ``templates/``: autoescaping on, an undefined name an error, and every text
    shown through :func:`plain` first (control characters and bidi overrides as ``\\uXXXX``, as in Markdown)."""
    import jinja2
    import markupsafe

    def finalize(value: object) -> object:
        keep = isinstance(value, markupsafe.Markup) or not isinstance(value, str)
        return value if keep else _plain(value, "\r\n\t")

    return jinja2.Environment(loader=jinja2.FileSystemLoader(os.path.join(os.path.dirname(__file__), "templates")),
                              autoescape=True, undefined=jinja2.StrictUndefined, finalize=finalize)


def _markup(text: str) -> Any:
    """Constant page text of this module that carries its own markup (never a record's)."""
    import markupsafe

    return markupsafe.Markup(text)


# the pieces a cell with an interval never breaks inside: the value with its interval, "not resolved", "(why)"
_GROUPS = re.compile(r"\([^)]*\)|not resolved|\S+(?: \[[^\]]*\])?")


def _html_cell(head: str, text: str, title: str | None, trend: dict | None) -> dict:
    """One cell as the template draws it: its text (or its parts: a line may break between them, never inside),
    class, hover reason, and the trend's sparkline (markup built by :func:`trend.sparkline_svg`, escaped there)."""
    import markupsafe

    cell: dict[str, Any] = {"text": text, "title": title, "cls": None, "parts": None, "slash": False, "svg": None}
    if head == "verdict":
        cell["cls"] = f"verdict v-{text}"
    elif head == "case":  # a long name may break after its "/" (model/variant) in a narrow window
        cell.update(cls="narrow-wrap", parts=re.split(r"(?<=/)", text), slash=True)
    elif head.endswith("[95% CI]"):  # "1.07× [0.73, 2.64] not resolved": the note under the value if need be
        cell.update(cls="wrap", parts=_GROUPS.findall(text))
    elif head == TREND and trend:
        cell.update(cls="trend", svg=markupsafe.Markup(sparkline_svg(trend)))
    elif head == MACHINE and text:
        cell["cls"] = "busy"
    return cell


def _html_table(model: str, t: dict, traces: dict, speedup: dict | None, trend: dict, summary: bool = False) -> dict:
    """A model's table (or, ``summary``, the page's first table: no trace column, no trends) as the template draws
    it: cells with their class and hover reason, busbw notes."""
    busbw: dict = {}
    rows = []
    for r, cells, why in t["rows"]:
        key = (r.case, r.world_size)
        rows.append({"bad": r.verdict in ("fail", "error"), "trace": traces.get(key),
                     "cells": [_html_cell(h, c, why.get(h) or None, trend.get(key) if not summary else None)
                               for h, c in zip(t["head"], cells)]})
        if why.get("busbw GB/s"):
            busbw.setdefault(why["busbw GB/s"], []).append(f"{r.case}@{r.world_size}")
    return {"model": model, "slug": _slug(model), "head": t["head"], "rows": rows, "notes": t["notes"],
            "busbw_notes": [(why, ", ".join(cases)) for why, cases in busbw.items()], "speedup": speedup,
            "traces": not summary}
