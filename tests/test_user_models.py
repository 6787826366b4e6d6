"""Users' own models (tests/scripts/my_models.py): what the backend cannot run is skipped with its reason, a bug
is an error, and parameters without a gradient get one message, the fix first, per run.

`fleetbench run` is driven in-process on the session's pool (its close() is the session's business)."""
from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import traceback
from pathlib import Path

import pytest
import torch

import suite.runtime
from suite.cli.main import main
from suite.comm.grad_sync import unused_parameters_error
from suite.runner import backend_lacks, unused_parameters
from suite.runtime import RankError, RankFailure
from tests.clitools import ROOT
from tests.clitools import alive as _alive
from tests.clitools import cli as _cli
from tests.clitools import one_error as _one_error
from tests.fakes import GOOD_FACTORY, Borrowed
from tests.scripts import my_models

MODELS = "tests.scripts.my_models"
LSTM_SKIP = ("the cpu backend cannot run this: could not create a primitive descriptor for the LSTM forward "
             "propagation primitive")


def run_cli(pool2, monkeypatch, tmp_path, factory: str, *cases: str) -> tuple[int, dict]:
    monkeypatch.setattr(suite.runtime, "RankPool", lambda *a, **k: Borrowed(pool2))
    results = tmp_path / f"{factory}.jsonl"
    argv = ["run", "--model", f"{MODELS}:{factory}", "--size", "tiny", "--rounds", "2", "--steps", "2",
            "--warmup", "1", "--no-utilization", "--results", str(results)]
    for c in cases:
        argv += ["--case", c]
    rc = main(argv)
    recs = {r["case"]: r for r in map(json.loads, results.read_text().splitlines())}
    return rc, recs


def raised(fn) -> str:
    """The traceback text a rank would send for the error ``fn`` raises."""
    try:
        fn()
    except Exception:  # noqa: BLE001
        return traceback.format_exc()
    raise AssertionError("expected an error")


def on_ranks(*tracebacks: str) -> RankError:
    return RankError("raised on the ranks", dict(enumerate(tracebacks)))


def lstm_bf16() -> None:
    spec = my_models.make_lstm("tiny")
    x, _ = spec.dataset(8).get(torch.arange(8))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        spec.make(0)(x)


def own_not_implemented() -> None:
    raise NotImplementedError("Could not decide")  # a model's own: a bug or a stub, never the backend


def test_backend_lacks_only_what_the_backend_says_it_lacks():
    onednn = raised(lstm_bf16)
    assert backend_lacks(on_ranks(onednn, onednn), "cpu") == LSTM_SKIP
    eigh = raised(lambda: torch.linalg.eigh(torch.eye(2, dtype=torch.bfloat16)))  # a dtype's kernel missing
    assert backend_lacks(on_ranks(eigh), "cuda") == ("the cuda backend cannot run this: \"linalg_eigh_cpu\" "
                                                     "not implemented for 'BFloat16'")
    sparse = raised(lambda: torch.ones(2, 2).to_sparse().view(4))  # the dispatcher: no kernel for this backend
    assert backend_lacks(on_ranks(sparse), "cpu") == ("the cpu backend cannot run this: Could not run 'aten::view' "
                                                      "with arguments from the 'SparseCPU' backend")
    bugs = [
        raised(lambda: my_models.make_buggy("tiny").make(0)(torch.ones(2, 32))),  # a shape bug
        raised(own_not_implemented),  # NotImplementedError raised by the model, not torch
        raised(lambda: torch.nn.Module()(torch.ones(1))),  # raised inside torch, but the model lacks forward()
        raised(lambda: torch.nn.functional.linear(torch.ones(2, 2, dtype=torch.long), torch.ones(2, 2))),
        raised(lambda: torch.ones(2, dtype=torch.bool).mean()),  # wrong dtype for the op: the caller's bug
    ]
    for tb in bugs:
        assert backend_lacks(on_ranks(tb, tb), "cpu") is None, tb
    assert backend_lacks(on_ranks(onednn, bugs[0]), "cpu") is None, "one rank's real error keeps it an error"
    assert backend_lacks(RankFailure(f"rank 0 died:\n{onednn}", [0], "checking"), "cpu") is None
    assert backend_lacks(RuntimeError("could not create a primitive descriptor"), "cpu") is not None  # in-process


def test_a_kernel_the_backend_lacks_is_skipped_with_its_reason_and_the_run_passes(pool2, monkeypatch, tmp_path,
                                                                                 capsys):
    # On this machine's CPU (AVX512-BF16) torch's oneDNN has the bf16 LSTM: my_models.Tagger raises oneDNN's
    # message itself there (a stand-in, from inside the model's forward), as the LSTM does on CPUs without it.
    rc, recs = run_cli(pool2, monkeypatch, tmp_path, "make_lstm", "*/plain", "*/amp_bf16")
    out = capsys.readouterr().out
    assert rc == 0, out
    skipped = recs["my_models.make_lstm/amp_bf16"]
    assert (skipped["status"], skipped["verdict"], skipped["error"]) == ("skipped", "skipped", LSTM_SKIP)
    assert not skipped["metrics"], "a case that cannot run is not timed"
    plain = recs["my_models.make_lstm/plain"]
    assert plain["verdict"] == "pass" and plain["metrics"]["samples_per_s"] > 0
    assert "check skipped: " + LSTM_SKIP in out and "failed" not in out, out


def test_an_ordinary_error_in_a_user_model_stays_an_error(pool2, monkeypatch, tmp_path, capsys):
    rc, recs = run_cli(pool2, monkeypatch, tmp_path, "make_buggy", "*/plain")
    assert rc == 1, capsys.readouterr().out
    rec = recs["my_models.make_buggy/plain"]
    assert (rec["status"], rec["verdict"]) == ("error", "error")
    assert "mat1 and mat2 shapes cannot be multiplied" in rec["error"], rec["error"]


def test_the_unused_parameter_message_names_the_fix_first():
    assert str(unused_parameters_error(["spare.weight"])).startswith("set find_unused_parameters=true ")
    ddp = ("RuntimeError: Expected to have finished reduction in the prior iteration before starting a new one. "
           "You can enable unused parameter detection by passing the keyword argument `find_unused_parameters=True`"
           " to `torch.nn.parallel.DistributedDataParallel`")
    assert unused_parameters(on_ranks(f'  File "x.py", line 1, in f\n    g()\n{ddp}\n')).startswith(
        "set find_unused_parameters=true: torch DDP says Expected to have finished")
    assert unused_parameters(on_ranks(raised(own_not_implemented))) is None


@pytest.fixture(scope="module")
def spare_run(pool2, tmp_path_factory):
    mp, buf = pytest.MonkeyPatch(), io.StringIO()  # module-scoped: no capsys, the output is captured here
    try:
        with contextlib.redirect_stdout(buf):
            rc, recs = run_cli(pool2, mp, tmp_path_factory.mktemp("spare"), "make_spare", "*/plain", "*/overlap",
                                  "*/ddp", "*/fusion", "*/none")
    finally:
        mp.undo()
    return rc, buf.getvalue(), recs


def test_parameters_without_a_gradient_get_the_fix_first_in_records_and_output(spare_run):
    rc, out, recs = spare_run
    assert rc == 1, out  # plain data parallel cannot run the model as it is: a real failure
    for case in ("my_models.make_spare/plain", "my_models.make_spare/overlap", "my_models.make_spare/fusion"):
        assert recs[case]["status"] == "error" and recs[case]["error"].startswith("set find_unused_parameters=true")
    assert recs["my_models.make_spare/ddp"]["error"].startswith("set find_unused_parameters=true: torch DDP says")
    note = [ln for ln in out.splitlines() if ln.startswith("set find_unused_parameters=true")]
    assert len(note) == 1 and "'spare.weight'" in note[0], out


def test_the_unused_parameter_message_is_said_once_per_run(spare_run):
    rc, out, recs = spare_run
    assert out.count("received no gradient") == 1, out
    assert out.count("find_unused_parameters (see above)") == 4, out  # the cases that stopped, named in one line
    assert "interleaved timing" not in out, "cases whose check stopped there are not timed again"


def test_the_unused_parameter_message_is_no_error_for_none(spare_run):
    rc, out, recs = spare_run
    none = recs["my_models.make_spare/none"]
    assert (none["status"], none["verdict"], none["error"]) == ("ok", "n/a", None), none
    assert none["metrics"]["samples_per_s"] > 0 and "speedup" not in none["metrics"], "timed without the baseline"
    assert "nan" not in out and "no baseline" in next(
        ln for ln in out.splitlines() if "my_models.make_spare/none " in ln and "samples/s" in ln), out


def test_two_modules_factories_of_one_name_get_their_own_cases_and_histories(tmp_path, monkeypatch, capsys):
    """The README's factory name in two modules (issue 46.3): cases named after the module and the function, so
    their records never share a name, and the report's history of each is its own."""
    from suite.report.trend import trends
    from suite.results.records import CaseRecord

    source = (__import__("pathlib").Path(my_models.__file__)).read_text()
    for mod in ("team_a", "team_b"):
        (tmp_path / f"{mod}.py").write_text(source)
    monkeypatch.chdir(tmp_path)
    assert main(["run", "--model", "team_a:make_spec", "--model", "team_b:make_spec", "--list", "--size",
                 "tiny"]) == 0
    listed = capsys.readouterr().out
    assert "team_a.make_spec/plain" in listed and "team_b.make_spec/plain" in listed, listed
    recs = [CaseRecord(f"{m}.make_spec/plain", f"{m}:make_spec", 2, {}, f"r{i}", size="tiny", device="cpu",
                       metrics={"samples_per_s": 100.0 + i})
            for i, m in enumerate(("team_a", "team_b", "team_a", "team_b"))]
    final = {(r.case, r.world_size): r for r in recs}
    got = trends(recs, final)
    assert set(got) == {("team_a.make_spec/plain", 2), ("team_b.make_spec/plain", 2)}
    assert [p["samples_per_s"] for p in got[("team_a.make_spec/plain", 2)]["points"]] == [100.0, 102.0]


# ---- a factory runs only where the user named it -------------------------------------------------------------------
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


FACTORIES = '''
import os, sys, time
from suite.models import get_model

def exits(size):
    sys.exit(0)

def hard_exit(size):
    os._exit(0)

def sleeps(size):
    time.sleep(600)

def garbage(size):
    import dataclasses
    return dataclasses.replace(get_model("mlp", size), build=lambda: "not a module")

def good(size):
    return get_model("mlp", size)
'''


@pytest.mark.parametrize("ref,words", [
    ("os:remove", ["standard library"]), ("shutil:rmtree", ["standard library"]), ("json:loads", ["standard"]),
    ("builtins:input", ["standard library"]), ("..:x", ["absolute module name"]), ("a b:c", ["module:function"]),
])
def test_a_model_reference_to_anything_but_your_own_factory_is_refused_unimported(tmp_path, monkeypatch, capsys,
                                                                                  no_ranks, ref, words):
    import suite.models

    def no_child(*a, **k):
        raise AssertionError("a factory process was started")

    monkeypatch.setattr(suite.models, "call_in_child", no_child)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "keep").write_text("x")
    code, _, err = _cli(["run", "--model", ref, "--list", "--size", "cpu", "--device", "cpu"], capsys)
    _one_error(code, err, ref, *words)
    assert (tmp_path / "cpu" / "keep").exists()


@pytest.mark.parametrize("fn,words", [
    ("exits", ["sys.exit(0)"]), ("hard_exit", ["exit code 0", "without returning"]),
    ("sleeps", ["did not return within 4 s"]), ("garbage", ["build() returned str"]),
])
def test_a_factory_that_exits_hangs_or_returns_garbage_is_one_error_and_the_parent_lives(
        tmp_path, monkeypatch, capsys, no_ranks, fn, words):
    import suite.models

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(suite.models, "FACTORY_TIMEOUT", 4.0 if fn == "sleeps" else 300.0)
    monkeypatch.setattr(suite.models, "_INFO", {})
    (tmp_path / "hostile_factories.py").write_text(FACTORIES)
    ref = f"hostile_factories:{fn}"
    code, _, err = _cli(["run", "--model", ref, "--list", "--size", "tiny", "--device", "cpu"], capsys)
    _one_error(code, err, ref, *words)


def test_a_good_factory_is_listed_without_being_called_in_the_parent(tmp_path, monkeypatch, capsys, no_ranks):
    import suite.models

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(suite.models, "_INFO", {})
    monkeypatch.setattr(suite.models, "_user_model", lambda *a: pytest.fail("the factory ran in the parent"))
    (tmp_path / "hostile_factories.py").write_text(FACTORIES)
    code, out, err = _cli(["run", "--model", "hostile_factories:good", "--list", "--size", "tiny", "--device",
                           "cpu"], capsys)
    assert code == 0 and "good/plain" in out, err


# ---- a factory's processes die with fleetbench; what it daemonized is named ----------------------------------------
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


BUILD_DAEMON = '''
import dataclasses, os, subprocess
from suite.models import get_model

def _build_and_daemonize(build):
    def build_it():
        daemon = subprocess.Popen(["setsid", "sleep", "600"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        with open(os.environ["DAEMON_PIDS"], "a") as fh:
            fh.write(f"{daemon.pid}\\n")
        return build()
    return build_it

def make(size):
    spec = get_model("mlp", size)
    return dataclasses.replace(spec, build=_build_and_daemonize(spec.build))
'''


@pytest.mark.heavy  # a real run's rank (about 10 s): make test-slow
@pytest.mark.timeout(300)
def test_a_daemon_a_models_build_started_in_a_rank_is_named_at_the_end(tmp_path):
    """The probe: a `build()` that started a new-session `sleep 600` (in a rank) left it, unsaid."""
    import shutil

    if shutil.which("setsid") is None:
        pytest.skip("no setsid here: a daemon in a session of its own cannot be started")
    (tmp_path / "daemonic.py").write_text(BUILD_DAEMON)
    pids = tmp_path / "daemon.pids"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path), "DAEMON_PIDS": str(pids)}
    proc = subprocess.run([sys.executable, "-m", "suite.cli.main", "run", "--model", "daemonic:make", "--case",
                           "daemonic.make/plain", "--size", "tiny", "--nproc", "1", "--steps", "1", "--rounds", "1",
                           "--warmup", "0", "--no-check", "--no-utilization", "--results",
                           str(tmp_path / "runs.jsonl")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=280)
    found = [int(x.split(")")[0]) for x in proc.stderr.split("(pid ")[1:]]
    try:
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "outlived it in a session of their own" in proc.stderr, proc.stderr[-3000:]
        assert ("sleep (pid " in proc.stderr or "setsid (pid " in proc.stderr) and found, proc.stderr[-3000:]
        assert all(map(_alive, found)), proc.stderr[-3000:]
    finally:
        if pids.exists():  # said or not, the daemons go
            found += [int(p) for p in pids.read_text().split()]
        for pid in found:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
