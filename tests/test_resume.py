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
from pathlib import Path

import pytest

from suite.cli.main import main
from tests.clitools import RUN
from tests.clitools import cli as _cli
from tests.clitools import one_error as _one_error
from tests.fakes import GOOD_FACTORY, fake_record, write_records

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _cmd(results, *extra):
    # resnet's group runs first (registry order), then mlp's: the kill lands in mlp's group.
    return [sys.executable, "-m", "suite.cli.main", "run", "--nproc", "2", "--case", "resnet/none",
            "--case", "mlp/none", "--case", "mlp/plain", "--no-check", "--rounds", "2", "--steps", "2",
            "--warmup", "1", "--no-utilization", "--pg-timeout", "60", "--timeout", "300", "--results",
            str(results), *extra]


def _env():
    return dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))


@pytest.mark.heavy  # two whole runs as subprocesses, ~15 s: make test-slow
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


# ---- a resumed run is the same run: its selection and options come from its records ----------------------------
@pytest.fixture
def fake_ranks(monkeypatch):
    """`fleetbench run` on :class:`tests.fakes.FakeRankPool` (synthetic timings, no process): fast and exact."""
    import suite.runtime
    from tests.fakes import FakeRankPool

    monkeypatch.setattr(suite.runtime, "RankPool", FakeRankPool)
    monkeypatch.setattr(FakeRankPool, "made", [])
    return FakeRankPool


FIRST = ["run", "--case", "mlp/plain,mlp/overlap", "--size", "tiny", "--rounds", "3", "--steps", "4", "--warmup",
         "1", "--set", "fuse_grad_size_in_MB=8", "--no-check", "--no-utilization", "--timeout", "60"]


def _interrupted(tmp_path, capsys) -> tuple[str, str]:
    """A run of two cases cut back to its first record (as a run killed after it): (results file, run id)."""
    results = tmp_path / "runs.jsonl"
    assert main(FIRST + ["--results", str(results)]) == 0
    capsys.readouterr()
    first = results.read_text().splitlines()[0]
    results.write_text(first + "\n")
    return str(results), json.loads(first)["run_id"]


def test_a_resumed_run_takes_its_selection_and_options_from_its_records(tmp_path, capsys, fake_ranks):
    results, run_id = _interrupted(tmp_path, capsys)
    fake_ranks.made.clear()
    assert main(["run", "--resume", results, "--no-utilization", "--timeout", "60"]) == 0
    out = capsys.readouterr().out
    assert f"resuming run {run_id}: 1 case(s) already recorded, skipped: mlp/plain; to run: mlp/overlap" in out, out
    assert "do not say" not in out
    (pool,) = fake_ranks.made
    assert pool.nproc == 2
    (call,) = pool.calls
    assert (call["steps"], call["rounds"], call["warmup"]) == (4, 3, 1)
    assert call["workload_spec"].size == "tiny"
    recs = [json.loads(line) for line in open(results)]
    assert [(r["case"], r["run_id"], r["size"]) for r in recs] == [("mlp/plain", run_id, "tiny"),
                                                                   ("mlp/overlap", run_id, "tiny")]
    assert recs[1]["config"]["fuse_grad_size_in_MB"] == 8.0 and recs[1]["metrics"]["steps_per_window"] == 4
    # schema 4: every record carries the run's specification, the resumed ones the same
    assert recs[0]["schema_version"] == recs[1]["schema_version"] == 4 and "run" not in recs[0]["metadata"]
    assert recs[1]["spec"] == recs[0]["spec"]
    assert recs[0]["spec"]["selection"]["cases"] == ["mlp/plain", "mlp/overlap"]
    assert (recs[0]["spec"]["run"]["steps"], recs[0]["spec"]["selection"]["size"]) == (4, "tiny")


def test_resuming_a_complete_run_says_so_and_starts_no_rank(tmp_path, capsys, fake_ranks):
    results = tmp_path / "runs.jsonl"
    assert main(FIRST + ["--results", str(results)]) == 0
    run_id = json.loads(results.read_text().splitlines()[0])["run_id"]
    capsys.readouterr()
    fake_ranks.made.clear()
    before = results.read_bytes()
    # the options given again with the run's own values are fine (--case in another order, --steps as recorded)
    for extra in ([], ["--case", "mlp/overlap", "--case", "mlp/plain", "--steps", "4", "--size", "tiny"]):
        assert main(["run", "--resume", str(results), *extra]) == 0
        assert capsys.readouterr().out.strip() == f"nothing to resume: run {run_id} is complete (2 cases)"
    assert fake_ranks.made == [] and results.read_bytes() == before


@pytest.mark.parametrize("given,words", [
    (["--steps", "5"], "ran with --steps 4, this command gives --steps 5"),  # 5 is the default, given explicitly
    (["--rounds", "9"], "ran with --rounds 3, this command gives --rounds 9"),
    (["--case", "mlp/plain"], "ran with --case mlp/plain,mlp/overlap, this command gives --case mlp/plain"),
    (["--tag", "smoke"], "ran with --tag (none), this command gives --tag smoke"),
    (["--size", "cpu"], "ran with --size tiny, this command gives --size cpu"),
    (["--set", "fuse_grad_size_in_MB=16"], "ran with --set fuse_grad_size_in_MB=8, this command gives --set "
                                           "fuse_grad_size_in_MB=16"),
    (["--batch", "4"], "ran with --batch (not given), this command gives --batch 4"),
    (["--nproc", "4"], "ran at world size [2], this one at 4"),
])
def test_an_option_given_again_with_another_value_is_refused(tmp_path, capsys, fake_ranks, given, words):
    results, run_id = _interrupted(tmp_path, capsys)
    fake_ranks.made.clear()
    assert main(["run", "--resume", results, *given]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"error: --resume {results}: run {run_id} " in err and words in err, err
    assert fake_ranks.made == []


def test_records_written_before_runs_kept_their_options_resume_with_the_command_line(tmp_path, capsys, fake_ranks):
    """Older records say their size, device and world size only: those are taken, the rest is this command's,
    and the resume says which cases it runs and what the records could not tell."""
    from suite.results.records import CaseRecord, append_record

    results = str(tmp_path / "runs.jsonl")
    append_record(results, CaseRecord("mlp/plain", "mlp", 2, {}, "old-run", size="tiny", device="cpu",
                                      metadata={"torch": "2.4.0"}))
    assert main(["run", "--resume", results, "--size", "cpu"]) == 2
    assert "run old-run ran with --size tiny, this command gives --size cpu" in capsys.readouterr().err
    assert main(["run", "--resume", results, "--case", "mlp/plain,mlp/overlap", "--rounds", "2", "--no-check",
                 "--no-utilization", "--timeout", "60"]) == 0
    out = capsys.readouterr().out
    assert "resuming run old-run: 1 case(s) already recorded, skipped: mlp/plain; to run: mlp/overlap" in out, out
    assert "run old-run's records do not say its --case, --tag, --model, --config, --set, --set-baseline, --vary, " \
           "--strategy, --batch, --steps, --rounds, --warmup, --check-steps, --no-check" in out, out
    assert fake_ranks.made[-1].calls[0]["rounds"] == 2
    rec = json.loads(open(results).read().splitlines()[1])
    assert (rec["case"], rec["run_id"], rec["size"]) == ("mlp/overlap", "old-run", "tiny")


@pytest.mark.parametrize("stored,words", [({"steps": "many"}, "recorded --steps is 'many'"),
                                          ({"case": "mlp/plain"}, "recorded --case is 'mlp/plain'"),
                                          ({"steps": 10**9}, "recorded --steps is 1000000000, not a value of that "
                                                             "option (expected a whole number >= 1 and <= 1000000)"),
                                          ({"no_check": "yes"}, "recorded --no-check is 'yes'")])
def test_damaged_recorded_options_are_one_error(tmp_path, capsys, fake_ranks, stored, words):
    from suite.results.records import CaseRecord, append_record

    results = str(tmp_path / "runs.jsonl")
    append_record(results, CaseRecord("mlp/plain", "mlp", 2, {}, "r1", size="tiny", device="cpu",
                                      metadata={"run": stored}))
    assert main(["run", "--resume", results]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err, err
    assert fake_ranks.made == []


def test_a_schema_3_run_resumes_from_its_metadata_run(tmp_path, capsys, fake_ranks):
    """The legacy path: a schema-3 record kept the run's options in ``metadata["run"]`` (argparse names); the resume
    takes them (converted into the run's spec, each value checked as the spec's field) and its new records are
    schema 4, with the spec."""
    results = tmp_path / "runs.jsonl"
    assert main(FIRST + ["--results", str(results)]) == 0
    capsys.readouterr()
    new = json.loads(results.read_text().splitlines()[0])
    old = {k: v for k, v in new.items() if k != "spec"} | {"schema_version": 3}
    old["metadata"] = dict(new["metadata"], run={
        "case": ["mlp/plain", "mlp/overlap"], "tag": [], "model": [], "config": None,
        "set": ["fuse_grad_size_in_MB=8"], "size": "tiny", "device": "cpu", "batch": None, "steps": 4, "rounds": 3,
        "warmup": 1, "check_steps": 3, "no_check": True})
    results.write_text(json.dumps(old) + "\n")
    fake_ranks.made.clear()
    assert main(["run", "--resume", str(results), "--steps", "5"]) == 2  # the run's own are checked as before
    assert "ran with --steps 4, this command gives --steps 5" in capsys.readouterr().err
    assert main(["run", "--resume", str(results), "--no-utilization"]) == 0
    out = capsys.readouterr().out
    assert f"resuming run {old['run_id']}: 1 case(s) already recorded, skipped: mlp/plain; to run: mlp/overlap" in out
    (call,) = fake_ranks.made[-1].calls
    assert (call["steps"], call["rounds"], call["warmup"], call["workload_spec"].size) == (4, 3, 1, "tiny")
    first, second = (json.loads(line) for line in results.read_text().splitlines())
    assert first["schema_version"] == 3 and second["schema_version"] == 4
    assert second["spec"]["run"]["check"] is False and second["spec"]["selection"]["sets"] == ["fuse_grad_size_in_MB=8"]
    assert second["config"]["fuse_grad_size_in_MB"] == 8.0


def test_a_schema_4_record_s_spec_is_what_resume_reads(tmp_path, capsys, fake_ranks):
    """The spec in the run's last record, and nothing else, says what the resumed run does: a record whose spec says
    --steps 7 resumes with 7 steps, whatever the metadata holds; a spec a results file cannot hold is refused as the
    file's error."""
    results, run_id = _interrupted(tmp_path, capsys)
    rec = json.loads(open(results).read())
    rec["spec"]["run"]["steps"] = 7
    rec["metadata"]["run"] = {"steps": 9}  # ignored: schema 4 reads the spec
    open(results, "w").write(json.dumps(rec) + "\n")
    fake_ranks.made.clear()
    assert main(["run", "--resume", results, "--no-utilization"]) == 0
    capsys.readouterr()
    assert fake_ranks.made[-1].calls[0]["steps"] == 7
    rec["spec"]["run"]["steps"] = 0
    open(results, "w").write(json.dumps(rec) + "\n")
    assert main(["run", "--resume", results]) == 2
    err = capsys.readouterr().err
    assert f"{results}:1: spec: field 'run.steps' is 0; expected a whole number >= 1" in err, err


# ---- what a record names -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("run_id", ["../../escaped", "/tmp/abs", "a/b", ".hidden"])
def test_resume_refuses_a_run_id_that_is_a_path(tmp_path, capsys, no_ranks, run_id):
    results = write_records(tmp_path / "results" / "runs.jsonl", fake_record(run_id=run_id))
    code, _, err = _cli(RUN + ["--resume", results, "--trace-steps", "1"], capsys)
    _one_error(code, err, "run id", "not a name")
    assert sorted(os.listdir(tmp_path)) == ["results"] and os.listdir(tmp_path / "results") == ["runs.jsonl"]


def _resume_file(tmp: Path, model: str) -> Path:
    from suite.results.records import CaseRecord, append_record

    results = tmp / "runs.jsonl"
    run = {"case": [], "tag": [], "model": [model], "config": None, "set": [], "size": "tiny", "device": "cpu",
           "batch": None, "steps": 2, "rounds": 2, "warmup": 1, "check_steps": 2, "no_check": True}
    append_record(str(results), CaseRecord("mine.make/plain", "mine:make", 2, {}, "r1", size="tiny", device="cpu",
                                           metadata={"run": run}))
    return results


@pytest.mark.parametrize("model", ["pip._internal.utils.misc:rmtree", "mine:make"])
def test_resume_never_imports_a_factory_because_a_record_names_it(tmp_path, monkeypatch, capsys, no_ranks, model):
    """The probe: a record whose metadata.run.model names pip's rmtree deleted ./cpu through `run --resume`."""
    import suite.models

    monkeypatch.setattr(suite.models, "call_in_child", lambda *a: pytest.fail("a factory process was started"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "cpu" / "x").mkdir(parents=True)
    (tmp_path / "mine.py").write_text(GOOD_FACTORY)
    results = _resume_file(tmp_path, model)
    code, _, err = _cli(["run", "--resume", results, "--no-utilization"], capsys)
    _one_error(code, err, "never names code to run", f"--model {model}")
    code, _, err = _cli(["run", "--resume", results, "--model", "mine:other"], capsys)
    _one_error(code, err, f"ran with --model {model}, this command gives --model mine:other")
    assert (tmp_path / "cpu" / "x").is_dir()


def test_resume_with_the_factory_given_again_goes_on(tmp_path, monkeypatch, capsys, fake_rank_pool):
    import suite.models

    # the factory's facts read here (it is the user's own module, checked all the same): no child process to wait for
    import suite.runner
    import suite.selection

    def here(ref, size="cpu", timeout=None):
        return suite.models._info(suite.models.get_model(ref, size))

    for module in (suite.selection, suite.runner):
        monkeypatch.setattr(module, "model_info", here)
    monkeypatch.chdir(tmp_path)
    # the factory is imported in this process, its directory appended to the import path (suite/usercode.py): the
    # path put back afterwards, or a later test's own `mine.py` is not the one an import finds
    monkeypatch.setattr(sys, "path", list(sys.path))
    (tmp_path / "mine.py").write_text(GOOD_FACTORY)
    results = _resume_file(tmp_path, "mine:make")
    code, out, err = _cli(["run", "--resume", results, "--model", "mine:make", "--no-utilization", "--timeout",
                           "60"], capsys)
    assert code == 0, err
    assert "resuming run r1" in out and "skipped: mine.make/plain" in out


def test_sigint_during_timing_keeps_the_checks_that_passed(tmp_path, capsys, fake_rank_pool, monkeypatch):
    """The probe: Ctrl-C while a model group was timed discarded the checks its cases had passed.  They are kept as
    ``not_run`` records with their check, and --resume times them."""
    import suite.runner
    from suite.results.records import CheckSummary, read_records

    monkeypatch.setattr(suite.runner.CaseRunner, "check",
                        lambda self, rc: CheckSummary("pass", reference="fake", steps=2, losses=[1.0, 0.9]))

    def interrupted(self, *a, **k):
        raise KeyboardInterrupt

    measure = suite.runner.CaseRunner.measure
    monkeypatch.setattr(suite.runner.CaseRunner, "measure", interrupted)
    results = tmp_path / "runs.jsonl"
    code, _, err = _cli(["run", "--case", "mlp/plain,mlp/overlap", "--size", "tiny", "--results", results,
                         "--no-utilization", "--timeout", "60"], capsys)
    assert code == 130 and "2 of them checked, their timing interrupted" in err, err
    recs = read_records(str(results))
    assert [(r.case, r.status, r.verdict, r.check.reference) for r in recs] == [
        ("mlp/plain", "not_run", "pass", "fake"), ("mlp/overlap", "not_run", "pass", "fake")]
    monkeypatch.setattr(suite.runner.CaseRunner, "measure", measure)
    code, out, err = _cli(["run", "--resume", results, "--no-utilization", "--timeout", "60"], capsys)
    assert code == 0 and "to run: mlp/plain, mlp/overlap" in out, out + err
    assert [r.status for r in read_records(str(results))] == ["not_run", "not_run", "ok", "ok"]
