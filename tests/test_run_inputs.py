"""`fleetbench run`'s own inputs: results that cannot be written are refused before any rank starts,
a later append failure keeps the records in a fallback file, bounds on time are finite, --resume
names the file it was given."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from suite.cli import run as run_cli
from suite.cli.main import main
from suite.results.records import CaseRecord, read_records
from tests.clitools import ROOT, RUN, one_error
from tests.clitools import cli as _cli
from tests.fakes import fake_record


def _one_error(capsys, words: str) -> None:
    err = capsys.readouterr().err
    assert words in err and err.count("error:") == 1 and "Traceback" not in err, err


@pytest.mark.parametrize("argv,words", [
    (["--timeout", "-1"], "--timeout -1.0: must be a finite number of seconds > 0"),
    (["--timeout", "nan"], "--timeout nan: must be a finite number of seconds > 0"),
    (["--timeout", "inf"], "--timeout inf: must be a finite number of seconds > 0"),
    (["--pg-timeout", "-1"], "--pg-timeout -1.0: must be a finite number of seconds > 0"),
    (["--pg-timeout", "0"], "--pg-timeout 0.0: must be a finite number of seconds > 0"),
])
def test_bounds_on_time_are_finite_and_positive(no_ranks, capsys, argv, words):
    assert main(["run", "--case", "mlp/plain", *argv]) == 2
    _one_error(capsys, words)


def test_a_results_path_under_a_regular_file_is_refused_before_any_rank(no_ranks, capsys, tmp_path):
    blocker = tmp_path / "existing_file"
    blocker.write_text("not a directory\n")
    assert main(["run", "--case", "mlp/plain", "--results", str(blocker / "x.jsonl")]) == 2
    _one_error(capsys, f"--results {blocker / 'x.jsonl'}: cannot be written")
    assert main(["run", "--case", "mlp/plain", "--results", str(tmp_path)]) == 2
    _one_error(capsys, f"--results {tmp_path}: is a directory")


@pytest.mark.parametrize("argv,knob", [
    (["--set", "use_double_buffer=true"], "use_double_buffer=True"),
    (["--set", "reader_num_workers=2"], "reader_num_workers=2"),
    (["--config", "READER_TOML"], "reader_return_uint8=True"),
])
def test_a_reader_knob_is_refused_by_run_naming_the_command_that_reads_it(no_ranks, capsys, tmp_path, argv, knob):
    toml = tmp_path / "reader.toml"
    toml.write_text("reader_return_uint8 = true\n")
    argv = [str(toml) if a == "READER_TOML" else a for a in argv]
    assert main(["run", "--case", "mlp/plain", "--no-check", *argv]) == 2
    _one_error(capsys, f"{knob}: `fleetbench run` does not use this knob")
    assert main(["run", "--case", "mlp/plain", *argv]) == 2
    assert "`fleetbench figures reader` is the command that reads it" in capsys.readouterr().err


@pytest.mark.skipif(shutil.which("chattr") is None, reason="chattr is not installed: the immutable-directory case "
                                                           "needs it (root ignores plain permission bits)")
def test_an_immutable_results_directory_is_refused_before_any_rank(no_ranks, capsys, tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    if subprocess.run(["chattr", "+i", str(locked)], capture_output=True).returncode != 0:
        pytest.skip("this filesystem does not support the immutable attribute (chattr +i failed)")
    try:
        assert main(["run", "--case", "mlp/plain", "--results", str(locked / "runs.jsonl")]) == 2
        _one_error(capsys, f"--results {locked / 'runs.jsonl'}: cannot be written")
        assert os.listdir(locked) == []
    finally:
        subprocess.run(["chattr", "-i", str(locked)], check=True)


def test_resume_of_a_missing_file_names_the_file_given(no_ranks, capsys, tmp_path):
    missing = tmp_path / "nowhere" / "runs.jsonl"
    assert main(["run", "--case", "mlp/plain", "--resume", str(missing)]) == 2
    _one_error(capsys, f"--resume {missing}: no such results file")


def test_an_append_that_fails_mid_run_keeps_the_records_in_a_fallback_file(monkeypatch, capsys, tmp_path):
    from suite.results import records

    target = str(tmp_path / "runs.jsonl")
    real = records.append_record

    def failing(path, rec):
        if path == target:
            raise OSError(28, "No space left on device")
        return real(path, rec)

    monkeypatch.setattr(records, "append_record", failing)
    monkeypatch.setattr(run_cli, "_FALLBACK", {})
    recs = [CaseRecord(f"mlp/{v}", "mlp", 2, {}, "r1") for v in ("plain", "overlap")]
    for rec in recs:
        run_cli._append(target, rec)
    err = capsys.readouterr().err
    assert err.count("cannot append to") == 1 and "No space left on device" in err, err
    fallback = err.split("records of this run go to ")[1].split()[0]
    try:
        assert [r.case for r in read_records(fallback)] == ["mlp/plain", "mlp/overlap"]
        assert not os.path.exists(target)
    finally:
        os.unlink(fallback)


# ---- limits, write targets, interrupts -----------------------------------------------------------------------------
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
    one_error(code, err, "open-file limit is 20", "ulimit -n 256")
    limits["now"] = (20, 4096)  # the soft limit alone is low: raised, the command goes on (to --list here)
    code, out, err = _cli(["run", "--case", "mlp/plain", "--size", "tiny", "--list"], capsys)
    assert code == 0 and limits["now"] == (4096, 4096) and "mlp/plain" in out, err


def test_results_through_a_symlink_is_refused_and_its_target_not_created(tmp_path, capsys, no_ranks):
    outside = tmp_path / "outside" / "stolen.jsonl"
    (tmp_path / "outside").mkdir()
    (tmp_path / "results").mkdir()
    os.symlink(outside, tmp_path / "results" / "runs.jsonl")  # dangling
    code, _, err = _cli(RUN + ["--results", tmp_path / "results" / "runs.jsonl"], capsys)
    one_error(code, err, "symbolic link")
    assert not outside.exists()


@pytest.mark.parametrize("make", ["traces_file", "dev_full", "fifo"])
def test_every_write_target_is_checked_before_any_rank(tmp_path, capsys, no_ranks, bounded, make):
    results = tmp_path / "runs.jsonl"
    argv = RUN + ["--results", results]
    if make == "traces_file":
        (tmp_path / "traces").write_text("not a directory")
        argv += ["--trace-steps", "2"]
        words = ["traces", "not a directory"]
    elif make == "dev_full":
        argv[-1] = "/dev/full"
        words = ["/dev/full", "not a regular file"]
    else:
        os.mkfifo(results)
        words = ["not a regular file"]
    code, _, err = _cli(argv, capsys)
    one_error(code, err, *words)


def test_a_failed_append_goes_to_a_fallback_file_and_says_so(tmp_path, monkeypatch, capsys):
    from suite.cli import run
    from suite.outputs import ShortWrite
    from suite.results import records
    from suite.results.records import read_records

    path = str(tmp_path / "runs.jsonl")
    real = records.append_record

    def full(target, rec):
        if target == path:
            raise ShortWrite(28, "only 10 of 900 bytes written")
        real(target, rec)

    monkeypatch.setattr(records, "append_record", full)
    monkeypatch.setattr(run, "_FALLBACK", {})
    dest = run._append(path, fake_record())
    err = capsys.readouterr().err
    try:
        assert dest != path and dest in err and path in err
        assert [r.case for r in read_records(dest)] == ["mlp/plain"]
    finally:
        os.unlink(dest)


@pytest.mark.parametrize("finished", [0, 1])
def test_sigint_keeps_what_finished_and_says_so_truthfully(tmp_path, monkeypatch, capsys, finished):
    import suite.runner
    import suite.runtime

    class Launcher:
        def __init__(self, *a, **k):
            pass

        def close(self):
            pass

    def run(self, selected, progress=None):
        for _ in range(finished):
            yield [fake_record(run_id=self.run_id)]
        raise KeyboardInterrupt

    monkeypatch.setattr(suite.runtime, "RankPool", Launcher)
    monkeypatch.setattr(suite.runner.CaseRunner, "run", run)
    results = tmp_path / "runs.jsonl"
    code, _, err = _cli(RUN + ["--results", results, "--no-utilization"], capsys)
    assert code == 130
    if finished:
        assert f"1 record(s) of finished cases kept in {results}" in err
        assert len(results.read_text().splitlines()) == 1
    else:
        assert "nothing was written" in err and not results.exists()


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
              "from tests.fakes import fake_record\n"
              "for case in ('mlp/plain', 'mlp/overlap'):\n"
              "    print(run._append(sys.argv[1], fake_record(case=case)), flush=True)\n")
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
