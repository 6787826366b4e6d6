"""The report's plots, drawn from records (matplotlib, Agg backend): each function returns a Figure, or
None when there is nothing meaningful to draw (the page then shows no chart rather than an empty one).

- speedup over the plain baseline per model (:func:`speedup_figure`): a ratio chart centred on 1 (log scale,
  as far either side), each case a dot and its paired 95% interval, hollow where the speedup is not resolved
  (:func:`speedup_unresolved`, ``suite.measure.stats``'s rule: the interval spans 1, fewer rounds than give a 95%
  interval, or rounds that disagree); speedups are
  comparable across models, throughputs are not;
- throughput (samples/s) per model at one world size (:func:`throughput_figure`), one panel per model,
  each on its own axis;
- the step broken into compute and exposed communication (:func:`breakdown_figure`), only for models
  whose ``none`` case (compute alone) ran: without it the split is unknown; and only for strategies that
  change communication alone (:func:`splits_step`): a strategy that changes compute (AMP, compute fusion,
  a fused optimizer, Local SGD …) is drawn as its whole step, since step − compute is not communication;
- scaling over world sizes (:func:`scaling_figure`): efficiency = throughput(n) / (n · throughput(1)),
  only for cases recorded at world size 1 and at least one other;
- the Local SGD trade-off (:func:`local_sgd_figure`): throughput against the final loss, per setting, only
  where a difference exceeds its noise (:func:`local_sgd_unresolved` says when it does not).

``latest(records)`` keeps the last ok record of each (case, world size); every figure reads only
``metrics`` the run wrote, so what is drawn is what was recorded.  Case names are drawn as plain text
(:func:`plain`): a ``$`` in a name must not start matplotlib's mathtext.

The page embeds them as SVG (:func:`svg_bytes`), :data:`WIDTH_IN` wide: 480 px at the page's :data:`DPI`, so
a 420 px window (a phone) shows them at four fifths of their size and their 9 pt text stays legible (10 px); one
case is one row of a horizontal chart (labels never rotated), legends stand below the axes.  No figure is wider
than :data:`MAX_WIDTH_PX`.
"""
from __future__ import annotations

import io
import math
import textwrap
from collections.abc import Iterable
from typing import Any

from ..cases import VARIANTS
from ..measure.stats import NOT_RESOLVED, RUN_ROUNDS_FOR_95, speedup_unresolved  # the one rule, run's too
from ..results.gate import CLIP
from ..results.records import CaseRecord, Metrics, allreduce_total
from ..results.records import plain as escaped
from .mpl import Line2D, NullLocator, Patch, matplotlib, plt  # matplotlib without writing under ~ (mpl.py)

__all__ = ["latest", "throughput_figure", "speedup_figure", "breakdown_figure", "scaling_figure",
           "local_sgd_figure", "scaling_table", "plain", "num", "busbw_measurable", "DPI", "MAX_WIDTH_PX", "WIDTH_IN",
           "BASELINE_VARIANT", "COMPUTE_VARIANT", "variant_of", "order_key", "splits_step", "local_sgd_unresolved",
           "speedup_unresolved", "ratio_ticks", "svg_bytes", "NOT_RESOLVED", "median_step", "Records"]

DPI = 96  # the page's pixels per inch (CSS: 96 px to the inch; an SVG's size in pt is shown at 96/72 px per pt)
MAX_WIDTH_PX = 1300  # no figure is wider than this (the page's window is 1400 px)
WIDTH_IN = 5.0  # every figure's width: 480 px, shown at 388/480 of its size in a 420 px window (text stays legible)
ROW_IN = 0.24  # one case's row in a horizontal chart
FONT = 9.0  # tick labels and legends, pt (titles 9.5): 12 px, 9.7 px in a 420 px window
BASELINE_VARIANT = "plain"
COMPUTE_VARIANT = "none"
# busbw is a bandwidth: it means something only where communication is exposed, measurably, and
# where messages are large enough that their time is not just latency
MIN_EXPOSED_FRACTION = 0.10  # exposed communication at least this share of the step
MIN_BYTES_PER_CALL = 256e3  # mean allreduce message at least this large (smaller ones measure mostly latency)
_WORLD_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf")


Records = dict[tuple[str, int], CaseRecord]  # (case, world) -> its record: what every figure draws from


def latest(records: Iterable[CaseRecord]) -> Records:
    """(case, world) -> the last ok record of it."""
    out = {}
    for r in records:
        if r.status == "ok" and not r.metrics.empty:
            out[(r.case, r.world_size)] = r
    return out


def plain(text: object) -> str:
    """``text`` for a matplotlib label, shown as it is: every ``$`` escaped, so mathtext never parses
    it (matplotlib counts ``$`` against ``\\$`` and shows ``\\$`` as ``$`` in text that is not math)."""
    return escaped(text, keep="\n").replace("$", r"\$")  # control characters and bidi overrides as \uXXXX


def num(x: object) -> float:
    """A recorded number as a float (an absent one, None, is nan; JSON's "nan", "inf", "-inf" are read as theirs)."""
    if isinstance(x, bool):
        return math.nan
    if isinstance(x, (int, float)):
        return float(x)
    if isinstance(x, str) and x in ("nan", "inf", "-inf"):
        return float(x)
    return math.nan


def median_step(metrics: Metrics) -> float:
    """The record's median step, seconds (nan where it has none)."""
    return num(metrics.step_time_s.median) if metrics.step_time_s is not None else math.nan


def variant_of(case: str) -> str:
    return case.split("/", 1)[-1]


# the strategy families (suite.cases.Variant.family) whose step differs from the `none` case's by communication
# alone; every other family changes compute too (precision, compute fusion, the training method, host syncs)
COMM_FAMILIES = ("baseline", "communication")


def splits_step(case: str) -> bool:
    """Whether step − the ``none`` case's step is communication for ``case``: its variant is registered and
    changes communication only (an unknown variant: not known, so not split)."""
    family = next((v.family for v in VARIANTS if v.name == variant_of(case)), None)
    return family in COMM_FAMILIES


def _figure(width_in: float, height_in: float, rows: int = 1, cols: int = 1,
            height_ratios: list | None = None) -> tuple[Any, list]:
    width_in = min(width_in, MAX_WIDTH_PX / DPI)
    fig, axes = plt.subplots(rows, cols, figsize=(width_in, height_in), squeeze=False,
                             gridspec_kw={"height_ratios": height_ratios} if height_ratios else None)
    return fig, [ax for row in axes for ax in row]


def _legend_in(entries: int, ncol: int = 1) -> float:
    """The height, inches, of a legend of ``entries`` lines in ``ncol`` columns below the axes."""
    return 0.08 + 0.19 * math.ceil(entries / ncol)


def _legend_below(fig: Any, handles: list, ncol: int = 1) -> None:
    """``handles`` as one legend at the bottom of the figure (its height :func:`_legend_in`, included in the
    figure's), the axes laid out above it: a legend beside the axes would take a narrow figure's width."""
    fig.legend(handles=handles, loc="lower left", bbox_to_anchor=(0.01, 0.0), ncol=ncol, fontsize=FONT - 0.5,
               frameon=False, handlelength=1.6)
    fig.tight_layout(rect=(0, _legend_in(len(handles), ncol) / fig.get_size_inches()[1], 1, 1))


LABEL_CHARS = 24  # a case's label in a chart at most (the table has its whole name): the axes keep their width
TITLE_CHARS = 40  # a title's line at most: centred over axes beside LABEL_CHARS labels, it stays inside WIDTH_IN


def _label(variant: str, suffix: str = "") -> str:
    """A case's row label: its variant (the panel's title names the model), cut to LABEL_CHARS, then ``suffix``."""
    short = variant if len(variant) <= LABEL_CHARS else variant[:LABEL_CHARS - 1] + "…"
    return plain(short + suffix)


def _title(ax: Any, text: str, pad: float = 6.0) -> None:
    """A panel's title, in lines of at most TITLE_CHARS (a long model name wraps rather than leaving the figure),
    ``pad`` points above the axes."""
    lines = [ln for part in plain(text).split("\n") for ln in textwrap.wrap(part, TITLE_CHARS, break_on_hyphens=False)]
    ax.set_title("\n".join(lines), fontsize=9.5, pad=pad)


def _rows_axis(ax: Any, labels: list) -> None:
    """A horizontal chart's case axis: one row per label, the first on top."""
    ax.set_yticks(range(len(labels)), labels, fontsize=FONT)
    ax.set_ylim(len(labels) - 0.5, -0.5)
    ax.tick_params(axis="x", labelsize=FONT)


def _by_model(rows: list[tuple[str, CaseRecord]]) -> dict[str, list[tuple[str, CaseRecord]]]:
    out: dict[str, list[tuple[str, CaseRecord]]] = {}
    for case, r in rows:
        out.setdefault(r.model, []).append((case, r))
    return out


def _model_panels(rows: list[tuple[str, CaseRecord]], below_in: float = 0.0
                  ) -> tuple[Any, list, dict[str, list[tuple[str, CaseRecord]]]] | None:
    """One panel per model (a row per model, each as tall as its cases), ``below_in`` inches under them for a
    legend: (figure, axes, rows by model), or None without rows."""
    models = _by_model(sorted(rows, key=lambda cr: (cr[1].model, order_key(cr[0]))))
    if not models:
        return None
    heights = [ROW_IN * len(v) + 1.05 for v in models.values()]
    fig, axes = _figure(WIDTH_IN, sum(heights) + below_in, rows=len(models), height_ratios=heights)
    return fig, axes, models


def _error_bars(vals: list, ci: list) -> list:
    """Matplotlib's [below, above] error lengths from each value's [lo, hi] (0 where a bound is not finite)."""
    return [[max(0.0, v - num(c[0])) if math.isfinite(num(c[0])) else 0.0 for v, c in zip(vals, ci)],
            [max(0.0, num(c[1]) - v) if math.isfinite(num(c[1])) else 0.0 for v, c in zip(vals, ci)]]


def order_key(case: str) -> tuple:
    """The baseline first, then `none`, then the rest by name."""
    v = variant_of(case)
    return (v != BASELINE_VARIANT, v != COMPUTE_VARIANT, case)


def throughput_figure(recs: Records, world: int) -> Any:
    """Horizontal bars of samples/s per case at ``world`` ranks with their intervals, one panel per model (models
    never share an axis: their samples differ); the baseline drawn grey.  None without data."""
    rows = [(c, r) for (c, w), r in recs.items() if w == world and math.isfinite(num(r.metrics.samples_per_s))]
    panels = _model_panels(rows)
    if panels is None:
        return None
    fig, axes, models = panels
    for ax, (model, mrows) in zip(axes, models.items()):
        vals = [num(r.metrics.samples_per_s) for _, r in mrows]
        err = _error_bars(vals, [r.metrics.samples_per_s_ci or [v, v] for (_, r), v in zip(mrows, vals)])
        colors = ["#888888" if variant_of(c) == BASELINE_VARIANT else "#1f77b4" for c, _ in mrows]
        ax.barh(range(len(mrows)), vals, xerr=err, color=colors, capsize=2, height=0.65, error_kw={"elinewidth": 1})
        _rows_axis(ax, [_label(variant_of(c)) for c, _ in mrows])
        ax.set_xlabel("samples/s", fontsize=FONT)
        _title(ax, f"{model}: throughput at world size {world}\n(median, 95% interval; grey: plain)")
    fig.tight_layout()
    return fig


def _interval(ci: object) -> tuple[float, float]:
    """A recorded [lo, hi] as two floats (nan where absent or not a number)."""
    if isinstance(ci, (list, tuple)) and len(ci) == 2:
        return num(ci[0]), num(ci[1])
    return math.nan, math.nan


_RATIO_TICKS = (1.05, 1.1, 1.25, 1.5, 2.0, 4.0, 10.0)


def _ratio_extent(values: Iterable[float]) -> float:
    """k such that the axis from 1/k to k (centred on 1 on a log scale) holds every finite positive value with a
    margin: at least 1.25, at most CLIP's 10 (an end beyond is drawn at the edge)."""
    k = 1.0
    for x in values:
        if math.isfinite(x) and x > 0:
            k = max(k, x, 1 / x)
    return min(max(1.15 * k, 1.25), CLIP[1])


def ratio_ticks(k: float) -> list[float]:
    """Ticks of a ratio axis from 1/k to k: 1, and the same ratios either side (1.5 and 1/1.5), at least a quarter of
    the half-axis apart on the log scale (so their labels never touch)."""
    gap = 0.25 * math.log(k)
    kept: list[float] = []
    for t in sorted(_RATIO_TICKS, reverse=True):
        if t <= k * (1 + 1e-9) and math.log(t) >= gap and all(math.log(u / t) >= gap for u in kept):
            kept.append(t)
    return sorted([1 / t for t in kept] + [1.0] + kept)


def _ratio_label(x: float) -> str:
    return f"{x:g}" if x >= 1 else f"{x:.2f}".rstrip("0").rstrip(".")


def speedup_figure(recs: Records, model: str) -> Any:
    """A ratio chart of the speedup over the plain baseline per case of ``model``: a log axis centred on 1 (as far
    either side: 2x faster and 2x slower lie as far from 1), each case a dot at its speedup and a line over its
    paired 95% interval, one colour per world size; the dot filled where the speedup is resolved and hollow, its
    interval dashed and its label grey, where it is not (:func:`speedup_unresolved`); a failed or errored case's
    label red.  None when no case of the model has a speedup (the baseline's own is 1 by definition and is not
    drawn)."""
    rows = [(c, w, r) for (c, w), r in recs.items()
            if r.model == model and variant_of(c) != BASELINE_VARIANT and math.isfinite(num(r.metrics.speedup))]
    if not rows:
        return None
    rows.sort(key=lambda cwr: (order_key(cwr[0]), cwr[1]))  # top to bottom
    worlds = sorted({w for _, w, _ in rows})
    several = len(worlds) > 1
    color = {w: _WORLD_COLORS[i % len(_WORLD_COLORS)] for i, w in enumerate(worlds)}
    bad = [r.verdict in ("fail", "error") for _, _, r in rows]
    n_legend = 2 + (len(worlds) if several else 0) + any(bad)
    fig, axes = _figure(WIDTH_IN, ROW_IN * len(rows) + 1.25 + _legend_in(n_legend))
    ax = axes[0]
    ax.set_xscale("log")
    k = _ratio_extent(v for _, _, r in rows for v in (num(r.metrics.speedup), *_interval(r.metrics.speedup_ci)))
    ax.set_xlim(1 / k, k)
    ax.axvspan(1 / k, 1, color="#d62728", alpha=0.06, lw=0, zorder=0)
    ax.axvspan(1, k, color="#2ca02c", alpha=0.06, lw=0, zorder=0)
    ax.axvline(1.0, color="black", lw=0.9, zorder=1)
    for y, (_, w, r) in enumerate(rows):
        v = num(r.metrics.speedup)
        lo, hi = _interval(r.metrics.speedup_ci)
        resolved = speedup_unresolved(r.metrics) is None
        col = color[w]
        if math.isfinite(lo) and math.isfinite(hi):
            ends = [min(max(lo, 1 / k), k), min(max(hi, 1 / k), k)]
            ax.plot(ends, [y, y], color=col, lw=1.5, ls="-" if resolved else (0, (2.5, 1.5)), zorder=2)
            ax.plot([e for e, x in zip(ends, (lo, hi)) if e == x], [y] * sum(e == x for e, x in zip(ends, (lo, hi))),
                    ls="none", marker="|", ms=7, mew=1.5, color=col, zorder=2)
        at = min(max(v, 1 / k), k)  # a speedup beyond the axis: an arrowhead at its edge
        ax.plot([at], [y], ls="none", marker="o" if at == v else (">" if v > k else "<"), ms=6, mew=1.5, mec=col,
                mfc=col if resolved else "white", zorder=3, gid="resolved" if resolved else "unresolved")
    labels = [_label(variant_of(c), (f" @{w}" if several else "") + (f" ({r.verdict})" if b else ""))
              for (c, w, r), b in zip(rows, bad)]
    _rows_axis(ax, labels)
    for t, (_, _, r), b in zip(ax.get_yticklabels(), rows, bad):
        if b:
            t.set_color("#c00000")
        elif speedup_unresolved(r.metrics) is not None:
            t.set_color("#666666")
    ticks = ratio_ticks(k)
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticks(ticks, [_ratio_label(t) for t in ticks])
    ax.set_xlabel("speedup over plain (log scale)", fontsize=FONT)
    for x, ha, text in ((0.0, "left", "\u2190 slower"), (1.0, "right", "faster \u2192")):  # over the shaded halves
        ax.text(x, 1.01, text, transform=ax.transAxes, ha=ha, va="bottom", fontsize=FONT - 0.5, color="#555555")
    _title(ax, f"{model}: speedup over plain" + ("" if several else f" at world size {worlds[0]}"), pad=15)
    handles: list = [Line2D([], [], ls="-", marker="o", color="#444444",
                      label="resolved: the paired 95% interval is apart from 1"),
               Line2D([], [], ls=(0, (2.5, 1.5)), marker="o", color="#666666", mfc="white",
                      label=f"{NOT_RESOLVED}: the interval spans 1, under {RUN_ROUNDS_FOR_95} rounds, or its rounds "
                            "disagree")]
    handles += [Patch(color=color[w], label=f"world size {w}") for w in worlds] if several else []
    if any(bad):
        handles.append(Patch(color="#c00000", label="red label: the check failed, or an error"))
    _legend_below(fig, handles)
    return fig


def breakdown_figure(recs: Records, world: int) -> Any:
    """Stacked horizontal bars per case: compute (the model's ``none`` case: the same step without communication)
    and exposed communication (the rest of the step), ms per step (median); one panel per model, and only models
    whose ``none`` case ran (without it the split is unknown).  None when no model qualifies.

    A case whose strategy changes compute (:func:`splits_step` is False: AMP, compute fusion, Local SGD …)
    is drawn as its whole step in grey, not split: its difference to the ``none`` case is not
    communication.  A communication strategy's step shorter than the ``none`` case's is drawn as its
    whole step, hatched: its exposed communication is negative (noise)."""
    rows = [(c, r) for (c, w), r in recs.items() if w == world and math.isfinite(num(r.metrics.compute_s))
            and math.isfinite(median_step(r.metrics))]
    splits = [splits_step(c) for c, _ in rows]
    below_none = [s and median_step(r.metrics) < num(r.metrics.compute_s) for (c, r), s in zip(rows, splits)]
    handles = [Patch(color="#2ca02c", label="compute (the none case's step)"),
               Patch(color="#d62728", label="exposed communication")]
    if not all(splits):
        handles.append(Patch(color="#9e9e9e", label="whole step: the strategy changes compute, not split"))
    if any(below_none):
        handles.append(Patch(facecolor="#2ca02c", hatch="//", label="step below the none case's"))
    panels = _model_panels(rows, below_in=_legend_in(len(handles)))
    if panels is None:
        return None
    fig, axes, models = panels
    for ax, (model, mrows) in zip(axes, models.items()):
        ys = range(len(mrows))
        compute: list[float] = []
        exposed: list[float] = []
        below: list[bool] = []
        whole: list[float] = []
        for c, r in mrows:
            step = median_step(r.metrics)
            comp = num(r.metrics.compute_s)
            split = splits_step(c)
            whole.append(0.0 if split else 1e3 * step)
            compute.append(1e3 * min(comp, step) if split else 0.0)
            exposed.append(1e3 * max(0.0, step - comp) if split else 0.0)
            below.append(split and step < comp)
        bars = ax.barh(ys, compute, color="#2ca02c", height=0.65)
        for bar, b in zip(bars, below):
            if b:
                bar.set_hatch("//")
        ax.barh(ys, exposed, left=compute, color="#d62728", height=0.65)
        ax.barh(ys, whole, color="#9e9e9e", height=0.65)
        _rows_axis(ax, [_label(variant_of(c)) for c, _ in mrows])
        ax.set_xlabel("ms per step (median)", fontsize=FONT)
        _title(ax, f"{model}: step breakdown at world size {world}")
    _legend_below(fig, handles)
    return fig


def scaling_table(recs: Records) -> dict[str, list[tuple[int, float, float]]]:
    """case -> [(world, samples/s, efficiency vs world size 1)], for cases recorded at world size 1 and another."""
    out: dict[str, list[tuple[int, float, float]]] = {}
    for (case, w), r in sorted(recs.items()):
        one = recs.get((case, 1))
        if one is None:
            continue
        t1, tn = num(one.metrics.samples_per_s), num(r.metrics.samples_per_s)
        out.setdefault(case, []).append((w, tn, tn / (w * t1) if t1 > 0 else math.nan))
    return {c: rows for c, rows in out.items() if len(rows) > 1}


def scaling_figure(recs: Records) -> Any:
    """Scaling efficiency over world sizes, one panel per model; None when no case has world size 1 and another."""
    table = scaling_table(recs)
    models: dict[str, list] = {}
    for case, rows in table.items():
        model = recs[(case, rows[0][0])].model
        models.setdefault(model, []).append((case, rows))
    if not models:
        return None
    fig, axes = _figure(WIDTH_IN, 2.9 * len(models), rows=len(models))
    for ax, (model, cases) in zip(axes, models.items()):
        for case, rows in cases:
            ax.plot([w for w, _, _ in rows], [e for _, _, e in rows], marker="o", label=_label(variant_of(case)))
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax.set_xticks(sorted({w for _, rows in cases for w, _, _ in rows}))
        ax.tick_params(labelsize=FONT)
        ax.set_xlabel("world size", fontsize=FONT)
        ax.set_ylabel("throughput(n) / (n · throughput(1))", fontsize=FONT)
        _title(ax, f"{model}: scaling efficiency over world sizes")
        ax.legend(fontsize=FONT - 1, loc="best")  # each panel its own: colours repeat from one panel to the next
    fig.tight_layout()
    return fig


def _loss_noise(losses: list[float]) -> float:
    """The final loss's noise: half the range of the last quarter of the losses (at least the last 2)."""
    tail = losses[-max(2, len(losses) // 4):]
    return (max(tail) - min(tail)) / 2


def _local_sgd_points(recs: Records) -> list:
    """(case, world, model, samples/s, its 95% interval, final loss, its noise) for the Local SGD cases and their
    model's baseline, where a finite final loss was recorded."""
    pts = []
    with_lsgd = {r.model for (c, _), r in recs.items() if "local_sgd" in variant_of(c)}
    for (case, w), r in sorted(recs.items()):
        variant = variant_of(case)
        if "local_sgd" in variant or (variant == BASELINE_VARIANT and r.model in with_lsgd):
            losses = [float(x) for x in r.metrics.losses or [] if isinstance(x, (int, float))]
            sps = num(r.metrics.samples_per_s)
            ci = [num(c) for c in r.metrics.samples_per_s_ci or [sps, sps]]
            if losses and all(math.isfinite(x) for x in [losses[-1], sps, *ci]):
                pts.append((case, w, r.model, sps, ci, losses[-1], _loss_noise(losses)))
    return pts


def _local_sgd_pairs(pts: list) -> list:
    """(Local SGD point, its baseline's point: same model and world size) of :func:`_local_sgd_points`."""
    base = {(m, w): p for p in pts for (c, w, m) in [p[:3]] if variant_of(c) == BASELINE_VARIANT}
    return [(p, base[(p[2], p[1])]) for p in pts if "local_sgd" in variant_of(p[0]) and (p[2], p[1]) in base]


def local_sgd_unresolved(recs: Records) -> str | None:
    """Why the Local SGD trade-off is not drawn (no Local SGD records, no baseline to compare with, or every
    difference within its noise), or None when it is: some Local SGD case's throughput interval is apart
    from its baseline's (same model and world size), or its final loss differs by more than both losses'
    noise (:func:`_loss_noise`)."""
    pts = _local_sgd_points(recs)
    if not any("local_sgd" in variant_of(p[0]) for p in pts):
        return "No Local SGD records: the trade-off plot is omitted."
    pairs = _local_sgd_pairs(pts)
    if not pairs:
        return "No Local SGD plot: no plain baseline with a final loss at the Local SGD cases' world size."
    for p, b in pairs:
        if p[4][0] > b[4][1] or p[4][1] < b[4][0] or abs(p[5] - b[5]) > p[6] + b[6]:
            return None
    return ("No Local SGD plot: the Local SGD cases' throughput and final loss differ from plain's within their "
            "noise (overlapping 95% intervals of samples/s; final losses within the spread of their last steps): "
            "there is no trade-off to draw.")


def local_sgd_figure(recs: Records) -> Any:
    """Throughput (with its 95% interval) against final loss for the Local SGD settings and their baseline;
    None where :func:`local_sgd_unresolved` gives a reason."""
    if local_sgd_unresolved(recs) is not None:
        return None
    pts = _local_sgd_points(recs)
    fig, axes = _figure(WIDTH_IN, 4.0)
    ax = axes[0]
    mid = (min(p[5] for p in pts) + max(p[5] for p in pts)) / 2
    for case, w, _, sps, ci, loss, noise in pts:
        ax.errorbar([loss], [sps], xerr=[[noise], [noise]], yerr=[[sps - ci[0]], [ci[1] - sps]], fmt="o", capsize=3)
        right = loss > mid  # labels point inwards, so none leaves the axes
        ax.annotate(plain(f"{case}@{w}"), (loss, sps), xytext=(-6 if right else 6, 6), textcoords="offset points",
                    ha="right" if right else "left", fontsize=8)
    ax.margins(x=0.25, y=0.2)
    for axis in (ax.xaxis, ax.yaxis):
        axis.get_major_formatter().set_useOffset(False)
    ax.tick_params(labelsize=FONT)
    ax.set_xlabel("final training loss (lower is better;\nbar: spread of the last steps)", fontsize=FONT)
    ax.set_ylabel("samples/s (95% interval)", fontsize=FONT)
    apart = any(abs(p[5] - b[5]) > p[6] + b[6] for p, b in _local_sgd_pairs(pts))
    ax.set_title("Local SGD: throughput against loss" + ("" if apart else "\n(final losses: within their noise)"),
                 fontsize=9.5)
    fig.tight_layout()
    return fig


def svg_bytes(fig: Any) -> tuple[bytes, tuple[int, int]]:
    """``fig`` as an SVG document and its size in the page's pixels (:data:`DPI`).  Text is drawn as paths (the
    figure looks the same in every browser, whatever fonts it has) and the file holds no date and no random ids:
    the same figure gives the same bytes."""
    buf = io.BytesIO()
    with matplotlib.rc_context({"svg.fonttype": "path", "svg.hashsalt": "fleetbench"}):
        fig.savefig(buf, format="svg", metadata={"Date": None})
    width, height = fig.get_size_inches()
    return buf.getvalue(), (round(width * DPI), round(height * DPI))


def busbw_measurable(metrics: Metrics) -> tuple[bool, str]:
    """(True, "") when the record's busbw means something, else (False, why not).

    busbw divides the allreduce bytes by the exposed communication time: it is a bandwidth only where
    that time is positive, a measurable share of the step (at least MIN_EXPOSED_FRACTION of it and above
    half the interquartile range of the step times, the spread of the measurement) and spent on messages
    of at least MIN_BYTES_PER_CALL on average (smaller messages measure latency, not bandwidth)."""
    if not math.isfinite(num(metrics.busbw_GBps)):
        return False, "not recorded (no none case, or no allreduce counted by fleetbench)"
    exposed = num(metrics.exposed_comm_s)
    st = metrics.step_time_s
    step, iqr = (num(st.median), num(st.iqr)) if st is not None else (math.nan, math.nan)
    if not exposed > 0:
        return False, "no exposed communication"
    if math.isfinite(step) and exposed < MIN_EXPOSED_FRACTION * step:
        return False, f"exposed communication under {MIN_EXPOSED_FRACTION:.0%} of the step"
    if math.isfinite(iqr) and exposed < iqr / 2:
        return False, "exposed communication within the step times' spread (half the IQR)"
    calls = allreduce_total(metrics.comm_calls_per_step)
    nbytes = allreduce_total(metrics.comm_bytes_per_step)
    if calls > 0 and nbytes / calls < MIN_BYTES_PER_CALL:
        return False, (f"allreduce messages of {nbytes / calls / 1e3:.0f} kB on average: their time is mostly "
                       f"latency, not bandwidth")
    return True, ""
