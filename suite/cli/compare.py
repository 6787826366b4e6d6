"""`fleetbench compare BASE HEAD`: the regression gate.

Each side is the suite's records (JSON lines from `fleetbench run`) or a pytest-benchmark
JSON file (saved with --benchmark-save-data or written by --benchmark-json).  Prints a table
of the change per case (speedup > 1: HEAD faster) with a noise-aware verdict from the
per-window samples, and the exact structural gate.  For two git revisions, `fleetbench ab`
is the sharper gate (trials interleaved in time); see docs/figures/gate.md for both.
"""
from __future__ import annotations

import sys

from ..outputs import write_atomic
from ..report.page import md_text
from ..results.load import load_side
from ..results.records import ResultsFileError, plain
from . import GATE_CODES, error, helps, print_json
from .checks import require_writable


def add_parser(sub) -> None:
    p = sub.add_parser("compare", help="the regression gate: compare two results files case by case", **helps(
        __doc__, """
        fleetbench compare results/last-good/runs.jsonl results/nightly/runs.jsonl
        fleetbench compare base.json head.json --threshold 0.1 --markdown cmp.md
        fleetbench compare base.jsonl head.jsonl --json""",
        verdicts="per case, the table's `verdict` column (`change` in --json) is the performance verdict, the "
                 "answer to: is HEAD slower by the threshold or more? not slower (the whole HEAD/BASE interval below "
                 "1 + threshold), slower (the test says so and the whole interval above 1 + threshold), faster (the "
                 "test says so and the whole interval below 1), undecided (the interval spans the threshold; what "
                 "would decide it is said), too few windows for alpha, not run on HEAD (BASE ran it; HEAD's record "
                 "says why), identical (the same records on both sides: nothing compared). "
                 "`check` is the correctness check on each side, BASE -> HEAD (`verdict` in --json; pass -> fail "
                 "fails the gate); `structure` identical, changed (fails) or not recorded; `status` the row's "
                 "outcome: ok, regression, undecided or not compared (an error on both sides, only in BASE / only "
                 "in HEAD: listed). `could_catch` is the smallest slowdown its samples could have caught at 95% "
                 "(a power statement, not the interval), or past 100% the windows a side it would take.",
        codes={**GATE_CODES, 1: "regression: a case slower beyond --threshold, a structure changed, a check "
                                "verdict pass -> fail, a case that errors on HEAD only (--strict: on one side only), "
                                "a nan, inf or non-positive time on HEAD",
               2: "unusable input: a file it cannot use (file and line or benchmark named), a nan, inf or "
                  "non-positive time on BASE; two files with no case in common; under --strict, different torch "
                  "versions or devices",
               3: "undecided: a case whose samples cannot support a verdict at the threshold, or that BASE ran and "
                  "HEAD did not (skipped, not_run); nothing worse"}))
    p.add_argument("base", help="BASE results: records .jsonl or pytest-benchmark .json")
    p.add_argument("head", help="HEAD results: records .jsonl or pytest-benchmark .json")
    p.add_argument("--threshold", type=float, default=0.25,
                   help="slowdown that fails the gate, a fraction below 1 (default 0.25 = 25%% slower). "
                        "docs/figures/gate.md section 1 (`fleetbench compare` on separate runs, 2-core CPU, 7 "
                        "windows a run): over pairs of unchanged runs 10%% gave 1.2%% (mlp/plain) and 0.2%% "
                        "(resnet/plain) false alarms, 25%% gave 0.1%% and 0.0%%, and caught a +10%% slowdown in 9%% "
                        "and 0%% of pairs; pass a smaller value on "
                        "quieter GPU runners")
    p.add_argument("--alpha", type=float, default=0.01, help="significance level (default 0.01)")
    p.add_argument("--method", default="mwu", help="mwu (Mann-Whitney U, default) or bootstrap (interval)")
    p.add_argument("--strict", action="store_true",
                   help="also fail on cases present on one side only; differing torch/device is an error")
    p.add_argument("--base-run-id", help="only this run of BASE (records files)")
    p.add_argument("--head-run-id", help="only this run of HEAD (records files)")
    p.add_argument("--markdown", metavar="PATH", help="also write the table as Markdown here")
    p.add_argument("--json", action="store_true", help="print the comparison as JSON (for machines) instead of a table")
    p.set_defaults(func=main)


def main(args) -> int:
    from ..results.compare import IDENTICAL, NOT_RUN, SAME_RECORDS, compare_sides, could_catch
    from ..results.gate import GateOptions

    require_writable("--markdown", args.markdown)  # found out now, not after the comparison
    try:
        opts = GateOptions(threshold=args.threshold, alpha=args.alpha, method=args.method)
        base = load_side(args.base, args.base_run_id)
        head = load_side(args.head, args.head_run_id)
        cmp = compare_sides(base, head, opts, strict=args.strict)
    except (ResultsFileError, ValueError) as exc:
        return error("compare", plain(exc))
    if cmp.same_records:  # before anything else: identical, and nothing below was compared
        print(f"compare: {SAME_RECORDS}", file=sys.stderr)
    if args.json:
        print_json(cmp.to_dict(base, head, opts))
        for w in cmp.warnings:
            print(f"warning: {w}", file=sys.stderr)
        return cmp.exit_code
    import pandas as pd

    frame = cmp.frame()
    with pd.option_context("display.width", 200, "display.max_columns", 20, "display.max_rows", 500):
        print(plain(f"BASE {args.base} ({_used(base, 'base')})\nHEAD {args.head} ({_used(head, 'head')})\n",
                    keep="\n"))
        print(plain(frame.to_string(index=False), keep="\n") if len(frame) else "(no cases)")
    for w in cmp.warnings:
        print(f"warning: {plain(w)}", file=sys.stderr)
    if args.markdown:
        try:
            write_atomic(args.markdown, markdown_table(frame))
        except OSError as exc:
            return error("compare", f"--markdown {args.markdown!r}: not written ({exc.strerror or exc})")
    if cmp.failures:
        print(f"\nregression gate: FAIL ({len(cmp.failures)})", file=sys.stderr)
        for f in cmp.failures:
            print(f"  {plain(f)}", file=sys.stderr)
        return 1
    if cmp.undecided:
        not_run = [r for r in cmp.undecided if r["change"].startswith(NOT_RUN)]
        weak = len(cmp.undecided) - len(not_run)
        why = ([f"{weak} case(s) whose samples cannot support a verdict at the {opts.threshold:.0%} threshold; more "
                f"windows, or `fleetbench ab` for two revisions"] if weak else []) \
            + ([f"{len(not_run)} case(s) not run on HEAD"] if not_run else [])
        print(f"\nregression gate: UNDECIDED ({'; '.join(why)})", file=sys.stderr)
        for r in cmp.undecided:
            more = [x for x in (could_catch(r), r.get("to_decide")) if x]
            print(plain(f"  {r['case']}@{r['world']}: {r['change']}" + "".join(f"; {x}" for x in more)),
                  file=sys.stderr)
        return 3
    if cmp.rows and all(r["change"] == IDENTICAL for r in cmp.rows):
        print("\nregression gate: ok (identical: BASE and HEAD hold the same times; nothing compared)")
        return 0
    print(f"\nregression gate: ok (nothing slower by {opts.threshold:.0%} or more; alpha {opts.alpha:g}, "
          f"{opts.method})")
    return 0


def _used(side, which: str) -> str:
    """What a side's header says it read: its kind and, for records, the run(s) its cases came from."""
    used = side.used_run_ids
    if side.kind != "records" or not used:
        return side.kind
    text = f"records; run {used[0]}" if len(used) == 1 else \
        f"records; runs {', '.join(used[:4])}{', …' if len(used) > 4 else ''}"
    if len(side.runs_in_file) > 1:
        text += f" of the {len(side.runs_in_file)} runs in the file, " \
            + (f"chosen by --{which}-run-id" if side.run_id else "the last record of each case")
    return text


def markdown_table(frame) -> str:
    """The comparison as a Markdown table; every cell escaped (case names and verdicts come from the
    results files, which are untrusted: no HTML, links or extra cells get through)."""
    def cell(v) -> str:
        if isinstance(v, float):
            return md_text(format(v, "g"))
        return md_text(v)

    from ..results.compare import NUMERIC

    cols = list(frame.columns)
    numeric = {c for c in cols if frame[c].dtype.kind in "iuf" or c in NUMERIC}
    lines = ["| " + " | ".join(md_text(c) for c in cols) + " |",
             "|" + "|".join("---:" if c in numeric else "---" for c in cols) + "|"]
    for row in frame.itertuples(index=False):
        lines.append("| " + " | ".join(cell(v) for v in row) + " |")
    return "\n".join(lines) + "\n"
