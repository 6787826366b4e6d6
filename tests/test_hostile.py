"""Issue 26: the second round of hostile probes, each kept as a regression test.

Writes stay inside the directories given (a run id or case name is a name, never a path; links are
refused where they would lead out; a user's directory is not overwritten); an append is all or
nothing; inputs are read with limits (regular files only, size, nesting, digits); terminal and
Markdown output escape control characters.  Everything here is fast and deterministic; the kill
sweep is marked ``statistical`` (make test-slow).
"""
from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from tests.clitools import alive as _alive
from tests.clitools import bounded_by
from tests.clitools import cli as _cli
from tests.clitools import one_error as _one_error

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def bounded():
    """In-process calls that must not block: a hang becomes a failure after 30 s."""
    with bounded_by(30):
        yield


def _record(case="mlp/plain", world=2, run_id="r1", **metrics):
    from suite.results.records import CaseRecord

    base = {"samples_per_s": 100.0, "step_time_s": {"median": 0.02}, "step_times_s": [0.02, 0.021, 0.019],
            "window_s": [0.1, 0.11, 0.1], "steps_per_window": 5}
    return CaseRecord(case, case.split("/")[0], world, {"data_parallel": "suite"}, run_id, verdict="pass",
                      metrics={**base, **metrics}, metadata={"torch": "2.4.0", "cpu": "test cpu"})


def _write(path: Path, *records) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(r.to_json() + "\n" for r in records))
    return path


@pytest.fixture
def no_ranks(monkeypatch):
    """Fails the test if a rank pool starts: every probe here must be refused before any rank."""
    import suite.runtime

    class NoRanks:
        def __init__(self, *a, **k):
            raise AssertionError("a rank pool was started despite bad input")

    monkeypatch.setattr(suite.runtime, "RankPool", NoRanks)


RUN = ["run", "--case", "mlp/plain", "--size", "tiny", "--device", "cpu"]


# ---- 1. writes confined ----------------------------------------------------------------------
@pytest.mark.parametrize("run_id", ["../../escaped", "/tmp/abs", "a/b", ".hidden"])
def test_resume_refuses_a_run_id_that_is_a_path(tmp_path, capsys, no_ranks, run_id):
    results = _write(tmp_path / "results" / "runs.jsonl", _record(run_id=run_id))
    code, _, err = _cli(RUN + ["--resume", results, "--trace-steps", "1"], capsys)
    _one_error(code, err, "run id", "not a name")
    assert sorted(os.listdir(tmp_path)) == ["results"] and os.listdir(tmp_path / "results") == ["runs.jsonl"]


def test_results_through_a_symlink_is_refused_and_its_target_not_created(tmp_path, capsys, no_ranks):
    outside = tmp_path / "outside" / "stolen.jsonl"
    (tmp_path / "outside").mkdir()
    (tmp_path / "results").mkdir()
    os.symlink(outside, tmp_path / "results" / "runs.jsonl")  # dangling
    code, _, err = _cli(RUN + ["--results", tmp_path / "results" / "runs.jsonl"], capsys)
    _one_error(code, err, "symbolic link")
    assert not outside.exists()


def test_append_record_does_not_follow_a_symlink(tmp_path):
    from suite.results.records import append_record

    outside = tmp_path / "outside.jsonl"
    os.symlink(outside, tmp_path / "runs.jsonl")
    with pytest.raises(OSError):
        append_record(str(tmp_path / "runs.jsonl"), _record())
    assert not outside.exists()


def test_report_refuses_a_hard_linked_trace(tmp_path, capsys):
    from suite.report.page import build_report

    secret = tmp_path / "secret.json"
    secret.write_text('{"TOP SECRET": 1}')
    (tmp_path / "results" / "traces" / "r1").mkdir(parents=True)
    os.link(secret, tmp_path / "results" / "traces" / "r1" / "plain@2.json")
    data = build_report([_record(trace_file="traces/r1/plain@2.json")], str(tmp_path / "out"),
                        str(tmp_path / "results"))
    assert data["traces"] == [] and not (tmp_path / "out" / "traces").exists()
    assert "hard links" in capsys.readouterr().err


def test_runner_trace_is_not_written_through_a_planted_symlink(tmp_path, monkeypatch):
    from suite.run_spec import ResolvedCase, RunFacts, RunOptions
    from suite.runner import CaseRunner

    class Launcher:
        def run(self, *a, **k):
            return [{"events": [], "rank": 0}]

    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "results" / "traces").mkdir(parents=True)
    os.symlink(outside, tmp_path / "results" / "traces" / "run1")
    runner = CaseRunner(Launcher(), 2, RunOptions(trace_steps=1), run_id="run1",
                        facts=RunFacts(results_dir=str(tmp_path / "results")))
    rec = _record()
    from suite.cases import CASES
    from suite.config import StrategyConfig

    case = next(c for c in CASES if c.name == "mlp/plain")
    import suite.runner

    monkeypatch.setattr(suite.runner, "chrome_trace", lambda answers, title="": {"traceEvents": []})
    runner.trace(ResolvedCase(case, StrategyConfig.from_dict(case.config), None), rec)
    assert os.listdir(outside) == [] and rec.metrics.trace_file is None
    assert rec.metrics.trace_error is not None and "outside" in rec.metrics.trace_error


def test_report_out_refuses_a_users_directory_a_file_and_the_results_directory(tmp_path, capsys):
    results = _write(tmp_path / "results" / "runs.jsonl", _record())
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "index.html").write_text("my own page")
    code, _, err = _cli(["report", results, "--out", mine], capsys)
    _one_error(code, err, "not empty", "--force")
    assert (mine / "index.html").read_text() == "my own page"
    afile = tmp_path / "afile"
    afile.write_text("x")
    code, _, err = _cli(["report", results, "--out", afile], capsys)
    _one_error(code, err, "not a directory")
    code, _, err = _cli(["report", results, "--out", tmp_path / "results"], capsys)
    _one_error(code, err, "results directory itself")
    assert os.listdir(tmp_path / "results") == ["runs.jsonl"]


def test_report_with_two_results_files_keeps_their_traces_apart(tmp_path, capsys):
    files = []
    for name, payload in (("a", '{"from": "A"}'), ("b", '{"from": "B"}')):
        d = tmp_path / name
        (d / "traces" / "r1").mkdir(parents=True)
        (d / "traces" / "r1" / "mlp_plain@2.json").write_text(payload)
        files.append(_write(d / "runs.jsonl", _record(world=2 if name == "a" else 4,
                                                      trace_file="traces/r1/mlp_plain@2.json")))
    code, _, err = _cli(["report", *files, "--out", tmp_path / "out"], capsys)
    assert code == 0, err
    copied = sorted(p.read_text() for p in (tmp_path / "out" / "traces").rglob("*.json"))
    assert copied == ['{"from": "A"}', '{"from": "B"}']


# ---- 2. appends all or nothing; every write target checked first; SIGINT ------------------------
def test_a_short_write_leaves_the_results_file_whole(tmp_path, monkeypatch):
    from suite.outputs import ShortWrite
    from suite.results.records import append_record, read_records

    path = tmp_path / "runs.jsonl"
    append_record(str(path), _record(case="mlp/first"))
    before = path.read_bytes()
    real = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: real(fd, data[: len(data) // 2]))
    with pytest.raises(ShortWrite):
        append_record(str(path), _record(case="mlp/second"))
    monkeypatch.setattr(os, "write", real)
    assert path.read_bytes() == before
    assert [r.case for r in read_records(str(path))] == ["mlp/first"]


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
    dest = run._append(path, _record())
    err = capsys.readouterr().err
    try:
        assert dest != path and dest in err and path in err
        assert [r.case for r in read_records(dest)] == ["mlp/plain"]
    finally:
        os.unlink(dest)


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
    _one_error(code, err, *words)


def test_compare_markdown_to_dev_full_is_one_error(tmp_path, capsys):
    a = _write(tmp_path / "a.jsonl", _record())
    code, _, err = _cli(["compare", a, a, "--markdown", "/dev/full"], capsys)
    _one_error(code, err, "--markdown", "/dev/full")


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
            yield [_record(run_id=self.run_id)]
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


# ---- 3. inputs with limits ---------------------------------------------------------------------
def _inputs(tmp: Path) -> dict:
    fifo = tmp / "fifo"
    os.mkfifo(fifo)
    deep = tmp / "deep.jsonl"
    deep.write_text("[" * 100_000 + "\n")
    nested = tmp / "nested.jsonl"  # valid JSON and within Python's recursion limit, but no record nests so
    nested.write_text(json.dumps(json.loads(_record().to_json()) | {"describe": json.loads("[" * 200 + "]" * 200)})
                      + "\n")
    digits = tmp / "digits.jsonl"
    digits.write_text(_record().to_json().replace('"world_size": 2', '"world_size": ' + "9" * 5000) + "\n")
    wide = tmp / "wide.jsonl"
    wide.write_text(_record().to_json().replace('"world_size": 2', '"world_size": ' + "9" * 400) + "\n")
    many = tmp / "many.jsonl"
    many.write_text(_record(window_s=[0.1] * 200_000).to_json() + "\n")
    return {"fifo": (fifo, "FIFO"), "zero": ("/dev/zero", "device"), "deep": (deep, "nested deeper"),
            "nested": (nested, "nested deeper"), "digits": (digits, "digits"), "wide": (wide, "world_size"),
            "many": (many, "window_s")}


@pytest.mark.parametrize("command", ["report", "compare", "resume"])
def test_hostile_results_files_are_one_error_without_blocking(tmp_path, capsys, no_ranks, bounded, command):
    good = _write(tmp_path / "good.jsonl", _record())
    for name, (path, word) in _inputs(tmp_path).items():
        if command != "compare" and name == "many":
            continue  # only compare reads the samples
        argv = {"report": ["report", path, "--out", tmp_path / "out"], "compare": ["compare", good, path],
                "resume": RUN + ["--resume", path]}[command]
        code, _, err = _cli(argv, capsys)
        _one_error(code, err, word)


@pytest.mark.parametrize("content,word", [(None, "FIFO"), ("/dev/zero", "not a regular file"),
                                          ("x = " + "9" * 5000, "digits"), ("x = " + "[" * 100_000, "deeply")])
def test_hostile_config_files_are_one_error_without_blocking(tmp_path, capsys, no_ranks, bounded, content, word):
    path = tmp_path / "c.toml"
    if content is None:
        os.mkfifo(path)
    elif content.startswith("/dev/"):
        path = Path(content)
    else:
        path.write_text(content + "\n")
    code, _, err = _cli(RUN + ["--config", path], capsys)
    _one_error(code, err, word)


# ---- 6. escaping -----------------------------------------------------------------------------
HOSTILE = "mlp/\x1b[31mred\x1b[0m\u202eevil\x07"


def test_control_characters_and_bidi_overrides_are_escaped_in_markdown_and_on_the_terminal(tmp_path, capsys):
    from suite.report.page import md_text

    for text in (md_text(HOSTILE),):
        assert "\x1b" not in text and "\u202e" not in text and "\x07" not in text and "\\u001b" in text
    results = _write(tmp_path / "runs.jsonl", _record(case=HOSTILE))
    code, out, err = _cli(["compare", results, results], capsys)
    assert "\x1b" not in out + err and "\u202e" not in out + err and "\\u202e" in out
    code, out, err = _cli(["report", results, "--out", tmp_path / "out"], capsys)
    assert code == 0, err
    md = (tmp_path / "out" / "summary.md").read_text()
    assert "\x1b" not in md and "\u202e" not in md and "\\u202e" in md


# ---- 4. processes --------------------------------------------------------------------------------
def _kill_in_rendezvous(tmp_path: Path, *flags: str) -> tuple[list[int], dict]:
    """Start the rendezvous parent, wait until both ranks are inside their store (blocked in C, holding the
    GIL), SIGKILL the parent; the ranks still alive 3 s later, and the parent's report."""
    import subprocess
    import sys
    import time

    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "scripts" / "rendezvous_parent.py"), *flags],
                            stdout=subprocess.PIPE, text=True, env=env, cwd=str(ROOT))
    info: dict = {}
    try:
        info = json.loads(proc.stdout.readline())  # type: ignore[union-attr]
        deadline = time.monotonic() + 300
        inside = [f"{info['store']}.{r}" for r in range(2)]
        while not all(map(os.path.exists, inside)) and time.monotonic() < deadline:  # a condition, not a timing
            time.sleep(0.1)
        assert all(map(os.path.exists, inside)), "the ranks never reached their store"
        time.sleep(0.5)
        assert all(_alive(p) for p in info["ranks"]), "a rank died before its parent"
        os.kill(info["parent"], signal.SIGKILL)
        proc.wait(timeout=30)
        deadline = time.monotonic() + 3.0
        while any(_alive(p) for p in info["ranks"]) and time.monotonic() < deadline:
            time.sleep(0.05)
        return [p for p in info["ranks"] if _alive(p)], info
    finally:
        for p in info.get("ranks", []):
            if _alive(p):
                os.kill(p, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_ranks_killed_in_the_rendezvous_die_with_their_parent_and_the_next_pool_removes_the_store(tmp_path,
                                                                                                  monkeypatch):
    import tempfile

    from suite.runtime.pool import owned_tempdir, remove_stale

    survivors, info = _kill_in_rendezvous(tmp_path)
    assert not survivors, f"ranks {survivors} outlived their parent by 3 s while in the rendezvous"
    # the parent's lock died with it: the next pool's sweep removes its store directory, not a live one's
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    live, fd = owned_tempdir("fleetbench-store-")
    store = os.path.dirname(info["store"])
    try:
        # a rank's watching thread may have removed it already (it races the kernel's SIGKILL); else the sweep does
        assert set(remove_stale()) <= {store} and not os.path.exists(store)
        assert os.path.isdir(live) and sorted(os.listdir(tmp_path)) == [os.path.basename(live)]
    finally:
        os.close(fd)
    assert remove_stale() == [live] and os.listdir(tmp_path) == []


@pytest.mark.parametrize("argv,words", [
    (RUN + ["--nproc", "100000"], ["--nproc 100000", "local ranks"]),
    (RUN + ["--pg-timeout", "1e300"], ["--pg-timeout", "a week"]),
    (RUN + ["--steps", "10000000000"], ["--steps"]),
    (["ab", "HEAD", "HEAD", "--nproc", "1000"], ["--nproc 1000"]),
    (["ab", "HEAD", "HEAD", "--batch", "-3"], ["--batch -3"]),
    (["ab", "HEAD", "HEAD", "--timeout", "nan"], ["--timeout nan"]),
    (["ab", "HEAD", "HEAD", "--timeout", "0"], ["--timeout 0"]),
    (["ab", "HEAD", "HEAD", "--seed", "-1"], ["--seed -1"]),
    (["ab", "HEAD", "HEAD", "--python", "/nonexistent"], ["--python", "/nonexistent"]),
    (["doctor", "--nproc", "100000"], ["--nproc 100000"]),
    (["doctor", "--hang-timeout", "nan"], ["--hang-timeout nan"]),
    (["doctor", "--hang-timeout", "-5"], ["--hang-timeout -5"]),
    (["figures", "host", "--rounds", "0"], ["--rounds 0"]),
])
def test_options_out_of_range_are_one_error_before_anything_starts(capsys, no_ranks, monkeypatch, argv, words):
    import suite.ab.trials
    import suite.doctor

    def nothing(*a, **k):
        raise AssertionError("started despite bad input")

    monkeypatch.setattr(suite.ab.trials, "run_ab", nothing)
    monkeypatch.setattr(suite.doctor, "run_doctor", nothing)
    code, _, err = _cli(argv, capsys)
    _one_error(code, err, *words)


class _Ctx:
    """What the doctor's items use of its run, over a session pool."""

    def __init__(self, pool, nproc):
        self.pool, self.nproc, self.hang_timeout = pool, nproc, 120.0

    def call(self, fn, kwargs=None, timeout=None):
        return self.pool.run(fn, kwargs or {}, timeout=timeout)


def test_doctor_hierarchical_item_adapts_to_two_ranks_and_is_not_applicable_at_one(pool2):
    from suite.doctor import FAIL, NA, PASS, item_hierarchical

    one = item_hierarchical(_Ctx(None, 1))
    assert one.status == NA and "one rank" in one.numbers
    two = item_hierarchical(_Ctx(pool2, 2))
    assert two.status == PASS and two.status != FAIL, two
    assert "1 node(s) of 2" in two.numbers


# ---- kills at any moment (make test-slow) ------------------------------------------------------------
SWEEP = ["run", "--case", "mlp/plain", "--case", "mlp/overlap", "--size", "tiny", "--device", "cpu", "--nproc", "2",
         "--steps", "2", "--rounds", "2", "--warmup", "1", "--check-steps", "2", "--no-utilization",
         "--trace-steps", "1"]
# (phase, the marker after which the run is in it): the last marker printed tells the phase at a kill
MARKERS = [("rendezvous", "fleetbench run "), ("check", " check "), ("timing", "timing "), ("write", "samples/s")]


def _tagged(token: str) -> list[int]:
    """Live processes whose environment carries ``token`` (every process a run started inherits it)."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as fh:
                if token.encode() in fh.read() and _alive(int(pid)):
                    out.append(int(pid))
        except OSError:
            continue
    return out


def _run_and_kill(tmp: Path, token: str, at: float | None, trigger: str | None) -> tuple[str, list[int]]:
    """Start a run, SIGKILL its parent ``at`` seconds in (or as soon as ``trigger`` shows: the marker of a
    phase, or "store" for a store a rank wrote to); the phase it was in and what lived on 3 s later."""
    import subprocess
    import sys
    import threading
    import time

    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp / "tmp"), "FLEETBENCH_SWEEP": token,
           "TORCHINDUCTOR_CACHE_DIR": str(tmp / "inductor"), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "suite.cli.main", *SWEEP, "--results", str(tmp / "runs.jsonl")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=str(tmp))
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True).start()  # type: ignore

    def phase() -> str:
        seen = [name for name, marker in MARKERS if any(marker in ln for ln in lines)]
        return seen[-1] if seen else "import"

    def stored() -> bool:
        stores = list((tmp / "tmp").glob("fleetbench-store-*/store"))
        return any(s.exists() and s.stat().st_size > 0 for s in stores)

    t0 = time.monotonic()
    while proc.poll() is None and time.monotonic() - t0 < 600:
        if (at is not None and time.monotonic() - t0 >= at) or (trigger == "store" and stored()) or \
                (trigger is not None and trigger != "store" and any(trigger in ln for ln in lines)):
            break
        time.sleep(0.02)
    killed = proc.poll() is None
    where = ("rendezvous" if trigger == "store" else phase()) if killed else "finished"
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 3.0
    while _tagged(token) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = _tagged(token)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return where, left


@pytest.mark.statistical
@pytest.mark.timeout(3600)
def test_kill_9_of_the_parent_at_any_moment_leaves_no_process_and_no_temp_entry(tmp_path):
    from suite.runtime.pool import remove_stale

    (tmp_path / "tmp").mkdir()
    plan = [(i * 0.5, None) for i in range(1, 21)]  # every 0.5 s of the first 10 s
    plan += [(None, "store")] + [(None, marker) for _, marker in MARKERS[1:]]  # each phase surely hit once
    hits: dict = {}
    problems = []
    for n, (at, trigger) in enumerate(plan):
        where, left = _run_and_kill(tmp_path, f"fleetbench-sweep-{os.getpid()}-{n}", at, trigger)
        hits[where] = hits.get(where, 0) + 1
        if left:
            problems.append(f"killed at {at} s / on {trigger!r} ({where}): processes {left} alive 3 s later")
    remove_stale(tmp=str(tmp_path / "tmp"))  # what the next run does first: leftovers of dead owners go
    left_in_tmp = sorted(os.listdir(tmp_path / "tmp"))
    assert not problems, "\n".join(problems)
    assert {"import", "rendezvous", "check", "timing", "write"} <= set(hits), hits
    assert left_in_tmp == [], left_in_tmp


# ---- 5. a user's --model factory ------------------------------------------------------------------
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


# ---- 6. ab: a dirty checkout; killed ab leaves nothing ------------------------------------------------
def _git(repo, *args):
    import subprocess

    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout.strip()


def test_ab_refuses_a_checked_out_revision_with_uncommitted_changes(tmp_path, capsys, monkeypatch):
    import suite.ab.trials

    monkeypatch.setattr(suite.ab.trials, "TrialServer", lambda *a, **k: pytest.fail("a server was started"))
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "f.py").write_text("x = 1\n")
    _git(repo, "add", "f.py")
    _git(repo, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "-m", "one")
    (repo / "f.py").write_text("x = 2\n")  # the change ab would silently not measure
    code, _, err = _cli(["ab", "HEAD", "HEAD", "--repo", repo, "--case", "mlp/plain"], capsys)
    _one_error(code, err, "uncommitted changes", "f.py", "commit them")
    assert _git(repo, "worktree", "list").count("\n") == 0 and not list(tmp_path.glob("fleetbench-*"))


@pytest.mark.statistical
@pytest.mark.timeout(1200)
def test_ab_killed_by_sigterm_or_sigint_leaves_no_server_and_no_temp_entry_within_5s(tmp_path):
    import subprocess
    import sys
    import time

    repo = tmp_path / "repo"  # a clean clone: ab refuses a checkout with uncommitted changes
    subprocess.run(["git", "clone", "-q", "--shared", str(ROOT), str(repo)], check=True)
    for sig in (signal.SIGTERM, signal.SIGINT):
        tmp = tmp_path / sig.name
        tmp.mkdir()
        token = f"fleetbench-ab-kill-{os.getpid()}-{sig.name}"
        env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp), "FLEETBENCH_SWEEP": token}
        proc = subprocess.Popen([sys.executable, "-m", "suite.cli.main", "ab", "HEAD", "HEAD", "--repo", str(repo),
                                 "--case", "mlp/plain", "--size", "tiny", "--nproc", "2", "--steps", "2",
                                 "--budget", "600"], env=env, cwd=str(ROOT), stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and len(list(tmp.glob("fleetbench-store-*"))) < 2:
            time.sleep(0.2)  # both trial servers have started their rank pools
        assert len(list(tmp.glob("fleetbench-store-*"))) == 2, "the trial servers never started their ranks"
        time.sleep(2.0)
        proc.send_signal(sig)
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline and (proc.poll() is None or _tagged(token) or os.listdir(tmp)):
            time.sleep(0.05)
        left, entries = _tagged(token), sorted(os.listdir(tmp))
        for pid in left + ([proc.pid] if proc.poll() is None else []):
            os.kill(pid, signal.SIGKILL)
        assert proc.poll() is not None and not left and not entries, (sig.name, left, entries)
    _git(repo, "worktree", "prune")
    assert "fleetbench-ab-" not in _git(repo, "worktree", "list")


# ---- 6. Paddle users' TOML ------------------------------------------------------------------------------
def test_paddle_build_and_exec_strategy_tables_beside_strategy_are_read(tmp_path):
    from suite.config import toml_fields

    path = tmp_path / "c.toml"
    path.write_text("[strategy]\nfuse_all_reduce_ops = true\n\n[build_strategy]\nfuse_bn_act_ops = true\n\n"
                    "[exec_strategy]\nnum_threads = 2\n")
    assert toml_fields(str(path)) == {"fuse_all_reduce_ops": True, "fuse_bn_act_ops": True, "num_threads": 2}


@pytest.mark.parametrize("text,words", [
    ("[strategy]\namp = true\n\n[build_strategy]\nfuse_bn_act_opz = true\n", ["fuse_bn_act_opz"]),
    ("[strategy]\namp = true\n\n[build_stratgy]\nfuse_bn_act_ops = true\n", ["'build_stratgy'", "ignored"]),
    ("stray = 1\n[strategy]\namp = true\n", ["'stray'", "beside [strategy]"]),
    ("[strategy]\namp = true\n\n[build_strategy]\nenable_inplace = true\n", ["enable_inplace", "not implemented"]),
])
def test_unknown_tables_and_keys_in_a_paddle_toml_are_refused_by_name(tmp_path, capsys, no_ranks, text, words):
    path = tmp_path / "c.toml"
    path.write_text(text)
    code, _, err = _cli(RUN + ["--config", path], capsys)
    _one_error(code, err, *words)


def test_a_report_of_thousands_of_cases_draws_a_bounded_number_of_plots_and_lists_every_case(tmp_path,
                                                                                              monkeypatch):
    import suite.report.figures as F
    from suite.report.page import MAX_BARS, MAX_MODEL_PLOTS, build_report

    drawn = []
    for name in ("speedup_figure", "throughput_figure", "breakdown_figure", "scaling_figure", "local_sgd_figure"):
        monkeypatch.setattr(F, name, lambda *a, _n=name: drawn.append(_n))  # counted, nothing drawn
    records = [_record(case=f"m{i % 300}/v{i // 300}", world=2 + i % 2) for i in range(3000)]
    data = build_report(records, str(tmp_path / "out"), str(tmp_path))
    assert len(drawn) <= MAX_MODEL_PLOTS and drawn.count("speedup_figure") == MAX_MODEL_PLOTS
    assert 3000 > MAX_BARS * 4 and "throughput_figure" not in drawn and "scaling_figure" not in drawn
    assert len(data["cases"]) == 3000
    # every case twice: in the summary table and in its model's table (no busy case: no machine column)
    assert (tmp_path / "out" / "summary.md").read_text().count("| m") == 2 * 3000


def test_a_spawned_rank_reaches_its_entry_point_without_importing_torch():
    """The parent-death signal is set first thing in the rank's entry point; what the rank imports to find
    that entry point must not take seconds (torch), or a parent killed meanwhile leaves it running."""
    import subprocess
    import sys

    code = "import sys, suite.runtime.pool; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(ROOT)},
                         capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "False", out.stdout + out.stderr


def test_a_trial_server_that_cannot_start_leaves_no_log_or_process(tmp_path, monkeypatch):
    import tempfile

    from suite.ab.client import ProtocolMismatch, TrialServer

    root = tmp_path / "nothing"
    (root / "suite" / "cli").mkdir(parents=True)
    (root / "suite" / "__init__.py").write_text("")
    (root / "suite" / "cli" / "__init__.py").write_text("")
    (root / "suite" / "cli" / "main.py").write_text("import sys; sys.exit(\"invalid choice: 'trial-server'\")\n")
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    with pytest.raises(ProtocolMismatch):
        TrialServer(str(root), "BASE", start_timeout=60)
    assert os.listdir(tmp_path / "tmp") == []


def test_set_takes_exec_strategy_as_a_file_does_and_names_both_spellings_when_given_twice():
    from suite.config import ConfigError, StrategyConfig

    base = StrategyConfig()
    assert base.num_threads != 4
    assert base.with_overrides(["exec_strategy.num_threads=4"]).num_threads == 4
    assert base.with_overrides(["execution_strategy.num_threads=4"]).num_threads == 4
    with pytest.raises(ConfigError, match="exec_strategy.nope"):
        base.with_overrides(["exec_strategy.nope=1"])
    with pytest.raises(ConfigError, match="'exec_strategy.num_threads' and as 'num_threads'"):
        StrategyConfig.from_dict({"exec_strategy.num_threads": 2, "num_threads": 2})


def test_report_into_a_directory_that_cannot_be_created_is_one_error(tmp_path, capsys):
    """/proc/x passes every check that can be made beforehand (root may write anywhere) and still cannot be made."""
    results = _write(tmp_path / "results" / "runs.jsonl", _record())
    code, _, err = _cli(["report", results, "--out", "/proc/fleetbench-report"], capsys)
    _one_error(code, err, "--out /proc/fleetbench-report", "cannot be written", "pick a writable directory")
