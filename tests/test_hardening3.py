"""Issue 36 (the third hostile probe), items 2 onwards: code runs only where the user named it, names are
names, processes die with fleetbench, nothing measured is lost, everything bounded.  (Item 1, the one output
writer, is tests/test_outputs.py.)  Each probe's one-line reproduction is a test here where it runs in seconds.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.clitools import alive as _alive
from tests.clitools import cli as _cli
from tests.clitools import one_error as _one_error

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def fake_rank_pool(monkeypatch):
    import suite.runtime
    from tests.fakes import FakeRankPool

    monkeypatch.setattr(suite.runtime, "RankPool", FakeRankPool)
    monkeypatch.setattr(FakeRankPool, "made", [])
    return FakeRankPool


GOOD_FACTORY = "from suite.models import get_model\n\ndef make(size):\n    return get_model('mlp', size)\n"


# ---- 2. code runs only where the user named it ----------------------------------------------------------------
def test_an_installed_packages_function_is_refused_before_anything_is_imported(tmp_path, monkeypatch, capsys,
                                                                               no_ranks):
    """The probe: `mkdir -p cpu/x && fleetbench run --model pip._internal.utils.misc:rmtree --list` deleted ./cpu."""
    import suite.models

    monkeypatch.setattr(suite.models, "call_in_child", lambda *a: pytest.fail("a factory process was started"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "cpu" / "x").mkdir(parents=True)
    for name in [m for m in sys.modules if m == "pip" or m.startswith("pip.")]:
        monkeypatch.delitem(sys.modules, name)
    code, _, err = _cli(["run", "--model", "pip._internal.utils.misc:rmtree", "--list"], capsys)
    _one_error(code, err, "pip._internal.utils.misc", "not your own code", "site-packages", "model_factory")
    assert (tmp_path / "cpu" / "x").is_dir()
    assert not [m for m in sys.modules if m == "pip" or m.startswith("pip.")], "pip was imported"


def _installed(tmp: Path, monkeypatch, marked: str) -> str:
    """A package on the import path that is neither the current directory nor PYTHONPATH (as an installed one)."""
    lib = tmp / "lib"
    (lib / "theirpkg").mkdir(parents=True)
    (lib / "theirpkg" / "__init__.py").write_text("raise SystemExit('the package ran while being checked')\n")
    body = GOOD_FACTORY.replace("def make", {"decorator": "@model_factory\ndef make", "list": "def make",
                                             "none": "def make"}[marked])
    if marked == "decorator":
        body = "from suite.models import model_factory\n" + body
    if marked == "list":
        body += "\nFLEETBENCH_FACTORIES = ('make',)\n"
    (lib / "theirpkg" / "models.py").write_text(body)
    monkeypatch.syspath_prepend(str(lib))
    return "theirpkg.models:make"


@pytest.mark.parametrize("marked", ["none", "decorator", "list"])
def test_a_function_outside_your_directories_runs_only_when_marked_a_factory(tmp_path, monkeypatch, capsys, marked):
    from suite.models import ModelError, _check_user_ref

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    ref = _installed(tmp_path, monkeypatch, marked)
    if marked == "none":
        with pytest.raises(ModelError, match="not your own code"):
            _check_user_ref(ref)
    else:  # read from the source, nothing imported (the package's __init__ would exit)
        assert _check_user_ref(ref) == ("theirpkg.models", "make", False)
    assert "theirpkg" not in sys.modules


def test_a_module_of_your_own_under_the_current_directory_is_yours(tmp_path, monkeypatch):
    from suite.models import _check_user_ref

    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.py").write_text(GOOD_FACTORY)
    assert _check_user_ref("mine:make") == ("mine", "make", True)


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
    (tmp_path / "mine.py").write_text(GOOD_FACTORY)
    results = _resume_file(tmp_path, "mine:make")
    code, out, err = _cli(["run", "--resume", results, "--model", "mine:make", "--no-utilization", "--timeout",
                           "60"], capsys)
    assert code == 0, err
    assert "resuming run r1" in out and "skipped: mine.make/plain" in out


def test_a_multiprocessing_py_in_the_current_directory_runs_in_no_spawned_process(tmp_path):
    """The probe: spawn's child put '' first on sys.path, so a multiprocessing.py where fleetbench was started ran
    in every rank, the factory's process and the resource tracker."""
    marker = tmp_path / "RAN"
    (tmp_path / "multiprocessing.py").write_text(
        f"import os\nopen({str(marker)!r}, 'a').write(str(os.getpid()) + '\\n')\nraise SystemExit(7)\n")
    (tmp_path / "mine.py").write_text(GOOD_FACTORY)
    script = ("from suite.models import model_info\n"
              "from suite.runtime.pool import RankPool\n"
              "from suite.runtime.probes import whoami\n"
              "if __name__ == '__main__':\n"
              "    print(model_info('mine:make', 'tiny').name)\n"
              "    pool = RankPool(1, num_threads=1, timeout=120)\n"
              "    print(pool.run(whoami)[0]['rank'])\n"
              "    pool.close()\n")
    # the parent as the `fleetbench` script starts: its own directory first on its path, not the current one
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "driver.py").write_text(script)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("PYTHONSAFEPATH", None)
    proc = subprocess.run([sys.executable, str(tmp_path / "bin" / "driver.py")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert not marker.exists(), f"multiprocessing.py ran in process(es) {marker.read_text().split()}"
    assert proc.returncode == 0 and proc.stdout.split() == ["mlp", "0"], proc.stdout + proc.stderr[-2000:]


def test_a_spawned_childs_path_has_the_current_directory_last(tmp_path, monkeypatch):
    from suite.runtime.spawn import child_sys_path

    cwd = str(tmp_path)
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    assert child_sys_path(["", "/usr/lib/python3.11", cwd, "/site"], cwd) == ["/usr/lib/python3.11", "/site", cwd]
    assert child_sys_path(["/usr/lib/python3.11"], cwd) == ["/usr/lib/python3.11", cwd]
    monkeypatch.setenv("PYTHONPATH", cwd)  # PYTHONPATH names it: the user put it there, it stays
    assert child_sys_path(["", cwd, "/usr/lib/python3.11"], cwd) == [cwd, "/usr/lib/python3.11"]


# ---- 3. names, home, loopback, bounds ------------------------------------------------------------------------
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


def test_stale_torchrun_variables_are_refused_unless_torchruns_agent_set_them(monkeypatch, capsys, no_ranks):
    """The probe: `RANK=0 WORLD_SIZE=2 … MASTER_ADDR=127.0.0.1 fleetbench run …` listened on *:29778 for 20 s."""
    for k, v in {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2",
                 "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29778"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    code, _, err = _cli(["run", "--case", "mlp/plain", "--size", "tiny"], capsys)
    _one_error(code, err, "RANK='0'", "TORCHELASTIC_RUN_ID", "unset them")
    from suite.runtime.launch import torchrun_env

    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job-1")  # torchrun's agent: the world is real
    assert torchrun_env().world_size == 2


@pytest.mark.parametrize("given,words", [(["--set", "straggler_ms=1e300"], ["straggler_ms=1e+300", "<= 60000"]),
                                         (["--set", "num_threads=1024"], ["num_threads=1024", "CPU"])])
def test_knob_values_are_bounded_by_what_a_rank_can_run(capsys, no_ranks, monkeypatch, given, words):
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    code, _, err = _cli(["run", "--case", "mlp/plain", "--size", "tiny", *given], capsys)
    _one_error(code, err, *words)


def test_refusals_do_not_echo_huge_input(capsys, no_ranks):
    huge = "x" * 500_000
    for argv in (["run", "--case", huge, "--list"], ["run", "--set", f"lr={huge}", "--list"],
                 ["run", "--steps", huge]):
        code, _, err = _cli(argv, capsys)
        assert code == 2 and len(err) < 3000 and "characters left out" in err, (argv[:2], len(err))


# ---- 3. compare's input ------------------------------------------------------------------------------------------
def _record_line(**kw) -> str:
    from tests.test_hostile import _record

    return _record(**kw).to_json()


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


# ---- 3. the six tracebacks ----------------------------------------------------------------------------------------
def test_run_list_into_a_closed_pipe_is_quiet(monkeypatch, capsys, no_ranks):
    """The probe: `fleetbench run --list | head -3` ended in a BrokenPipeError traceback (here the reader is gone
    before the first line)."""
    from suite.cli.main import main

    r, w = os.pipe()
    os.close(r)
    out = os.fdopen(w, "w")
    monkeypatch.setattr(sys, "stdout", out)
    try:
        code = main(["run", "--list", "--tag", "nightly-gpu"])
    finally:
        monkeypatch.undo()
        out.close()
    assert code == 141
    assert capsys.readouterr().err == ""


def test_too_few_open_files_is_one_error_before_any_rank(monkeypatch, capsys, no_ranks):
    """The probe: `ulimit -n 20; fleetbench run …` ended in a traceback.  The limit as `ulimit -n 20` sets it (hard
    and soft), read by the command; a too-low soft limit under a higher hard one is raised instead."""
    import resource

    limits = {"now": (20, 20)}

    def setrlimit(which, value):
        if value[0] > limits["now"][1]:
            raise ValueError("not allowed to raise maximum limit")
        limits["now"] = value

    monkeypatch.setattr(resource, "getrlimit", lambda which: limits["now"])
    monkeypatch.setattr(resource, "setrlimit", setrlimit)
    code, _, err = _cli(["run", "--case", "mlp/plain", "--size", "tiny"], capsys)
    _one_error(code, err, "open-file limit is 20", "ulimit -n 256")
    limits["now"] = (20, 4096)  # the soft limit alone is low: raised, the command goes on (to --list here)
    code, out, err = _cli(["run", "--case", "mlp/plain", "--size", "tiny", "--list"], capsys)
    assert code == 0 and limits["now"] == (4096, 4096) and "mlp/plain" in out, err


@pytest.mark.parametrize("argv,words", [
    (["comm", "-n", "100000000000"], ["--iters 100000000000"]),
    (["comm", "--timeout", "1e-9"], ["--timeout 1e-09", ">= 1"]),
])
def test_comm_bounds_its_iterations_and_timeout(capsys, no_ranks, argv, words):
    code, _, err = _cli(argv, capsys)
    _one_error(code, err, *words)


def test_figures_load_of_a_file_that_is_not_raw_data_is_one_error(tmp_path, capsys, no_ranks):
    """The probe: `figures host --load /etc/hostname` ended in a traceback."""
    for text in ("myhost\n", "12345\n", '{"rows": 3}\n'):
        (tmp_path / "hostname").write_text(text)
        code, _, err = _cli(["figures", "host", "--load", tmp_path / "hostname"], capsys)
        _one_error(code, err, "--load", str(tmp_path / "hostname"))


# ---- 3. nothing lost -------------------------------------------------------------------------------------------
def _unshare_m() -> str:
    import shutil

    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("no unshare here: a full tmpfs (results disk and TMPDIR) cannot be made without touching the "
                    "machine's own file systems")
    probe = subprocess.run([unshare, "-m", "true"], capture_output=True, text=True)
    if probe.returncode:
        pytest.skip(f"`unshare -m` is not allowed here ({probe.stderr.strip()[:200]}): needs root or user "
                    f"namespaces; a full tmpfs cannot be made")
    return unshare


def test_a_full_results_disk_and_a_full_tmpdir_lose_no_record(tmp_path):
    """The probe: both full, the fallback append raised, an empty fallback file was left and there was no table.
    Here both are one tmpfs of 64 KiB, filled, in a private mount namespace (`unshare -m`)."""
    unshare = _unshare_m()
    full = tmp_path / "full"
    full.mkdir()
    script = ("import sys\n"
              "from suite.cli import run\n"
              "from tests.test_hostile import _record\n"
              "for case in ('mlp/plain', 'mlp/overlap'):\n"
              "    print(run._append(sys.argv[1], _record(case=case)), flush=True)\n")
    cmd = ('mount -t tmpfs -o size=64k tmpfs "$0" && (head -c 1M /dev/zero > "$0/fill" 2>/dev/null; true) && '
           'exec "$1" -c "$2" "$0/runs.jsonl"')
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(full), "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.run([unshare, "-m", "sh", "-c", cmd, str(full), sys.executable, script], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    from suite.outputs import STDERR
    from suite.results.records import CaseRecord

    assert proc.stdout.split("\n")[:2] == [STDERR, STDERR], proc.stdout
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("{")]
    assert [CaseRecord.from_dict(json.loads(ln)).case for ln in lines] == ["mlp/plain", "mlp/overlap"]
    assert proc.stderr.count("cannot append to") == 1 and "No space left" in proc.stderr, proc.stderr
    assert os.listdir(full) == []  # the tmpfs is gone with its namespace; nothing was written beneath it


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


# ---- 3. every process dies with fleetbench -------------------------------------------------------------------------
FORKY = '''
import os, subprocess, sys, time
from suite.models import get_model

def make(size):
    pid = os.fork()
    if pid == 0:  # the factory's own child, in its process group
        time.sleep(600)
        os._exit(0)
    with open(os.environ["PIDS_FILE"], "w") as fh:
        fh.write(f"{os.getpid()} {pid}\\n")
    time.sleep(600)

def daemon(size):
    subprocess.Popen(["setsid", "sleep", "600"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL)
    return get_model("mlp", size)
'''


def _kill_while_the_factory_runs(tmp_path: Path, sig: int) -> list[int]:
    """`fleetbench run --model forky:make --list` killed with ``sig`` while its factory (which forked) sleeps: the
    factory's processes still alive 3 s later."""
    import time

    (tmp_path / "forky.py").write_text(FORKY)
    pids_file = tmp_path / "pids"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PIDS_FILE": str(pids_file)}
    proc = subprocess.Popen([sys.executable, "-m", "suite.cli.main", "run", "--model", "forky:make", "--list",
                             "--size", "tiny"], cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    pids: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not pids:  # a condition: the factory and its child are running
            if pids_file.exists() and pids_file.read_text().endswith("\n"):
                pids = [int(p) for p in pids_file.read_text().split()]
            time.sleep(0.05)
        assert len(pids) == 2 and all(map(_alive, pids)), "the factory never ran"
        proc.send_signal(sig)
        proc.wait(timeout=30)
        deadline = time.monotonic() + 3.0
        while any(map(_alive, pids)) and time.monotonic() < deadline:
            time.sleep(0.05)
        return [p for p in pids if _alive(p)]
    finally:
        for p in pids + [proc.pid]:
            with contextlib.suppress(OSError):
                os.kill(p, signal.SIGKILL)
        proc.wait()


def test_a_factory_and_what_it_forked_die_with_a_killed_fleetbench(tmp_path):
    """The probe: SIGKILL while a user's factory ran left it running with PPID 1; a factory that forked left two."""
    left = _kill_while_the_factory_runs(tmp_path, signal.SIGKILL)
    assert not left, f"the factory's processes {left} outlived fleetbench (SIGKILL) by 3 s"


@pytest.mark.statistical  # one more start of fleetbench and its factory: make test-slow
def test_a_factory_and_what_it_forked_die_with_a_terminated_fleetbench(tmp_path):
    left = _kill_while_the_factory_runs(tmp_path, signal.SIGTERM)
    assert not left, f"the factory's processes {left} outlived fleetbench (SIGTERM) by 3 s"


def test_a_daemon_a_factory_started_is_named_at_the_end(tmp_path, monkeypatch, capsys, no_ranks):
    """The probe: a `build()` or factory that started a new-session `sleep 600` left it behind, unsaid."""
    import shutil

    if shutil.which("setsid") is None:
        pytest.skip("no setsid here: a daemon in a session of its own cannot be started")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "forky.py").write_text(FORKY)
    code, out, err = _cli(["run", "--model", "forky:daemon", "--list", "--size", "tiny"], capsys)
    found = [int(x.split(")")[0]) for x in err.split("(pid ")[1:]]
    try:
        assert code == 0 and "daemon/plain" in out, err
        # named as it is when the command ends: `setsid` until it has exec'd `sleep` (same pid; under load, later)
        assert "outlived it in a session of their own" in err and ("sleep (pid " in err or "setsid (pid " in err), err
        assert found and all(map(_alive, found)), err
    finally:
        for pid in found:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


# ---- 3. bounded reports ------------------------------------------------------------------------------------------
def test_a_report_caps_its_plots_rows_and_boxes_and_says_so(tmp_path, monkeypatch):
    """The probe: 300 world sizes drew 301 plots; 20,000 cases took minutes and gigabytes."""
    import suite.report.figures as F
    import suite.report.page as page
    from tests.test_hardening import _record

    drawn = []
    for name in ("speedup_figure", "throughput_figure", "breakdown_figure", "scaling_figure", "local_sgd_figure"):
        monkeypatch.setattr(F, name, lambda *a, _n=name: drawn.append(_n))  # counted, nothing drawn
    monkeypatch.setattr(page, "MAX_TABLE_ROWS", 50)
    monkeypatch.setattr(page, "MAX_PROBLEM_GROUPS", 5)
    records = [_record(f"m{i % 4}/v{i}", world=2 + i % 300) for i in range(1200)]
    records += [_record(f"m9/e{i}", status="error", error=f"boom {i}") for i in range(20)]
    data = page.build_report(records, str(tmp_path / "out"), str(tmp_path))
    assert drawn.count("throughput_figure") == page.MAX_WORLD_PLOTS == drawn.count("breakdown_figure")
    md = (tmp_path / "out" / "summary.md").read_text()
    rows = [ln for ln in md.splitlines() if ln.startswith("| m")]
    assert 0 < len(rows) <= 2 * 50 and len(data["cases"]) == 1220  # in the summary table and the model tables
    assert "world sizes only" in md and "a page lists at most 50 cases" in md and "boxes of failures" in md
    assert md.count("- error:") == 5


# ---- 3. temporary directories -------------------------------------------------------------------------------------
def test_a_command_sweeps_dead_runs_temp_directories_first(tmp_path, monkeypatch, capsys, no_ranks):
    """A run killed -9 leaves its store; the next command that starts processes removes it (its owner's lock is
    free), and leaves a live owner's alone."""
    import tempfile

    from suite.runtime.pool import OWNER_FILE, owned_tempdir

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = tmp_path / "fleetbench-store-4242-dead"
    dead.mkdir()
    (dead / OWNER_FILE).write_text("")  # nobody holds its lock
    (dead / "store").write_text("x")
    live, fd = owned_tempdir("fleetbench-store-")
    try:
        code, out, err = _cli(["run", "--case", "mlp/plain", "--size", "tiny", "--list"], capsys)
        assert code == 0, err
        assert not dead.exists() and os.path.isdir(live)
        assert os.path.basename(live).startswith(f"fleetbench-store-{os.getpid()}-")  # named per run
    finally:
        os.close(fd)
        import shutil

        shutil.rmtree(live, ignore_errors=True)


@pytest.mark.statistical  # a real run's ranks: make test-slow
@pytest.mark.timeout(600)
def test_sigterm_during_a_run_removes_its_temp_directories_and_keeps_its_records(tmp_path):
    import time

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp)}
    proc = subprocess.Popen([sys.executable, "-m", "suite.cli.main", "run", "--case", "mlp/plain", "--size", "tiny",
                             "--nproc", "2", "--steps", "100000", "--rounds", "3", "--no-check", "--no-utilization",
                             "--results", str(tmp_path / "runs.jsonl")], env=env, cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not list(tmp.glob("fleetbench-store-*/store")):
            time.sleep(0.1)
        assert list(tmp.glob("fleetbench-store-*/store")), "the ranks never started"
        time.sleep(3.0)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        deadline = time.monotonic() + 5
        while os.listdir(tmp) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert proc.returncode == 130 and "interrupted" in err, err[-2000:]
        assert os.listdir(tmp) == [], os.listdir(tmp)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
