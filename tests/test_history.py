"""History: asv stores each case's step time with its spread, and unchanged reruns are no regression.

Two asv passes of the nightly's asv step (the same flags: existing environment, the commit hash
set, --record-samples) are recorded back to back for two commits of unchanged code; asv's own
detection must not call that a regression: `asv compare` marks nothing worse, and the
dashboard's regressions list (`asv publish`'s step detection) is empty, as are the nightly's
history alerts.  The alert rule itself (a new level that lasts two nights) is tested on series.
"""
from __future__ import annotations

import glob
import json
import os
import random
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.dirname(sys.executable)


def _git(repo, *args):
    out = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.mark.statistical  # two passes' medians depend on the machine's load: make test-slow
@pytest.mark.timeout(900)
def test_two_unchanged_asv_passes_are_not_a_regression_for_asv(tmp_path):
    # a repository with two commits of the same code (asv needs real commits for their dates and order)
    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    _git(repo, "config", "user.email", "h@test")
    _git(repo, "config", "user.name", "history test")
    commits = []
    for i in range(2):
        _git(repo, "commit", "-q", "--allow-empty", "-m", f"night {i + 1}: nothing changed")
        commits.append(_git(repo, "rev-parse", "HEAD"))
    conf = json.load(open(os.path.join(REPO, "asv.conf.json")))
    conf.update(repo=str(repo), benchmark_dir=os.path.join(REPO, "bench_cases"), results_dir=str(tmp_path / "asv"),
                html_dir=str(tmp_path / "html"), env_dir=str(tmp_path / "asv-env"), branches=["main"])
    cfg = tmp_path / "asv.conf.json"
    cfg.write_text(json.dumps(conf))
    env = dict(os.environ, HOME=str(tmp_path), FLEETBENCH_BENCH_CASES="mlp/plain", FLEETBENCH_BENCH_WORLDS="2",
               FLEETBENCH_BENCH_ROUNDS="5", FLEETBENCH_BENCH_STEPS="3", FLEETBENCH_BENCH_SIZE="tiny")
    asv = os.path.join(BIN, "asv")

    def run(*args, timeout=600):
        p = subprocess.run([asv, *args, "--config", str(cfg)], cwd=REPO, env=env, capture_output=True, text=True,
                           timeout=timeout)
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
        return p.stdout

    run("machine", "--machine", "cpu-test", "--yes")
    loads = [os.getloadavg()[0]]
    for c in commits:  # the nightly's asv step, twice
        run("run", "-E", "existing:same", "--set-commit-hash", c, "--machine", "cpu-test", "--launch-method", "spawn",
            "--show-stderr", "--record-samples")
    # what asv stored: a statistic with its spread, and the samples (the ranks' timed windows)
    for path in glob.glob(str(tmp_path / "asv" / "cpu-test" / "*.json")):
        if path.endswith("machine.json"):
            continue
        doc = json.load(open(path))
        row = dict(zip(doc["result_columns"], doc["results"]["asv_cases.StepTime.time_step"]))
        samples = row["samples"][0]
        assert len(samples) == 10, row  # 5 windows in each of 2 processes
        eps = 1e-3 * row["result"][0]  # asv rounds the stats it stores
        assert row["stats_ci_99_a"][0] - eps <= row["result"][0] <= row["stats_ci_99_b"][0] + eps, row
        assert row["stats_q_25"][0] < row["stats_q_75"][0], row

    out = run("compare", commits[0], commits[1], "--machine", "cpu-test")
    assert "time_step" in out, out
    worse = [ln for ln in out.splitlines() if ln.startswith("+")]
    assert not worse and "PERFORMANCE DECREASED" not in out, out

    hist = subprocess.run([sys.executable, "-m", "suite.cli.main", "history", "--results", str(tmp_path / "asv"),
                           "--machine", "cpu-test"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert hist.returncode == 0 and "1 series" in hist.stdout and ": none" in hist.stdout, hist.stdout + hist.stderr

    run("publish")
    loads.append(os.getloadavg()[0])
    regressions = json.load(open(tmp_path / "html" / "regressions.json"))
    if regressions["regressions"] and max(loads) > 2 * (os.cpu_count() or 1):
        # With two points, the dashboard's step detection is a threshold on the two medians whatever their
        # spread (asv.step_detect: a single-point segment has no error estimate); asv.conf.json sets it to 20%
        # for time_step.  A machine whose speed changes more than that between the passes (other jobs starting)
        # moves it; asv compare above, which reads the spread, did not.  Not a verdict on the statistic: say why.
        pytest.skip(f"the machine's load average was {max(loads):.1f} on {os.cpu_count()} cores between the passes; "
                    f"the dashboard's two-point step detection saw the machine's drift: {regressions['regressions']}")
    assert regressions["regressions"] == [], regressions


def test_dashboard_threshold_is_asvs_own_setting():
    # asv.conf.json's regressions_thresholds reaches asv's detection: two unchanged passes 16% apart (measured
    # in CI) are no regression, a 30% step is.
    from asv.step_detect import detect_regressions

    conf = json.load(open(os.path.join(REPO, "asv.conf.json")))
    [(regex, threshold)] = conf["regressions_thresholds"].items()
    assert __import__("re").search(regex, "asv_cases.StepTime.time_step")
    two_points = [(0, 1, 0.042, 0.042, 0.0), (1, 2, 0.049, 0.049, 0.0)]
    assert detect_regressions(two_points, threshold) == (None, None, None)
    assert detect_regressions([(0, 1, 0.042, 0.042, 0.0), (1, 2, 0.055, 0.055, 0.0)], threshold)[2]
    assert detect_regressions(two_points, 0.05)[2]  # asv's default would have shown the CI run's drift


def _series(values):
    return {("asv_cases.StepTime.time_step", ("mlp/plain", "2")):
            [(i, f"{i:040d}", v, 1 / (0.02 * v)) for i, v in enumerate(values)]}


def test_a_history_alert_needs_a_new_level_that_lasts_two_nights():
    from suite.ab.history import alerts_in

    rng = random.Random(7)
    flat = [0.05 * (1 + rng.gauss(0, 0.01)) for _ in range(12)]
    assert alerts_in(_series(flat)) == []
    assert alerts_in(_series(flat + [0.06])) == [], "one slow night is no alert"
    (alert,) = alerts_in(_series(flat + [0.06, 0.0605]))
    assert alert.nights == 2 and alert.first_commit == f"{12:040d}" and 1.15 < alert.ratio < 1.25, alert
    assert alerts_in(_series(flat + [0.06, 0.0605, 0.05, 0.0501])) == [], "a step gone back down is no alert"
    assert alerts_in(_series(flat + [0.0502, 0.0503])) == [], "a step below the threshold is no alert"
    (alert,) = alerts_in(_series(flat + [0.06, 0.0605]), persist=1)
    assert alerts_in(_series(flat + [0.06, 0.0605]), persist=3) == []


def test_history_refuses_a_machine_without_results(tmp_path):
    p = subprocess.run([sys.executable, "-m", "suite.cli.main", "history", "--results", str(tmp_path),
                        "--machine", "nope"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "no asv results for machine 'nope'" in p.stderr, p.stderr


class _AsvResult:
    """What suite.ab.history reads of an asv Results: one benchmark, one parameter, one value a commit."""

    def __init__(self, date: int, version: str, value: float):
        self.date, self.commit_hash, self.value = date, f"{date:040d}", value
        self.benchmark_version = {"asv_cases.StepTime.time_step": version}

    def get_all_result_keys(self):
        return list(self.benchmark_version)

    def get_result_params(self, key):
        return [["'mlp/plain'"]]

    def get_result_value(self, key, params):
        return [self.value]

    def get_result_stats(self, key, params):
        return [{"ci_99_a": 0.9 * self.value, "ci_99_b": 1.1 * self.value, "q_25": self.value, "q_75": self.value}]


def test_history_follows_the_newest_version_of_a_benchmark_only(monkeypatch):
    """A different setup (--rounds, size ...) is another asv version: its points are not one series with the old
    setup's, or a setup change would be an alert; asv publish draws the newest version only, and so does history."""
    from asv import results as asv_results

    from suite.ab.history import alerts, series

    old = [_AsvResult(i, "v1", 0.05) for i in range(10)]
    new = [_AsvResult(10 + i, "v1+rounds=3", 0.08) for i in range(3)]
    monkeypatch.setattr(asv_results, "iter_results_for_machine", lambda d, m: iter(old + new))
    ((key, points),) = series("unused", "m").items()
    assert [p[2] for p in points] == [0.08] * 3 and key[1] == ("'mlp/plain'",)
    assert alerts("unused", "m") == ([], 1)
    monkeypatch.setattr(asv_results, "iter_results_for_machine",
                        lambda d, m: iter(old + [_AsvResult(10 + i, "v1", 0.08) for i in range(3)]))
    assert len(alerts("unused", "m")[0]) == 1  # the same version's step up is an alert
