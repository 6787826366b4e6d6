"""The report page: an HTML file and a Markdown summary, with the plots as PNG files beside them.

``build_report(records, out_dir, results_dir)`` writes ``index.html``, ``summary.md``, the
PNGs, ``report_data.json`` (the numbers every plot was drawn from) and copies the runs'
Perfetto traces into ``traces/``.

Records are untrusted input (a results file can be edited or crafted): only trace files inside
the results directory's own ``traces/`` folder are copied (symlinks resolved), and every text
from a record is escaped for the page it goes into (:func:`md_text` for Markdown).
"""
from __future__ import annotations

import html
import json
import math
import os
import re
import shutil
import sys
import urllib.parse

__all__ = ["build_report", "md_text", "trace_source"]

_MD_PUNCT = re.compile(r"([\\`*~\[\]|])")


def md_text(value) -> str:
    """Untrusted text as one Markdown table cell or list line: HTML-escaped (no tags, entities or
    autolinks), the characters of links, code spans, emphasis and table cells backslash-escaped,
    line breaks as ``<br>``."""
    text = html.escape(str(value), quote=True)
    text = _MD_PUNCT.sub(r"\\\1", text)
    return re.sub(r"\r\n|\r|\n", "<br>", text)


def _md_link_target(path: str) -> str:
    return urllib.parse.quote(path, safe="/@")


def trace_source(results_dir: str, rel) -> tuple[str | None, str]:
    """(the file to copy, "") when ``rel`` names a regular file inside ``results_dir/traces`` (after
    resolving symlinks), else (None, why)."""
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
    if not os.path.isfile(src):
        return None, "does not exist" if not os.path.exists(src) else "is not a regular file"
    return src, ""


def _fmt(x, spec=".1f") -> str:
    return format(x, spec) if isinstance(x, (int, float)) and math.isfinite(x) else "-"


def build_report(records, out_dir: str, results_dir: str = ".") -> dict:
    import matplotlib.pyplot as plt

    from . import figures as F

    os.makedirs(out_dir, exist_ok=True)
    recs = F.latest(records)
    worlds = sorted({w for _, w in recs})
    plots: list = []  # (title, file)
    data: dict = {"cases": {}, "scaling": {}, "plots": []}
    for (case, w), r in sorted(recs.items()):
        m = r.metrics
        data["cases"][f"{case}@{w}"] = {k: m.get(k) for k in ("samples_per_s", "samples_per_s_ci", "speedup",
                                                                 "speedup_ci", "compute_s", "exposed_comm_s",
                                                                 "data_wait_s", "busbw_GBps", "peak_memory_bytes")}
        data["cases"][f"{case}@{w}"].update(verdict=r.verdict, step_median_s=(m.get("step_time_s") or {}).get("median"),
                                             run_id=r.run_id)

    def save(fig, name: str, title: str) -> None:
        if fig is None:
            return
        fig.savefig(os.path.join(out_dir, name), dpi=90)
        plt.close(fig)
        plots.append((title, name))
        data["plots"].append(name)

    for w in worlds:
        save(F.throughput_figure(recs, w), f"throughput_w{w}.png", f"Throughput at world size {w}")
        save(F.breakdown_figure(recs, w), f"breakdown_w{w}.png", f"Step breakdown at world size {w}")
    data["scaling"] = {c: rows for c, rows in F.scaling_table(recs).items()}
    save(F.scaling_figure(recs), "scaling.png", "Scaling over world sizes")
    lsgd = F.local_sgd_figure(recs)
    save(lsgd, "local_sgd.png", "Local SGD trade-off")

    traces = []
    data["warnings"] = []
    for (case, w), r in sorted(recs.items()):
        rel = r.metrics.get("trace_file")
        if rel:
            src, why = trace_source(results_dir, rel)
            if src is None:
                msg = f"record {case}@{w} (run {r.run_id}): trace_file {rel!r} {why}; not copied"
                print(f"fleetbench report: warning: {msg}", file=sys.stderr)
                data["warnings"].append(msg)
                continue
            dst = os.path.join("traces", os.path.basename(src))
            os.makedirs(os.path.join(out_dir, "traces"), exist_ok=True)
            shutil.copyfile(src, os.path.join(out_dir, dst))
            traces.append((f"{case}@{w}", dst))
    data["traces"] = [t for _, t in traces]

    errors = [r for r in records if r.status == "error"]
    rows = []
    for (case, w), r in sorted(recs.items()):
        m = r.metrics
        st = m.get("step_time_s") or {}
        rows.append([case, str(w), r.verdict, _fmt(m.get("samples_per_s")), _fmt(m.get("speedup"), ".2f"),
                     _fmt(1e3 * st["median"] if isinstance(st.get("median"), (int, float)) else None),
                     _fmt(1e3 * m["exposed_comm_s"] if isinstance(m.get("exposed_comm_s"), (int, float)) else None),
                     _fmt(m.get("busbw_GBps"), ".3f")])
    head = ["case", "world", "verdict", "samples/s", "speedup vs plain", "step ms", "exposed comm ms", "busbw GB/s"]
    runs = sorted({r.run_id for r in records})
    notes = []
    if not any(isinstance(r.metrics.get("data_wait_s"), (int, float)) for r in recs.values()):
        notes.append("Data wait is not measured by these records (shown as 0 in the breakdown).")
    if lsgd is None:
        notes.append("No Local SGD records: the trade-off plot is omitted.")

    m = md_text
    md = ["# fleetbench report", "", f"runs: {', '.join(m(x) for x in runs)}", "",
          "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    md += ["| " + " | ".join(m(c) for c in r) + " |" for r in rows]
    md += [""] + [f"![{t}]({f})" for t, f in plots]
    md += [""] + [f"- trace {m(c)}: [{m(t)}]({_md_link_target(t)}) (open in https://ui.perfetto.dev)"
                  for c, t in traces]
    md += [""] + [f"- error: {m(r.case)}@{m(r.world_size)}: "
                  f"{m((r.error or '').splitlines()[0]) if (r.error or '').strip() else ''}" for r in errors]
    md += [""] + [f"_{n}_" for n in notes]
    with open(os.path.join(out_dir, "summary.md"), "w") as fh:
        fh.write("\n".join(md) + "\n")

    e = html.escape
    body = [f"<h1>fleetbench report</h1><p>runs: {e(', '.join(runs))}</p>", "<table border=1 cellpadding=4><tr>"
            + "".join(f"<th>{e(h)}</th>" for h in head) + "</tr>"]
    body += ["<tr>" + "".join(f"<td>{e(c)}</td>" for c in r) + "</tr>" for r in rows]
    body.append("</table>")
    for t, f in plots:
        body.append(f"<h2>{e(t)}</h2><img src='{e(f)}' alt='{e(t)}'>")
    if traces:
        body.append("<h2>Traces</h2><ul>" + "".join(
            f"<li><a href='{e(t)}'>{e(c)}</a> (Chrome/Perfetto JSON: open in https://ui.perfetto.dev)</li>"
            for c, t in traces) + "</ul>")
    if errors:
        body.append("<h2>Errors</h2><ul>" + "".join(
            f"<li>{e(r.case)}@{e(str(r.world_size))}: {e((r.error or '')[:300])}</li>" for r in errors) + "</ul>")
    body += [f"<p><i>{e(n)}</i></p>" for n in notes]
    with open(os.path.join(out_dir, "index.html"), "w") as fh:
        fh.write("<!doctype html><html><head><meta charset='utf-8'><title>fleetbench report</title></head><body>"
                 + "\n".join(body) + "</body></html>\n")
    with open(os.path.join(out_dir, "report_data.json"), "w") as fh:
        json.dump(data, fh, indent=1, default=str)
    return data
