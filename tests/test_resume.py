"""Results integrity: a run killed mid-way keeps every finished case, and `--resume` finishes it
without running (or losing) them again.  End to end: the parent `fleetbench run` is SIGKILLed
while its second model group is being timed."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from suite.cli.main import main

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _cmd(results, *extra):
    # resnet's group runs first (registry order), then mlp's: the kill lands in mlp's group.
    return [sys.executable, "-m", "suite.cli.main", "run", "--nproc", "2", "--case", "resnet/none",
            "--case", "mlp/none", "--case", "mlp/plain", "--no-check", "--rounds", "2", "--steps", "2",
            "--warmup", "1", "--no-utilization", "--pg-timeout", "60", "--timeout", "300", "--results",
            str(results), *extra]


def _env():
    return dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))


def test_killed_run_resumed_loses_no_finished_case(tmp_path):
    results = tmp_path / "runs.jsonl"
    # A 300 ms sleep in every step keeps mlp's group running long after resnet's record lands.
    proc = subprocess.Popen(_cmd(results, "--set", "straggler_ms=300"), cwd=REPO, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 400
        while not (results.exists() and results.read_text().count("\n") >= 1):
            assert proc.poll() is None, f"the run ended before it could be killed:\n{proc.stdout.read().decode()}"
            assert time.monotonic() < deadline, "no record appeared within 400 s"
            time.sleep(0.1)
        os.kill(proc.pid, signal.SIGKILL)  # the parent, mid-run
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # and the ranks it started (its own session)
        except ProcessLookupError:
            pass
        proc.wait(timeout=60)
    kept = results.read_bytes()
    first = [json.loads(line) for line in kept.decode().splitlines()]
    assert [r["case"] for r in first] == ["resnet/none"], first
    run_id = first[0]["run_id"]

    out = subprocess.run(_cmd(results, "--resume", str(results)), cwd=REPO, env=_env(), capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"resuming run {run_id}: 1 case(s) already recorded, skipped: resnet/none" in out.stdout
    after = results.read_bytes()
    assert after.startswith(kept)  # nothing recorded before was rewritten
    recs = [json.loads(line) for line in after.decode().splitlines()]
    assert sorted(r["case"] for r in recs) == ["mlp/none", "mlp/plain", "resnet/none"]
    assert {r["run_id"] for r in recs} == {run_id}
    assert all(r["status"] == "ok" and r["metrics"]["samples_per_s"] > 0 for r in recs)


def test_resume_refuses_unknown_run_and_corrupt_file(tmp_path, capsys):
    results = tmp_path / "runs.jsonl"
    results.write_text('{"kind": "fleetbench.case", "schema_version": 1, "case": "mlp/none", "model": "mlp", '
                       '"world_size": 2, "config": {}, "run_id": "r1"}\n')
    assert main(["run", "--case", "mlp/none", "--results", str(results), "--resume", "nope"]) == 2
    assert "run id 'nope' is not in" in capsys.readouterr().err
    assert main(["run", "--case", "mlp/none", "--nproc", "4", "--resume", str(results)]) == 2
    assert "ran at world size [2], this one at 4" in capsys.readouterr().err
    with open(results, "a") as fh:
        fh.write('{"kind": "fleetb')
    assert main(["run", "--case", "mlp/none", "--resume", str(results)]) == 2
    assert f"{results}:2" in capsys.readouterr().err
