"""Each case's trend over the runs a report is given: the samples/s of every run that measured it, drawn as a
sparkline (inline SVG in the page, block characters in the Markdown).

The page's tables show the last record of each case and world size; with several runs in the results files
(a nightly's, or a developer's repeated runs) a row also shows how that number moved.  Only runs of the same
size and device as the last record count (a ``tiny`` run beside a ``cpu`` one is another workload), at most
:data:`MAX_TREND_RUNS` of them (the latest); a run whose machine was busy (:func:`busy_reason`) is a hollow
grey point.  Every text of the SVG (run ids come from records, which are untrusted) is escaped here.
"""
from __future__ import annotations

import html
import math
from collections.abc import Iterable

from ..measure.utilization import busy_reason
from ..results.records import CaseRecord, plain

__all__ = ["trends", "sparkline_svg", "sparkline_text", "MAX_TREND_RUNS"]

MAX_TREND_RUNS = 20  # points of one trend at most (the latest runs); report_data.json says how many runs there were
WIDTH, HEIGHT, PAD = 84, 20, 3  # the sparkline's box, px
_BLOCKS = "▁▂▃▄▅▆▇█"


def _value(r: CaseRecord) -> float:
    v = r.metrics.samples_per_s if r.status == "ok" else None
    return float(v) if v is not None and math.isfinite(v) else math.nan


def trends(records: Iterable[CaseRecord], final: dict[tuple[str, int], CaseRecord]) -> dict[tuple[str, int], dict]:
    """(case, world) -> {"runs": how many runs measured it, "points": [{"run_id", "samples_per_s", "busy"}, ...]}
    (oldest first, in the order the records come; a run's last record of the case; the latest MAX_TREND_RUNS),
    for the cases of ``final`` (its last record by (case, world)) measured in at least two runs of the same size
    and device as that last record."""
    by: dict[tuple[str, int], dict] = {}
    for r in records:
        key = (r.case, r.world_size)
        last = final.get(key)
        v = _value(r)
        if last is None or not math.isfinite(v) or r.size != last.size or r.device != last.device:
            continue
        by.setdefault(key, {})[r.run_id] = {"run_id": r.run_id, "samples_per_s": v,
                                            "busy": bool(busy_reason(r.metrics))}
    return {k: {"runs": len(runs), "points": list(runs.values())[-MAX_TREND_RUNS:]}
            for k, runs in by.items() if len(runs) >= 2}


def _describe(trend: dict) -> str:
    pts = trend["points"]
    shown = f"the last {len(pts)} of {trend['runs']} runs" if trend["runs"] > len(pts) else f"{len(pts)} runs"
    return (f"samples/s over {shown}, oldest first: "
            + ", ".join(f"{p['run_id']} {p['samples_per_s']:.1f}" + (" (machine busy)" if p["busy"] else "")
                        for p in pts))


def sparkline_svg(trend: dict) -> str:
    """The trend as a small inline SVG (a line through one point per run, the last one larger; a busy run's
    point hollow and grey), its values and run ids in its <title> (shown on hover), escaped."""
    pts = trend["points"]
    vals = [p["samples_per_s"] for p in pts]
    lo, hi = min(vals), max(vals)
    step = (WIDTH - 2 * PAD) / (len(pts) - 1)

    def y(v: float) -> float:
        return HEIGHT / 2 if hi == lo else PAD + (HEIGHT - 2 * PAD) * (hi - v) / (hi - lo)

    xy = [(PAD + i * step, y(v)) for i, v in enumerate(vals)]
    dots = "".join(
        f"<circle cx='{x:.1f}' cy='{yy:.1f}' r='{2.6 if i == len(xy) - 1 else 1.7}' "
        + ("fill='#fff' stroke='#999' stroke-width='1'" if p["busy"] else "fill='#1f77b4'") + "/>"
        for i, ((x, yy), p) in enumerate(zip(xy, pts)))
    line = " ".join(f"{x:.1f},{yy:.1f}" for x, yy in xy)
    title = html.escape(plain(_describe(trend)), quote=True)
    return (f"<svg class='spark' xmlns='http://www.w3.org/2000/svg' width='{WIDTH}' height='{HEIGHT}' "
            f"viewBox='0 0 {WIDTH} {HEIGHT}' role='img' aria-label='{title}'><title>{title}</title>"
            f"<polyline points='{line}' fill='none' stroke='#1f77b4' stroke-width='1.2'/>{dots}</svg>")


def sparkline_text(trend: dict) -> str:
    """The trend in block characters, for Markdown: one per run, lowest ▁ to highest █, how many runs and how many of
    them on a busy machine."""
    vals = [p["samples_per_s"] for p in trend["points"]]
    lo, hi = min(vals), max(vals)
    blocks = "".join(_BLOCKS[3 if hi == lo else round((v - lo) / (hi - lo) * (len(_BLOCKS) - 1))] for v in vals)
    busy = sum(p["busy"] for p in trend["points"])
    return f"{blocks} ({len(vals)} runs" + (f", {busy} busy)" if busy else ")")
