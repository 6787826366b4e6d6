"""`fleetbench run`'s own inputs: results that cannot be written are refused before any rank starts,
a later append failure keeps the records in a fallback file, bounds on time are finite, --resume
names the file it was given."""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from suite.cli import run as run_cli
from suite.cli.main import main
from suite.results.records import CaseRecord, read_records


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
