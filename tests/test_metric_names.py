"""One list of metric names: the fields of ``suite.results.records.Metrics``.

Every metric the summary and the runner write is in it (a record built from them is refused
otherwise), no other module spells out its own list of metric names, and every metric the
report, ``compare``'s loader and ``run``'s table read by name is one of them."""
from __future__ import annotations

import ast
import os

from suite.cases import CASES, RECORDED
from suite.config import StrategyConfig
from suite.measure.timing import CasePrepared, RankTiming, prepare_case
from suite.results.records import METRIC_NAMES, METRIC_UNITS, Metrics
from suite.run_spec import ResolvedCase, RunOptions
from suite.runner import CaseRunner

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _answers(names: list[str], ranks: int = 2) -> list[RankTiming]:
    """What ``time_on_rank`` answers, made up (three rounds of two steps)."""
    out = []
    for rank in range(ranks):
        variants = {n: {"windows": [0.2 + 0.01 * i, 0.21, 0.22], "step_times": [0.1, 0.11] * 3,
                        "losses": [2.0, 1.9] * 3, "comm_calls_per_step": {"world/all_reduce": 2.0},
                        "comm_bytes_per_step": {"world/all_reduce": 4096.0}, "host_syncs": 0, "threads": 1,
                        "describe": {"strategy": n}, "peak_memory_bytes": 1000 + rank,
                        "peak_memory_kind": "process_rss"} for i, n in enumerate(names)}
        out.append(RankTiming.from_dict({"rank": rank, "variants": variants}))
    return out


class _Launcher:
    """Answers every rank function with made-up timing answers (no process is started)."""

    def __init__(self, names: list[str]):
        self.names = names

    def run(self, fn, kwargs, timeout=None):
        if fn is prepare_case:
            return [CasePrepared(r, {"strategy": "plain"}) for r in range(2)]
        return _answers(self.names)


def _rc(name: str) -> ResolvedCase:
    (case,) = [c for c in CASES if c.name == name]
    return ResolvedCase(case, StrategyConfig())


def test_every_metric_the_summary_and_the_runner_write_is_a_metric_name():
    names = ["plain", "none", "overlap"]
    runner = CaseRunner(_Launcher(names), 2, RunOptions(per_rank_batch=4, utilization=True), metadata={},
                        say=lambda _: None)
    measured = runner._time([_rc("mlp/overlap"), _rc("mlp/none")], names)  # summary, speedup, exposed, utilization
    prepared = runner.prepare(_rc("mlp/plain"))
    prepared.key = "plain"
    written = {n: t.metrics for n, t in measured.items()} | {"prepared": prepared.metrics().metrics}
    for name, metrics in written.items():
        assert isinstance(metrics, Metrics) and set(metrics.to_dict()) <= set(METRIC_NAMES), name
    for key in ("speedup", "exposed_comm_s", "busbw_GBps", "utilization"):
        assert key in written["overlap"].to_dict(), key
    assert written["prepared"].workload is not None
    rec = runner.record(_rc("mlp/overlap"), None, measured["overlap"])
    assert isinstance(rec.metrics, Metrics) and rec.metrics.comm_calls_per_step == {"world/all_reduce": 2.0}
    assert rec.describe.engine["strategy"] == "overlap"
    assert rec.structure.comm_calls_per_step == {"world/all_reduce": 2.0}


def test_the_registry_uses_the_one_list():
    assert RECORDED == METRIC_NAMES
    for case in CASES:
        assert set(case.records) <= set(METRIC_NAMES), (case.name, set(case.records) - set(METRIC_NAMES))


def _python_files():
    for top in ("suite", "bench_cases"):
        for root, _, files in os.walk(os.path.join(ROOT, top)):
            for f in files:
                if f.endswith(".py"):
                    yield os.path.join(root, f)


# modules that build or read records: a dict literal with metric names as keys there is a second schema
# (the ranks' answers, the ab protocol and pytest-benchmark's extra_info are other formats)
RECORD_SIDE = ("suite/measure/summary.py", "suite/runner.py", "suite/results/", "suite/report/", "suite/cli/")


def test_no_other_module_lists_metric_names():
    """A tuple, list or set literal naming three metrics or more is a second list of metric names (and so is
    a dict literal keyed by them, where records are built or read)."""
    found = []
    for path in _python_files():
        rel = os.path.relpath(path, ROOT)
        if rel == os.path.join("suite", "results", "records.py"):
            continue
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else \
                node.keys if isinstance(node, ast.Dict) and rel.startswith(RECORD_SIDE) else []
            names = [i.value for i in items if isinstance(i, ast.Constant) and i.value in METRIC_NAMES]
            if len(names) >= 3:
                found.append(f"{os.path.relpath(path, ROOT)}:{node.lineno}: {names}")
    assert not found, "metric names listed outside suite/results/records.py:\n" + "\n".join(found)
    assert set(METRIC_UNITS) <= set(METRIC_NAMES), set(METRIC_UNITS) - set(METRIC_NAMES)  # units of metrics only


READERS = ["suite/report", "suite/results/load.py", "suite/results/compare.py", "suite/cli/run.py",
           "bench_cases/test_cases.py"]


PART_API = ("empty", "to_dict", "from_dict")  # what a record's part has besides its fields (no mapping's get, items)


def _is_metrics(expr: ast.expr) -> bool:
    text = ast.unparse(expr)
    return text in ("m", "metrics") or text.endswith(".metrics")


def _is_str(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def test_the_report_compare_and_run_read_metrics_by_their_names():
    paths = [p for p in _python_files() if any(os.path.relpath(p, ROOT).startswith(r) for r in READERS)]
    assert len(paths) >= 5
    read, unknown = set(), []
    for path in paths:
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            key = None
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" \
                    and _is_metrics(node.func.value) and node.args and _is_str(node.args[0]):
                key = node.args[0].value
            elif isinstance(node, ast.Subscript) and _is_metrics(node.value) and _is_str(node.slice):
                key = node.slice.value
            elif isinstance(node, ast.Attribute) and _is_metrics(node.value) and not node.attr.startswith("_") \
                    and node.attr not in PART_API:
                key = node.attr
            if key is not None:
                read.add(key)
                if key not in METRIC_NAMES:
                    unknown.append(f"{os.path.relpath(path, ROOT)}:{node.lineno}: {key!r}")
    assert not unknown, "metrics read by a name Metrics does not have:\n" + "\n".join(unknown)
    assert {"samples_per_s", "speedup", "step_times_s", "window_s", "trace_file"} <= read
