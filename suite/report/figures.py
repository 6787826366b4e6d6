"""The report's plots, drawn from records (matplotlib, Agg backend): each function returns a Figure, or
None when there is nothing meaningful to draw (the page then shows no chart rather than an empty one).

- speedup over the plain baseline per model (:func:`speedup_figure`), with the paired 95% intervals
  the run measured: speedups are comparable across models, throughputs are not;
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
(:func:`plain`): a ``$`` in a name must not start matplotlib's mathtext.  Figures are at most
:data:`MAX_WIDTH_PX` pixels wide when saved at :data:`DPI` (the page is read in a 1400 px window).
"""
from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.patches import Patch

from ..cases import VARIANTS
from ..results.records import allreduce_total
from ..results.records import plain as escaped

__all__ = ["latest", "throughput_figure", "speedup_figure", "breakdown_figure", "scaling_figure",
           "local_sgd_figure", "scaling_table", "plain", "num", "busbw_measurable", "DPI", "MAX_WIDTH_PX",
           "BASELINE_VARIANT", "COMPUTE_VARIANT", "variant_of", "order_key", "splits_step", "local_sgd_unresolved"]

DPI = 90
MAX_WIDTH_PX = 1300  # a figure saved at DPI is never wider than this (the page's window is 1400 px)
BASELINE_VARIANT = "plain"
COMPUTE_VARIANT = "none"
# busbw is a bandwidth: it means something only where communication is exposed, measurably, and
# where messages are large enough that their time is not just latency
MIN_EXPOSED_FRACTION = 0.10  # exposed communication at least this share of the step
MIN_BYTES_PER_CALL = 256e3  # mean allreduce message at least this large (smaller ones measure mostly latency)
_WORLD_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf")


def latest(records) -> dict:
    """(case, world) -> the last ok record of it."""
    out = {}
    for r in records:
        if r.status == "ok" and r.metrics:
            out[(r.case, r.world_size)] = r
    return out


def plain(text) -> str:
    """``text`` for a matplotlib label, shown as it is: every ``$`` escaped, so mathtext never parses
    it (matplotlib counts ``$`` against ``\\$`` and shows ``\\$`` as ``$`` in text that is not math)."""
    return escaped(text, keep="\n").replace("$", r"\$")  # control characters and bidi overrides as \uXXXX


def num(x) -> float:
    """A recorded number as a float (records keep nan/inf as the strings "nan", "inf", "-inf"); nan otherwise."""
    if isinstance(x, bool):
        return math.nan
    if isinstance(x, (int, float)):
        return float(x)
    if x in ("nan", "inf", "-inf"):
        return float(x)
    return math.nan


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


def _figure(width_in: float, height_in: float, rows: int = 1, cols: int = 1):
    width_in = min(width_in, MAX_WIDTH_PX / DPI)
    fig, axes = plt.subplots(rows, cols, figsize=(width_in, height_in), squeeze=False)
    return fig, [ax for row in axes for ax in row]


def _by_model(rows: list) -> dict:
    out: dict = {}
    for case, r in rows:
        out.setdefault(r.model, []).append((case, r))
    return out


def _model_panels(rows: list, legend_in: float = 0.0):
    """One panel per model (a row per model), wide enough for its most cases and a legend of ``legend_in``
    inches beside them: (figure, axes, rows by model), or None without rows."""
    models = _by_model(sorted(rows, key=lambda cr: (cr[1].model, order_key(cr[0]))))
    if not models:
        return None
    widest = max(len(v) for v in models.values())
    fig, axes = _figure(max(6.0, 0.55 * widest + 2.5) + legend_in, 3.6 * len(models), rows=len(models))
    return fig, axes, models


def _error_bars(vals: list, ci: list) -> list:
    """Matplotlib's [below, above] error lengths from each value's [lo, hi] (0 where a bound is not finite)."""
    return [[max(0.0, v - num(c[0])) if math.isfinite(num(c[0])) else 0.0 for v, c in zip(vals, ci)],
            [max(0.0, num(c[1]) - v) if math.isfinite(num(c[1])) else 0.0 for v, c in zip(vals, ci)]]


def order_key(case: str) -> tuple:
    """The baseline first, then `none`, then the rest by name."""
    v = variant_of(case)
    return (v != BASELINE_VARIANT, v != COMPUTE_VARIANT, case)


def throughput_figure(recs: dict, world: int):
    """Bars of samples/s per case at ``world`` ranks with their intervals, one panel per model (models
    never share an axis: their samples differ); the baseline drawn grey.  None without data."""
    rows = [(c, r) for (c, w), r in recs.items() if w == world and math.isfinite(num(r.metrics.get("samples_per_s")))]
    panels = _model_panels(rows)
    if panels is None:
        return None
    fig, axes, models = panels
    for ax, (model, mrows) in zip(axes, models.items()):
        xs = list(range(len(mrows)))
        vals = [num(r.metrics.get("samples_per_s")) for _, r in mrows]
        err = _error_bars(vals, [r.metrics.get("samples_per_s_ci") or [v, v] for (_, r), v in zip(mrows, vals)])
        colors = ["#888888" if variant_of(c) == BASELINE_VARIANT else "#1f77b4" for c, _ in mrows]
        ax.bar(xs, vals, yerr=err, color=colors, capsize=3)
        ax.set_xticks(xs, [plain(c) for c, _ in mrows], rotation=30, ha="right")
        ax.set_ylabel("samples/s")
        ax.set_title(plain(f"{model}: throughput at world size {world}\n(median over rounds, 95% interval; "
                           f"grey: the plain baseline)"), fontsize=10)  # two lines: one overflowed a narrow plot
    fig.tight_layout()
    return fig


def speedup_figure(recs: dict, model: str):
    """Horizontal bars of speedup over the plain baseline per case of ``model``, one colour per world size,
    with the paired 95% intervals; a line at 1 (> 1: faster than plain).  None when no case of the model
    has a speedup (the baseline's own is 1 by definition and is not drawn)."""
    rows = [(c, w, r) for (c, w), r in recs.items()
            if r.model == model and variant_of(c) != BASELINE_VARIANT and math.isfinite(num(r.metrics.get("speedup")))]
    if not rows:
        return None
    rows.sort(key=lambda cwr: (order_key(cwr[0]), cwr[1]), reverse=True)  # barh draws bottom-up
    worlds = sorted({w for _, w, _ in rows})
    color = {w: _WORLD_COLORS[i % len(_WORLD_COLORS)] for i, w in enumerate(worlds)}
    fig, axes = _figure(9.5, max(2.2, 0.32 * len(rows) + 1.4))
    ax = axes[0]
    ys = list(range(len(rows)))
    vals = [num(r.metrics.get("speedup")) for _, _, r in rows]
    err = _error_bars(vals, [r.metrics.get("speedup_ci") or [v, v] for (_, _, r), v in zip(rows, vals)])
    bars = ax.barh(ys, vals, xerr=err, color=[color[w] for _, w, _ in rows], capsize=2, height=0.7)
    for bar, (_, _, r) in zip(bars, rows):
        if r.verdict in ("fail", "error"):
            bar.set_hatch("//")
            bar.set_edgecolor("#c00000")
    labels = [plain(f"{c} @{w}" + (f" ({r.verdict})" if r.verdict in ("fail", "error") else ""))
              for c, w, r in rows]
    ax.set_yticks(ys, labels, fontsize=8)
    ax.axvline(1.0, color="black", lw=0.8, ls="--")
    ax.set_xlabel("speedup over plain data parallel (> 1: faster), paired 95% interval")
    handles = [Patch(color=color[w], label=f"world size {w}") for w in worlds]
    if any(r.verdict in ("fail", "error") for _, _, r in rows):
        handles.append(Patch(facecolor="white", edgecolor="#c00000", hatch="//", label="check failed or error"))
    ax.legend(handles=handles, fontsize=8, loc="lower right")
    ax.set_title(plain(f"{model}: speedup over the plain baseline"), fontsize=10)
    fig.tight_layout()
    return fig


def breakdown_figure(recs: dict, world: int):
    """Stacked bars per case: compute (the model's ``none`` case: the same step without communication) and
    exposed communication (the rest of the step), ms per step (median); one panel per model, and only
    models whose ``none`` case ran (without it the split is unknown).  None when no model qualifies.

    A case whose strategy changes compute (:func:`splits_step` is False: AMP, compute fusion, Local SGD …)
    is drawn as its whole step in grey, not split: its difference to the ``none`` case is not
    communication.  A communication strategy's step shorter than the ``none`` case's is drawn as its
    whole step, hatched: its exposed communication is negative (noise)."""
    rows = [(c, r) for (c, w), r in recs.items() if w == world and math.isfinite(num(r.metrics.get("compute_s")))
            and math.isfinite(num((r.metrics.get("step_time_s") or {}).get("median")))]
    panels = _model_panels(rows, legend_in=3.5)  # the legend stands right of the bars
    if panels is None:
        return None
    fig, axes, models = panels
    for ax, (model, mrows) in zip(axes, models.items()):
        xs = list(range(len(mrows)))
        compute, exposed, below, whole = [], [], [], []
        for c, r in mrows:
            step = num(r.metrics["step_time_s"]["median"])
            comp = num(r.metrics["compute_s"])
            split = splits_step(c)
            whole.append(0.0 if split else 1e3 * step)
            compute.append(1e3 * min(comp, step) if split else 0.0)
            exposed.append(1e3 * max(0.0, step - comp) if split else 0.0)
            below.append(split and step < comp)
        bars = ax.bar(xs, compute, color="#2ca02c")
        for bar, b in zip(bars, below):
            if b:
                bar.set_hatch("//")
        ax.bar(xs, exposed, bottom=compute, color="#d62728")
        ax.bar(xs, whole, color="#9e9e9e")
        ax.set_xticks(xs, [plain(c) for c, _ in mrows], rotation=30, ha="right")
        ax.set_ylabel("ms per step (median)")
        ax.set_title(plain(f"{model}: step breakdown at world size {world}"), fontsize=10)
        handles = [Patch(color="#2ca02c", label="compute (the none case's step)"),
                   Patch(color="#d62728", label="exposed communication")]
        if any(whole):
            handles.append(Patch(color="#9e9e9e", label="whole step: the strategy changes compute, not split"))
        if any(below):
            handles.append(Patch(facecolor="#2ca02c", hatch="//", label="step below the none case's"))
        ax.legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    return fig


def scaling_table(recs: dict) -> dict:
    """case -> [(world, samples/s, efficiency vs world size 1)], for cases recorded at world size 1 and another."""
    out: dict = {}
    for (case, w), r in sorted(recs.items()):
        one = recs.get((case, 1))
        if one is None:
            continue
        t1, tn = num(one.metrics.get("samples_per_s")), num(r.metrics.get("samples_per_s"))
        out.setdefault(case, []).append((w, tn, tn / (w * t1) if t1 > 0 else math.nan))
    return {c: rows for c, rows in out.items() if len(rows) > 1}


def scaling_figure(recs: dict):
    """Scaling efficiency over world sizes, one panel per model; None when no case has world size 1 and another."""
    table = scaling_table(recs)
    models: dict = {}
    for case, rows in table.items():
        model = recs[(case, rows[0][0])].model
        models.setdefault(model, []).append((case, rows))
    if not models:
        return None
    fig, axes = _figure(9.5, 3.8 * len(models), rows=len(models))
    for ax, (model, cases) in zip(axes, models.items()):
        for case, rows in cases:
            ax.plot([w for w, _, _ in rows], [e for _, _, e in rows], marker="o", label=plain(case))
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax.set_xticks(sorted({w for _, rows in cases for w, _, _ in rows}))
        ax.set_xlabel("world size")
        ax.set_ylabel("throughput(n) / (n · throughput(1))")
        ax.set_title(plain(f"{model}: scaling efficiency over world sizes"), fontsize=10)
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    return fig


def _loss_noise(losses: list) -> float:
    """The final loss's noise: half the range of the last quarter of the losses (at least the last 2)."""
    tail = losses[-max(2, len(losses) // 4):]
    return (max(tail) - min(tail)) / 2


def _local_sgd_points(recs: dict) -> list:
    """(case, world, model, samples/s, its 95% interval, final loss, its noise) for the Local SGD cases and their
    model's baseline, where a finite final loss was recorded."""
    pts = []
    with_lsgd = {r.model for (c, _), r in recs.items() if "local_sgd" in variant_of(c)}
    for (case, w), r in sorted(recs.items()):
        variant = variant_of(case)
        if "local_sgd" in variant or (variant == BASELINE_VARIANT and r.model in with_lsgd):
            losses = [float(x) for x in r.metrics.get("losses") or [] if isinstance(x, (int, float))]
            sps = num(r.metrics.get("samples_per_s"))
            ci = [num(c) for c in r.metrics.get("samples_per_s_ci") or [sps, sps]]
            if losses and all(math.isfinite(x) for x in [losses[-1], sps, *ci]):
                pts.append((case, w, r.model, sps, ci, losses[-1], _loss_noise(losses)))
    return pts


def _local_sgd_pairs(pts: list) -> list:
    """(Local SGD point, its baseline's point: same model and world size) of :func:`_local_sgd_points`."""
    base = {(m, w): p for p in pts for (c, w, m) in [p[:3]] if variant_of(c) == BASELINE_VARIANT}
    return [(p, base[(p[2], p[1])]) for p in pts if "local_sgd" in variant_of(p[0]) and (p[2], p[1]) in base]


def local_sgd_unresolved(recs: dict) -> str | None:
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


def local_sgd_figure(recs: dict) -> object | None:
    """Throughput (with its 95% interval) against final loss for the Local SGD settings and their baseline;
    None where :func:`local_sgd_unresolved` gives a reason."""
    if local_sgd_unresolved(recs) is not None:
        return None
    pts = _local_sgd_points(recs)
    fig, axes = _figure(7.5, 4.2)
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
    ax.set_xlabel("final training loss (lower is better; bar: spread of the last steps)")
    ax.set_ylabel("samples/s (95% interval)")
    apart = any(abs(p[5] - b[5]) > p[6] + b[6] for p, b in _local_sgd_pairs(pts))
    ax.set_title("Local SGD: throughput against loss" + ("" if apart else " (final losses: within their noise)"),
                 fontsize=10)
    fig.tight_layout()
    return fig


def busbw_measurable(metrics: dict) -> tuple[bool, str]:
    """(True, "") when the record's busbw means something, else (False, why not).

    busbw divides the allreduce bytes by the exposed communication time: it is a bandwidth only where
    that time is positive, a measurable share of the step (at least MIN_EXPOSED_FRACTION of it and above
    half the interquartile range of the step times, the spread of the measurement) and spent on messages
    of at least MIN_BYTES_PER_CALL on average (smaller messages measure latency, not bandwidth)."""
    if not math.isfinite(num(metrics.get("busbw_GBps"))):
        return False, "not recorded (no none case, or no allreduce counted by fleetbench)"
    exposed = num(metrics.get("exposed_comm_s"))
    st = metrics.get("step_time_s") or {}
    step, iqr = num(st.get("median")), num(st.get("iqr"))
    if not exposed > 0:
        return False, "no exposed communication"
    if math.isfinite(step) and exposed < MIN_EXPOSED_FRACTION * step:
        return False, f"exposed communication under {MIN_EXPOSED_FRACTION:.0%} of the step"
    if math.isfinite(iqr) and exposed < iqr / 2:
        return False, "exposed communication within the step times' spread (half the IQR)"
    calls = allreduce_total(metrics.get("comm_calls_per_step"))
    nbytes = allreduce_total(metrics.get("comm_bytes_per_step"))
    if calls > 0 and nbytes / calls < MIN_BYTES_PER_CALL:
        return False, (f"allreduce messages of {nbytes / calls / 1e3:.0f} kB on average: their time is mostly "
                       f"latency, not bandwidth")
    return True, ""
