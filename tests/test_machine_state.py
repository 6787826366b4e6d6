"""The machine's state in every record (issue 33, item 5): the load average at the start and end of a case's
timing and the CPU time other processes took during its windows, and "machine busy: timings unreliable" from
`run`, `compare`, `ab` and the report above the stated share (others' CPU over 10% of the machine's during the
windows, or a load average above the cores by more than one)."""
from __future__ import annotations

import math
import os
import subprocess
import sys
from dataclasses import replace

import pytest

from suite.measure.utilization import BUSY, BUSY_SHARE, busy_reason, others_cpu
from suite.results.records import Metrics


def test_the_busy_rule_reads_others_share_and_the_load_against_the_cores():
    quiet = Metrics(others_cpu_share=0.04, load_avg_start=1.2, load_avg_end=1.9, cpu_cores=2)
    assert busy_reason(quiet) is None
    assert busy_reason(Metrics()) is None  # an older record: nothing recorded, nothing claimed
    others = busy_reason(replace(quiet, others_cpu_share=0.25))
    assert others == f"{BUSY} (other processes took 25% of the CPU during the windows (over 10%))", others
    assert busy_reason(replace(quiet, load_avg_end=2.9)) is None  # the run's own ranks and parent: within the margin
    load = busy_reason(replace(quiet, load_avg_end=3.2))
    assert load == f"{BUSY} (load average 3.2 above the 2 cores by more than 1)", load
    assert busy_reason(replace(quiet, others_cpu_share=BUSY_SHARE)) is None  # "over" the share, not at it
    assert busy_reason(replace(quiet, others_cpu_share=math.nan)) is None
    # others = the machine's busy CPU time less the ranks' own on that machine (a rank elsewhere is not counted),
    # over the machine's whole CPU time; ticks against nanoseconds never make it negative
    ranks = [{"cpu_s": 0.9, "host_busy_s": 2.5, "host_total_s": 4.0, "host": "a"},
             {"cpu_s": 1.0, "host_busy_s": 2.6, "host_total_s": 4.0, "host": "a"},
             {"cpu_s": 1.0, "host_busy_s": 1.0, "host_total_s": 4.0, "host": "b"}]
    assert others_cpu(ranks) == pytest.approx((0.6, 0.15))
    assert others_cpu([dict(ranks[0], host_busy_s=0.85)]) == (0.0, 0.0)
    assert all(math.isnan(x) for x in others_cpu([dict(ranks[0], host_busy_s=math.nan)]))


def test_a_cpu_bound_process_beside_a_case_is_in_its_record_and_every_view_says_busy(pool2, tmp_path):
    """One process spinning beside a case on the session's ranks: the record holds the load average at the start
    and end of its timing, the cores and the CPU time others took in its windows (over 10% of the machine's: one
    spinning process is a whole core); run's summary line, compare's warning and the report's note and runs table
    all say "machine busy: timings unreliable" (the report in its runs table)."""
    from suite.cases import get_case
    from suite.cli.run import busy_summary
    from suite.config import StrategyConfig
    from suite.report.page import _runs
    from suite.results.compare import compare_sides
    from suite.results.load import load_side
    from suite.results.records import append_record
    from suite.run_spec import ResolvedCase, RunFacts, RunOptions
    from suite.runner import CaseRunner

    case = get_case("mlp/plain")
    rc = ResolvedCase(case, StrategyConfig.from_dict(case.config))
    runner = CaseRunner(pool2, 2, RunOptions(check=False, utilization=False, rounds=3, steps=10, warmup=1),
                        metadata={"torch": "test"}, facts=RunFacts(size="tiny"))
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        records = [r for batch in runner.run([rc]) for r in batch]
    finally:
        spin.kill()
        spin.wait(timeout=10)
    (rec,) = records
    m = rec.metrics
    assert rec.status == "ok", rec.error
    for name in ("load_avg_start", "load_avg_end", "others_cpu_s", "others_cpu_share"):
        value = getattr(m, name)
        assert isinstance(value, float) and math.isfinite(value) and value >= 0, (name, m.to_dict())
    assert m.cpu_cores == os.cpu_count()
    assert m.others_cpu_share is not None and m.others_cpu_share > BUSY_SHARE, m.to_dict()  # a spinning process's core
    assert m.others_cpu_s is not None and m.others_cpu_s > 0, m.to_dict()
    assert busy_reason(m).startswith(BUSY + " (other processes took"), busy_reason(m)
    line = busy_summary(records)
    assert line is not None and line.startswith(f"{BUSY} for 1 of 1 timed case(s): other processes took"), line
    # the record as written and read back: compare warns, the report marks the case and its run
    path = tmp_path / "runs.jsonl"
    append_record(str(path), rec)
    (again,) = load_side(str(path)).records
    assert again.metrics.others_cpu_share == pytest.approx(m.others_cpu_share)
    other = tmp_path / "other.jsonl"
    append_record(str(other), rec)
    cmp = compare_sides(load_side(str(path)), load_side(str(other)))
    assert any(w.startswith("mlp/plain@2: BASE's timings: " + BUSY) for w in cmp.warnings), cmp.warnings
    (run,) = _runs([again])
    assert run["machine"].startswith("BUSY: timings unreliable in 1 of 1 timed cases: mlp/plain (other processes "
                                     "took"), run
