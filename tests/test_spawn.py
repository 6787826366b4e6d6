"""Every spawned process (suite/runtime/spawn.py): the current directory last on its path, so a file there named
as a module runs nowhere, and a rank reaches its entry point without importing torch."""
from __future__ import annotations

import os
import subprocess
import sys

from tests.clitools import ROOT
from tests.fakes import GOOD_FACTORY


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


def test_a_spawned_rank_reaches_its_entry_point_without_importing_torch():
    """The parent-death signal is set first thing in the rank's entry point; what the rank imports to find
    that entry point must not take seconds (torch), or a parent killed meanwhile leaves it running."""
    import subprocess
    import sys

    code = "import sys, suite.runtime.pool; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(ROOT)},
                         capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "False", out.stdout + out.stderr
