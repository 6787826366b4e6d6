"""Nothing is written under the user's home (issue 36, what to build 3; issue 38: asv's subprocess gets a HOME
inside the results directory, asv writing ``~/.asv-machine.json`` itself).

``make asv-smoke``'s recipe runs here with stand-ins for the venv's programs (an ``asv`` that records its HOME and
writes its machine file there, as asv does); matplotlib's caches, which a report or a figure would put under
``~/.cache`` and ``~/.config``, go to a private directory of the process, removed once matplotlib has read them;
a run and a report of it with HOME set to an empty directory leave it empty (``heavy``: a real rank).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

FAKE_ASV = """#!/bin/sh
# asv as make asv-smoke calls it: its HOME and its command recorded; `asv machine` writes ~/.asv-machine.json
printf '%s\\t%s\\n' "$HOME" "$1" >> "$ASV_LOG"
if [ "$1" = machine ]; then echo '{}' > "$HOME/.asv-machine.json"; fi
"""


def _copy_of_the_makefile(tmp: Path) -> tuple[Path, Path]:
    """The Makefile in a scratch checkout with a venv of stand-ins (already set up: `.installed` newer than its
    inputs), so the recipe runs for real and writes only under ``tmp``."""
    work, venv = tmp / "checkout", tmp / "checkout" / "venv"
    (venv / "bin").mkdir(parents=True)
    shutil.copy(ROOT / "Makefile", work / "Makefile")
    for name in ("pyproject.toml", "constraints.txt", "constraints-cuda.txt"):
        (work / name).write_text("")
        os.utime(work / name, (1_000_000_000, 1_000_000_000))  # older than the venv's stamp: no set-up runs
    (venv / ".installed").write_text("")
    scripts = {"asv": FAKE_ASV, "python": "#!/bin/sh\necho fakehost\n", "fleetbench": "#!/bin/sh\nexit 0\n"}
    for name, text in scripts.items():
        (venv / "bin" / name).write_text(text)
        (venv / "bin" / name).chmod(0o755)
    return work, venv


def test_make_asv_smoke_gives_every_asv_call_a_home_inside_results(tmp_path):
    """The probe (issue 36, 5): asv rewrote the user's ~/.asv-machine.json.  Every asv call of `make asv-smoke`
    (machine, run, publish) runs with HOME = results/asv-home of the checkout; the user's HOME stays empty."""
    make = shutil.which("make")
    if make is None:
        pytest.skip("no make here: the Makefile's recipe cannot run")
    work, venv = _copy_of_the_makefile(tmp_path)
    home, log = tmp_path / "home", tmp_path / "asv.log"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLEETBENCH_", "MAKE", "MFLAGS"))}
    env.update(HOME=str(home), ASV_LOG=str(log), PATH=os.environ.get("PATH", "/usr/bin:/bin"))
    proc = subprocess.run([make, "asv-smoke", f"VENV={venv}", f"PY={venv / 'bin' / 'python'}"], cwd=work, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    calls = [line.split("\t") for line in log.read_text().splitlines()]
    assert [c for _, c in calls] == ["machine", "run", "publish"], calls
    assert {h for h, _ in calls} == {str(work / "results" / "asv-home")}, calls
    assert (work / "results" / "asv-home" / ".asv-machine.json").is_file()
    assert os.listdir(home) == [], os.listdir(home)


def test_make_test_runs_the_tests_on_two_workers_and_make_test_slow_one_at_a_time(tmp_path):
    """make test: pytest-xdist's two workers, one test file each at a time (TEST_WORKERS=0: none); make test-slow,
    whose verdicts depend on the machine's load, never on workers.  The recipes as make would run them (make -n)."""
    make = shutil.which("make")
    if make is None:
        pytest.skip("no make here: the Makefile's recipe cannot run")
    work, venv = _copy_of_the_makefile(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MAKE", "MFLAGS"))}

    def pytest_line(*argv: str) -> str:
        proc = subprocess.run([make, "-n", *argv, f"VENV={venv}"], cwd=work, env=env, capture_output=True,
                              text=True, timeout=60)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        lines = [ln for ln in proc.stdout.splitlines() if "-m pytest tests" in ln]
        assert len(lines) == 1, proc.stdout
        return lines[0] + " "

    assert " -n 2 --dist loadfile " in pytest_line("test")
    assert " -n 0 " in pytest_line("test", "TEST_WORKERS=0")
    assert " -n " not in pytest_line("test-slow") and "--dist" not in pytest_line("test-slow")


def test_make_asv_preview_serves_the_dashboard_on_loopback_only(tmp_path):
    """The dashboard opened as a file shows "Error fetching content" (issue 46.5): `make asv-preview` serves
    results/html, bound to 127.0.0.1 (`asv preview` binds every interface).  The recipe as make would run it."""
    make = shutil.which("make")
    if make is None:
        pytest.skip("no make here: the Makefile's recipe cannot run")
    work, venv = _copy_of_the_makefile(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MAKE", "MFLAGS"))}
    proc = subprocess.run([make, "-n", "asv-preview", f"VENV={venv}"], cwd=work, env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (line,) = [ln for ln in proc.stdout.splitlines() if "http.server" in ln]
    assert "-m http.server --bind 127.0.0.1 --directory results/html 8080" in line, line


MATPLOTLIB_USER = """
import os, sys
from suite.report import charts as figures
fig = figures.plt.figure()
fig.gca().plot([1, 2], [3, 4])
fig.savefig(sys.argv[1])
print(os.environ.get("MPLCONFIGDIR", ""))
"""


def _clean_env(home: Path, tmp: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MPL", "XDG_"))}
    env.update(HOME=str(home), TMPDIR=str(tmp), PYTHONPATH=str(ROOT))
    return env


def test_drawing_a_figure_writes_nothing_under_home_and_leaves_no_private_directory(tmp_path):
    """matplotlib writes its font cache to ~/.cache/matplotlib (and makes ~/.config/matplotlib) unless MPLCONFIGDIR
    says where: fleetbench's drawing imports it with a private directory, removed once read, and the process's
    environment as it was (a child of fleetbench's, a user's tool, is not pointed there)."""
    home, tmp = tmp_path / "home", tmp_path / "tmp"
    home.mkdir()
    tmp.mkdir()
    proc = subprocess.run([sys.executable, "-c", MATPLOTLIB_USER, str(tmp_path / "f.svg")], cwd=tmp_path,
                          env=_clean_env(home, tmp), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "f.svg").stat().st_size > 0
    assert os.listdir(home) == [], sorted(str(p.relative_to(home)) for p in home.rglob("*"))
    assert os.listdir(tmp) == [], os.listdir(tmp)
    assert proc.stdout.strip() == "", proc.stdout  # MPLCONFIGDIR not left set


def test_a_users_own_mplconfigdir_is_used_as_given(tmp_path):
    home, tmp, mine = tmp_path / "home", tmp_path / "tmp", tmp_path / "mine"
    for d in (home, tmp, mine):
        d.mkdir()
    env = {**_clean_env(home, tmp), "MPLCONFIGDIR": str(mine)}
    proc = subprocess.run([sys.executable, "-c", MATPLOTLIB_USER, str(tmp_path / "f.svg")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == str(mine) and any(n.startswith("fontlist") for n in os.listdir(mine))
    assert os.listdir(home) == [] and os.listdir(tmp) == []


@pytest.mark.heavy  # a real run's rank, then a report (about 15 s): make test-slow
@pytest.mark.timeout(300)
def test_a_run_and_its_report_with_home_an_empty_directory_leave_it_empty(tmp_path):
    """`fleetbench run` (a rank: torch, its caches) and `fleetbench report` (matplotlib) with HOME an empty
    directory: nothing under it afterwards, nothing of fleetbench's left in TMPDIR."""
    home, tmp = tmp_path / "home", tmp_path / "tmp"
    home.mkdir()
    tmp.mkdir()
    env = _clean_env(home, tmp)
    results = tmp_path / "runs.jsonl"
    for argv in (["run", "--case", "mlp/plain", "--size", "tiny", "--nproc", "1", "--steps", "1", "--rounds", "1",
                  "--warmup", "0", "--no-check", "--no-utilization", "--results", str(results)],
                 ["report", str(results), "--out", str(tmp_path / "report")]):
        proc = subprocess.run([sys.executable, "-m", "suite.cli.main", *argv], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=280)
        assert proc.returncode == 0, (argv[0], proc.stderr[-3000:])
    assert (tmp_path / "report" / "summary.md").is_file()
    assert os.listdir(home) == [], sorted(str(p.relative_to(home)) for p in home.rglob("*"))
    assert not [n for n in os.listdir(tmp) if n.startswith("fleetbench-")], os.listdir(tmp)
