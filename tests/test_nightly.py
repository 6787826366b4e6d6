"""The nightly pipeline, `fleetbench nightly` (what `.ci/nightly` execs, `make nightly-cpu` and the GPU workflow
run): its plan (stages, cases x world sizes, the gate's cases and budget, estimated durations) without a GPU, the
limit that refuses a night that does not fit, the gate cases covering every strategy family, and the pipeline end
to end on CPU: records and traces, a pytest-benchmark pass of bench_cases with raw data, an asv results file for
this commit (a statistic with its spread and the samples) and the dashboard `asv publish` builds, the report, the
state written as each stage ends, and the history alerts step.  The gate failing the job when HEAD is a commit
whose training step is twice as slow depends on timing: `statistical`.  The workflows are validated against
GitHub's schema in tests/test_workflows.py."""
from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import uuid

import pytest

import suite.runtime.device as device_mod
from suite.cases import CASES, FAMILIES, PUBLISHED_MODELS, SMALL_MODELS, VARIANTS
from suite.cli.main import main
from suite.run_spec import RUN_ROUNDS_FOR_95
from tests.clitools import cli as _cli
from tests.clitools import one_error as _one_error

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.dirname(sys.executable)
WORKFLOW = os.path.join(REPO, ".github", "workflows", "nightly-gpu.yml")


def test_gpu_workflow_runs_the_nightly_pipeline_on_a_schedule():
    text = open(WORKFLOW).read()
    for words in ("schedule:", "self-hosted", "gpu", ".ci/nightly --workflow gpu", "results/last-good",
                  "results/nightly/nightly.json", "fetch-depth: 0"):
        assert words in text, words
    # the self-check runs first and stops the job; the plan (refused over the limit) comes before the night
    assert text.index(".venv/bin/fleetbench doctor --device cuda") < text.index(".ci/nightly --workflow gpu")
    assert text.index('"$NIGHTLY_WORLDS" --plan') < text.index('"$NIGHTLY_WORLDS"\n')
    # GPUs are counted by torch (CUDA_VISIBLE_DEVICES, no MIG lines)
    assert 'n=$(.venv/bin/python -c "import torch; print(torch.cuda.device_count())")' in text
    assert "n=$(nvidia-smi" not in text
    # the wrapper only execs the command
    wrapper = open(os.path.join(REPO, ".ci", "nightly")).read()
    assert 'exec "$PY" -m suite.cli.main nightly "$@"' in wrapper and "NIGHTLY_" not in wrapper


def _no_gpu_probe(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("a plan must not probe the GPU")

    monkeypatch.setattr(device_mod, "select_platform", refuse)
    monkeypatch.setattr(device_mod, "cuda_device_count", refuse)


def test_plan_on_cuda_needs_no_gpu_and_lists_every_case_at_1_and_8_the_gate_and_the_stages(monkeypatch, capsys,
                                                                                            tmp_path):
    _no_gpu_probe(monkeypatch)
    assert main(["nightly", "--plan", "--device", "cuda", "--worlds", "1,8", "--out", str(tmp_path),
                 "--machine", "gpu-test"]) == 0
    out = capsys.readouterr().out
    every = out.splitlines()
    gate_at = next(i for i, ln in enumerate(every) if ln.startswith("gate: "))
    lines, gate_lines = every[every.index("cases x world sizes:"):gate_at], every[gate_at:]
    gpu = [c for c in CASES if "nightly-gpu" in c.tags]
    for c in gpu:
        assert f"  {c.name}@8" in lines, c.name  # every case at 8, no skip
        at1 = [ln for ln in lines if ln.startswith(f"  {c.name}@1")]
        assert len(at1) == 1 and (("[skip: needs at least 2 ranks]" in at1[0]) == (c.min_world > 1)), at1
    assert sum(f"  {c.name}@8" in lines for c in gpu if c.variant == "hierarchical") == 6
    stages = [ln.split() for ln in every[every.index("stages (estimated duration):") + 1:] if ln.startswith("  ")]
    assert [s[0] for s in stages[:6]] == ["run", "pytest-benchmark", "asv", "report", "gate", "history"]
    assert all(s[2] == "min" and float(s[1]) > 0 for s in stages[:6]), stages
    assert "rough step times" in out and "no earlier night recorded" in out
    gate = [c.name for c in gpu if "gate" in c.tags]
    assert f"gate: {2 * len(gate)} (case, world) pair(s), one total budget of 30 min" in out
    assert all(f"  {n}@1" in gate_lines and f"  {n}@8" in gate_lines for n in gate)


def test_a_limit_below_the_estimate_exits_2_naming_the_stage_before_anything_runs(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: pytest.fail("nothing may run"))
    # a night (not only a plan) is refused before any stage starts
    assert main(["nightly", "--device", "cpu", "--tag", "nightly-cpu", "--out", str(tmp_path), "--limit", "5"]) == 2
    assert "stage 'run' would end at" in capsys.readouterr().err
    _no_gpu_probe(monkeypatch)
    argv = ["nightly", "--device", "cuda", "--worlds", "1,8", "--out", str(tmp_path), "--machine", "gpu-test"]
    assert main(argv + ["--plan", "--limit", "5"]) == 2
    err = capsys.readouterr().err
    assert "--limit 5 min: the plan does not fit: stage 'run' would end at" in err and err.count("error:") == 1
    # a limit the run stage fits in, but not the whole night: the stage named is a later one
    state = {"machine": "gpu-test", "stages": {"run": {"seconds": 60.0, "pairs": 150}}}
    (tmp_path / "nightly.json").write_text(json.dumps(state))
    assert main(argv + ["--plan", "--limit", "5"]) == 2
    assert "stage 'report' would end at" in capsys.readouterr().err  # the exports fit: 1.7 min of 5
    assert main(argv + ["--plan", "--limit", "100000"]) == 0


def test_last_nights_stages_on_the_same_machine_are_the_estimates(capsys, tmp_path):
    state = {"machine": "m1", "stages": {"run": {"seconds": 600.0, "pairs": 4}, "report": {"seconds": 120.0},
                                         "gate": {"seconds": 900.0, "pairs": 1, "budget_s": 600.0}}}
    (tmp_path / "nightly.json").write_text(json.dumps(state))
    argv = ["nightly", "--plan", "--device", "cpu", "--case", "mlp/plain", "--case", "mlp/overlap", "--worlds", "2",
            "--out", str(tmp_path), "--gate-budget", "5"]
    assert main(argv + ["--machine", "m1"]) == 0
    rows = {ln.split()[0]: ln for ln in capsys.readouterr().out.splitlines() if " min  (ends at" in ln}
    assert rows["run"].split()[1] == "5.0" and "last night's 10.0 min for 4 pair(s)" in rows["run"]  # 2 of 4 pairs
    assert rows["report"].split()[1] == "2.0"
    # the gate: tonight's budget (5 min) plus last night's 5 min beyond its budget for 1 pair, now 2 pairs
    assert rows["gate"].split()[1] == "15.0", rows["gate"]
    assert "rough step times" in rows["asv"]
    assert main(argv + ["--machine", "m2"]) == 0  # another machine's night is not an estimate
    assert "last night" not in capsys.readouterr().out


def test_bad_nightly_input_is_one_clear_error(capsys, tmp_path):
    for argv, words in [(["--worlds", "1,x"], "--worlds '1,x': 'x' is not a whole number >= 1"),
                        (["--gate-budget", "0"], "--gate-budget 0"),
                        (["--case", "mlp/none"], "the gate has no case"),
                        (["--case", "*/hierarchical", "--worlds", "1"], "world size 1: no selected case can run")]:
        assert main(["nightly", "--plan", "--device", "cpu", "--out", str(tmp_path), *argv]) == 2, argv
        err = capsys.readouterr().err
        assert words in err and err.count("error:") == 1, err


def test_every_strategy_family_has_a_gate_case_among_small_and_published_models():
    family = {v.name: v.family for v in VARIANTS}
    assert set(family.values()) == set(FAMILIES)
    for models in (SMALL_MODELS, tuple(PUBLISHED_MODELS)):
        covered = {family[c.variant] for c in CASES if "gate" in c.tags and c.model in models}
        assert covered == set(FAMILIES), (models, set(FAMILIES) - covered)
    assert len([c for c in CASES if "gate" in c.tags]) <= 3 * len(SMALL_MODELS + tuple(PUBLISHED_MODELS))


def _head():
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()


def _night(tmp_path, last_good: str | None, *extra: str, env: dict | None = None, repo: str = REPO):
    """`.ci/nightly` of ``repo`` (this checkout, or a throw-away repository's) on mlp/plain at world 2."""
    conf = json.load(open(os.path.join(repo, "asv.conf.json")))
    conf.update(repo=repo, benchmark_dir=os.path.join(repo, "bench_cases"), results_dir=str(tmp_path / "asv"),
                 html_dir=str(tmp_path / "html"), env_dir=str(tmp_path / "asv-env"))
    (tmp_path / "asv.conf.json").write_text(json.dumps(conf))
    good = tmp_path / "last-good" / "commit"
    if last_good:
        good.parent.mkdir()
        good.write_text(last_good + "\n")
    out_dir = tmp_path / "out"
    env = dict(os.environ, HOME=str(tmp_path), PY=sys.executable, MPLCONFIGDIR=str(tmp_path / "mpl"), **(env or {}))
    proc = subprocess.run([os.path.join(repo, ".ci", "nightly"), "--device", "cpu", "--case", "mlp/plain",
                           "--worlds", "2", "--rounds", "2", "--steps", "2", "--quick", "--out", str(out_dir),
                           "--last-good", str(good), "--asv-config", str(tmp_path / "asv.conf.json"),
                           "--machine", "cpu-test", *extra], cwd=repo, env=env, capture_output=True, text=True,
                          timeout=900)
    return proc, proc.stdout + proc.stderr, out_dir, good


@pytest.mark.heavy  # 36 s of subprocesses; make test-slow and make nightly-cpu run the pipeline
def test_nightly_cpu_pipeline_end_to_end(tmp_path):
    """Quick mode, no last good commit: every stage runs and writes its output, the night becomes the baseline
    (no verdict here depends on timing)."""
    head = _head()
    proc, log, out_dir, good = _night(tmp_path, None)
    assert proc.returncode == 0, log[-5000:]
    assert good.read_text().strip() == head, "a night with every stage ok becomes the last good commit"
    assert "no last good commit" in log and "this night's commit becomes the baseline" in log
    state = json.load(open(out_dir / "nightly.json"))
    assert state["machine"] == "cpu-test" and state["commit"] == head and state["status"] == 0
    assert list(state["stages"]) == ["run", "pytest-benchmark", "asv", "report", "gate", "history"]
    assert all(st["exit"] == 0 and st["seconds"] > 0 for st in state["stages"].values()), state["stages"]
    assert state["stages"]["run"]["pairs"] == 1
    assert "history alerts (cpu-test" in log and (out_dir / "history-alerts.md").exists(), log[-3000:]

    recs = [json.loads(line) for line in open(out_dir / "runs.jsonl")]
    assert [(r["case"], r["world_size"], r["status"]) for r in recs] == [("mlp/plain", 2, "ok")]
    assert os.path.exists(out_dir / recs[0]["metrics"]["trace_file"])

    pb = json.load(open(out_dir / "pytest-benchmark.json"))  # the run's windows exported, read by its compare
    (bench,) = pb["benchmarks"]
    assert bench["stats"]["data"] == pytest.approx([w / 2 for w in recs[0]["metrics"]["window_s"]])
    compared = subprocess.run([os.path.join(BIN, "py.test-benchmark"), "compare",
                               str(out_dir / "pytest-benchmark.json")], capture_output=True, text=True, timeout=120)
    assert compared.returncode == 0 and "test_step[mlp/plain@2]" in compared.stdout, compared.stderr[-2000:]
    assert bench["extra_info"]["case"] == "mlp/plain" and bench["extra_info"]["world_size"] == 2
    assert len(bench["stats"]["data"]) == 2 and bench["extra_info"]["samples_per_s"] > 0
    assert pb["machine_info"]["torch"] and "gpu" in pb["machine_info"]

    results = [f for f in glob.glob(str(tmp_path / "asv" / "cpu-test" / "*.json")) if not f.endswith("machine.json")]
    assert len(results) == 1, results
    asv = json.load(open(results[0]))
    assert asv["commit_hash"] == head
    cols = asv["result_columns"]
    row = dict(zip(cols, asv["results"]["asv_cases.StepTime.time_step"]))
    assert isinstance(row["result"][0], (int, float)) and row["result"][0] > 0, row
    # a statistic with its spread, and the samples (the ranks' windows, seconds per step)
    eps = 1e-3 * row["result"][0]  # asv rounds the stats it stores
    assert row["stats_q_25"][0] - eps <= row["result"][0] <= row["stats_q_75"][0] + eps, row
    assert row["samples"][0] == pytest.approx([w / 2 for w in recs[0]["metrics"]["window_s"]]), row  # measured once
    discovered = json.load(open(tmp_path / "asv" / "benchmarks.json"))["asv_cases.StepTime.time_step"]
    assert row["version"] == discovered["version"] and row["params"] == discovered["params"]  # the series go on
    assert os.path.exists(tmp_path / "html" / "index.html")
    assert os.path.exists(tmp_path / "html" / "index.json")
    # and made to work offline (vendored assets, no CDN): fleetbench asv-offline
    assert os.path.exists(tmp_path / "html" / "vendor" / "jquery.min.js")
    assert "code.jquery.com" not in open(tmp_path / "html" / "index.html").read()

    page = open(out_dir / "report" / "index.html").read()
    assert "mlp/plain" in page and "throughput_w2.svg" in page
    assert glob.glob(str(out_dir / "report" / "traces" / "*" / "timeline.json"))
    assert glob.glob(str(out_dir / "report" / "traces" / "*" / "rank0.pt.trace.json"))
    # the night's JUnit XML: a case per stage, then the run's own
    from tests.clitools import cases, outcome, valid

    junit = cases(valid(out_dir / "junit.xml"))
    stages = ("run", "pytest-benchmark", "asv", "report", "gate", "history")
    assert {n: outcome(junit[n])[0] for n in stages} == dict.fromkeys(stages, "passed"), junit
    assert outcome(junit["mlp/plain@2"])[0] == "passed" and "test_step[mlp/plain@2]" not in junit  # no re-timing


@pytest.mark.statistical
def test_the_gate_fails_the_night_when_head_is_twice_as_slow(tmp_path):
    """A throw-away repository of this tree: the last good commit is the tree as it is, HEAD a commit whose
    training step is twice as slow (tests/test_ab.py's busy work, at 100%): the nightly of HEAD's checkout must
    find mlp/plain slower at its gate, fail the job and keep the last good commit."""
    from tests.clitools import SLOW_PATCH, copy_tree
    from tests.clitools import commit as _commit
    from tests.clitools import git as _git

    root = tmp_path / "repo"
    copy_tree(root)
    base = _commit(root, "base: the current tree")
    with open(root / "suite" / "engine.py", "a") as fh:
        fh.write(SLOW_PATCH)
    head = _commit(root, "slow: busy work in the training step")
    assert _git(root, "rev-parse", "HEAD") == head
    proc, log, out_dir, good = _night(tmp_path, base, "--gate-budget", "1.5", "--ab-args", "--steps 3 --rotate 2",
                                      env={"FLEETBENCH_TEST_SLOWDOWN": "1.0", "PYTHONPATH": str(root)},
                                      repo=str(root))
    assert proc.returncode == 1, log[-5000:]
    assert "ab gate: FAIL" in log and "mlp/plain@2: slower" in log, log[-5000:]
    assert good.read_text().strip() == base, "a failed night must not become the last good commit"
    ab = json.load(open(out_dir / "ab-w2.json"))
    assert (ab["base"]["commit"], ab["head"]["commit"]) == (base, head), (ab["base"], ab["head"])
    (case,) = ab["cases"]
    assert case["verdict"] == "slower" and case["structure_diff"] == [] and ab["exit_code"] == 1, case
    assert "mlp/plain@2: slower" in (out_dir / "gate.md").read_text()
    state = json.load(open(out_dir / "nightly.json"))
    assert state["status"] == 1 and state["stages"]["gate"]["exit"] == 1
    assert state["gate"]["worlds"]["2"]["cases"] == ["mlp/plain"]


def _fake_record(path: str, run_id: str) -> None:
    """What a `fleetbench run` of mlp/plain at world 2 appends: one timed record (3 windows of 3 steps)."""
    from suite.results.records import CaseRecord, append_record

    append_record(path, CaseRecord(case="mlp/plain", model="mlp", world_size=2, config={}, run_id=run_id,
                                   size="tiny", backend="gloo", device="cpu",
                                   metrics={"window_s": [0.3, 0.33, 0.36], "steps_per_window": 3}))


def _stands_for(cmd: list, env: dict | None, measure: bool = True) -> None:
    """What a night's command writes, for a night whose commands are recorded, not run: `fleetbench run` its record,
    `asv machine` the machine file in asv's HOME, asv's discovery benchmarks.json."""
    if cmd[1:4] == ["-m", "suite.cli.main", "run"] and measure:
        _fake_record(cmd[cmd.index("--results") + 1], f"run-w{cmd[cmd.index('--nproc') + 1]}-{uuid.uuid4().hex[:6]}")
    elif cmd[0].endswith("asv") and cmd[1] == "machine":
        home = (env or {})["HOME"]
        with open(os.path.join(home, ".asv-machine.json"), "w") as fh:
            json.dump({"version": 1, "m": {"machine": "m", "arch": "x", "cpu": "c", "num_cpu": "2", "os": "o",
                                           "ram": "1"}}, fh)
    elif cmd[0].endswith("asv") and cmd[1:4] == ["run", "--bench", "just-discover"]:
        conf = json.load(open(cmd[cmd.index("--config") + 1]))
        os.makedirs(conf["results_dir"], exist_ok=True)
        with open(os.path.join(conf["results_dir"], "benchmarks.json"), "w") as fh:
            json.dump({"version": 2, "asv_cases.StepTime.time_step": {
                "name": "asv_cases.StepTime.time_step", "params": [["'mlp/plain'"], ["2"]], "version": "v1",
                "param_names": ["case", "world_size"], "type": "time", "unit": "seconds"}}, fh)


def _fake_night(tmp_path, monkeypatch, codes: dict, cancel_at: str | None = None, *extra: str, on_call=None,
                verdict: str = "inconclusive", measure: bool = True, ab_doc: dict | None = None):
    """A night whose stage commands are recorded, not run: ``codes`` maps a command's first words to its exit;
    ``on_call(cmd)`` stands for what a command writes (besides :func:`_stands_for`; ``measure``: the run stage
    appends its record); the gate's `ab --json` says ``verdict`` for its one case (or writes ``ab_doc``)."""
    from suite.cli import nightly
    from suite.cli.main import build_parser

    calls = []

    def call(self, cmd, stdout=None, env=None):
        calls.append((cmd, env))
        _stands_for(cmd, env or self.env, measure)
        if on_call is not None:
            on_call(cmd)
        key = cmd[3] if cmd[1:3] == ["-m", "suite.cli.main"] else "pytest" if "pytest" in cmd else "asv"
        if cancel_at == key:
            raise KeyboardInterrupt
        if key == "ab" and stdout is not None and ab_doc is not None:
            stdout.write(json.dumps(ab_doc))
        elif key == "ab" and stdout is not None:
            stdout.write(json.dumps({"cases": [{"case": "mlp/plain", "world": 2, "verdict": verdict,
                                                "ci": [0.9, 1.1], "ratio": 1.0, "blocks": 12, "structure_diff": [],
                                                "check": "n/a -> n/a"}], "failures": []}))
        return codes.get(key, 0)

    monkeypatch.setattr(nightly.Night, "call", call)
    before = subprocess.run(["git", "rev-parse", "HEAD~1"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    good = tmp_path / "good"
    good.write_text(before + "\n")
    conf = tmp_path / "asv.conf.json"  # asv's results and pages under tmp_path, never the checkout's
    conf.write_text(json.dumps({"version": 1, "results_dir": str(tmp_path / "asv"),
                                "html_dir": str(tmp_path / "html")}))
    args = build_parser().parse_args(
        ["nightly", "--device", "cpu", "--case", "mlp/plain", "--set", "fetch_frequency=2", "--size", "tiny",
         "--worlds", "2", "--out", str(tmp_path / "out"), "--last-good", str(good), "--machine", "m",
         "--gate-budget", "2", "--asv-config", str(conf), *extra])
    code = args.func(args)
    state = json.load(open(tmp_path / "out" / "nightly.json"))
    return code, calls, state, good.read_text().strip(), before


def test_every_stage_gets_the_same_selection_and_an_undecided_gate_keeps_the_last_good_commit(tmp_path, monkeypatch):
    """One run specification for every stage, handed over as it is (never spelled back into options): run gets
    the file, asv's discovery the JSON in FLEETBENCH_BENCH_SPEC (the benchmark's version depends on it), the gate's
    ab the same spec narrowed to its cases at its world size."""
    from suite.run_spec import RunSpec

    code, calls, state, good, before = _fake_night(tmp_path, monkeypatch, {"ab": 3})
    assert code == 3 and state["status"] == 3 and state["stages"]["gate"]["exit"] == 3
    assert good == before  # an undecided gate never advances the last good commit
    run, ab = (next(c for c, _ in calls if c[1:4] == ["-m", "suite.cli.main", name]) for name in ("run", "ab"))
    spec = RunSpec.from_json(open(run[run.index("--spec") + 1]).read())
    sel = spec.selection
    assert (sel.cases, sel.sets, sel.size, sel.device, sel.worlds) == (("mlp/plain",), ("fetch_frequency=2",), "tiny",
                                                                       "cpu", (2,))
    # the run specification's own defaults (issue 43.9: the nightly restated 3 rounds and 1 warm-up step), traced 2
    assert (spec.run.rounds, spec.run.steps, spec.run.warmup, spec.run.trace_steps) == (6, 5, 2, 2)
    assert spec.run.rounds >= RUN_ROUNDS_FOR_95  # the night's speedups are "resolved" by run's own rule
    for cmd in (run, ab):  # no selection option spelled out
        assert not {"--case", "--set", "--size", "--device", "--rounds", "--steps"} & set(cmd), cmd
    assert run[run.index("--nproc") + 1] == "2"
    gate = RunSpec.from_json(open(ab[ab.index("--spec") + 1]).read())
    assert gate == spec.replace(selection={"cases": ("mlp/plain",), "tags": (), "models": (), "worlds": (2,)})
    assert ab[ab.index("--total-budget") + 1] == "120"  # the whole gate budget: one world size, one case
    asv_env = next(env for c, env in calls if c[1:2] == ["run"] and c[0].endswith("asv"))  # asv's discovery
    assert RunSpec.from_json(asv_env["FLEETBENCH_BENCH_SPEC"]) == spec
    assert not [k for k in asv_env if k.startswith("FLEETBENCH_BENCH_") and k != "FLEETBENCH_BENCH_SPEC"]
    assert "mlp/plain@2: inconclusive" in (tmp_path / "out" / "gate.md").read_text()
    assert "ab gate: UNDECIDED (exit 3)" in (tmp_path / "out" / "gate.md").read_text()


def test_a_gate_that_says_not_slower_advances_the_last_good_commit(tmp_path, monkeypatch):
    """The gate's question is "slower by the threshold or more?": `ab` answering "not slower" (exit 0) makes this
    night's commit the last good one, so a noisy runner's baseline moves on (an inconclusive gate keeps it)."""
    code, calls, state, good, before = _fake_night(tmp_path, monkeypatch, {"ab": 0}, verdict="not slower")
    assert code == 0 and state["stages"]["gate"]["exit"] == 0, state
    assert good == _head() == state["commit"] != before
    gate = (tmp_path / "out" / "gate.md").read_text()
    assert "mlp/plain@2: not slower" in gate and "ab gate: ok (exit 0)" in gate, gate


def test_exit_codes_and_the_last_good_commit(tmp_path, monkeypatch):
    (tmp_path / "a").mkdir()
    code, _, state, good, before = _fake_night(tmp_path / "a", monkeypatch, {"ab": 1, "run": 3})
    assert code == 1 and state["status"] == 1 and good == before  # a regression outranks an undecided stage
    (tmp_path / "b").mkdir()
    code, _, state, good, _ = _fake_night(tmp_path / "b", monkeypatch, {"history": 1})
    assert code == 0 and state["stages"]["history"]["exit"] == 0  # an alert is reported, not the gate
    assert good == _head() == state["commit"]  # a night with every stage ok is the new last good commit
    (tmp_path / "c").mkdir()
    code, _, state, _, _ = _fake_night(tmp_path / "c", monkeypatch, {"report": 2, "run": 5})
    assert code == 1 and state["stages"]["report"]["exit"] == 2 and state["stages"]["run"]["exit"] == 1
    (tmp_path / "d").mkdir()  # a run stage that timed nothing: nothing to export, the exports say so
    code, _, state, _, _ = _fake_night(tmp_path / "d", monkeypatch, {}, measure=False)
    assert code == 2 and state["stages"]["pytest-benchmark"]["exit"] == 2 and state["stages"]["asv"]["exit"] == 2


def test_a_cancelled_night_keeps_the_stages_that_ended_and_the_earlier_estimates(tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    out.mkdir()
    earlier = {"machine": "m", "stages": {name: {"seconds": 60.0, "pairs": 1, "exit": 0, "exported": True} for name
                                          in ("run", "pytest-benchmark", "asv", "report", "gate", "history")}}
    (out / "nightly.json").write_text(json.dumps(earlier))
    code, calls, state, _, _ = _fake_night(tmp_path, monkeypatch, {}, "asv")
    assert code == 130 and state["status"] == "cancelled"
    assert state["stages"]["run"]["exit"] == 0 and state["stages"]["pytest-benchmark"]["exit"] == 0
    assert state["stages"]["asv"]["exit"] == "cancelled" and "gate" not in state["stages"]
    capsys.readouterr()
    # the next plan: tonight's finished stages, the earlier night's for the cancelled and the missing ones
    assert main(["nightly", "--plan", "--device", "cpu", "--case", "mlp/plain", "--worlds", "2", "--out", str(out),
                 "--machine", "m"]) == 0
    rows = {ln.split()[0]: ln for ln in capsys.readouterr().out.splitlines() if " min  (ends at" in ln}
    assert all("last night's" in rows[name] for name in rows), "\n".join(rows.values())
    assert rows["asv"].split()[1] == "1.0" and rows["history"].split()[1] == "1.0"


def test_a_stage_running_past_the_limit_is_stopped_and_the_night_ends_with_2(tmp_path, monkeypatch, capsys):
    import time

    from suite.cli import nightly

    def slow_run(self):  # the limit is as good as reached when the stage starts
        self.deadline = time.monotonic() + 1.0
        return self.call([sys.executable, "-c", "import time; time.sleep(120)"])

    monkeypatch.setattr(nightly.Night, "run_stage", slow_run)
    out = tmp_path / "out"
    assert main(["nightly", "--device", "cpu", "--case", "mlp/plain", "--worlds", "2", "--out", str(out),
                 "--machine", "m", "--limit", "10000"]) == 2
    assert "over --limit 10000 min; what finished is kept in" in capsys.readouterr().err
    state = json.load(open(out / "nightly.json"))
    assert state["status"] == "over the limit" and state["stages"]["run"]["exit"] == "cancelled"
    assert list(state["stages"]) == ["run"]



def test_the_nights_junit_has_a_case_per_stage_and_the_suites_its_stages_wrote(tmp_path, monkeypatch):
    """--junit (default OUT/junit.xml): a test case per stage by its exit status (an undecided gate skipped), then
    the suites the stages' commands wrote into OUT/junit/; last night's file of a stage that wrote none tonight is
    never reported, and its missing file is said on the stage's case."""
    from suite.report.junit import Suite, TestCase, write_junit
    from tests.clitools import cases, outcome, valid

    stale = tmp_path / "out" / "junit" / "ab-w2.xml"
    stale.parent.mkdir(parents=True)
    write_junit(str(stale), [Suite("last night's gate", (TestCase("old/case@2", "fleetbench.ab", "failure", "x"),))])

    def run_writes_its_file(cmd):
        if cmd[1:4] == ["-m", "suite.cli.main", "run"]:
            write_junit(cmd[cmd.index("--junit") + 1],
                        [Suite("fleetbench run", (TestCase("mlp/plain@2", "fleetbench.run.mlp", "failure", "nan"),))])

    code, calls, _, _, _ = _fake_night(tmp_path, monkeypatch, {"ab": 3, "run": 1}, on_call=run_writes_its_file)
    assert code == 1
    got = cases(valid(tmp_path / "out" / "junit.xml"))
    assert outcome(got["run"]) == ("failure", "regression (exit 1)") and outcome(got["asv"]) == ("passed", "")
    assert outcome(got["gate"]) == ("skipped", "undecided: inconclusive, nothing worse (exit 3)")
    assert outcome(got["mlp/plain@2"]) == ("failure", "nan")  # the run stage's own suite
    assert "old/case@2" not in got and not stale.exists()
    assert "junit/ab-w2.xml: not written" in got["gate"].findtext("system-out")
    assert not [c for c, _ in calls if "pytest" in c]  # the night measures once: no pytest session


def _plan_rows(capsys, out_dir, *extra: str) -> dict:
    assert main(["nightly", "--plan", "--device", "cpu", "--case", "mlp/plain", "--worlds", "2", "--out", str(out_dir),
                 "--machine", "m", "--gate-budget", "5", *extra]) == 0
    return {ln.split()[0]: ln for ln in capsys.readouterr().out.splitlines() if " min  (ends at" in ln}


# the gate's rough set-up for mlp/plain@2 on CPU, by hand (suite/nightly.py's constants): two worktrees 2 x 60 s;
# a trial server of 2 ranks per revision 2 x (30 + 2 x 5) s; the case checked and prepared on each revision
# 2 x (15 + (2 x 3 check steps + 2 warm-up) x 0.01 s); plus tonight's 5-minute budget
GATE_MLP_PLAIN_2 = (2 * 60 + 2 * (30 + 2 * 5) + 2 * (15 + 8 * 0.01) + 300) / 60


def test_night_2_after_a_night_without_a_gate_plans_the_gates_set_up(tmp_path, monkeypatch, capsys):
    """Night 1 had no last good commit: its gate took no time and is no basis; night 2's plan is the budget plus the
    set-up (worktrees, servers, checks and preparations of both revisions), whatever form night 1's state has."""
    code, _, state, _, _ = _fake_night(tmp_path, monkeypatch, {}, None)  # a night 1 as nightly writes it ...
    state["gate"].update(last_good=None, base=None)  # ... had it found no last good commit
    state["stages"]["gate"].update(seconds=0.01, skipped="no last good commit")
    out = tmp_path / "out"
    (out / "nightly.json").write_text(json.dumps(state))
    rows = _plan_rows(capsys, out)
    assert rows["gate"].split()[1] == f"{GATE_MLP_PLAIN_2:.1f}" and "rough" in rows["gate"], rows["gate"]
    assert "last night's" in rows["run"]  # the stages night 1 did run stay its basis
    del state["stages"]["gate"]["skipped"]  # a night 1 written before the flag: its gate's last_good says it
    del state["gate"]["base"]
    (out / "nightly.json").write_text(json.dumps(state))
    assert _plan_rows(capsys, out)["gate"].split()[1] == f"{GATE_MLP_PLAIN_2:.1f}"
    # the flag is what nightly writes when there is no last good commit
    (tmp_path / "n1").mkdir()
    from suite.cli import nightly

    monkeypatch.setattr(nightly.Night, "last_good", lambda self: None)
    _, _, state, _, _ = _fake_night(tmp_path / "n1", monkeypatch, {}, None)
    assert state["stages"]["gate"]["skipped"] == "no last good commit" and state["gate"]["last_good"] is None


def test_a_cancelled_gate_keeps_its_measured_time_for_the_next_plans(tmp_path, capsys):
    from suite.nightly import finished_stages

    complete = {"seconds": 400.0, "pairs": 1, "budget_s": 300.0, "exit": 0}
    cancelled = {"seconds": 3600.0, "pairs": 1, "budget_s": 300.0, "exit": "cancelled"}
    state = {"machine": "m", "stages": {"gate": cancelled, "run": {"seconds": 60.0, "pairs": 1, "exit": 0}},
             "earlier": {"gate": complete}, "gate": {"last_good": "abc", "worlds": {}}}
    assert finished_stages(state)["gate"] == cancelled  # carried into the next night's "earlier" as it is
    assert finished_stages(dict(state, stages={"gate": dict(cancelled, seconds=10.0)}))["gate"] == complete
    (tmp_path / "nightly.json").write_text(json.dumps(state))
    row = _plan_rows(capsys, tmp_path)["gate"]
    assert row.split()[1] == "60.0" and "cancelled gate ran 60.0 min" in row, row  # 3600 s, not 400 s


def test_measured_step_times_replace_the_rough_ones_in_the_plan(tmp_path, capsys):
    rough = _plan_rows(capsys, tmp_path)
    (tmp_path / "steps.json").write_text(json.dumps({"models": {"mlp": 1.0}, "cases": {"mlp/plain": 2.0}}))
    measured = _plan_rows(capsys, tmp_path, "--step-times", str(tmp_path / "steps.json"))
    # run: one world's pool 30 s + the case: 15 s + (2 x 3 check + 2 warm-up + 2 traced + 6 x 5 timed) steps x 2.0 s
    assert measured["run"].split()[1] == f"{(30 + 15 + 40 * 2.0) / 60:.1f}" and "measured step times" in measured["run"]
    assert float(measured["run"].split()[1]) > float(rough["run"].split()[1])
    (tmp_path / "bad.json").write_text(json.dumps({"models": {"mlp": -1}}))
    assert main(["nightly", "--plan", "--device", "cpu", "--case", "mlp/plain", "--worlds", "2", "--out",
                 str(tmp_path), "--step-times", str(tmp_path / "bad.json")]) == 2
    err = capsys.readouterr().err
    assert "bad.json: models.mlp is -1; expected seconds per step" in err and err.count("error:") == 1


def test_the_night_measures_once_and_exports_the_run_stages_records(tmp_path, monkeypatch):
    """Each case x world size is timed once, by the run stage: no pytest session, no `asv run` that times; the
    pytest-benchmark JSON and the asv results file hold the run's windows (seconds per step), the asv benchmark's
    version as asv's discovery gave it."""
    from suite.results.export import asv_env_name, asv_results_path

    code, calls, state, _, _ = _fake_night(tmp_path, monkeypatch, {"ab": 0}, verdict="not slower")
    assert code == 0, state
    assert not [c for c, _ in calls if "pytest" in c]
    asv_runs = [c for c, _ in calls if c[0].endswith("asv") and c[1] == "run"]
    assert asv_runs and all(c[2:4] == ["--bench", "just-discover"] for c in asv_runs), asv_runs
    runs = [c for c, _ in calls if c[1:4] == ["-m", "suite.cli.main", "run"]]
    assert len(runs) == 1 and [i[:7] for i in state["stages"]["run"]["run_ids"]] == ["run-w2-"]
    pb = json.load(open(tmp_path / "out" / "pytest-benchmark.json"))
    (bench,) = pb["benchmarks"]
    assert bench["name"] == "test_step[mlp/plain@2]" and bench["stats"]["data"] == pytest.approx([0.1, 0.11, 0.12])
    assert glob.glob(str(tmp_path / "out" / "pytest-benchmark" / "*" / "0001_*.json"))
    path = tmp_path / "asv" / asv_results_path("m", state["commit"], asv_env_name(sys.executable))
    doc = json.load(open(path))
    row = dict(zip(doc["result_columns"], doc["results"]["asv_cases.StepTime.time_step"]))
    assert row["version"] == "v1" and row["samples"] == [pytest.approx([0.1, 0.11, 0.12])], row
    assert json.load(open(tmp_path / "asv" / "m" / "machine.json"))["machine"] == "m"


def test_the_plan_times_each_pair_once(tmp_path, capsys):
    """Only the run stage's estimate grows with the step time: the exports time nothing; an earlier night's
    pytest-benchmark or asv stage that timed the pairs again is no basis for tonight's export."""
    rough = _plan_rows(capsys, tmp_path)
    (tmp_path / "steps.json").write_text(json.dumps({"models": {"mlp": 100.0}}))
    slow = _plan_rows(capsys, tmp_path, "--step-times", str(tmp_path / "steps.json"))
    assert float(slow["run"].split()[1]) > 30 * float(rough["run"].split()[1])
    for stage in ("pytest-benchmark", "asv"):
        assert slow[stage].split()[1] == rough[stage].split()[1], (slow[stage], rough[stage])
    old = {"machine": "m", "stages": {s: {"seconds": 1500.0, "pairs": 1, "exit": 0}
                                      for s in ("pytest-benchmark", "asv")}}
    (tmp_path / "nightly.json").write_text(json.dumps(old))
    rows = _plan_rows(capsys, tmp_path)
    assert all("rough" in rows[s] and float(rows[s].split()[1]) < 2 for s in ("pytest-benchmark", "asv")), rows
    old["stages"]["asv"]["exported"] = True  # a measure-once night's export is
    (tmp_path / "nightly.json").write_text(json.dumps(old))
    assert _plan_rows(capsys, tmp_path)["asv"].split()[1] == "25.0"


def _overlap_too(cmd) -> None:
    """The run stage also appends a passed mlp/overlap record (a smoke night must run an overlap case green)."""
    from suite.results.records import CaseRecord, append_record

    if cmd[1:4] == ["-m", "suite.cli.main", "run"]:
        append_record(cmd[cmd.index("--results") + 1], CaseRecord(
            case="mlp/overlap", model="mlp", world_size=2, config={}, run_id=f"run-w2-{uuid.uuid4().hex[:6]}",
            size="tiny", backend="gloo", device="cpu", verdict="pass",
            metrics={"window_s": [0.3, 0.33, 0.36], "steps_per_window": 3}))


def test_the_scheduled_profile_is_smoke_until_one_smoke_night_is_green_then_full(tmp_path, monkeypatch, capsys):
    """--profile auto (what the workflow runs): smoke (one case per strategy family, an overlap case among them, `ab`
    on one gate case, an hour at most) until a smoke night ends green in the state, then full, and full stays.  Green
    needs status 0, a gate that compared something and an overlap case that passed (issue 43.4)."""
    from suite.nightly import SMOKE_LIMIT_S

    out = tmp_path / "out"
    smoke = ("--profile", "auto", "--case", "mlp/overlap")
    code, _, state, _, _ = _fake_night(tmp_path, monkeypatch, {"ab": 3}, None, *smoke, on_call=_overlap_too)
    assert code == 3 and state["profile"] == "smoke" and state["smoke_green"] is False  # undecided: not green
    code, _, state, _, _ = _fake_night(tmp_path, monkeypatch, {"ab": 0}, None, *smoke, verdict="not slower")
    assert code == 0 and state["smoke_green"] is False and state["overlap_cases"] == []  # no overlap case ran
    code, _, state, _, _ = _fake_night(tmp_path, monkeypatch, {"ab": 0}, None, *smoke, verdict="not slower",
                                       on_call=_overlap_too)
    assert code == 0 and state["profile"] == "smoke" and state["smoke_green"] is True
    assert state["overlap_cases"] == ["mlp/overlap"] and state["gate"]["worlds"]["2"]["identical"] is False
    for _night_n in range(2):  # then full, night after night (the flag is carried, whatever a full night says)
        code, _, state, _, _ = _fake_night(tmp_path, monkeypatch, {"ab": 1}, None, "--profile", "auto")
        assert code == 1 and state["profile"] == "full" and state["smoke_green"] is True
    (out / "nightly.json").write_text(json.dumps({"machine": "gpu-test", "stages": {}}))  # no green smoke night
    _no_gpu_probe(monkeypatch)
    capsys.readouterr()
    assert main(["nightly", "--plan", "--device", "cuda", "--worlds", "1,8", "--out", str(out), "--machine",
                 "gpu-test", "--profile", "auto", "--limit", "330"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("nightly plan (smoke profile)")
    lines = text.splitlines()
    gate_at = next(i for i, ln in enumerate(lines) if ln.startswith("gate:"))
    pairs = lines[lines.index("cases x world sizes:") + 1:gate_at]
    cases = {ln.strip().rsplit("@", 1)[0] for ln in pairs if ln.startswith("  ")}
    fam = {v.name: v.family for v in VARIANTS}
    by_family = [fam[c.split("/", 1)[1]] for c in cases if c.split("/", 1)[1] in fam]
    assert sorted(set(by_family)) == sorted(FAMILIES) and len(by_family) == len(set(by_family)) == len(FAMILIES)
    assert [c for c in cases if c.endswith("/multicomm")], cases  # overlap on 2 communicators (issue 43.4)
    gate = text.split("gate: ", 1)[1]
    assert gate.startswith("2 (case, world) pair(s)") and "budget of 10 min" in gate  # one case at 1 and 8
    total = float(next(ln for ln in lines if ln.strip().startswith("total")).split()[1])
    assert total <= SMOKE_LIMIT_S / 60, total


def test_a_first_smoke_night_gates_against_head_1_and_an_identical_gate_is_not_green(tmp_path, monkeypatch):
    """No last good commit: a full night makes this commit the baseline (no gate), a smoke night compares HEAD with
    HEAD~1, so the gate has run before smoke counts as green; `ab` saying "identical" (the same code) is no gate."""
    from suite.cli import nightly

    monkeypatch.setattr(nightly.Night, "last_good", lambda self: None)
    parent = subprocess.run(["git", "rev-parse", "HEAD~1"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    smoke = ("--profile", "smoke", "--case", "mlp/overlap")
    code, calls, state, _, _ = _fake_night(tmp_path, monkeypatch, {"ab": 0}, None, *smoke, verdict="not slower",
                                           on_call=_overlap_too)
    (ab,) = [c for c, _ in calls if c[1:4] == ["-m", "suite.cli.main", "ab"]]
    assert ab[4] == parent and state["gate"]["base"] == parent and state["gate"]["base_kind"].startswith("HEAD~1")
    assert code == 0 and state["smoke_green"] is True

    (tmp_path / "n2").mkdir()  # ab answers "identical" (the same code: nothing timed)
    code, _, state, _, _ = _fake_night(tmp_path / "n2", monkeypatch, {"ab": 0}, None, *smoke, on_call=_overlap_too,
                                       ab_doc={"identical": "the same tree", "cases": [], "failures": []})
    assert code == 0 and state["gate"]["worlds"]["2"]["identical"] is True and state["smoke_green"] is False
    (tmp_path / "n3").mkdir()
    code, calls, state, _, _ = _fake_night(tmp_path / "n3", monkeypatch, {"ab": 0}, None, "--profile", "full")
    assert not [c for c, _ in calls if c[1:4] == ["-m", "suite.cli.main", "ab"]]  # full: this commit the baseline
    assert state["stages"]["gate"]["skipped"] == "no last good commit"


def test_night_2_after_a_smoke_night_is_planned_from_full_estimates_and_fits_the_workflow(tmp_path, monkeypatch,
                                                                                          capsys):
    """A green smoke night whose run stage took 25 minutes for 12 pairs: the next night (auto: full) is no scaling
    of it (x12.5, with asv's fixed costs: refused before), but planned from the rough step times, and fits the GPU
    workflow's limit; its plan says its basis (issue 43.3)."""
    from suite.nightly import WORKFLOWS

    _no_gpu_probe(monkeypatch)
    smoke = {"run": {"seconds": 1500.0, "pairs": 12, "exit": 0},
             "pytest-benchmark": {"seconds": 20.0, "pairs": 12, "exit": 0, "exported": True},
             "asv": {"seconds": 240.0, "pairs": 12, "exit": 0, "exported": True},
             "report": {"seconds": 60.0, "exit": 0}, "gate": {"seconds": 900.0, "pairs": 2, "budget_s": 600.0,
                                                             "exit": 0}}
    state = {"machine": "gpu-test", "profile": "smoke", "status": 0, "smoke_green": True, "stages": smoke,
             "gate": {"last_good": None, "base": "abc", "worlds": {"8": {"cases": ["gpt2/overlap"]}}},
             "overlap_cases": ["gpt2/multicomm"]}
    (tmp_path / "nightly.json").write_text(json.dumps(state))
    argv = ["nightly", "--plan", "--workflow", "gpu", "--worlds", "1,8", "--out", str(tmp_path), "--machine",
            "gpu-test"]
    assert main(argv) == 0, capsys.readouterr().err
    text = capsys.readouterr().out
    assert text.startswith("nightly plan (full profile)")
    rows = {ln.split()[0]: ln for ln in text.splitlines() if " min  (ends at" in ln}
    assert all("rough step times" in rows[s] for s in ("run", "asv", "gate")), rows
    assert "no earlier full night recorded for this machine (nights of other profiles: smoke" in text
    total = float(next(ln for ln in text.splitlines() if ln.strip().startswith("total")).split()[1])
    assert total <= WORKFLOWS["gpu"].limit_min, total
    # the smoke night's own estimates stay the basis of a later smoke night
    assert main(argv + ["--profile", "smoke"]) == 0
    smoke_rows = {ln.split()[0]: ln for ln in capsys.readouterr().out.splitlines() if " min  (ends at" in ln}
    assert "last night's 25.0 min for 12 pair(s)" in smoke_rows["run"], smoke_rows["run"]


def test_a_refused_night_records_why_and_auto_picks_a_profile_that_fits(tmp_path, monkeypatch, capsys):
    """A night whose plan does not fit --limit is refused before anything runs, and its state says why (what was
    recorded stays); under --profile auto a full plan that does not fit becomes a smoke night, said in the plan."""
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: pytest.fail("nothing may run"))
    state = {"machine": "m", "profile": "smoke", "status": 0, "smoke_green": True,
             "stages": {"run": {"seconds": 60.0, "pairs": 1, "exit": 0}}}
    (tmp_path / "nightly.json").write_text(json.dumps(state))
    argv = ["nightly", "--device", "cpu", "--tag", "nightly-cpu", "--out", str(tmp_path), "--machine", "m"]
    assert main(argv + ["--limit", "5"]) == 2
    err = capsys.readouterr().err
    kept = json.loads((tmp_path / "nightly.json").read_text())
    assert kept["refused"]["profile"] == "full" and "--limit 5 min: the plan does not fit" in kept["refused"]["why"]
    assert kept["refused"]["why"] in err and kept["stages"] == state["stages"] and kept["smoke_green"] is True
    assert main(argv + ["--plan", "--limit", "30", "--profile", "auto"]) == 0  # full does not fit 30 min: smoke
    out = capsys.readouterr().out
    assert out.startswith("nightly plan (smoke profile)") and "the full profile does not fit: --limit 30 min" in out


def test_the_gpu_workflow_and_the_gpu_checks_plan_take_the_nights_options_from_one_place(tmp_path, monkeypatch,
                                                                                          capsys):
    """The workflow passes `--workflow gpu` and none of the options that preset holds; the GPU check's phase 5 plans
    with the same preset (issue 43.7), and that plan is accepted on CUDA and on CPU (`.ci/gpu-check --device cpu`);
    the preset's limit leaves the job's timeout room for its other steps."""
    import yaml

    from suite.gpucheck import phases as P
    from suite.nightly import WORKFLOWS

    (night,) = [s for s in _steps() if ".ci/nightly" in s.get("run", "")]
    for line in [ln for ln in night["run"].splitlines() if ".ci/nightly" in ln]:
        assert "--workflow gpu" in line, line
        assert not {"--rounds", "--steps", "--gate-budget", "--gate-case", "--limit", "--profile"} & set(line.split())
    job = yaml.safe_load(open(WORKFLOW))["jobs"]["matrix"]
    assert WORKFLOWS["gpu"].limit_min <= job["timeout-minutes"] - 20
    args = P.plan_args("cuda", "/tmp/x", None)
    assert args[args.index("--workflow") + 1] == "gpu" and "--rounds" not in args and "--steps" not in args
    _no_gpu_probe(monkeypatch)
    for device in ("cuda", "cpu"):
        assert main(P.plan_args(device, str(tmp_path / device), None)) == 0, capsys.readouterr().err
        out = capsys.readouterr().out
        assert "(smoke profile)" in out and "gate: 2 (case, world) pair(s)" in out, out[-2000:]


def _steps() -> list[dict]:
    import yaml

    return yaml.safe_load(open(WORKFLOW))["jobs"]["matrix"]["steps"]


def test_the_asv_history_is_kept_on_a_branch_and_the_doctors_json_is_among_the_artifacts():
    """The asv history (and the last good commit and the nightly state) live on the branch asv-history, restored
    before the night and pushed after it whatever the night's outcome, not in actions/cache alone (it evicts);
    the doctor's JSON and the versions are written to results/doctor/ even when it fails, and uploaded always."""
    steps = _steps()
    names = [s.get("name", s.get("uses", "")) for s in steps]
    night = next(i for i, s in enumerate(steps) if ".ci/nightly" in s.get("run", ""))
    restore = next(i for i, s in enumerate(steps) if "git fetch --quiet origin asv-history" in s.get("run", "")
                   and "git archive FETCH_HEAD" in s.get("run", ""))
    save = next(i for i, s in enumerate(steps) if "refs/heads/asv-history" in s.get("run", ""))
    assert restore < night < save, names
    for i in (restore, save):
        assert "results/asv" in steps[i]["run"] and "results/nightly/nightly.json" in steps[i]["run"]
        assert "results/last-good/commit" in steps[i]["run"]
    assert "always()" in steps[save]["if"]
    assert not [s for s in steps if "actions/cache" in s.get("uses", "")], "asv history in actions/cache"
    from suite.nightly import WORKFLOWS

    assert "--workflow gpu" in steps[night]["run"] and WORKFLOWS["gpu"].profile == "auto"
    doctor = next(s for s in steps if "fleetbench doctor" in s.get("run", ""))
    run = doctor["run"]
    # into a file, never through stdout (NCCL prints its banner there: issue 43.1), streamed item by item
    assert "fleetbench doctor --device cuda --json results/doctor/doctor.jsonl || code=$?" in run, run
    assert run.index("doctor.jsonl || code=$?") < run.index('exit "$code"')  # the JSON first, then the stop
    assert "pip freeze > results/doctor/" in run and "nvidia-smi -q > results/doctor/" in run
    upload = next(s for s in steps if "actions/upload-artifact" in s.get("uses", ""))
    assert upload["if"].startswith("always()") and "results/doctor" in upload["with"]["path"].split(), upload


# ---- options checked before the first stage; asv's HOME ------------------------------------------------------------
NIGHT = ["nightly", "--plan", "--device", "cpu", "--case", "mlp/plain", "--worlds", "2"]


@pytest.mark.parametrize("extra,words", [
    (["--machine", "../../.."], ["--machine", "'../../..'", "not a name"]),
    (["--machine", "a/b"], ["--machine", "not a name"]),
    (["--worlds", "99999"], ["--worlds 99999", "local ranks"]),
    (["--gate-budget", "1e308"], ["--gate-budget 1e+308"]),
    (["--steps", "99999999999"], ["--steps 99999999999"]),
    (["--limit", "1e308"], ["--limit 1e+308"]),
    (["--out", "/dev/null"], ["--out '/dev/null'", "not a directory"]),
    (["--ab-args=--delta"], ["--ab-args", "--delta", "expected one argument"]),
    (["--ab-args=--nproc 1000"], ["--ab-args", "--nproc 1000"]),
    (["--ab-args=--no-such-option"], ["--ab-args", "unrecognized arguments"]),
    (["--ab-args='unclosed"], ["--ab-args", "No closing quotation"]),
])
def test_every_nightly_option_is_checked_before_the_first_stage(tmp_path, capsys, monkeypatch, extra, words):
    """The probe: --ab-args, --worlds 99999, --gate-budget 1e308, --steps 99999999999 and --out /dev/null were found
    out only when their stage ran, hours in; `nightly --machine ../../..` wrote asv results outside results/asv."""
    from suite.cli import nightly

    monkeypatch.setattr(nightly.Night, "run", lambda self: pytest.fail("the night started"))
    argv = [a for a in NIGHT if a != "--plan"] if extra[0].startswith("--ab-args") else NIGHT  # ab's: a real night
    code, _, err = _cli([*argv, "--out", tmp_path / "night", *extra], capsys)
    _one_error(code, err, *words)
    assert not (tmp_path / "night").exists()


def test_asv_runs_with_a_home_inside_the_nights_output(tmp_path, monkeypatch):
    """asv writes ~/.asv-machine.json itself: its HOME is a folder of the night's output, the user's is untouched."""
    from suite.cli import nightly
    from suite.cli.main import build_parser

    calls = []
    monkeypatch.setattr(nightly.Night, "call", lambda self, cmd, stdout=None, env=None: calls.append((cmd, env)) or 0)
    monkeypatch.setattr(nightly.Night, "run_stage", lambda self: 0)
    args = build_parser().parse_args([*[a for a in NIGHT if a != "--plan"], "--out", str(tmp_path / "night"),
                                      "--machine", "m", "--last-good", str(tmp_path / "none")])
    ch = nightly.chosen(args)
    resolved, plan, _, spec = nightly.plan_of(args, ch)
    night = nightly.Night(args, ch, resolved, plan, spec)
    night.dir = None
    night.asv_stage()  # 2 here: the stubbed asv discovers nothing (tests/test_nightly.py runs the whole stage)
    asv = [(c, e) for c, e in calls if c[0].endswith("asv")]
    assert [c[1] for c, _ in asv] == ["machine", "run"], calls  # asv's machine file, then its discovery
    assert all(e is not None and e["HOME"] == str(tmp_path / "night" / "asv-home") for _, e in asv)
    assert (tmp_path / "night" / "asv-home").is_dir()
