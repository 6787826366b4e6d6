"""`fleetbench run --trace-steps`: one torch.profiler trace per rank (Kineto's Chrome-trace JSON) with the engine's
phases as ranges, and the timeline of every rank beside them.

Kineto's format has no official loader to call: the files are read here as JSON, with Kineto's fields
(``traceEvents``; complete events ``ph: "X"`` with ``ts`` and ``dur`` in microseconds and a ``name``; each training
step inside the profiler's ``ProfilerStep#N`` range)."""
from __future__ import annotations

import json
import os
import re
import stat

import pytest

import suite.runtime
from suite.cli.main import main
from tests.fakes import Borrowed

STEPS = 2  # traced steps
# communication a step may wait on: the engine's and the synchronizer's ranges, c10d's and the backends' own ops
COMM = re.compile(r"^(wait|bucket \d+ (wait|allreduce issue)|allreduce.*|c10d::.*|gloo:.*|nccl.*|ncclDevKernel.*)$")


@pytest.fixture(scope="module")
def traced(pool2, tmp_path_factory):
    """One run of mlp/overlap with --trace-steps on the session's two ranks, under a umask that would leave
    files writable by everyone: the trace files must be 0644 all the same."""
    out = tmp_path_factory.mktemp("traced")
    mp = pytest.MonkeyPatch()
    mp.setattr(suite.runtime, "RankPool", lambda *a, **k: Borrowed(pool2))
    old = os.umask(0)
    try:
        code = main(["run", "--case", "mlp/overlap", "--size", "tiny", "--device", "cpu", "--rounds", "1", "--steps",
                     "1", "--warmup", "0", "--no-check", "--no-utilization", "--trace-steps", str(STEPS),
                     "--results", str(out / "runs.jsonl")])
    finally:
        os.umask(old)
        mp.undo()
    assert code == 0
    (rec,) = [json.loads(line) for line in open(out / "runs.jsonl")]
    where = out / rec["metrics"]["trace_file"]
    return where


def _x(events: list, name: str | re.Pattern) -> list[dict]:
    match = (lambda n: name.match(n)) if isinstance(name, re.Pattern) else (lambda n: n == name)
    return sorted((e for e in events if e.get("ph") == "X" and match(e.get("name", ""))), key=lambda e: e["ts"])


def _end(e: dict) -> float:
    return e["ts"] + e["dur"]


def test_one_torch_profiler_trace_per_rank_and_the_timeline_all_0644(traced):
    assert sorted(os.listdir(traced)) == ["rank0.pt.trace.json", "rank1.pt.trace.json", "timeline.json"]
    for name in os.listdir(traced):
        mode = stat.S_IMODE(os.stat(traced / name).st_mode)
        assert mode == 0o644, f"{name}: mode {mode:o}"


@pytest.mark.parametrize("rank", [0, 1])
def test_each_step_has_the_engines_phases_a_wait_before_the_optimizer_and_no_comm_inside_it(traced, rank):
    events = json.load(open(traced / f"rank{rank}.pt.trace.json"))["traceEvents"]
    steps = _x(events, re.compile(r"ProfilerStep#\d+"))
    assert len(steps) == STEPS, [e["name"] for e in steps]
    comm = _x(events, COMM)
    assert any(e["name"].startswith("gloo:") for e in comm), "the collectives themselves are in the trace"
    for step in steps:
        inside = [e for e in events if e.get("ph") == "X" and step["ts"] <= e["ts"] and _end(e) <= _end(step)]
        phase = {n: _x(inside, n) for n in ("forward", "backward", "wait", "optimizer")}
        assert all(len(v) == 1 for v in phase.values()), {n: len(v) for n, v in phase.items()}
        fwd, bwd, wait, opt = (phase[n][0] for n in ("forward", "backward", "wait", "optimizer"))
        assert _end(fwd) <= bwd["ts"] and _end(bwd) <= wait["ts"]
        assert wait["dur"] > 0 and _end(wait) <= opt["ts"], (wait, opt)  # its own range, before the optimizer
        overlapping = [e["name"] for e in comm if e["ts"] < _end(opt) and _end(e) > opt["ts"]]
        assert not overlapping, f"communication inside the optimizer range: {overlapping}"
        ready = {int(e["name"].split()[1]): e for e in _x(inside, re.compile(r"bucket \d+ ready$"))}
        issue = {int(e["name"].split()[1]): e for e in _x(inside, re.compile(r"bucket \d+ allreduce issue$"))}
        waited = {int(e["name"].split()[1]) for e in _x(inside, re.compile(r"bucket \d+ wait$"))}
        assert ready and set(ready) == set(issue) == waited == set(range(len(ready))), (ready, issue, waited)
        for b in ready:
            assert ready[b]["ts"] <= issue[b]["ts"], f"bucket {b} ready after its allreduce was issued"


def test_the_timeline_has_a_wait_before_the_optimizer_and_buckets_ready_before_their_allreduce(traced):
    events = json.load(open(traced / "timeline.json"))["traceEvents"]
    for rank in (0, 1):
        mine = [e for e in events if e.get("pid") == rank and e.get("ph") in ("X", "i", "b", "e")]
        for step in range(1, STEPS + 1):
            at = [e for e in mine if e.get("args", {}).get("step") == step]
            span = {e["name"]: e for e in at if e["ph"] == "X"}
            assert {"forward", "backward", "wait", "optimizer"} <= set(span), sorted(span)
            wait, opt = span["wait"], span["optimizer"]
            assert wait["dur"] > 0 and _end(wait) <= opt["ts"] + 1e-3
            comm_ends = [e["ts"] for e in at if e["ph"] == "e"]
            assert comm_ends and max(comm_ends) <= opt["ts"] + 1e-3, "a collective still ran in the optimizer"
            begins = sorted(e["ts"] for e in at if e["ph"] == "b")  # buckets are launched in bucket order
            ready = {int(e["name"].split()[1]): e["ts"] for e in at if e["ph"] == "i"}
            assert ready and len(begins) == len(ready)
            for b, t in ready.items():
                assert t <= begins[b], f"rank {rank} step {step}: bucket {b} ready {t - begins[b]:.1f} us late"


def test_a_large_trace_is_written_gzipped_and_a_small_one_plain(tmp_path, monkeypatch):
    import gzip

    from suite import runner

    monkeypatch.setattr(runner, "GZIP_TRACE_OVER", 100)
    small, large = b'{"traceEvents": []}', json.dumps({"traceEvents": [{"ph": "X", "name": "x" * 200}]}).encode()
    answers = [{"rank": r, "steps": [], "kineto": gzip.compress(doc), "kineto_bytes": len(doc)}
               for r, doc in ((0, small), (1, large))]
    runner._write_traces(str(tmp_path), "traces/run/c@2", answers, "t")
    where = tmp_path / "traces" / "run" / "c@2"
    assert sorted(os.listdir(where)) == ["rank0.pt.trace.json", "rank1.pt.trace.json.gz", "timeline.json"]
    assert (where / "rank0.pt.trace.json").read_bytes() == small
    assert gzip.decompress((where / "rank1.pt.trace.json.gz").read_bytes()) == large


def test_the_report_copies_a_trace_directory_file_by_file_and_leaves_a_link_out(tmp_path, capsys):
    from suite.report.page import build_report
    from suite.results.records import CaseRecord

    results = tmp_path / "results"
    case_dir = results / "traces" / "r1" / "mlp_plain@2"
    case_dir.mkdir(parents=True)
    (case_dir / "timeline.json").write_text('{"traceEvents": []}')
    (case_dir / "rank0.pt.trace.json").write_text('{"traceEvents": []}')
    secret = tmp_path / "secret.json"
    secret.write_text('{"TOP SECRET": 1}')
    os.symlink(secret, case_dir / "rank1.pt.trace.json")
    rec = CaseRecord("mlp/plain", "mlp", 2, {}, "r1", verdict="pass",
                     metrics={"samples_per_s": 1.0, "trace_file": "traces/r1/mlp_plain@2"})
    data = build_report([rec], str(tmp_path / "out"), str(results))
    assert sorted(data["traces"]) == ["traces/mlp_plain@2/rank0.pt.trace.json", "traces/mlp_plain@2/timeline.json"]
    assert not (tmp_path / "out" / "traces" / "mlp_plain@2" / "rank1.pt.trace.json").exists()
    assert "rank1.pt.trace.json resolves to" in capsys.readouterr().err
    page = (tmp_path / "out" / "index.html").read_text()
    assert "href='traces/mlp_plain@2/timeline.json'" in page


@pytest.mark.heavy  # two interpreters importing torch, ~7 s: make test-slow
def test_kineto_says_nothing_on_the_terminal_of_a_cpu_rank(monkeypatch):
    """Kineto's ``USDT: … profiler_start/stop`` lines (two per profiled section per rank, on stderr) are silenced on
    CPU by ``quiet_kineto`` before the process's first profiler; without it they are printed (the first run shows
    what the second removes).  On CUDA, and where the user set KINETO_LOG_LEVEL, the variable is left alone."""
    import subprocess
    import sys

    from suite.measure.trace import quiet_kineto

    body = ("import os, torch\nfrom torch.profiler import profile\nfrom suite.measure.trace import quiet_kineto\n"
            "{call}\nwith profile() as p:\n    torch.ones(3) + 1\n")
    env = {k: v for k, v in os.environ.items() if k != "KINETO_LOG_LEVEL"}
    loud, quiet = (subprocess.run([sys.executable, "-c", body.format(call=call)], capture_output=True, text=True,
                                  timeout=120, env=env) for call in ("pass", "quiet_kineto(False)"))
    assert loud.returncode == 0 and quiet.returncode == 0, loud.stderr[-2000:] + quiet.stderr[-2000:]
    assert "profiler_start" in loud.stderr, loud.stderr[-2000:]
    assert "USDT" not in quiet.stderr and "profiler_st" not in quiet.stderr, quiet.stderr[-2000:]
    monkeypatch.delenv("KINETO_LOG_LEVEL", raising=False)
    quiet_kineto(True)
    assert "KINETO_LOG_LEVEL" not in os.environ  # CUDA: CUPTI's warnings are kept
    monkeypatch.setenv("KINETO_LOG_LEVEL", "4")
    quiet_kineto(False)
    assert os.environ["KINETO_LOG_LEVEL"] == "4"  # the user's own level
