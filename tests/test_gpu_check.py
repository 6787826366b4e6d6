"""`.ci/gpu-check` (suite/gpucheck/), proven on CPU before any GPU is lent: a phase that hangs is killed at its bound
and the later phases still run, SUMMARY.md written; a CPU-wheel torch on a machine whose (fake) nvidia-smi lists a
GPU is one line and exit 2; with no .venv and no package index the present python3 (a fake one that has no asv) runs
the phases with PYTHONPATH at the checkout; --only reruns keep the other phases; and, in make test-slow, the whole
check with --device cpu (phases 0, 2, 4 and 5 for real, 1 and 3 not applicable) within the output limits."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile

import pytest

from suite.gpucheck import phases as P
from suite.gpucheck.interpreter import Interpreter
from suite.gpucheck.summary import FILES
from tests.fakes import NCCL_LIKE_RANKS, fake_nvidia_smi

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NO_INDEX = "http://127.0.0.1:9/"  # the 20 s index probe, stubbed: refused at once (nothing listens on port 9)

# a python3 stand-in: the test's own interpreter (its torch is the CPU wheel 2.13.0+cpu) without asv, logging the
# PYTHONPATH of every start
NO_ASV = """import sys


class _NoAsv:
    def find_spec(self, name, path=None, target=None):
        if name == "asv" or name.startswith("asv."):
            raise ModuleNotFoundError("No module named 'asv' (this python3 has none)", name=name)
        return None


sys.meta_path.insert(0, _NoAsv())
"""


def _fake_python3(tmp_path, more: str = "") -> tuple[str, str]:
    """A folder holding `python3` (see NO_ASV; ``more``: more of its sitecustomize) and the log of each start's
    PYTHONPATH."""
    (tmp_path / "noasv").mkdir()
    (tmp_path / "noasv" / "sitecustomize.py").write_text(NO_ASV + more)
    (tmp_path / "bin").mkdir()
    log = tmp_path / "python3.log"
    py = tmp_path / "bin" / "python3"
    py.write_text(f'#!/bin/sh\necho "$PYTHONPATH" >> "{log}"\n'
                  f'PYTHONPATH="{tmp_path / "noasv"}${{PYTHONPATH:+:$PYTHONPATH}}" exec "{sys.executable}" "$@"\n')
    py.chmod(0o755)
    return str(tmp_path / "bin"), str(log)


def _path(*first: str) -> str:
    """``first``, then the system's folders without any python3 or nvidia-smi of their own (a bare GPU machine's)."""
    system = [d for d in ("/usr/local/bin", "/usr/bin", "/bin") if not os.path.exists(os.path.join(d, "nvidia-smi"))]
    return os.pathsep.join([*first, *system])


def _gpu_check(tmp_path, *args: str, gpu: bool, timeout: float, more: str = "", env_more: dict | None = None):
    fake_bin, log = _fake_python3(tmp_path, more)
    dirs = [fake_bin]
    if gpu:
        (tmp_path / "smi").mkdir()
        dirs.append(fake_nvidia_smi(tmp_path / "smi", gpus=1))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VENV", "VIRTUAL_ENV")}
    env.update(PATH=_path(*dirs), OUT=str(tmp_path / "out"), VENV=str(tmp_path / "no-venv"),
               MPLCONFIGDIR=str(tmp_path / "mpl"), HOME=str(tmp_path), **(env_more or {}))
    proc = subprocess.run([os.path.join(REPO, ".ci", "gpu-check"), "--index-url", NO_INDEX, *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)
    return proc, tmp_path / "out", log


def test_a_cpu_wheel_beside_a_gpu_exits_2_in_one_line_and_the_present_python3_runs_the_phases(tmp_path):
    """No .venv, no package index: the present python3 (one without asv) is chosen, with PYTHONPATH at the checkout
    and asv named as missing; its torch is a CPU wheel and the fake nvidia-smi lists an H100: exit 2, one line on
    stderr naming the wheel, the CUDA phases skipped for that reason."""
    proc, out, log = _gpu_check(tmp_path, "--only", "0,1,2", gpu=True, timeout=300)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    err = proc.stderr.strip().splitlines()
    import torch

    assert len(err) == 1 and f"torch {torch.__version__} is a CPU wheel" in err[0] and "1 GPU(s)" in err[0], err
    env = json.load(open(out / "env.json"))
    it = env["interpreter"]
    assert it["path"] == str(tmp_path / "bin" / "python3") and "the present python3" in it["how"], it
    assert it["missing"] == ["asv"] and it["torch"] == str(torch.__version__)
    assert any("no such environment" in t for t in it["tried"])
    assert any("make setup not tried: not asked" in t for t in it["tried"])  # nothing installed (issue 43.6)
    starts = open(log).read().split()
    assert starts and all(s.split(os.pathsep)[0] == REPO for s in starts), starts  # PYTHONPATH=. every time
    by = {p["number"]: p for p in env["phases"]}
    assert by[0]["status"] == P.PASS and by[1]["status"] == P.FAIL and by[2]["status"] == P.SKIPPED
    assert "is a CPU wheel" in by[2]["next"] and {by[n]["status"] for n in (3, 4, 5)} == {P.NOT_RUN}
    summary = (out / "SUMMARY.md").read_text()
    assert "**Exit 2**" in summary and "is a CPU wheel" in summary and "NVIDIA H100" in summary
    assert (out / "pip-freeze.txt").read_text().count("==") > 10  # the freeze of the interpreter that ran


def _quick(status: str):
    def phase(c, bound):
        return status, "", {}
    return phase


def _hangs(c, bound):
    # a shell writes its pid and becomes `sleep 600` at once (a Python child could take longer than the bound to
    # start on a loaded machine, and be killed before it wrote anything)
    out = c.command(2, ["/bin/sh", "-c", 'echo $$ > "$1"; exec sleep 600', "hangs", str(c.out) + "/../pid"], bound)
    return (P.TIMED_OUT if out.timed_out else P.PASS), "hung", {}


@pytest.fixture
def no_interpreter_probe(monkeypatch):
    monkeypatch.setattr(P, "choose", lambda *a, **k: Interpreter(sys.executable, "this test's", "2.13.0+cpu"))
    monkeypatch.setattr(P, "driver_facts", lambda: None)


def test_a_hung_phase_is_killed_at_its_bound_and_the_later_phases_still_run_and_write_the_summary(
        tmp_path, monkeypatch, no_interpreter_probe):
    monkeypatch.setattr(P, "PHASES", ((0, P.host_facts), (2, _hangs), (4, _quick(P.PASS)), (5, _quick(P.PASS))))
    monkeypatch.setitem(P.BOUNDS["cpu"], 2, 2.0)
    check = P.Check(P.Options(device="cpu", out=str(tmp_path / "out")), log=lambda s: None)
    assert check.run() == 1
    assert [(n, p.status) for n, p in sorted(check.results.items())] == \
        [(0, P.PASS), (2, P.TIMED_OUT), (4, P.PASS), (5, P.PASS)]
    pid = int((tmp_path / "pid").read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # killed, not left running
    summary = (tmp_path / "out" / "SUMMARY.md").read_text()
    assert "| 2 | doctor | timed out |" in summary and "| 5 | plan | pass |" in summary
    assert "killed at its bound" in (tmp_path / "out" / "stderr.log").read_text()
    assert set(os.listdir(tmp_path / "out")) <= {"SUMMARY.md", *FILES}
    # --only 4: the rerun phase is replaced, the others keep what the last check wrote
    monkeypatch.setattr(P, "PHASES", ((0, P.host_facts), (2, _hangs), (4, _quick(P.FAIL)), (5, _quick(P.PASS))))
    check = P.Check(P.Options(device="cpu", out=str(tmp_path / "out"), only=(4,)), log=lambda s: None)
    assert check.run() == 1
    assert [(n, p.status) for n, p in sorted(check.results.items())] == \
        [(0, P.PASS), (2, P.TIMED_OUT), (4, P.FAIL), (5, P.PASS)]
    assert "| 4 | cases | fail |" in (tmp_path / "out" / "SUMMARY.md").read_text()


def test_the_cases_phase_takes_what_the_earlier_phases_left_and_the_plan_keeps_its_own_bound(
        tmp_path, monkeypatch, no_interpreter_probe):
    # the first H200 run: phases 0-3 took 55 s of their 215, the cases were killed at their 150 s with 130 s of
    # the deadline unspent
    got: dict[int, float] = {}

    def records(number):
        def phase(c, bound):
            got[number] = bound
            return P.PASS, "", {}
        return phase

    monkeypatch.setattr(P, "PHASES", tuple((n, records(n)) for n in (0, 2, 4, 5)))
    check = P.Check(P.Options(device="cpu", out=str(tmp_path / "out")), log=lambda s: None)
    assert check.run() == 0
    deadline, bounds = P.DEADLINE_S["cpu"], P.BOUNDS["cpu"]
    assert got[0] == bounds[0] and got[2] == bounds[2] and got[5] == bounds[5]
    assert deadline - bounds[5] - 30 < got[4] <= deadline - bounds[5], got  # not its own 240 s
    assert got[4] > bounds[4]


def test_phase_4_takes_one_case_per_strategy_family_of_each_published_model():
    from suite.cases import CASES, FAMILIES, VARIANTS

    family = {v.name: v.family for v in VARIANTS}
    chosen = P.phase_cases()
    assert list(chosen) == ["resnet50", "gpt2", "bert"]
    for model, names in chosen.items():
        families = [family[n.split("/")[1]] for n in names]
        assert families == [f for f in FAMILIES if any(c.model == model and family[c.variant] == f for c in CASES)]
        assert names[0] == f"{model}/plain"
        assert all(next(c for c in CASES if c.name == n).min_world == 1 for n in names)
        assert f"{model}/multicomm" in names  # overlap on 2 communicators: the trace shows it (issue 43.8)
    assert "resnet50/compute_fusion" in chosen["resnet50"]  # the gate's case of the compute family


@pytest.mark.heavy  # the whole check as a subprocess: about 3 minutes on 2 cores
def test_gpu_check_on_cpu_runs_phases_0_2_4_5_for_real_within_the_output_limits(tmp_path):
    proc, out, _ = _gpu_check(tmp_path, "--device", "cpu", gpu=False, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    env = json.load(open(out / "env.json"))
    by = {p["number"]: p for p in env["phases"]}
    assert [by[n]["status"] for n in range(6)] == [P.PASS, P.NA, P.PASS, P.NA, P.PASS, P.PASS], by
    assert "no GPU asked for" in by[1]["next"] and "no GPU asked for" in by[3]["next"]
    assert env["interpreter"]["missing"] == ["asv"]  # nothing on these paths imports asv
    names = os.listdir(out)
    assert "SUMMARY.md" in names and len(names) <= 8 and set(names) <= {"SUMMARY.md", *FILES}, names
    assert all(os.path.isfile(out / n) and os.path.getsize(out / n) <= 16 << 20 for n in names)
    from suite.doctor_report import read_lines

    doctor = read_lines((out / "doctor.jsonl").read_text())
    assert doctor is not None and doctor.ok and doctor.platform == "cpu/gloo" and doctor.nproc == 1
    records = [json.loads(ln) for ln in open(out / "runs.jsonl")]
    wanted = [n for names in P.phase_cases(P.MODELS["cpu"], ("baseline", "compute")).values() for n in names]
    assert sorted(r["case"] for r in records) == sorted(wanted)
    assert all(r["status"] == "ok" and r["verdict"] == "pass" for r in records), [r["error"] for r in records]
    with tarfile.open(out / "traces.tar.gz") as tar:
        traces = [m.name for m in tar.getmembers() if m.name.endswith(".json")]
    assert traces and all(t.startswith("traces/") for t in traces)
    summary = (out / "SUMMARY.md").read_text()
    assert "measured step times (--step-times)" in summary and '"cases"' in summary
    for case in wanted:
        assert f"| {case} | pass (ok) |" in summary
    assert "| torchrun error path | pass |" in summary


def test_no_interpreter_with_torch_skips_the_phases_that_need_it_with_the_reason_and_fails_the_check(tmp_path,
                                                                                                      monkeypatch):
    monkeypatch.setattr(P, "choose", lambda *a, **k: Interpreter(None, "none", tried=["python3: no torch (...)"]))
    monkeypatch.setattr(P, "driver_facts", lambda: None)
    monkeypatch.setattr(P, "PHASES", ((0, P.host_facts), (2, P.doctor), (5, P.plan)))
    check = P.Check(P.Options(device="cpu", out=str(tmp_path)), log=lambda s: None)
    assert check.run() == 1
    assert [(n, p.status) for n, p in sorted(check.results.items())] == [(0, P.PASS), (2, P.SKIPPED), (5, P.SKIPPED)]
    assert check.results[2].next == "no interpreter imports torch: python3: no torch (...)"


def test_a_rank_printing_on_stdout_leaves_the_doctors_json_and_the_summarys_doctor_table_whole(tmp_path):
    """The doctor's ranks print NCCL's banner on their stdout and a WARN line into NCCL_DEBUG_FILE (tests/fakes.py
    NCCL_LIKE_RANKS; a doctor of two items): phase 2 passes, doctor.jsonl is whole, the summary has the doctor's
    table and NCCL's WARN line (issue 43.1)."""
    proc, out, _ = _gpu_check(tmp_path, "--device", "cpu", "--only", "0,2", gpu=False, timeout=300,
                              more=NCCL_LIKE_RANKS,
                              env_more={"NCCL_LIKE_RANKS": "1", "NCCL_LIKE_ITEMS": "item_platform,item_allreduce"})
    env = json.load(open(out / "env.json"))
    by = {p["number"]: p for p in env["phases"]}
    assert by[2]["status"] == P.PASS, (by[2], proc.stderr[-3000:])
    lines = [json.loads(ln) for ln in open(out / "doctor.jsonl")]
    assert lines[0]["kind"] == "fleetbench.doctor" and lines[-1]["end"] is True and len(lines) == 4
    summary = (out / "SUMMARY.md").read_text()
    assert "## 2 doctor (cpu/gloo" in summary and "| platform | pass |" in summary, summary
    assert "| allreduce on each communicator (fp32, exact) | pass |" in summary
    assert "NCCL WARN a warning only NCCL_DEBUG_FILE keeps" in summary  # NCCL's lines kept, not thrown away
    assert "NCCL WARN a warning only NCCL_DEBUG_FILE keeps" in (out / "stderr.log").read_text()


def test_a_reused_out_shows_nothing_an_earlier_check_wrote(tmp_path, monkeypatch, no_interpreter_probe):
    """An earlier check's doctor report, premises and records in OUT are removed before this check's phases run:
    the summary reads only what this check wrote; with --only, the phases not rerun keep theirs (issue 43.8)."""
    out = tmp_path / "out"
    out.mkdir()
    earlier = {"doctor.jsonl": '{"kind": "fleetbench.doctor", "platform": "cuda/nccl", "nproc": 1, "versions": {}}\n'
                               '{"item": "stale item", "status": "pass", "numbers": "", "seconds": 1}\n',
               "premises.json": '[{"premise": "stale premise", "ok": true}]',
               "runs.jsonl": '{"case": "stale/case"}\n', "pip-freeze.txt": "stale==1\n"}
    for name, text in earlier.items():
        (out / name).write_text(text)
    monkeypatch.setattr(P, "PHASES", ((0, P.host_facts), (2, _quick(P.PASS)), (4, _quick(P.PASS))))
    P.Check(P.Options(device="cpu", out=str(out)), log=lambda s: None).run()
    summary = (out / "SUMMARY.md").read_text()
    assert "stale" not in summary and not [n for n in earlier if (out / n).exists()], os.listdir(out)
    (out / "doctor.jsonl").write_text(earlier["doctor.jsonl"])  # as phase 2 of that check would have left it
    P.Check(P.Options(device="cpu", out=str(out), only=(4,)), log=lambda s: None).run()
    assert "stale item" in (out / "SUMMARY.md").read_text()  # phase 2 not rerun: its report stays


def test_the_interpreter_choice_installs_nothing_unless_asked_and_probes_within_the_deadline(tmp_path, monkeypatch):
    """Without --setup no `make setup` runs, on a GPU check too, and the index is not even asked; every probe's bound
    is what is left of the check's deadline (the choice is inside its six minutes: issue 43.6)."""
    import time

    from suite.gpucheck import interpreter as I

    started, bounds = [], []
    monkeypatch.setattr(I, "run_child", lambda cmd, *a, **k: started.append(cmd) or pytest.fail(f"ran {cmd}"))
    monkeypatch.setattr(I, "index_answers", lambda *a, **k: pytest.fail("the index was asked"))
    def probe(python, env, timeout=I.PROBE_TIMEOUT_S):
        bounds.append(timeout)
        return {"torch": "2.11.0+cu130", "cuda": "13.0", "missing": []} if "python3" in python else {"torch_error": "x"}

    monkeypatch.setattr(I, "probe", probe)
    venv = tmp_path / "venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").write_text("#!/bin/sh\n")
    (venv / "python").chmod(0o755)
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "python3").write_text("#!/bin/sh\n")
    (bin_ / "python3").chmod(0o755)
    deadline = time.monotonic() + 7.0
    it = I.choose(REPO, str(tmp_path / "venv"), "cuda", {"PATH": str(bin_)}, deadline=deadline)
    assert it.path == str(bin_ / "python3") and started == []
    assert any("make setup not tried: not asked" in t for t in it.tried), it.tried
    assert len(bounds) == 2 and all(1.0 <= b <= 7.0 for b in bounds), bounds  # not the probe's own 90 s


def test_premise_1_expects_the_count_of_cudas_own_formula_computed_on_the_host():
    """CUDA divides by a CPU scalar as a * (1/b) with the reciprocal in float32: that differs from true division on
    126 of the 256 byte values (111 was the old normalization's count); the premise expects the host's count of the
    same formula (issue 43.2), so a correct GPU passes it and another count fails it."""
    from suite.gpucheck.premises import division_verdict, host_division_mismatches

    assert host_division_mismatches() == 126
    assert division_verdict(126, 0)[2] is True and "126 of 256" in division_verdict(126, 0)[0]
    assert division_verdict(111, 0)[2] is False and division_verdict(126, 1)[2] is False


def test_one_rank_collectives_are_not_called_confirmed_beyond_torchs_stream_plumbing(tmp_path):
    """At one rank NCCL launches nothing for an in-place sum (ncclLaunchOneRank): the premises timed on such a
    collective are listed as seen on one rank, not under "Confirmed on this GPU" (issue 43.8)."""
    from suite.gpucheck.summary import write_summary

    check = P.Check(P.Options(device="cuda", out=str(tmp_path)), log=lambda s: None)
    rows = [{"premise": name, "expected": "", "observed": "", "ok": True} for name in
            ("work.wait() does not block the host", "a synchronous collective runs on the current stream",
             "post-accumulate hook: thread and stream")]
    (tmp_path / "premises.json").write_text(json.dumps(rows))
    write_summary(check)
    text = (tmp_path / "SUMMARY.md").read_text()
    confirmed = text.split("Confirmed on this GPU:")[1].split("Seen on one rank")[0]
    one_rank = text.split("Seen on one rank")[1].split("Not confirmed by this run:")[0]
    assert "post-accumulate hooks" in confirmed and "Work.wait()" not in confirmed
    assert "Work.wait() makes the current stream wait" in one_rank and "collective spans" in one_rank
    assert "ncclLaunchOneRank" in one_rank
