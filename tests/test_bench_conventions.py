"""pytest-benchmark conventions of ``bench_cases/``: ``case`` and ``world`` as plain parameters (nothing
UNSERIALIZABLE in the saved JSON), one group per model and world size, what a round measures said in
``extra_info`` and after the tables, and a ``smoke`` selection that is small and distinct from ``default``."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys

from suite.cases import SMOKE, select_cases

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _pytest_bench(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETBENCH_BENCH_")}
    return subprocess.run([sys.executable, "-m", "pytest", "bench_cases", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_smoke_is_a_handful_of_cases_distinct_from_default():
    smoke = [c.name for c in select_cases(tags=["smoke"])]
    default = [c.name for c in select_cases(tags=["default"])]
    assert sorted(smoke) == sorted(SMOKE) and len(smoke) <= 6
    assert set(smoke) < set(default)


def test_the_default_bench_selection_is_the_smoke_cases_at_world_size_2():
    proc = _pytest_bench("--collect-only", "-q", timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ids = sorted(line.split("[", 1)[1].rstrip("]") for line in proc.stdout.splitlines() if "test_step[" in line)
    assert ids == sorted(f"{name}@2" for name in SMOKE), proc.stdout
    # requested world sizes replace the default one; a case that cannot run at a size is collected (and skipped
    # with its reason when run)
    proc = _pytest_bench("--collect-only", "-q", "--fleetbench-case", "mlp/*", "--fleetbench-world", "1",
                         "--fleetbench-world", "4", timeout=120)
    ids = sorted(line.split("[", 1)[1].rstrip("]") for line in proc.stdout.splitlines() if "test_step[" in line)
    assert "mlp/plain@1" in ids and "mlp/plain@4" in ids and "mlp/hierarchical@4" in ids, proc.stdout
    assert "mlp/hierarchical@1" in ids and not any(i.endswith("@2") for i in ids), proc.stdout


def test_saved_json_has_plain_params_groups_and_says_what_a_round_is(tmp_path):
    out = tmp_path / "bench.json"
    proc = _pytest_bench("--benchmark-only", "--fleetbench-case", "mlp/plain", "--fleetbench-case", "mlp/overlap",
                         "--fleetbench-world", "2", "--fleetbench-rounds", "2", "--fleetbench-steps", "2",
                         "--fleetbench-no-check", "--benchmark-json", str(out),
                         "--benchmark-storage", f"file://{tmp_path / 'storage'}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    text = out.read_text()
    assert "UNSERIALIZABLE" not in text
    saved = list((tmp_path / "storage").rglob("*.json"))
    assert saved and all("UNSERIALIZABLE" not in p.read_text() for p in saved)
    benches = {b["params"]["case"]: b for b in json.loads(text)["benchmarks"]}
    assert set(benches) == {"mlp/plain", "mlp/overlap"}
    for case, b in benches.items():
        assert b["params"] == {"case": case, "world": 2} and b["param"] == f"{case}@2"
        assert b["group"].startswith("mlp at world size 2") and "2 steps" in b["group"]
        e = b["extra_info"]
        assert e["case"] == case and e["world_size"] == 2 and e["steps_per_round"] == 2
        assert "2 training steps on every rank between two barriers" in e["round"] and "round trip" in e["round"]
        assert {"rank_window_s", "round_trip_s", "step_times_s", "samples_per_s"} <= set(e["units"])
        # per round: every rank's window; the slowest is the window; the round contains it
        assert len(e["rank_window_s"]) == 2 and all(len(w) == 2 for w in e["rank_window_s"])
        assert e["window_s"] == [max(w) for w in e["rank_window_s"]]
        assert len(e["round_trip_s"]) == 2 and all(math.isfinite(x) and x >= 0 for x in e["round_trip_s"])
        assert len(b["stats"]["data"]) == 2
    # one table per group, and the note after them
    assert "benchmark 'mlp at world size 2" in proc.stdout
    assert "fleetbench: what the tables above measure" in proc.stdout
    assert "round trip from pytest to the ranks" in proc.stdout
