"""`fleetbench doctor`: the whole self-check on CPU (every CPU item passes, CUDA items say why they do not
apply, under two minutes), and its failure paths (a failing, raising or hanging item fails the run)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from suite import doctor as D

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ALL_ITEMS = ["platform", "allreduce on each communicator", "half-precision allreduce", "bucketed overlap",
             "hierarchical overlap", "reader device copy", "CUDA event timing vs host clock", "NVML",
             "memory window", "torchrun error path"]


@pytest.fixture(scope="module")
def cpu_report():
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "suite.cli.main", "doctor", "--device", "cpu", "--json"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)
    return proc, time.monotonic() - t0


def test_doctor_on_cpu_passes_every_cpu_item(cpu_report):
    proc, _elapsed = cpu_report
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-3000:]
    rep = json.loads(proc.stdout)
    assert rep["ok"] is True and rep["platform"] == "cpu/gloo" and rep["nproc"] == 4
    # its duration (under 2 minutes on a quiet machine) is not asserted: the subprocess timeout bounds a hang
    items = {i["item"].split(" (")[0]: i for i in rep["items"]}
    assert list(items) == ALL_ITEMS
    for name in ("CUDA event timing vs host clock", "NVML"):
        assert items[name]["status"] == D.NA and items[name]["numbers"], items[name]
    for name, item in items.items():
        if name not in ("CUDA event timing vs host clock", "NVML", "memory window"):
            assert item["status"] == D.PASS, item
    assert items["memory window"]["status"] in (D.PASS, D.NA)
    assert "0 wrong of" in items["allreduce on each communicator"]["numbers"]
    assert "2 node(s) of 2" in items["hierarchical overlap"]["numbers"]
    assert "rank 1's error reported" in items["torchrun error path"]["numbers"]
    assert rep["versions"]["torch"] and rep["versions"]["python"]


def _ok(ctx):
    return D.Item("fine", D.PASS, "1 = 1")


def _wrong(ctx):
    return D.Item("sums", D.FAIL, "3 wrong of 1024 elements")


def _raises(ctx):
    raise RuntimeError("no such thing\nlast line says why")


def _hangs(ctx):
    from suite.runtime.probes import sleep_then_allreduce

    ctx.call(sleep_then_allreduce, dict(seconds=20.0, sleeper=1), timeout=2.0)  # rank 0 waits in the allreduce
    return D.Item("never", D.PASS, "")


def test_a_failing_raising_or_hanging_item_fails_the_run():
    seen = []
    t0 = time.monotonic()
    rep = D.run_doctor(nproc=2, device="cpu", items=[_ok, _wrong, _raises, _hangs], on_item=seen.append)
    assert time.monotonic() - t0 < 60
    assert [i.status for i in rep.items] == [D.PASS, D.FAIL, D.FAIL, D.FAIL] and not rep.ok
    assert rep.items[2].item == "_raises" and "no such thing … last line says why" in \
        rep.items[2].numbers
    assert "RankFailure" in rep.items[3].numbers and "within 2 s" in rep.items[3].numbers, rep.items[3]
    assert seen == rep.items
    table = D.format_table(rep)
    assert table.splitlines()[0].startswith("fleetbench doctor: cpu/gloo, 2 ranks; torch ")
    assert "FAIL: sums, _raises, _hangs" in table and "3 wrong of 1024 elements" in table
    assert json.loads(D.to_json(rep))["ok"] is False


def test_cli_exit_status_follows_the_report(monkeypatch, capsys):
    from suite.cli.main import main

    monkeypatch.setattr(D, "ITEMS", [_ok])
    assert main(["doctor", "--device", "cpu", "--nproc", "1"]) == 0
    assert "all checks passed" in capsys.readouterr().out
    monkeypatch.setattr(D, "ITEMS", [_ok, _wrong])
    assert main(["doctor", "--device", "cpu", "--nproc", "1", "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["ok"] is False
