"""The nightly pipeline end to end on CPU (`.ci/nightly`, what `make nightly-cpu` and the GPU
workflow run): records and traces, a pytest-benchmark pass of bench_cases with raw data, an asv
results file for this commit (a statistic with its spread and the samples) and the dashboard
`asv publish` builds, the report, the gate (`fleetbench ab LAST_GOOD_COMMIT HEAD`) failing the
job because HEAD's trials are made twice as slow (FLEETBENCH_AB_INJECT: busy work in HEAD's
step, in its trial server only), and the history alerts step.  The workflows are validated against
GitHub's schema in tests/test_workflows.py."""
from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.dirname(sys.executable)
WORKFLOW = os.path.join(REPO, ".github", "workflows", "nightly-gpu.yml")


def test_gpu_workflow_runs_the_nightly_pipeline_on_a_schedule():
    text = open(WORKFLOW).read()
    for words in ("schedule:", "self-hosted", "gpu", ".ci/nightly", "NIGHTLY_DEVICE: cuda", "results/last-good",
                  "fetch-depth: 0"):
        assert words in text, words
    # the self-check runs first and stops the job; GPUs are counted by torch (CUDA_VISIBLE_DEVICES, no MIG lines)
    assert text.index("run: .venv/bin/fleetbench doctor --device cuda") < text.index("run: .ci/nightly")
    assert 'n=$(.venv/bin/python -c "import torch; print(torch.cuda.device_count())")' in text
    assert "n=$(nvidia-smi" not in text


def _head():
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()


def test_nightly_cpu_pipeline_end_to_end(tmp_path):
    conf = json.load(open(os.path.join(REPO, "asv.conf.json")))
    conf.update(repo=REPO, benchmark_dir=os.path.join(REPO, "bench_cases"), results_dir=str(tmp_path / "asv"),
                 html_dir=str(tmp_path / "html"), env_dir=str(tmp_path / "asv-env"))
    (tmp_path / "asv.conf.json").write_text(json.dumps(conf))
    last_good = tmp_path / "last-good" / "commit"
    last_good.parent.mkdir()
    head = _head()
    last_good.write_text(head + "\n")  # the last good commit is this one: only the injected busy work differs
    seeded = last_good.read_bytes()
    out_dir = tmp_path / "out"
    env = dict(os.environ, HOME=str(tmp_path), PY=sys.executable, NIGHTLY_CASES="mlp/plain", NIGHTLY_WORLDS="2",
               NIGHTLY_ROUNDS="2", NIGHTLY_STEPS="2", NIGHTLY_QUICK="1", NIGHTLY_OUT=str(out_dir),
               NIGHTLY_LAST_GOOD=str(last_good), NIGHTLY_ASV_CONFIG=str(tmp_path / "asv.conf.json"),
               NIGHTLY_MACHINE="cpu-test", MPLCONFIGDIR=str(tmp_path / "mpl"), NIGHTLY_AB_BUDGET="90",
               NIGHTLY_AB_ARGS="--steps 3 --rotate 2", FLEETBENCH_AB_INJECT="head=1.0")
    proc = subprocess.run([os.path.join(REPO, ".ci", "nightly")], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=900)
    log = proc.stdout + proc.stderr
    # the gate fails the job: HEAD's trials are twice as slow as the last good commit's
    assert proc.returncode == 1, log[-5000:]
    assert "ab gate: FAIL" in log and "mlp/plain@2: slower" in log, log[-5000:]
    assert last_good.read_bytes() == seeded, "a failed night must not become the last good commit"
    ab = json.load(open(out_dir / "ab-w2.json"))
    assert ab["base"]["commit"] == ab["head"]["commit"] == head and ab["head"]["inject"] == 1.0
    (case,) = ab["cases"]
    assert case["verdict"] == "slower" and case["structure_diff"] == [] and ab["exit_code"] == 1, case
    assert "history alerts (cpu-test" in log and (out_dir / "history-alerts.md").exists(), log[-3000:]

    recs = [json.loads(line) for line in open(out_dir / "runs.jsonl")]
    assert [(r["case"], r["world_size"], r["status"]) for r in recs] == [("mlp/plain", 2, "ok")]
    assert os.path.exists(out_dir / recs[0]["metrics"]["trace_file"])

    pb = json.load(open(out_dir / "pytest-benchmark.json"))
    (bench,) = pb["benchmarks"]
    assert bench["extra_info"]["case"] == "mlp/plain" and bench["extra_info"]["world_size"] == 2
    assert len(bench["stats"]["data"]) == 2 and bench["extra_info"]["samples_per_s"] > 0
    assert pb["machine_info"]["torch"] and "gpu" in pb["machine_info"]

    results = [f for f in glob.glob(str(tmp_path / "asv" / "cpu-test" / "*.json")) if not f.endswith("machine.json")]
    assert len(results) == 1, results
    asv = json.load(open(results[0]))
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    assert asv["commit_hash"] == commit
    cols = asv["result_columns"]
    row = dict(zip(cols, asv["results"]["asv_cases.StepTime.time_step"]))
    assert isinstance(row["result"][0], (int, float)) and row["result"][0] > 0, row
    # a statistic with its spread, and the samples (the ranks' windows, seconds per step)
    eps = 1e-3 * row["result"][0]  # asv rounds the stats it stores
    assert row["stats_q_25"][0] - eps <= row["result"][0] <= row["stats_q_75"][0] + eps, row
    assert row["samples"][0] and all(0 < x < 60 for x in row["samples"][0]), row
    assert os.path.exists(tmp_path / "html" / "index.html")
    assert os.path.exists(tmp_path / "html" / "index.json")

    page = open(out_dir / "report" / "index.html").read()
    assert "mlp/plain" in page and "throughput_w2.png" in page
    assert glob.glob(str(out_dir / "report" / "traces" / "*.json"))
    assert "mlp/plain@2: slower" in (out_dir / "gate.md").read_text()
