"""`fleetbench report`: the report's command line (its --help: ``ABOUT``); the page is ``suite.report.page``'s."""
from __future__ import annotations

import os

from ..report.page import build_report, out_problem
from ..results.records import ResultsFileError, plain, read_records, run_ids_held
from . import error, helps

# --help's description: what the command does, for its users (the docstring above is for developers)
ABOUT = """`fleetbench report RESULTS...`: an HTML page and a Markdown summary of results files, with plots and traces.

Reads the records `fleetbench run` wrote (a corrupt file is an error naming the file and line) and
reports the last record of each case and world size (and its samples/s over the runs the files hold):
failures and errors first, with their messages, then what each run ran on, then one table and one speedup
chart per model (docs/report.md says how to read them).  Traces are the ones `fleetbench run --trace-steps`
wrote next to the results."""


def add_parser(sub) -> None:
    p = sub.add_parser("report", help="HTML page + Markdown summary with plots and Perfetto traces from records",
                       **helps(ABOUT, """
                           fleetbench report results/runs.jsonl
                           fleetbench report results/nightly/runs.jsonl --out results/reports/nightly"""))
    p.add_argument("results", nargs="+", help="records files (.jsonl) from fleetbench run")
    p.add_argument("--out", default=os.path.join("results", "reports", "latest"),
                   help="output directory (new, empty, or holding a previous report): index.html, summary.md, the "
                        "plots, report_data.json, the traces (default results/reports/latest)")
    p.add_argument("--force", action="store_true", help="write into --out even if it holds other files")
    p.add_argument("--run-id", action="append", default=[], help="only these runs (repeatable; default: every run "
                   "in the files, the last record of each case and world size)")
    p.set_defaults(func=main)


def main(args) -> int:
    dirs = [os.path.dirname(os.path.abspath(p)) for p in args.results]
    why = out_problem(args.out, dirs, force=args.force)
    if why:  # found out before anything is read or written
        return error("report", f"--out {plain(args.out)}: {why}")
    records, record_dirs = [], {}
    try:
        for path, d in zip(args.results, dirs):
            for rec in read_records(path):
                records.append(rec)
                record_dirs[id(rec)] = d  # each file's traces are under its own directory
    except ResultsFileError as exc:
        return error("report", plain(exc))
    chosen = [r for r in records if r.run_id in args.run_id] if args.run_id else records
    if not chosen:
        return error("report", f"no records in {plain(', '.join(args.results))}"
                     + (f" for run id(s) {plain(', '.join(args.run_id))}; "
                        f"{'they hold' if len(args.results) > 1 else 'it holds'} (newest first) "
                        f"{plain(run_ids_held(records))}" if records else ""))
    records = chosen
    try:  # what cannot be told beforehand (/proc, a full disk, a root-owned path root may not write)
        os.makedirs(args.out, exist_ok=True)
        data = build_report(records, args.out, dirs[0], record_dirs)
    except OSError as exc:
        return error("report", f"--out {plain(args.out)}: cannot be written ({plain(exc.strerror or str(exc))}); "
                               "pick a writable directory")
    bad = [p for p in data["problems"] if p["kind"] in ("fail", "error")]
    print(plain(f"report: {os.path.join(args.out, 'index.html')} and summary.md ({len(data['plots'])} plot(s), "
                f"{len(data['traces'])} trace(s))"
                + (f"; {len(bad)} failure(s) or error(s), listed first: "
                   + ", ".join(f"{p['case']}@{p['world']} {p['verdict']}" for p in bad) if bad else "")))
    return 0
