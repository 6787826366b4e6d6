"""`fleetbench compare`: the regression gate's statistics and exit status, on synthetic sample sets.

Exit 0 nothing worse, 1 slower beyond the threshold / pass -> fail / errors on HEAD only,
2 unusable input naming file and line, 3 undecided (samples that cannot support a verdict).  The gate flags
a 2x slowdown and does not flag unchanged reruns drawn from the same noise (false-alarm rate measured over many seeds).
"""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from suite.cli.main import main
from suite.results.gate import GateOptions, gate_samples
from suite.results.records import CaseRecord, append_record
from tests.clitools import HOSTILE_CASE, unescaped_pipes
from tests.clitools import cli as _cli
from tests.clitools import one_error as _one_error
from tests.fakes import fake_record, report_record
from tests.fakes import write_records as write_record_file


def noisy(seed: int, n: int = 40, median: float = 0.05, slow: float = 1.0) -> list:
    """Step times with the shape this machine shows: lognormal spread and a few long outliers."""
    rng = np.random.default_rng(seed)
    x = median * slow * rng.lognormal(0.0, 0.15, n)
    x[rng.random(n) < 0.08] *= 2.5
    return x.tolist()


def write_records(path, cases: dict, torch_version="2.4.0", run_id="r1", steps_per_window=8, structure=None):
    """Records as `run` writes them: per-step samples, and windows of ``steps_per_window`` steps."""
    for (name, world), (samples, verdict) in cases.items():
        status = "error" if verdict == "error" else "ok"
        k = steps_per_window
        windows = [float(sum(samples[i:i + k])) for i in range(0, len(samples) - k + 1, k)]
        append_record(str(path), CaseRecord(
            name, name.split("/")[0], world, {"data_parallel": "suite"}, run_id, status=status, verdict=verdict,
            metrics={"step_times_s": samples, "samples_per_s": 32 / float(np.median(samples)), "window_s": windows,
                     "steps_per_window": k} if samples else {},
            structure=(structure or {}).get(name, {}),
            metadata={"torch": torch_version, "cpu": "test cpu", "gpu": {"available": False}},
            error="RuntimeError: boom" if status == "error" else None))


def test_gate_flags_2x_slowdown_for_every_seed():
    for seed in range(30):
        g = gate_samples(noisy(seed), noisy(seed + 1000, slow=2.0))
        assert g["change"] == "slower", (seed, g)
        assert 0.4 < g["speedup"] < 0.6 and g["ci_high"] < 1.0


def test_gate_false_alarm_rate_over_unchanged_reruns_is_small():
    flagged = [gate_samples(noisy(s), noisy(s + 5000))["change"] for s in range(200)]
    rate = flagged.count("slower") / len(flagged)
    assert rate <= 0.02, rate
    assert flagged.count("faster") / len(flagged) <= 0.02


def test_gate_threshold_hides_small_significant_changes():
    base, head = noisy(1, n=400), noisy(2, n=400, slow=1.05)  # 5% slower, significant with 400 samples
    assert gate_samples(base, head, GateOptions(threshold=0.10))["change"] == "not slower"
    assert gate_samples(base, head, GateOptions(threshold=0.0))["change"] == "slower"


def test_compare_never_says_same_and_a_wide_interval_is_only_not_slower():
    """compare has no equivalence margin, so never "same" ("1.275 [1.045, 3.169]" was "same"): a HEAD faster
    with an interval that is wide says only what it shows, "not slower" (by the threshold)."""
    changes = {gate_samples(noisy(s), noisy(s + 5000))["change"] for s in range(60)}
    assert "same" not in changes and changes <= {"slower", "not slower", "faster", "undecided"}, changes
    rng = np.random.default_rng(1)
    base = 0.1 * np.exp(rng.normal(0, 0.3, 6))  # 6 windows a side, lognormal sd 30%: a wide interval
    head = 0.1 / 1.3 * np.exp(rng.normal(0, 0.3, 6))
    g = gate_samples(base, head)
    assert g["ci_low"] > 1 / 1.25 and g["ci_high"] / g["ci_low"] > 1.5 and g["change"] == "not slower", g


def test_gate_drops_nan_inf_and_refuses_too_few_samples():
    g = gate_samples([0.1, math.nan, math.inf, 0.1], [0.2, 0.2, 0.2, -1.0])
    assert g["change"] == "too few samples" and g["dropped"] == 3


@pytest.mark.parametrize("kw,words", [({"threshold": -0.1}, "--threshold -0.1"), ({"alpha": 0.0}, "--alpha 0.0"),
                                      ({"method": "t-test"}, "--method 't-test'")])
def test_bad_gate_options_name_the_value(kw, words):
    with pytest.raises(ValueError, match=words.replace("(", r"\(")):
        GateOptions(**kw)


@pytest.mark.parametrize("windows", [5, 7])
def test_each_comparisons_stated_slowdown_is_caught_95_percent_of_the_time(windows):
    """The power statement, checked per comparison (the project's rule: at the stated value at least 95% of
    comparisons say "slower"): every unchanged comparison of ``windows`` windows a side (lognormal, sd 5%) states
    the slowdown it could have caught; a fresh comparison of as many windows with HEAD exactly that much slower
    says "slower" at least 95% of the time, the lower end of its one-sided 95% Clopper-Pearson bound at least
    92%.  (With the interval's width taken for a known standard error this was 88-91%.)"""
    from suite.ab.stats import rate_interval

    rng = np.random.default_rng(windows)
    n, sd = 300, 0.05
    stated, caught = [], []
    for _ in range(n):
        d = gate_samples(0.1 * rng.lognormal(0, sd, windows), 0.1 * rng.lognormal(0, sd, windows))[
            "detectable_slowdown"]
        g = gate_samples(0.1 * rng.lognormal(0, sd, windows), 0.1 * (1 + d) * rng.lognormal(0, sd, windows))
        stated.append(d)
        caught.append(g["change"] == "slower")
    assert all(math.isfinite(d) and d > 0.25 for d in stated), stated
    rate, low = sum(caught) / n, rate_interval(sum(caught), n, level=0.90)[0]
    assert rate >= 0.95 and low >= 0.92, (windows, rate, low, float(np.median(stated)))


def test_too_few_windows_for_alpha_could_have_caught_nothing(tmp_path, capsys):
    """3 or 4 windows a side: no arrangement reaches alpha 0.01 (the smallest p is 1/20, 1/70), so the verdict is
    "too few samples" and the statement is that nothing could have been caught, not the interval's width; the
    bootstrap test, which has no such floor, still states a slowdown."""
    rng = np.random.default_rng(0)
    for windows in (3, 4):
        g = gate_samples(0.1 * rng.lognormal(0, 0.05, windows), 0.3 * rng.lognormal(0, 0.05, windows))
        assert g["change"] == "too few samples" and g["detectable_slowdown"] == math.inf, g
        g = gate_samples(0.1 * rng.lognormal(0, 0.05, windows), 0.1 * rng.lognormal(0, 0.05, windows),
                         GateOptions(method="bootstrap"))
        assert math.isfinite(g["detectable_slowdown"]), g
    g = gate_samples(0.1 * rng.lognormal(0, 0.05, 5), 0.1 * rng.lognormal(0, 0.05, 5))
    assert g["change"] != "too few samples" and math.isfinite(g["detectable_slowdown"]), g
    base, head = tmp_path / "b.jsonl", tmp_path / "h.jsonl"
    write_records(base, {("mlp/plain", 2): (noisy(1, n=24), "pass")})
    write_records(head, {("mlp/plain", 2): (noisy(2, n=24), "pass")})  # 3 windows of 8 steps a side
    assert main(["compare", str(base), str(head)]) == 3
    err = capsys.readouterr().err
    assert "mlp/plain@2: too few windows for alpha 0.01; could have caught nothing below 100%: fewer than 5 " \
           "windows a side" in err, err
    assert main(["compare", str(base), str(head), "--json"]) == 3
    (row,) = json.loads(capsys.readouterr().out)["rows"]
    assert row["detectable_slowdown"] is None, row


def test_compare_exit_codes_and_table(tmp_path, capsys):
    base, same, slow = tmp_path / "base.jsonl", tmp_path / "same.jsonl", tmp_path / "slow.jsonl"
    n = 200  # 25 windows a side: enough to say "same" at the 25% threshold
    write_records(base, {("mlp/plain", 2): (noisy(1, n), "pass"), ("mlp/none", 2): (noisy(2, n), "n/a"),
                         ("mlp/only_base", 2): (noisy(3, n), "pass")})
    write_records(same, {("mlp/plain", 2): (noisy(11, n), "pass"), ("mlp/none", 2): (noisy(12, n), "n/a")})
    write_records(slow, {("mlp/plain", 2): (noisy(21, n, slow=2.0), "pass"), ("mlp/none", 2): (noisy(22, n), "n/a")})
    assert main(["compare", str(base), str(same)]) == 0
    out = capsys.readouterr()
    assert "mlp/plain" in out.out and "only in BASE" in out.out and "regression gate: ok" in out.out
    assert main(["compare", str(base), str(slow)]) == 1
    out = capsys.readouterr()
    assert "mlp/plain@2" in out.err and "slower" in out.err and "mlp/none@2" not in out.err
    # one-sided cases fail only under --strict
    assert main(["compare", str(base), str(same), "--strict"]) == 1
    assert "only in BASE (--strict)" in capsys.readouterr().err


def test_compare_is_undecided_when_its_samples_cannot_support_a_verdict(tmp_path, capsys):
    """Five windows a side this spread: the interval reaches across the 25% threshold, so neither "not slower"
    nor "slower" can be claimed: exit 3, with the smallest slowdown the samples could have caught and what would
    decide it; --json holds numbers; a file compared with itself is identical."""
    base, head = tmp_path / "b.jsonl", tmp_path / "h.jsonl"
    write_records(base, {("mlp/plain", 2): (noisy(1), "pass")})
    write_records(head, {("mlp/plain", 2): (noisy(11), "pass")})  # unchanged: 5 windows of the same noise
    assert main(["compare", str(base), str(head)]) == 3
    err = capsys.readouterr().err
    # the power statement past 100% ("could catch ≥ 164%" before) says how many windows would catch less
    assert "regression gate: UNDECIDED" in err and "mlp/plain@2: undecided; could have caught nothing below 100%: " \
           "fewer than 7 windows a side" in err, err
    assert "HEAD/BASE's interval must lie below 1.250 (not slower) or above it (slower); about" in err, err
    assert main(["compare", str(base), str(head), "--json"]) == 3
    doc = json.loads(capsys.readouterr().out)
    (row,) = doc["rows"]
    assert row["n_base"] == 5 and row["n_head"] == 5 and row["samples"] == "windows", row
    lo, hi = row["ci"]
    assert isinstance(lo, float) and lo < 1 / 1.25 < hi, row
    assert row["detectable_slowdown"] is None and row["needed_windows"] == 7 and doc["exit_code"] == 3, row
    assert main(["compare", str(base), str(base)]) == 0
    assert "BASE and HEAD are the same records: identical" in capsys.readouterr().err


def test_correctness_pass_to_fail_and_error_on_head_fail_the_gate(tmp_path, capsys):
    base, head = tmp_path / "b.jsonl", tmp_path / "h.jsonl"
    write_records(base, {("mlp/plain", 2): (noisy(1), "pass"), ("mlp/ddp", 2): (noisy(2), "pass"),
                         ("mlp/overlap", 2): ([], "error")})
    write_records(head, {("mlp/plain", 2): (noisy(3), "fail"), ("mlp/ddp", 2): ([], "error"),
                         ("mlp/overlap", 2): ([], "error")})
    assert main(["compare", str(base), str(head)]) == 1
    err = capsys.readouterr().err
    assert "mlp/plain@2: correctness verdict went from pass to fail" in err
    assert "mlp/ddp@2: ran on BASE, errors on HEAD" in err
    assert "mlp/overlap" not in err  # an error on both sides is listed, not a regression


def test_torch_difference_warns_and_is_an_error_under_strict(tmp_path, capsys):
    base, head = tmp_path / "b.jsonl", tmp_path / "h.jsonl"
    write_records(base, {("mlp/plain", 2): (noisy(1), "pass")}, torch_version="2.4.0")
    write_records(head, {("mlp/plain", 2): (noisy(2), "pass")}, torch_version="2.5.1")
    assert main(["compare", str(base), str(head)]) == 0
    assert "torch versions differ: BASE 2.4.0, HEAD 2.5.1" in capsys.readouterr().err
    assert main(["compare", str(base), str(head), "--strict"]) == 2
    assert "refusing to compare under --strict" in capsys.readouterr().err


def _pytest_benchmark_json(path, samples, with_data=True, world=2):
    stats = {"median": float(np.median(samples)), "rounds": len(samples)}
    if with_data:
        stats["data"] = [5 * s for s in samples]
    path.write_text(json.dumps({"machine_info": {"torch": "2.4.0"}, "benchmarks": [
        {"name": f"test_step[mlp/plain@{world}]", "stats": stats,
         "extra_info": {"case": "mlp/plain", "world_size": world, "steps_per_round": 5, "verdict": "pass"}}]}))


def test_pytest_benchmark_json_on_either_side(tmp_path, capsys):
    rec, pb, pb_slow = tmp_path / "r.jsonl", tmp_path / "pb.json", tmp_path / "pb_slow.json"
    write_records(rec, {("mlp/plain", 2): (noisy(1), "pass")})
    _pytest_benchmark_json(pb, noisy(2))  # per-round data / steps_per_round -> per-step seconds
    _pytest_benchmark_json(pb_slow, noisy(3, slow=3.0))
    assert main(["compare", str(rec), str(pb)]) == 0
    assert main(["compare", str(pb), str(pb_slow)]) == 1
    capsys.readouterr()


@pytest.mark.parametrize("content,words", [
    ("", ["x.jsonl", "empty"]),
    ('{"kind": "fleetbench.case", "schema_version": 1, "case": "a", "model": "mlp", "world_size": 2, '
     '"config": {}, "run_id": "r"}\n{"broken', ["x.jsonl:2", "truncated"]),
    ('{"benchmarks": 3}', ["x.jsonl", "'benchmarks' is int"]),
    ('{"benchmarks": [{"name": "b", "stats": {}}]}', ["benchmark b", "--benchmark-save-data"]),
])
def test_unusable_input_exits_2_naming_file_and_line(tmp_path, capsys, content, words):
    bad, good = tmp_path / "x.jsonl", tmp_path / "good.jsonl"
    bad.write_text(content)
    write_records(good, {("mlp/plain", 2): (noisy(1), "pass")})
    assert main(["compare", str(good), str(bad)]) == 2
    err = capsys.readouterr().err
    assert all(w in err for w in words), err
    assert main(["compare", str(tmp_path / "missing.jsonl"), str(good)]) == 2
    assert "no such results file" in capsys.readouterr().err


def test_compare_gates_on_windows_not_steps(tmp_path, capsys):
    """Steps of one window share the window's level (load comes in bursts): per-step samples look like
    hundreds of independent numbers; the gate counts windows."""
    rng = np.random.default_rng(4)

    def run(level: float, windows: int = 5, k: int = 40) -> list:
        return [float(x) for w in range(windows) for x in 0.05 * level * rng.lognormal(0, 0.25) * rng.lognormal(
            0, 0.02, k)]

    base, head = tmp_path / "b.jsonl", tmp_path / "h.jsonl"
    write_records(base, {("mlp/plain", 2): (run(1.0), "pass")}, steps_per_window=40)
    write_records(head, {("mlp/plain", 2): (run(1.30), "pass")}, steps_per_window=40)
    assert main(["compare", str(base), str(head), "--json"]) in (0, 1, 3)
    doc = json.loads(capsys.readouterr().out)
    (row,) = doc["rows"]
    assert (row["n_base"], row["n_head"], row["samples"]) == (5, 5, "windows"), row
    assert doc["kind"] == "fleetbench.compare" and doc["exit_code"] in (0, 1, 3)
    # too few windows for alpha 0.01 (3 a side: the smallest p is 1/20) is said, not called "same"
    write_records(tmp_path / "b3.jsonl", {("mlp/plain", 2): (run(1.0, windows=3), "pass")}, steps_per_window=40)
    write_records(tmp_path / "h3.jsonl", {("mlp/plain", 2): (run(3.0, windows=3), "pass")}, steps_per_window=40)
    assert main(["compare", str(tmp_path / "b3.jsonl"), str(tmp_path / "h3.jsonl"), "--json"]) == 3  # undecided
    (row,) = json.loads(capsys.readouterr().out)["rows"]
    assert row["change"] == "too few windows for alpha 0.01" and (row["n_base"], row["n_head"]) == (3, 3), row


def test_compare_structure_changed_fails_whatever_the_timings(tmp_path, capsys):
    base, head, same = tmp_path / "b.jsonl", tmp_path / "h.jsonl", tmp_path / "s.jsonl"
    facts = {"allreduce_ops": 1, "buckets": [{"params": 8, "bytes": 12_000_000, "comm": 0}]}
    write_records(base, {("mlp/fusion", 2): (noisy(1), "pass")}, structure={"mlp/fusion": facts})
    write_records(same, {("mlp/fusion", 2): (noisy(2), "pass")}, structure={"mlp/fusion": dict(facts)})
    changed = {"allreduce_ops": 6, "buckets": [{"params": 2, "bytes": 2_000_000, "comm": 0}] * 6}
    write_records(head, {("mlp/fusion", 2): (noisy(2), "pass")}, structure={"mlp/fusion": changed})
    assert main(["compare", str(base), str(same)]) == 0
    capsys.readouterr()
    assert main(["compare", str(base), str(head)]) == 1
    err = capsys.readouterr().err
    assert "mlp/fusion@2: structure changed" in err and "allreduce_ops: 1 -> 6" in err, err
    assert main(["compare", str(base), str(head), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["rows"][0]["structure"] == "changed" and doc["rows"][0]["structure_diff"][0].startswith("allreduce")
    assert doc["exit_code"] == 1 and any("structure changed" in f for f in doc["failures"])


BAD_PYTEST_BENCHMARK = [
    ({"machine_info": "x"}, "'machine_info' is 'x'; expected an object"),
    ({"extra": [1]}, "'extra_info' is [1]; expected an object"),
    ({"extra": {"steps_per_round": 0}}, "extra_info.steps_per_round is 0"),
    ({"extra": {"world_size": "two"}}, "world_size='two'"),
    ({"extra": {"step_times_s": 5}}, "extra_info.step_times_s is 5"),
    ({"extra": {"verdict": "great"}}, "verdict='great'"),
]


@pytest.mark.parametrize("patch,words", BAD_PYTEST_BENCHMARK, ids=[w for _, w in BAD_PYTEST_BENCHMARK])
def test_malformed_pytest_benchmark_json_is_one_clear_error(tmp_path, capsys, patch, words):
    bench = {"name": "test_step[mlp/plain@2]", "stats": {"data": [0.1, 0.1, 0.1]},
             "extra_info": patch.get("extra", {"case": "mlp/plain", "world_size": 2})}
    data = {"machine_info": patch.get("machine_info", {}), "benchmarks": [bench]}
    bad = tmp_path / "pb.json"
    bad.write_text(json.dumps(data))
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"machine_info": {}, "benchmarks": [dict(bench, extra_info={"case": "mlp/plain"})]}))
    assert main(["compare", str(good), str(bad)]) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err and str(bad) in err, err


@pytest.mark.parametrize("value", ["5", "1", "1.5", "10"])
def test_threshold_is_a_fraction_below_1_not_a_percentage(tmp_path, capsys, value):
    """--threshold 5 meant 500% (a 2x slowdown passed): it is refused with one error saying what is allowed;
    0.99 is still a threshold, and the default still fails a 2x slowdown."""
    base, slow = tmp_path / "b.jsonl", tmp_path / "s.jsonl"
    write_records(base, {("mlp/plain", 2): (noisy(1, 200), "pass")})
    write_records(slow, {("mlp/plain", 2): (noisy(2, 200, slow=2.0), "pass")})
    assert main(["compare", str(base), str(slow), "--threshold", value]) == 2
    err = capsys.readouterr().err
    assert f"error: --threshold {value}: a fraction, e.g. 0.05 for 5%; allowed 0 <= t < 1" in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    with pytest.raises(ValueError, match="allowed 0 <= t < 1"):
        GateOptions(threshold=float(value))
    GateOptions(threshold=0.99)
    assert main(["compare", str(base), str(slow)]) == 1
    capsys.readouterr()


NOT_RESULTS = "not a results file: expected records (.jsonl lines from fleetbench run) or a pytest-benchmark JSON"


@pytest.mark.parametrize("name,content", [
    ("report_data.json", json.dumps({"plots": [], "problems": [], "runs": ["r1"]}, indent=1)),
    ("README.md", "# fleetbench\n\nA benchmark suite.\n"),
    ("cmp.json", json.dumps({"kind": "fleetbench.compare", "rows": []})),
    ("list.json", "[1, 2]\n"),
], ids=["report_data.json", "README.md", "compare-json", "list"])
def test_a_file_that_is_not_results_says_so_and_what_is_allowed(tmp_path, capsys, name, content):
    """Valid JSON that is not a results file (a report's report_data.json) was 'report_data.json:1: not valid JSON:
    Expecting property name...': the file is named with what it is not and what is allowed."""
    good, other = tmp_path / "good.jsonl", tmp_path / name
    write_records(good, {("mlp/plain", 2): (noisy(1), "pass")})
    other.write_text(content)
    assert main(["compare", str(good), str(other)]) == 2
    err = capsys.readouterr().err
    assert f"{other}: {NOT_RESULTS}" in err and "not valid JSON" not in err, err
    assert len(err.strip().splitlines()) == 1, err


def test_a_truncated_file_says_where_in_words(tmp_path, capsys):
    good, cut, doc = tmp_path / "good.jsonl", tmp_path / "cut.jsonl", tmp_path / "cut.json"
    write_records(good, {("mlp/plain", 2): (noisy(1), "pass")})
    cut.write_text('{"kind": "fleetbench.case", "schema_version": 3, "case": "mlp/pla')
    assert main(["compare", str(good), str(cut)]) == 2
    err = capsys.readouterr().err
    assert "cut.jsonl:1: not valid JSON (truncated: the file ends mid-record): Unterminated string starting at " \
           "column 58" in err and "at at" not in err, err
    doc.write_text(json.dumps({"machine_info": {}, "benchmarks": []}, indent=1)[:30])  # a pytest-benchmark JSON cut
    assert main(["compare", str(good), str(doc)]) == 2
    err = capsys.readouterr().err
    assert f"{doc}: not valid JSON (truncated: the file ends mid-document)" in err and "line " in err, err


def test_an_unknown_run_id_lists_the_run_ids_the_file_holds(tmp_path, capsys):
    runs = tmp_path / "runs.jsonl"
    for i, run in enumerate(["r1", "r2", "r3", "r4", "r5", "r6", "r7"]):
        cases = {("mlp/plain", 2): (noisy(i), "pass")}
        if run == "r6":
            cases[("mlp/none", 2)] = (noisy(50), "n/a")
        write_records(runs, cases, run_id=run)
    held = "r7 (1 record), r6 (2 records), r5 (1 record), r4 (1 record), r3 (1 record), and 2 older run(s)"
    for flag in ("--base-run-id", "--head-run-id"):
        assert main(["compare", str(runs), str(runs), flag, "nope"]) == 2
        err = capsys.readouterr().err
        assert f"{runs}: no record of run id 'nope'; the file holds (newest first) {held}" in err, err
    assert main(["report", str(runs), "--run-id", "nope", "--out", str(tmp_path / "rep")]) == 2
    err = capsys.readouterr().err
    assert f"no records in {runs} for run id(s) nope; it holds (newest first) {held}" in err, err
    assert not (tmp_path / "rep").exists()


def test_files_with_no_case_in_common_are_unusable_not_a_pass(tmp_path, capsys):
    """Every row 'only in BASE/HEAD' then 'regression gate: ok' compared nothing: one error naming a few cases of
    each side (the same case at another world size is another case); with one case in common, the one-sided
    cases stay rows."""
    base, other, some = tmp_path / "b.jsonl", tmp_path / "o.jsonl", tmp_path / "s.jsonl"
    write_records(base, {("mlp/plain", 2): (noisy(1, 200), "pass"), ("mlp/none", 2): (noisy(2, 200), "n/a")})
    write_records(other, {("gpt/plain", 2): (noisy(3, 200), "pass"), ("mlp/plain", 4): (noisy(4, 200), "pass")})
    assert main(["compare", str(base), str(other)]) == 2
    out = capsys.readouterr()
    assert (f"error: no case is in both files (a case is compared at the same world size): BASE {base} has "
            f"mlp/none@2, mlp/plain@2; HEAD {other} has gpt/plain@2, mlp/plain@4") in out.err, out.err
    assert len(out.err.strip().splitlines()) == 1 and "regression gate" not in out.out + out.err
    write_records(some, {("mlp/plain", 2): (noisy(5, 200), "pass"), ("gpt/plain", 2): (noisy(6, 200), "pass")})
    assert main(["compare", str(base), str(some)]) == 0
    out = capsys.readouterr().out
    assert "only in BASE" in out and "only in HEAD" in out and "regression gate: ok" in out, out


def test_the_table_names_its_columns_for_what_they_hold_and_each_row_its_outcome(tmp_path, capsys):
    """The column 'verdict' held the check (pass -> pass) and 'change' the performance verdict, which --help calls
    the verdict; 'status' said ok on every row of an UNDECIDED gate.  Now: `verdict` the performance verdict,
    `check` the check, `status` the row's outcome; speedups with 3 decimals, p with 2 significant digits."""
    import re

    base, head, md = tmp_path / "b.jsonl", tmp_path / "h.jsonl", tmp_path / "cmp.md"
    write_records(base, {("mlp/same", 2): (noisy(1, 200), "pass"), ("mlp/slow", 2): (noisy(2, 200), "pass"),
                         ("mlp/few", 2): (noisy(3), "pass"), ("mlp/gone", 2): (noisy(4), "pass")})
    write_records(head, {("mlp/same", 2): (noisy(11, 200), "pass"), ("mlp/slow", 2): (noisy(12, 200, 2.0), "pass"),
                         ("mlp/few", 2): (noisy(13), "pass")})
    assert main(["compare", str(base), str(head), "--markdown", str(md)]) == 1
    out = capsys.readouterr().out
    lines = out.splitlines()
    header = next(ln for ln in lines if ln.split()[:1] == ["case"]).split()
    assert header[-6:] == ["could_catch", "verdict", "check", "structure", "status", "machine"] and \
        "change" not in header, header
    rows = {ln.split()[0]: ln for ln in lines if ln.split()[:1] and ln.split()[0].startswith("mlp/")}
    expect = {"mlp/same": ("not slower", "ok"), "mlp/slow": ("slower", "regression"),
              "mlp/few": ("undecided", "undecided"), "mlp/gone": ("only in BASE", "not compared")}
    for case, (verdict, status) in expect.items():
        row = rows[case]
        assert row.rstrip().endswith(status) and f" {verdict} " in row, (case, row)
    assert "pass -> pass" in rows["mlp/same"] and "pass -> -" in rows["mlp/gone"]
    # the could_catch cell agrees with its verdict (issue 46.4): what the interval caught or rules out, not a power
    # beside "slower" that reads as more than it caught
    assert " caught ≥ " in rows["mlp/slow"] and " rules out " in rows["mlp/same"], (rows["mlp/slow"], rows["mlp/same"])
    for case in ("mlp/same", "mlp/slow", "mlp/few"):
        speedup, lo, hi = re.search(r" (\d\.\d+) \[(\d\.\d+), (\d\.\d+)\] ", rows[case]).groups()
        assert all(len(x.split(".")[1]) == 3 for x in (speedup, lo, hi)), rows[case]
    p = rows["mlp/same"].split("]")[1].split()[0]  # the cell after the interval: p_slower, 2 significant digits
    assert len(p.replace("0.", "", 1).lstrip("0").replace(".", "")) <= 2 or "e-" in p, (p, rows["mlp/same"])
    table = md.read_text().splitlines()
    cells = [c.strip() for c in table[0].strip("|").split("|")]
    assert cells[-6:] == ["could_catch", "verdict", "check", "structure", "status", "machine"], cells
    assert "| regression |" in md.read_text() and "| not compared |" in md.read_text()
    assert main(["compare", str(base), str(head), "--json"]) == 1  # --json keeps its keys
    doc = json.loads(capsys.readouterr().out)
    by = {r["case"]: r for r in doc["rows"]}
    assert (by["mlp/same"]["change"], by["mlp/same"]["verdict"], by["mlp/same"]["status"]) == \
        ("not slower", "pass -> pass", "ok")
    assert by["mlp/slow"]["status"] == "regression" and by["mlp/few"]["status"] == "undecided"


def test_non_finite_or_non_positive_times_fail_on_head_and_are_unusable_on_base(tmp_path, capsys):
    """nan and inf are failures, not samples to drop: HEAD with 5 windows and [nan, inf] said "same" (exit 0), all-inf
    HEAD "too few samples" (exit 3).  On HEAD the case fails and its row says why; on BASE the file is unusable."""
    base, head, inf, neg, pb = (tmp_path / n for n in ("b.jsonl", "h.jsonl", "inf.jsonl", "neg.jsonl", "pb.json"))
    good = noisy(1)  # 5 windows of 8 steps
    write_records(base, {("mlp/plain", 2): (good, "pass"), ("mlp/none", 2): (noisy(2, 200), "n/a")})
    nan_inf = noisy(11) + [math.nan] + noisy(12, 7) + [math.inf] + noisy(13, 7)  # 5 windows, then nan and inf
    write_records(head, {("mlp/plain", 2): (nan_inf, "pass"), ("mlp/none", 2): (noisy(3, 200), "n/a"),
                         ("mlp/new", 2): ([math.inf] * 40, "pass")})  # only in HEAD: still a failure
    assert main(["compare", str(base), str(head)]) == 1
    out = capsys.readouterr()
    row = next(ln for ln in out.out.splitlines() if ln.strip().startswith("mlp/plain"))
    assert "HEAD has 2 non-finite timing samples (nan, inf)" in row and row.rstrip().endswith("regression"), row
    assert "mlp/plain@2: HEAD has 2 non-finite timing samples (nan, inf)" in out.err, out.err
    assert "mlp/new@2: HEAD has 5 non-finite timing samples (inf)" in out.err, out.err
    assert "mlp/none@2" not in out.err
    write_records(inf, {("mlp/plain", 2): ([math.inf] * 40, "pass")})
    assert main(["compare", str(base), str(inf), "--json"]) == 1
    (row,) = [r for r in json.loads(capsys.readouterr().out)["rows"] if r["case"] == "mlp/plain"]
    assert row["status"] == "regression" and row["change"] == "HEAD has 5 non-finite timing samples (inf)", row
    write_records(neg, {("mlp/plain", 2): (noisy(14)[:-8] + [-0.05] * 8, "pass")})
    assert main(["compare", str(base), str(neg)]) == 1
    assert "mlp/plain@2: HEAD has 1 non-positive timing sample (-0.05)" in capsys.readouterr().err
    _pytest_benchmark_json(pb, noisy(15)[:-1] + [math.nan])  # pytest-benchmark JSON: NaN is a JSON literal there
    assert main(["compare", str(base), str(pb)]) == 1
    assert "mlp/plain@2: HEAD has 1 non-finite timing sample (nan)" in capsys.readouterr().err
    # on BASE: unusable input, naming the file, its line and the case
    assert main(["compare", str(head), str(base)]) == 2
    err = capsys.readouterr().err
    assert (f"error: {head}:3: case mlp/new@2: BASE has 5 non-finite timing samples (inf); a baseline's times must "
            f"be finite and positive seconds (also in mlp/plain@2)") in err and len(err.strip().splitlines()) == 1, err
    assert main(["compare", str(inf), str(base)]) == 2
    assert f"error: {inf}:1: case mlp/plain@2: BASE has 5 non-finite timing samples (inf)" in capsys.readouterr().err


def test_a_case_base_ran_and_head_did_not_is_undecided_with_its_reason(tmp_path, capsys):
    """BASE ok, HEAD skipped or not_run gave 'ok -> skipped' and exit 0: nothing was measured on HEAD, so nothing
    was decided (exit 3), the row and the summary say so with the record's reason; skipped on both sides is
    listed only."""
    base, head, both = tmp_path / "b.jsonl", tmp_path / "h.jsonl", tmp_path / "both.jsonl"
    write_records(base, {("mlp/plain", 2): (noisy(1, 200), "pass"), ("mlp/none", 2): (noisy(2, 200), "n/a"),
                         ("mlp/ddp", 2): (noisy(3, 200), "pass")})
    write_records(head, {("mlp/none", 2): (noisy(12, 200), "n/a")})
    append_record(str(head), CaseRecord("mlp/plain", "mlp", 2, {}, "r1", status="skipped", verdict="skipped",
                                        error="needs 4 ranks, this machine has 2"))
    append_record(str(head), CaseRecord("mlp/ddp", "mlp", 2, {}, "r1", status="not_run", verdict="not_run",
                                        error="the job's time budget ran out"))
    assert main(["compare", str(base), str(head)]) == 3
    out = capsys.readouterr()
    rows = {ln.split()[0]: ln for ln in out.out.splitlines() if ln.strip().startswith("mlp/")}
    assert "not run on HEAD (skipped: needs 4 ranks, this machine has 2)" in rows["mlp/plain"], rows
    assert rows["mlp/plain"].rstrip().endswith("undecided") and rows["mlp/none"].rstrip().endswith("ok"), rows
    assert "regression gate: UNDECIDED (2 case(s) not run on HEAD)" in out.err, out.err
    assert "mlp/plain@2: not run on HEAD (skipped: needs 4 ranks, this machine has 2)" in out.err
    assert "mlp/ddp@2: not run on HEAD (not_run: the job's time budget ran out)" in out.err
    assert main(["compare", str(base), str(head), "--json"]) == 3
    by = {r["case"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    assert by["mlp/ddp"]["status"] == "undecided" and by["mlp/ddp"]["change"].startswith("not run on HEAD")
    # not run on BASE either: nothing to decide, listed
    write_records(both, {("mlp/none", 2): (noisy(22, 200), "n/a")})
    append_record(str(both), CaseRecord("mlp/plain", "mlp", 2, {}, "r2", status="skipped", verdict="skipped",
                                        error="needs 4 ranks, this machine has 2"))
    assert main(["compare", str(head), str(both)]) == 0
    out = capsys.readouterr()
    assert "skipped -> skipped" in out.out and "regression gate: ok" in out.out, out


SAME = ("compare: BASE and HEAD are the same records: identical, nothing compared; pass --base-run-id/--head-run-id "
        "(or two files) to compare two runs")


def test_a_file_compared_with_itself_is_said_first_and_the_header_names_the_runs(tmp_path, capsys, monkeypatch):
    """`compare runs.jsonl runs.jsonl` said UNDECIDED with intervals between identical numbers: it is identical,
    said first, exit 0, every row "identical"; two runs of one file chosen by run id are two runs; each side's
    header says which runs it used when the file holds several."""
    runs = tmp_path / "runs.jsonl"
    write_records(runs, {("mlp/plain", 2): (noisy(1), "pass")}, run_id="r1")
    write_records(runs, {("mlp/plain", 2): (noisy(2), "pass")}, run_id="r2")
    monkeypatch.chdir(tmp_path)
    assert main(["compare", "runs.jsonl", str(runs)]) == 0  # the same file by two names: identical
    out = capsys.readouterr()
    assert out.err.splitlines()[0] == SAME and out.err.count("same records") == 1, out.err
    assert "identical" in out.out and "regression gate: ok (identical" in out.out and "[" not in out.out.split(
        "\n", 3)[-1], out.out  # no interval printed between a number and itself
    assert "BASE runs.jsonl (records; run r2 of the 2 runs in the file, the last record of each case)" in out.out
    assert main(["compare", str(runs), str(runs), "--json"]) == 0
    out = capsys.readouterr()
    doc = json.loads(out.out)
    assert out.err.splitlines()[0] == SAME and doc["warnings"][0] == SAME[len("compare: "):]
    assert [r["change"] for r in doc["rows"]] == ["identical"] and doc["rows"][0]["ci"] is None, doc["rows"]
    assert main(["compare", str(runs), str(runs), "--base-run-id", "r1", "--head-run-id", "r2"]) in (0, 3)
    out = capsys.readouterr()
    assert "same records" not in out.err, out.err
    assert f"BASE {runs} (records; run r1 of the 2 runs in the file, chosen by --base-run-id)" in out.out, out.out
    assert f"HEAD {runs} (records; run r2 of the 2 runs in the file, chosen by --head-run-id)" in out.out, out.out
    assert main(["compare", str(runs), str(runs), "--head-run-id", "r2"]) == 0  # r2 is the last record: the same
    assert capsys.readouterr().err.splitlines()[0] == SAME
    # a copy of the file: other records by name, the very same times: identical too (no warning needed)
    copy = tmp_path / "copy.jsonl"
    copy.write_bytes(runs.read_bytes())
    assert main(["compare", str(runs), str(copy), "--json"]) == 0
    out = capsys.readouterr()
    assert [r["change"] for r in json.loads(out.out)["rows"]] == ["identical"] and SAME not in out.err, out


def test_a_row_timed_on_a_busy_machine_is_marked_with_its_side_and_the_reason_under_the_table(tmp_path):
    """Issue 46.2: the busy mark is on the row (which side), its reason a warning naming the row."""
    from suite.results.compare import compare_sides
    from suite.results.load import load_side
    from suite.results.records import read_records

    base, head = tmp_path / "b.jsonl", tmp_path / "h.jsonl"
    cases = {("mlp/quiet", 2): (noisy(1, 80), "pass"), ("mlp/busy", 2): (noisy(2, 80), "pass")}
    write_records(base, cases)
    write_records(head, {k: (noisy(i + 10, 80), v) for i, (k, (_, v)) in enumerate(cases.items())})
    for path, busy_cases in ((base, {"mlp/busy"}), (head, {"mlp/busy", "mlp/quiet"})):
        recs = read_records(str(path))
        path.unlink()
        for r in recs:
            extra = {"others_cpu_share": 0.3 if r.case in busy_cases else 0.01, "cpu_cores": 2}
            r.metrics = type(r.metrics).from_dict(r.metrics.to_dict() | extra)
            append_record(str(path), r)
    cmp = compare_sides(load_side(str(base)), load_side(str(head)))
    machine = {r["case"]: r["machine"] for r in cmp.rows}
    assert machine == {"mlp/busy": "busy: both", "mlp/quiet": "busy: HEAD"}, machine
    assert "mlp/quiet@2: HEAD's timings: machine busy: timings unreliable (other processes took 30% of the CPU " \
           "during the windows (over 10%))" in cmp.warnings, cmp.warnings
    assert list(cmp.frame()["machine"]) == [machine[r["case"]] for r in cmp.rows]


# ---- hostile input -------------------------------------------------------------------------------------------------
def test_compare_markdown_escapes_case_names(tmp_path, capsys):
    from suite.cli.main import main
    from suite.results.records import append_record

    base, head = tmp_path / "base.jsonl", tmp_path / "head.jsonl"
    for path in (base, head):
        append_record(str(path), report_record(HOSTILE_CASE))
        append_record(str(path), report_record("mlp/plain\nnext | line"))
        append_record(str(path), report_record("mlp/<img src=x onerror=alert(1)>"))
    md_path = tmp_path / "cmp.md"
    assert main(["compare", str(base), str(head), "--markdown", str(md_path)]) in (0, 1, 3)
    md = md_path.read_text()
    assert "<script" not in md and "<img" not in md, md
    lines = md.strip().splitlines()
    assert len(lines) == 2 + 3, lines  # header, rule, one line per case (the newline did not split a row)
    assert len({unescaped_pipes(ln) for ln in lines}) == 1, lines
    assert "&lt;script&gt;alert(1)&lt;/script&gt;\\|x" in md


def test_compare_markdown_to_dev_full_is_one_error(tmp_path, capsys):
    a = write_record_file(tmp_path / "a.jsonl", fake_record())
    code, _, err = _cli(["compare", a, a, "--markdown", "/dev/full"], capsys)
    _one_error(code, err, "--markdown", "/dev/full")


def _record_line(**kw) -> str:
    from tests.fakes import fake_record

    return fake_record(**kw).to_json()


def test_compare_reads_a_raw_line_separator_as_report_and_run_do(tmp_path, capsys):
    """The probe: `compare` refused a file with a raw U+2028 in a record that `report` and `run` read."""
    line = _record_line(case="mlp/a\u2028b").replace("\\u2028", "\u2028")
    assert "\u2028" in line
    path = tmp_path / "runs.jsonl"
    path.write_text(line + "\n" + _record_line(case="mlp/c") + "\n", encoding="utf-8")
    code, out, err = _cli(["compare", path, path], capsys)
    assert code in (0, 3) and "not valid JSON" not in err and "mlp/a" in out, err
    code, _, err = _cli(["report", path, "--out", tmp_path / "out"], capsys)
    assert code == 0, err


def test_compare_caps_blank_lines(tmp_path, capsys):
    """The probe: one record and 300 M blank lines took compare 2.9 GB; a few thousand past the cap suffice here."""
    from suite.results.records import MAX_BLANK_LINES

    path = tmp_path / "runs.jsonl"
    path.write_text(_record_line() + "\n" + "\n" * (MAX_BLANK_LINES + 5))
    code, _, err = _cli(["compare", path, path], capsys)
    _one_error(code, err, "blank lines")
    path.write_text("\n" * 3 + _record_line() + "\n\n")  # a few are fine
    code, _, err = _cli(["compare", path, path], capsys)
    assert code in (0, 3), err
