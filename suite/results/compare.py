"""Comparing two sides case by case: the table and the exit status of `fleetbench compare`.

Samples are per timed window (``suite.results.load``); a side without window times (an old
record) falls back to per-step samples, and the row says so.  The structural gate is exact:
when both sides recorded a case's structure (``suite.results.structure``), any difference
is "structure changed", whatever the timings say.

Times are finite, positive seconds: a nan, inf or non-positive time is never dropped (a side would
look like fewer, better samples); on HEAD it fails its case, on BASE the file is unusable.

Exit status: 0 nothing worse; 1 a case slower beyond the threshold, a structure changed, a
correctness verdict that went from pass to fail, a case that ran on BASE and errors on
HEAD, or a non-finite or non-positive time on HEAD; 2 input that cannot be used (raised as
ResultsFileError / ValueError: by the caller's loaders, or here for a BASE case with such a time, or
two sides without a case in common); 3 undecided: a case whose samples cannot support a verdict
at the threshold (too few, or an interval across it; ``suite.results.gate``), and nothing worse.
A case on one side only is listed, not failed, unless ``strict``; a case BASE ran and HEAD did not
(skipped, not_run) is undecided, with the record's reason.  Identical inputs (one file with itself, or a
case whose records on both sides hold the very same times) are answered "identical" at once, exit 0: no
interval between a number and itself.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from ..measure.utilization import busy_reason
from .gate import MIN_SAMPLES, UNDECIDED, GateOptions, gate_samples, min_p_value, ratio_interval_text
from .load import Side, samples, windows
from .records import CaseRecord, ResultsFileError
from .structure import structure_diff, structure_new

__all__ = ["Comparison", "compare_sides", "COLUMNS", "NUMERIC", "NOT_RUN", "SAME_RECORDS", "IDENTICAL", "could_catch"]

GOOD = ("pass", "n/a")

# a row's status: its outcome
OK, REGRESSION, UNDECIDED_ROW, NOT_COMPARED = "ok", "regression", "undecided", "not compared"
SAME_RECORDS = ("BASE and HEAD are the same records: identical, nothing compared; pass --base-run-id/"
                "--head-run-id (or two files) to compare two runs")
IDENTICAL = "identical"  # a case whose two records hold the very same times (the same record, or a copy)
NOT_RUN = "not run on HEAD"  # a case BASE ran: undecided (its verdict starts so)

# The table's columns (`fleetbench compare` and its --markdown); NUMERIC ones are right-aligned in Markdown.
COLUMNS = ("case", "world", "base_ms", "head_ms", "speedup", "ci", "p_slower", "n", "could_catch", "verdict", "check",
           "structure", "status", "machine")
NUMERIC = ("world", "base_ms", "head_ms", "speedup", "p_slower")


@dataclass
class Comparison:
    rows: list  # one dict per case
    warnings: list = field(default_factory=list)
    failures: list = field(default_factory=list)  # why the gate fails (exit 1)
    same_records: bool = False  # BASE and HEAD are the same records of one file: said first (SAME_RECORDS)

    def frame(self) -> Any:
        """The rows for people, as text: ``verdict`` is the performance verdict (``change`` in --json), ``check``
        the correctness check on each side (``verdict`` in --json), ``status`` the row's outcome, ``machine`` the
        sides timed on a busy machine (their reasons are warnings); times in ms and speedups with 3 decimals,
        p-values with 2 significant digits, ``could_catch`` the smallest slowdown the samples could have caught
        (``detectable_slowdown``) as a percentage."""
        import pandas as pd

        def num(x: object, spec: str) -> str:
            return format(x, spec) if isinstance(x, (int, float)) and math.isfinite(x) else ""

        def show(r: dict) -> dict:
            ci = r["ci"]
            return dict(r, base_ms=num(r["base_ms"], ".3f"), head_ms=num(r["head_ms"], ".3f"),
                        speedup=num(r["speedup"], ".3f"), ci=ratio_interval_text(*ci) if ci else "",
                        p_slower=num(r["p_slower"], ".2g"),
                        n=f"{r['n_base']}/{r['n_head']} {r['samples']}" if r["samples"] else "",
                        could_catch=could_catch(r, short=True), verdict=r["change"], check=r["verdict"])

        return pd.DataFrame([show(r) for r in self.rows], columns=list(COLUMNS))

    @property
    def undecided(self) -> list[dict]:
        """Cases without a verdict at the threshold: samples that cannot support one, or not run on HEAD."""
        return [r for r in self.rows if r["status"] == UNDECIDED_ROW]

    @property
    def exit_code(self) -> int:
        return 1 if self.failures else 3 if self.undecided else 0

    def to_dict(self, base: Side | None = None, head: Side | None = None, opts: GateOptions | None = None) -> dict:
        """The comparison for machines (`fleetbench compare --json`)."""
        import dataclasses

        return {"kind": "fleetbench.compare", "samples": "per window (seconds per step of each timed window)",
                "base": _side_info(base), "head": _side_info(head),
                "options": dataclasses.asdict(opts) if opts is not None else None, "rows": self.rows,
                "warnings": ([SAME_RECORDS] if self.same_records else []) + self.warnings,
                "failures": self.failures, "exit_code": self.exit_code}


def _side_info(side: Side | None) -> dict | None:
    if side is None:
        return None
    return {"path": side.path, "kind": side.kind, "torch": side.torch, "device": side.device, "run_ids": side.run_ids}


def _records_of(side: Side) -> dict[str, str]:
    """Which record each case came from: its line (records) or benchmark (pytest-benchmark), without the path."""
    return {k: w[len(side.path):] if w.startswith(side.path) else w for k, w in side.where.items()}


def _same_file(a: str | None, b: str | None) -> bool:
    import os

    try:
        return bool(a and b) and os.path.samefile(str(a), str(b))
    except OSError:
        return False


def _bad_timings(c: CaseRecord) -> str | None:
    """What is wrong with a case's timing samples, or None: a time is finite and positive seconds, so nan, inf and
    values <= 0 are failures of the measurement (never dropped: a side would look like fewer, better samples)."""
    for values, what in ((windows(c), "timing"), (samples(c), "per-step timing")):
        bad = [x for x in values if not (math.isfinite(x) and x > 0)]
        if bad:
            finite = sum(math.isfinite(x) for x in bad)
            kind = ("non-finite" if not finite else "non-positive" if finite == len(bad)
                    else "non-finite or non-positive")
            shown = list(dict.fromkeys(format(x, "g") for x in bad))
            return (f"{len(bad)} {kind} {what} sample{'s' if len(bad) != 1 else ''} ({', '.join(shown[:4])}"
                    + (", …" if len(shown) > 4 else "") + ")")
    return None


def _some(cases: dict[str, CaseRecord], limit: int = 4) -> str:
    """A few of a side's cases (model/variant@world) for a message."""
    keys = sorted(cases)
    if not keys:
        return "no cases"
    return ", ".join(keys[:limit]) + (f", … ({len(keys)} cases)" if len(keys) > limit else "")


def _fmt_ms(x: float) -> float:
    return round(x * 1e3, 3) if isinstance(x, float) and math.isfinite(x) else math.nan


def could_catch(row: dict, short: bool = False) -> str:
    """A row's power statement: "≥ 12%", or "nothing < 100%: fewer than N windows a side" (short: the table's
    cell); "" for a row that compared no timings.  Beside a decided verdict the cell states what the verdict's
    interval caught or rules out instead, so the two agree (as `ab`'s do: ``suite.ab.stats.power_sentence``):
    "caught ≥ 6.2%" (slower: HEAD/BASE's lower end), "rules out ≥ 3.1%" (not slower: its upper end), "rules out any"
    (faster, or an upper end below 1)."""
    ci, change = row.get("ci"), row.get("change")
    if short and ci and change in ("slower", "not slower", "faster"):
        lo, hi = 1 / ci[1], 1 / ci[0]  # HEAD/BASE step time: the speedup's interval turned over
        if change == "slower":
            return f"caught ≥ {lo - 1:.1%}"
        return f"rules out ≥ {hi - 1:.1%}" if change == "not slower" and hi > 1 else "rules out any"
    d = row.get("detectable_slowdown")
    if d is not None:
        return f"≥ {d:.0%}" if short else f"could have caught ≥ {d:.0%}"
    if not row.get("samples"):
        return ""
    need = row.get("needed_windows")
    have = min(row.get("n_base", 0), row.get("n_head", 0))
    tail = f"fewer than {need} windows a side" if need and need > have else "too few windows"
    return f"nothing < 100%: {tail}" if short else f"could have caught nothing below 100%: {tail}"


def _identical(b: CaseRecord, h: CaseRecord) -> bool:
    """The two sides' records of a case hold the very same times (the same record, or a copy of it)."""
    return b.status == h.status == "ok" and bool(windows(b) or samples(b)) and windows(b) == windows(h) \
        and samples(b) == samples(h)


def compare_sides(base: Side, head: Side, opts: GateOptions | None = None, strict: bool = False) -> Comparison:
    opts = opts if opts is not None else GateOptions()
    cmp = Comparison(rows=[])
    if base.torch and head.torch and base.torch != head.torch:
        cmp.warnings.append(f"torch versions differ: BASE {base.torch}, HEAD {head.torch}")
    if base.device and head.device and base.device != head.device:
        cmp.warnings.append(f"devices differ: BASE {base.device}, HEAD {head.device}")
    # one file, and the same record of every case on both sides (no run id chosen, or the same one)
    cmp.same_records = _same_file(base.path, head.path) and _records_of(base) == _records_of(head)
    unusable = [(key, c, why) for key, c in sorted(base.cases.items())  # a baseline with nan/inf times is none
                if c.status == "ok" and (why := _bad_timings(c))]
    if unusable:
        key, c, why = unusable[0]
        more = [k for k, _, _ in unusable[1:]]
        also = f" (also in {', '.join(more[:3])}{', …' if len(more) > 3 else ''})" if more else ""
        raise ResultsFileError(f"{base.where.get(key, base.path)}: case {key}: BASE has {why}; a baseline's times "
                               f"must be finite and positive seconds{also}")
    if not set(base.cases) & set(head.cases):  # nothing to compare is not a pass
        raise ResultsFileError(f"no case is in both files (a case is compared at the same world size): BASE "
                               f"{base.path} has {_some(base.cases)}; HEAD {head.path} has {_some(head.cases)}")
    keys = list(dict.fromkeys(list(base.cases) + list(head.cases)))
    for key in sorted(keys):
        b, h = base.cases.get(key), head.cases.get(key)
        one = b if b is not None else h
        assert one is not None  # the key came from one of the sides
        row: dict[str, Any] = {"case": one.case, "world": one.world_size, "base_ms": math.nan, "head_ms": math.nan,
               "speedup": math.nan, "ci": None, "p_slower": math.nan, "n_base": 0, "n_head": 0, "samples": "",
               "detectable_slowdown": None, "needed_windows": None, "to_decide": "",
               "verdict": f"{b.verdict if b else '-'} -> {h.verdict if h else '-'}", "change": "",
               "structure": "", "structure_diff": [], "status": NOT_COMPARED,  # until its timings are compared
               "machine": ""}  # "busy: BASE", "busy: HEAD", "busy: both": the sides timed on a busy machine

        def fail(why: str, row: dict[str, Any] = row, key: str = key) -> None:
            row["status"] = REGRESSION
            cmp.failures.append(f"{key}: {why}")

        bad = _bad_timings(h) if h is not None and h.status == "ok" else None
        if b is None or h is None:
            row["change"] = "only in HEAD" if b is None else "only in BASE"
            if strict:
                fail(f"{row['change']} (--strict)")
            if bad:
                row["change"] += f"; HEAD has {bad}"
                fail(f"HEAD has {bad}")
            cmp.rows.append(row)
            continue
        if b.config and h.config and b.config != h.config:
            diff = sorted(k for k in set(b.config) | set(h.config) if b.config.get(k) != h.config.get(k))
            cmp.warnings.append(f"{key}: configs differ in {', '.join(diff)}")
        if b.verdict == "pass" and h.verdict == "fail":
            fail("correctness verdict went from pass to fail")
        if h.status == "error" or h.verdict == "error":
            if b.status != "error" and b.verdict != "error":
                detail = h.error.splitlines()[0][:120] if h.error else "no detail"
                fail(f"ran on BASE, errors on HEAD ({detail})")
            else:
                row["change"] = "error on both sides"
            cmp.rows.append(row)
            continue
        if b.status == "ok" and h.status in ("skipped", "not_run"):  # measured on BASE only: nothing decided
            reason = h.error.strip().splitlines()[0][:120] if h.error and h.error.strip() else "no reason recorded"
            row["change"] = f"{NOT_RUN} ({h.status}: {reason})"
            if row["status"] != REGRESSION:
                row["status"] = UNDECIDED_ROW
            cmp.rows.append(row)
            continue
        if b.status != "ok" or h.status != "ok":
            row["change"] = f"{b.status} -> {h.status}"
            cmp.rows.append(row)
            continue
        if not b.structure.empty and not h.structure.empty:
            bfacts, hfacts = b.structure.to_dict(), h.structure.to_dict()
            diff = structure_diff(bfacts, hfacts)
            new = structure_new(bfacts, hfacts)
            if new:
                cmp.warnings.append(f"{key}: structural facts on one side only (new, not a change): "
                                    + "; ".join(new))
            row["structure"] = "changed" if diff else "identical"
            row["structure_diff"] = diff
            if diff:
                fail(f"structure changed ({len(diff)} difference(s)): " + "; ".join(diff[:6])
                     + (" …" if len(diff) > 6 else ""))
        else:
            row["structure"] = "not recorded"
        if bad:  # a failure of the case, not samples to drop
            row["change"] = f"HEAD has {bad}"
            fail(row["change"])
            cmp.rows.append(row)
            continue
        busy_sides = []
        for label, rec in (("BASE", b), ("HEAD", h)):
            busy = busy_reason(rec.metrics)
            if busy:
                cmp.warnings.append(f"{key}: {label}'s timings: {busy}")  # the reason, under the table
                busy_sides.append(label)
        row["machine"] = f"busy: {'both' if len(busy_sides) == 2 else busy_sides[0]}" if busy_sides else ""
        if cmp.same_records or _identical(b, h):  # a case and itself: no interval between a number and itself
            row.update(change=IDENTICAL, base_ms=_fmt_ms(statistics.median(windows(b) or samples(b))),
                       head_ms=_fmt_ms(statistics.median(windows(h) or samples(h))), speedup=1.0)
            if row["status"] != REGRESSION:
                row["status"] = OK
            cmp.rows.append(row)
            continue
        bw, hw = windows(b), windows(h)
        by_window = len(bw) >= MIN_SAMPLES and len(hw) >= MIN_SAMPLES
        bs, hs = (bw, hw) if by_window else (samples(b), samples(h))
        row.update(n_base=len(bs), n_head=len(hs), samples="windows" if by_window else "steps")
        if not by_window and samples(b) and samples(h):
            cmp.warnings.append(f"{key}: fewer than {MIN_SAMPLES} timed windows on a side; compared per-step "
                                f"samples, whose p-values are overconfident (steps of one window are not independent)")
        g = gate_samples(bs, hs, opts)
        row.update(base_ms=_fmt_ms(g["base_median_s"]), head_ms=_fmt_ms(g["head_median_s"]),
                   speedup=round(g["speedup"], 3) if math.isfinite(g["speedup"]) else math.nan,
                   ci=[round(g["ci_low"], 3), round(g["ci_high"], 3)] if math.isfinite(g["ci_low"]) else None,
                   p_slower=g["p_slower"], change=g["change"], needed_windows=g["needed_windows"],
                   to_decide=g["to_decide"],
                   detectable_slowdown=(round(g["detectable_slowdown"], 4) if g["detectable_slowdown"] < 1
                                        else None))
        if g["change"] == "slower":
            fail(f"{1 / g['speedup']:.2f}x slower (speedup {g['speedup']:.3f}, 95% interval "
                 f"{ratio_interval_text(g['ci_low'], g['ci_high'])}, p={g['p_slower']:.2g}; threshold "
                 f"{opts.threshold:.0%})")
        if g["change"] == "too few samples" and opts.method == "mwu" and min_p_value(len(bs), len(hs)) >= opts.alpha:
            row["change"] = f"too few {'windows' if by_window else 'samples'} for alpha {opts.alpha:g}"
        if g["change"] == "too few samples" and strict:
            fail("too few samples to compare (--strict)")
        if row["status"] != REGRESSION:
            row["status"] = UNDECIDED_ROW if g["change"] in UNDECIDED else OK
        cmp.rows.append(row)
    if strict and cmp.warnings:
        env = [w for w in cmp.warnings if w.startswith(("torch versions", "devices"))]
        if env:
            raise ValueError("refusing to compare under --strict: " + "; ".join(env))
    return cmp
