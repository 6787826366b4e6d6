"""Issue 36, item 1: one way to write an output (suite/outputs.py), used by every command.

Nothing that is not ours is replaced (a FIFO, a device node, a socket, a link or a directory where a file is
written stays what it was, and the command says so in one line); the temporary file beside a write is created
exclusively and never through a link; nothing is written through a link anywhere under an output directory
(report traces, the asv dashboard's vendored assets); files are 0644; inputs where a file is expected never block.
Device nodes are ``mknod`` copies of /dev/null in the test's temporary directory (root only), never a path under
/dev.
"""
from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import pytest

from suite.outputs import OutputDir, OutputError, append_whole, open_input, write_atomic
from tests.clitools import bounded_by
from tests.clitools import cli as _cli_full
from tests.clitools import one_error as _one_error


@pytest.fixture
def bounded():
    """In-process calls that must not block: a hang becomes a failure after 20 s."""
    with bounded_by(20):
        yield


def _cli(argv, capsys) -> tuple[int, str]:
    code, _, err = _cli_full(argv, capsys)
    return code, err


def _device_copy(tmp: Path, name: str = "null-copy") -> Path:
    """A character device node equal to /dev/null, made in the test's own directory (needs root)."""
    path = tmp / name
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except (PermissionError, OSError) as exc:
        pytest.skip(f"cannot make a device node here ({exc}): mknod needs root (CAP_MKNOD); the FIFO and socket "
                    f"cases of this test still run")
    return path


def _special(tmp: Path, kind: str) -> Path:
    """A path of ``kind`` (fifo, device, socket, link, dir) in ``tmp``."""
    path = tmp / f"target-{kind}"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        path = _device_copy(tmp, path.name)
    elif kind == "socket":
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(path))
        s.close()
    elif kind == "link":
        (tmp / "link-target").write_text("untouched")
        os.symlink(tmp / "link-target", path)
    else:
        path.mkdir()
    return path


def _kind(path: Path) -> int:
    return stat.S_IFMT(os.lstat(path).st_mode)


# ---- the writer itself ---------------------------------------------------------------------------------------
def test_write_atomic_replaces_whole_or_leaves_the_old_file(tmp_path, monkeypatch):
    """A failure at the rename leaves the previous file as it was and no temporary file behind."""
    out = tmp_path / "summary.md"
    write_atomic(str(out), "first\n")
    assert out.read_text() == "first\n"
    write_atomic(str(out), "second\n")
    assert out.read_text() == "second\n"

    def refuse(src, dst, **kw):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(OSError, match="No space"):
        write_atomic(str(out), "third, never whole\n")
    assert out.read_text() == "second\n" and sorted(p.name for p in tmp_path.iterdir()) == ["summary.md"]


@pytest.mark.parametrize("kind", ["fifo", "device", "socket", "link", "dir"])
def test_write_atomic_refuses_what_is_not_a_regular_file_and_leaves_it(tmp_path, bounded, kind):
    path = _special(tmp_path, kind)
    before = _kind(path)
    with pytest.raises(OutputError) as info:
        write_atomic(str(path), "x")
    assert str(path) in str(info.value) and _kind(path) == before
    with OutputDir(str(tmp_path)) as out, pytest.raises(OutputError):
        out.write(path.name, "x")
    assert _kind(path) == before
    if kind == "link":
        assert (tmp_path / "link-target").read_text() == "untouched"
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_a_link_planted_under_a_temporary_name_is_never_written_through(tmp_path, monkeypatch):
    """The old scheme's temp name (PATH.tmpPID) sprayed with links, and a link planted under the very name the
    writer draws first: the link's target stays as it was, the write lands whole in the file asked for."""
    import secrets

    victim = tmp_path / "victim"
    victim.write_text("precious")
    out = tmp_path / "summary.md"
    for pid in range(max(2, os.getpid() - 50), os.getpid() + 50):
        os.symlink(victim, f"{out}.tmp{pid}")
    drawn = iter(["planted", "fresh"])
    monkeypatch.setattr(secrets, "token_hex", lambda n=None: next(drawn))
    os.symlink(victim, tmp_path / ".summary.md.planted.tmp")
    write_atomic(str(out), "the report\n")
    assert victim.read_text() == "precious" and out.read_text() == "the report\n"
    assert os.path.islink(tmp_path / ".summary.md.planted.tmp")  # left as found, never reused


def test_written_files_are_0644_and_folders_0755(tmp_path):
    old = os.umask(0o022)
    try:
        write_atomic(str(tmp_path / "a.md"), "x")
        with OutputDir(str(tmp_path / "out")) as out:
            out.write("deep/er/b.json", "{}")
            out.append("c.md", "line\n")
        append_whole(str(tmp_path / "d.jsonl"), b"{}\n")
    finally:
        os.umask(old)
    for f in ("a.md", "out/deep/er/b.json", "out/c.md", "d.jsonl"):
        assert stat.S_IMODE(os.stat(tmp_path / f).st_mode) == 0o644, f
    assert stat.S_IMODE(os.stat(tmp_path / "out" / "deep").st_mode) == 0o755


def test_output_dir_refuses_a_link_at_any_depth_and_writes_nothing_outside(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    out_path = tmp_path / "out"
    (out_path / "traces").mkdir(parents=True)
    os.symlink(outside, out_path / "traces" / "1")
    with OutputDir(str(out_path)) as out:
        with pytest.raises(OutputError, match="symbolic link"):
            out.write("traces/1/x.json", "{}")
        with pytest.raises(OutputError, match="not one component"):
            out.write("traces/../../outside/x.json", "{}")
        out.write("traces/0/x.json", "{}")  # beside the link, fine
    assert os.listdir(outside) == []
    os.symlink(outside, tmp_path / "linked-out")
    with pytest.raises(OutputError, match="symbolic link"):
        OutputDir(str(tmp_path / "linked-out"))


@pytest.mark.parametrize("kind", ["fifo", "device", "link"])
def test_append_whole_refuses_without_blocking(tmp_path, bounded, kind):
    path = _special(tmp_path, kind)
    before = _kind(path)
    with pytest.raises(OutputError):
        append_whole(str(path), b"{}\n")
    assert _kind(path) == before


@pytest.mark.parametrize("kind", ["fifo", "device", "dir"])
def test_open_input_refuses_without_blocking(tmp_path, bounded, kind):
    from suite.outputs import InputError

    path = _special(tmp_path, kind)
    with pytest.raises(InputError, match="expected a regular file"):
        open_input(str(path))


# ---- every command's outputs ---------------------------------------------------------------------------------
def _asv_machine(tmp: Path) -> Path:
    (tmp / "a" / "m").mkdir(parents=True)
    (tmp / "a" / "m" / "machine.json").write_text("{}")
    return tmp / "a"


def _records(tmp: Path) -> Path:
    from tests.fakes import fake_record as _record
    from tests.fakes import write_records as _write

    return _write(tmp / "runs.jsonl", _record())


WRITERS = {  # command line with TARGET where the output goes; the words of the one error line
    "history --markdown": (lambda t: ["history", "--results", _asv_machine(t), "--machine", "m", "--markdown"],
                           ["--markdown"]),
    "figures --save": (lambda t: ["figures", "host", "--save"], ["--save"]),
    "figures --out": (lambda t: ["figures", "host", "--out"], ["--out"]),
    "compare --markdown": (lambda t: ["compare", _records(t), _records(t), "--markdown"], ["--markdown"]),
    "nightly --last-good": (lambda t: ["nightly", "--plan", "--device", "cpu", "--out", t / "night", "--last-good"],
                            ["--last-good"]),
}


@pytest.mark.parametrize("kind", ["fifo", "device"])
@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_no_command_turns_a_fifo_or_a_device_node_into_a_file(tmp_path, capsys, no_ranks, bounded, monkeypatch,
                                                              writer, kind):
    """The probe: `mkdir -p a/m && echo '{}' > a/m/machine.json && mkfifo n && fleetbench history --results a
    --machine m --markdown n; stat -c %F n` said `regular file`; `figures --save` replaced a device node."""
    target = _special(tmp_path, kind)
    before = _kind(target)
    make, words = WRITERS[writer]
    code, err = _cli([*make(tmp_path), target], capsys)
    _one_error(code, err, *words, str(target))
    assert _kind(target) == before, f"{writer} replaced the {kind}"


def test_history_refuses_a_fifo_among_the_asv_results_without_blocking(tmp_path, capsys, bounded):
    results = _asv_machine(tmp_path)
    os.mkfifo(results / "m" / "0123abcd-existing.json")
    code, err = _cli(["history", "--results", results, "--machine", "m"], capsys)
    assert code == 2 and "0123abcd-existing.json" in err and "FIFO" in err, err
    os.unlink(results / "m" / "0123abcd-existing.json")
    os.unlink(results / "m" / "machine.json")
    os.mkfifo(results / "m" / "machine.json")
    code, err = _cli(["history", "--results", results, "--machine", "m"], capsys)
    assert code == 2 and "machine.json" in err and "FIFO" in err, err


def test_nightly_refuses_a_fifo_as_its_last_good_commit_before_anything_runs(tmp_path, capsys, bounded):
    os.mkfifo(tmp_path / "commit")
    code, err = _cli(["nightly", "--plan", "--device", "cpu", "--out", tmp_path / "night", "--last-good",
                      tmp_path / "commit"], capsys)
    _one_error(code, err, "--last-good", "FIFO")


def test_figures_load_of_a_fifo_says_fifo_not_no_such_file(tmp_path, capsys, no_ranks, bounded):
    os.mkfifo(tmp_path / "raw.json")
    code, err = _cli(["figures", "host", "--load", tmp_path / "raw.json"], capsys)
    _one_error(code, err, "--load", "FIFO")
    assert "no such file" not in err


def test_report_writes_no_trace_through_a_link_nested_in_its_out_directory(tmp_path, capsys):
    """The probe: `report` with --out holding a previous report whose traces/1 is a link to a folder outside."""
    from tests.fakes import fake_record as _record
    from tests.fakes import write_records as _write

    files = []
    for name in ("a", "b"):
        d = tmp_path / name
        (d / "traces" / "r1").mkdir(parents=True)
        (d / "traces" / "r1" / "mlp_plain@2.json").write_text('{"traceEvents": []}')
        files.append(_write(d / "runs.jsonl", _record(world=2 if name == "a" else 4,
                                                      trace_file="traces/r1/mlp_plain@2.json")))
    outside = tmp_path / "outside"
    outside.mkdir()
    out = tmp_path / "out"
    (out / "traces").mkdir(parents=True)
    (out / "report_data.json").write_text("{}")  # a previous report: allowed without --force
    os.symlink(outside, out / "traces" / "1")
    code, err = _cli(["report", *files, "--out", out], capsys)
    assert code == 0, err
    assert os.listdir(outside) == [], "a trace was written through the link"
    assert os.path.islink(out / "traces" / "1") and (out / "traces" / "0" / "mlp_plain@2.json").is_file()


@pytest.mark.parametrize("plant", ["vendor-link", "asset-link", "nested-link"])
def test_asv_offline_writes_nothing_through_a_link_inside_its_directory(tmp_path, capsys, plant):
    """The probe: a file outside DIR overwritten with jQuery through DIR/vendor/jquery.min.js, and a `vendor` link
    that copied every asset elsewhere."""
    html = tmp_path / "html"
    html.mkdir()
    (html / "index.html").write_text('<script src="https://code.jquery.com/jquery-3.3.1.min.js"></script>')
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "mine.txt").write_text("mine")
    if plant == "vendor-link":
        os.symlink(outside, html / "vendor")
    elif plant == "asset-link":
        (html / "vendor").mkdir()
        os.symlink(outside / "mine.txt", html / "vendor" / "jquery.min.js")
    else:
        (html / "vendor" / "bootstrap").mkdir(parents=True)
        os.symlink(outside, html / "vendor" / "bootstrap" / "js")
    code, err = _cli(["asv-offline", html], capsys)
    _one_error(code, err, "symbolic link")
    assert sorted(os.listdir(outside)) == ["mine.txt"] and (outside / "mine.txt").read_text() == "mine"


def test_output_problem_is_the_one_check_of_a_file_or_a_directory_before_anything_runs(tmp_path):
    """`run --results` (tried for real: ``probe``), `run --trace-steps`'s directory and the nightly's `--out` are
    checked by this one rule, not each by a rule of its own."""
    from suite.outputs import output_problem

    blocker = tmp_path / "file"
    blocker.write_text("x")
    os.symlink(tmp_path, tmp_path / "link")
    assert output_problem(str(blocker), "directory") == "exists and is not a directory"
    assert output_problem(str(tmp_path / "link"), "directory") == "is a symbolic link; give the directory itself"
    assert output_problem(str(tmp_path / "new" / "deeper"), "directory") is None  # made by its writer
    assert output_problem(str(tmp_path), probe=True) == "is a directory; give a file name"
    assert output_problem(str(blocker / "runs.jsonl"), probe=True).startswith("cannot be written (")
    assert output_problem(str(tmp_path / "made" / "runs.jsonl"), probe=True) is None
    assert (tmp_path / "made").is_dir() and os.listdir(tmp_path / "made") == []  # its directory made, no file left
