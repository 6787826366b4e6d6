"""How the benchmark harnesses meet their users (``bench_cases/``): a bounded timeout where bench_cases/ is the
rootdir; ``make asv-smoke`` under a machine name of its own.

Nothing here asserts on a time: the real runs are one tiny case, for their files and lines."""
from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

def _env(**more: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETBENCH_BENCH_")}
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return {**env, **more}

def _pytest_bench(*args: str, cwd: str = ROOT, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", os.path.join(ROOT, "bench_cases"), *args], cwd=cwd,
                          env=_env(), capture_output=True, text=True, timeout=timeout)

def test_benchmarks_have_a_bounded_timeout_of_their_own():
    """bench_cases/pytest.ini makes bench_cases/ the rootdir: pyproject.toml's timeout does not reach it."""
    proc = _pytest_bench("--collect-only", "--fleetbench-case", "mlp/plain", timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "rootdir: " + os.path.join(ROOT, "bench_cases") in proc.stdout, proc.stdout
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("timeout: ")), None)
    assert line is not None, proc.stdout
    assert 0 < float(line.split()[1].rstrip("s")) <= 4 * 3600

# ---- make asv-smoke -------------------------------------------------------------------------------------------

def test_asv_smoke_records_under_a_machine_name_of_its_own():
    """asv keeps one result per commit and machine, rewritten whole by each run: make asv-smoke's one case under
    the nightly's machine name would replace the nightly's cases for that commit."""
    from suite.measure.metadata import machine_name

    proc = subprocess.run(["make", "-n", "asv-smoke", f"PY={sys.executable}"], cwd=ROOT, env=_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    runs = [ln for ln in proc.stdout.replace("\\\n", " ").splitlines() if "asv run" in ln]
    assert len(runs) == 1, proc.stdout
    nightly = machine_name()  # `fleetbench nightly`'s default --machine
    assert f"--machine {nightly}-smoke " in runs[0] + " ", runs[0]
    assert f"--machine {nightly} " not in runs[0] + " ", runs[0]
