"""The report's plots, drawn from records (matplotlib, Agg backend): each function returns a Figure.

- throughput per strategy against the baseline, with the 95% intervals the run measured;
- the step broken down into compute, exposed communication and data wait;
- scaling over world sizes: efficiency = throughput(n) / (n · throughput(1));
- the Local SGD trade-off: throughput against the final loss, per setting.

``latest(records)`` keeps the last record of each (case, world size); every figure reads
only ``metrics`` the run wrote, so what is drawn is what was recorded.  Case names are drawn
as plain text (:func:`plain`): a ``$`` in a name must not start matplotlib's mathtext.
"""
from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

__all__ = ["latest", "throughput_figure", "breakdown_figure", "scaling_figure", "local_sgd_figure",
           "scaling_table", "plain"]


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
    return str(text).replace("$", r"\$")


def _num(x) -> float:
    return float(x) if isinstance(x, (int, float)) else math.nan


def throughput_figure(recs: dict, world: int):
    """Bars of samples/s per case at ``world`` ranks, with intervals; the baseline drawn apart."""
    rows = sorted(((c, r) for (c, w), r in recs.items() if w == world), key=lambda cr: cr[0])
    fig, ax = plt.subplots(figsize=(max(5, 0.7 * len(rows) + 2), 4))
    xs = list(range(len(rows)))
    vals = [_num(r.metrics.get("samples_per_s")) for _, r in rows]
    ci = [r.metrics.get("samples_per_s_ci") or [v, v] for (_, r), v in zip(rows, vals)]
    err = [[max(0.0, v - _num(c[0])) for v, c in zip(vals, ci)], [max(0.0, _num(c[1]) - v) for v, c in zip(vals, ci)]]
    colors = ["#888888" if c.endswith("/plain") else "#1f77b4" for c, _ in rows]
    ax.bar(xs, vals, yerr=err, color=colors, capsize=3)
    ax.set_xticks(xs, [plain(c) for c, _ in rows], rotation=45, ha="right")
    ax.set_ylabel("samples/s (median, 95% interval)")
    ax.set_title(f"throughput at world size {world} (grey: plain data parallel, the baseline)")
    fig.tight_layout()
    return fig


def breakdown_figure(recs: dict, world: int):
    """Stacked bars per case: compute, exposed communication, data wait, other (ms per step)."""
    rows = sorted(((c, r) for (c, w), r in recs.items() if w == world), key=lambda cr: cr[0])
    fig, ax = plt.subplots(figsize=(max(5, 0.7 * len(rows) + 2), 4))
    xs = list(range(len(rows)))
    parts: dict[str, list[float]] = {"compute": [], "exposed communication": [], "data wait": [], "other": []}
    for _, r in rows:
        m = r.metrics
        step = _num((m.get("step_time_s") or {}).get("median"))
        compute = _num(m.get("compute_s"))
        exposed = max(0.0, _num(m.get("exposed_comm_s"))) if math.isfinite(_num(m.get("exposed_comm_s"))) else math.nan
        wait = _num(m.get("data_wait_s"))
        wait = wait if math.isfinite(wait) else 0.0
        if not math.isfinite(compute):  # no `none` case in the run: the whole step, unsplit
            compute, exposed = 0.0, 0.0
            other = step
        else:
            other = max(0.0, step - compute - exposed - wait)
        for k, v in zip(parts, (compute, exposed, wait, other)):
            parts[k].append(1e3 * v)
    bottom = [0.0] * len(rows)
    for (name, vals), color in zip(parts.items(), ("#2ca02c", "#d62728", "#ff7f0e", "#bbbbbb")):
        ax.bar(xs, vals, bottom=bottom, label=name, color=color)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_xticks(xs, [plain(c) for c, _ in rows], rotation=45, ha="right")
    ax.set_ylabel("ms per step (median)")
    ax.set_title(f"step breakdown at world size {world}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def scaling_table(recs: dict) -> dict:
    """case -> [(world, samples/s, efficiency vs world size 1)], for cases recorded at world size 1."""
    out: dict = {}
    for (case, w), r in sorted(recs.items()):
        one = recs.get((case, 1))
        if one is None:
            continue
        t1, tn = _num(one.metrics.get("samples_per_s")), _num(r.metrics.get("samples_per_s"))
        out.setdefault(case, []).append((w, tn, tn / (w * t1) if t1 > 0 else math.nan))
    return {c: rows for c, rows in out.items() if len(rows) > 1}


def scaling_figure(recs: dict):
    table = scaling_table(recs)
    fig, ax = plt.subplots(figsize=(6, 4))
    for case, rows in table.items():
        ax.plot([w for w, _, _ in rows], [e for _, _, e in rows], marker="o", label=plain(case))
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xlabel("world size")
    ax.set_ylabel("scaling efficiency (throughput(n) / (n · throughput(1)))")
    ax.set_title("scaling over world sizes" + ("" if table else " (no case recorded at world size 1)"))
    if table:
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def local_sgd_figure(recs: dict) -> object | None:
    """Throughput against final loss for Local SGD settings and their baseline; None without records."""
    pts = []
    for (case, w), r in sorted(recs.items()):
        variant = case.split("/", 1)[-1]
        if "local_sgd" in variant or (variant == "plain" and any("local_sgd" in c for c, _ in recs)):
            losses = [x for x in r.metrics.get("losses") or [] if isinstance(x, (int, float))]
            if losses:
                pts.append((f"{case}@{w}", _num(r.metrics.get("samples_per_s")), losses[-1]))
    if not any("local_sgd" in p[0] for p in pts):
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, sps, loss in pts:
        ax.scatter([loss], [sps])
        ax.annotate(plain(name), (loss, sps), fontsize=8)
    ax.set_xlabel("final training loss (lower is better)")
    ax.set_ylabel("samples/s")
    ax.set_title("Local SGD: throughput against loss")
    fig.tight_layout()
    return fig
