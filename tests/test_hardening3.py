"""Issue 36 (the third hostile probe), items 2 onwards: code runs only where the user named it, names are
names, processes die with fleetbench, nothing measured is lost, everything bounded.  (Item 1, the one output
writer, is tests/test_outputs.py.)  Each probe's one-line reproduction is a test here where it runs in seconds.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _cli(argv, capsys) -> tuple[int, str, str]:
    from suite.cli.main import main

    term = signal.getsignal(signal.SIGTERM)
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    finally:
        signal.signal(signal.SIGTERM, term)
    out, err = capsys.readouterr()
    return code, out, err


def _one_error(code, err, *words) -> None:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, (code, err)
    for w in words:
        assert w in err, (w, err)


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

    monkeypatch.setattr(suite.models, "_info_child", lambda *a: pytest.fail("a factory process was started"))
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
    append_record(str(results), CaseRecord("make/plain", "make", 2, {}, "r1", size="tiny", device="cpu",
                                           metadata={"run": run}))
    return results


@pytest.mark.parametrize("model", ["pip._internal.utils.misc:rmtree", "mine:make"])
def test_resume_never_imports_a_factory_because_a_record_names_it(tmp_path, monkeypatch, capsys, no_ranks, model):
    """The probe: a record whose metadata.run.model names pip's rmtree deleted ./cpu through `run --resume`."""
    import suite.models

    monkeypatch.setattr(suite.models, "_info_child", lambda *a: pytest.fail("a factory process was started"))
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
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.py").write_text(GOOD_FACTORY)
    results = _resume_file(tmp_path, "mine:make")
    code, out, err = _cli(["run", "--resume", results, "--model", "mine:make", "--no-utilization", "--timeout",
                           "60"], capsys)
    assert code == 0, err
    assert "resuming run r1" in out and "skipped: make/plain" in out


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
