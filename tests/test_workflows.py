"""The GitHub workflows are validated offline against GitHub's workflow schema, with check-jsonschema's
vendored copy (`--builtin-schema vendor.github-workflows`), in `make test`."""
from __future__ import annotations

import glob
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHECK = os.path.join(os.path.dirname(sys.executable), "check-jsonschema")
WORKFLOWS = sorted(glob.glob(os.path.join(REPO, ".github", "workflows", "*.yml")))


def _validate(*paths: str) -> subprocess.CompletedProcess:
    assert os.path.exists(CHECK), f"check-jsonschema is a dev dependency but {CHECK} is missing: run `make setup`"
    return subprocess.run([CHECK, "--builtin-schema", "vendor.github-workflows", *paths], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def test_every_workflow_is_valid_against_githubs_schema():
    names = {os.path.basename(p) for p in WORKFLOWS}
    assert {"nightly-gpu.yml", "nightly-cpu.yml"} <= names, names
    out = _validate(*WORKFLOWS)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_validator_refuses_a_broken_workflow(tmp_path):
    bad = tmp_path / "bad.yml"
    bad.write_text("name: bad\non: push\njobs:\n  j:\n    runs-on: ubuntu-latest\n    steps: not-a-list\n")
    out = _validate(str(bad))
    assert out.returncode != 0, out.stdout
    assert "steps" in out.stdout + out.stderr


def test_the_cpu_workflow_runs_the_slow_tests_on_a_schedule():
    text = open(os.path.join(REPO, ".github", "workflows", "nightly-cpu.yml")).read()
    for words in ("schedule:", "run: make nightly-cpu", "fetch-depth: 0"):
        assert words in text, words
    makefile = open(os.path.join(REPO, "Makefile")).read()
    assert "\nnightly-cpu: setup test-slow\n" in makefile, "make nightly-cpu must run make test-slow first"


def test_ci_run_execs_make_test_and_installs_chromium_only_where_it_can():
    """Clarifications (cleanup and kills): wrappers exec the command, so a cancel's signals reach it; the browser
    checks get Chromium where apt-get and root allow, and a failed install does not fail CI."""
    text = open(os.path.join(REPO, ".ci", "run"), encoding="utf-8").read()
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]
    assert lines[-1] == "exec make test", lines
    assert "apt-get install -y -q chromium" in text and '[ "$(id -u)" = 0 ]' in text and "|| echo" in text
