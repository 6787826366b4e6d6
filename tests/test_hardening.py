"""Issue 12: every bad input a clear error, nothing measured lost, nothing leaked.

- ranks never outlive their parent process (SIGKILL, SIGTERM; pools started from any thread),
  and their own children go with them;
- a local run opens no network listener beyond loopback (the ranks meet through a private file);
- the report copies only traces from the results directory's own traces/ folder;
- Markdown and figures show hostile names as text;
- numeric options and profile files are checked before any rank starts: exit 2, one line.
"""
from __future__ import annotations

import json
import os
import re
import selectors
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PARENT_SCRIPT = ROOT / "tests" / "scripts" / "pool_parent.py"


# ---- processes ---------------------------------------------------------------------------------
def _alive(pid: int) -> bool:
    """Running (a zombie is dead: nobody may reap it in a container)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            state = fh.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")


def _start_parent(*flags: str) -> tuple[subprocess.Popen, dict]:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen([sys.executable, str(PARENT_SCRIPT), *flags], stdout=subprocess.PIPE, text=True,
                            cwd=str(ROOT), env=env)
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if sel.select(timeout=1.0):
            line = proc.stdout.readline()
            if line.startswith("{"):
                return proc, json.loads(line)
            if not line:
                break
        if proc.poll() is not None:
            break
    proc.kill()
    proc.wait()
    pytest.fail(f"the parent script did not report its ranks (exit code {proc.returncode})")


def _gone_within(pids: list[int], seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not any(_alive(p) for p in pids):
            return []
        time.sleep(0.05)
    return [p for p in pids if _alive(p)]


def _kill_parent_and_watch(sig: int, *flags: str) -> dict:
    proc, info = _start_parent(*flags)
    watched = info["ranks"] + info["grandchildren"]
    try:
        assert len(info["ranks"]) == 2 and all(_alive(p) for p in watched), info
        time.sleep(1.5)  # the ranks are inside the long call now, not waiting between calls
        assert all(_alive(p) for p in watched), "a rank died before its parent"
        os.kill(info["parent"], sig)
        proc.wait(timeout=30)  # the parent is dead (and reaped) from here on
        survivors = _gone_within(watched, 2.0)
        assert not survivors, (f"processes of the run still alive 2 s after the parent died "
                               f"({signal.Signals(sig).name}): {survivors} of ranks {info['ranks']}, "
                               f"their children {info['grandchildren']}")
        if info["store"]:
            deadline = time.monotonic() + 2.0
            while os.path.exists(os.path.dirname(info["store"])) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert not os.path.exists(os.path.dirname(info["store"])), "the store directory was left behind"
        return info
    finally:
        for p in [info["parent"]] + watched + ([info["forked"]] if info.get("forked") else []):
            if _alive(p):
                try:
                    os.kill(p, signal.SIGKILL)
                except OSError:
                    pass
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_ranks_and_their_children_die_within_2s_of_a_killed_parent():
    _kill_parent_and_watch(signal.SIGKILL, "--grandchild")


def test_ranks_die_within_2s_of_a_terminated_parent():
    _kill_parent_and_watch(signal.SIGTERM)


def test_a_forked_child_of_the_parent_does_not_keep_the_ranks_alive():
    info = _kill_parent_and_watch(signal.SIGKILL, "--fork")
    assert info["forked"] and _alive(info["forked"]), "the forked child should still be running"


def test_pool_started_from_a_thread_outlives_the_thread_but_not_the_process():
    info = _kill_parent_and_watch(signal.SIGKILL, "--thread")
    # The starting thread had ended before this: the same ranks were alive and answered a collective.
    assert info["after_thread"] == {"alive": True, "allreduce": [1.0, 1.0]}, info


# ---- no listener beyond loopback -----------------------------------------------------------------
def _listening_sockets() -> dict[int, str]:
    """inode -> "address:port" of every listening TCP socket (IPv4 and IPv6) in this network namespace."""
    import ipaddress

    out = {}
    for name, v6 in (("/proc/net/tcp", False), ("/proc/net/tcp6", True)):
        try:
            lines = Path(name).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            local, state, inode = f[1], f[3], int(f[9])
            if state != "0A":  # TCP_LISTEN
                continue
            hexaddr, hexport = local.split(":")
            raw = bytes.fromhex(hexaddr)
            # /proc writes the address as 32-bit words in host (little-endian) order
            raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
            addr = ipaddress.ip_address(raw)
            out[inode] = (addr, int(hexport, 16))
    return out


def _socket_inodes(pid: int) -> set[int]:
    inodes = set()
    fd_dir = f"/proc/{pid}/fd"
    for fd in os.listdir(fd_dir):
        try:
            target = os.readlink(os.path.join(fd_dir, fd))
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def _off_host_listeners(pids) -> list[str]:
    listening = _listening_sockets()
    bad = []
    for pid in pids:
        for inode in _socket_inodes(pid) & set(listening):
            addr, port = listening[inode]
            mapped = getattr(addr, "ipv4_mapped", None)
            if not (addr.is_loopback or (mapped is not None and mapped.is_loopback)):
                bad.append(f"pid {pid} listens on [{addr}]:{port}")
    return bad


def test_a_local_pool_listens_on_no_address_beyond_loopback_and_keeps_its_store_private():
    from suite.runtime import RankFailure, RankPool
    from suite.runtime.probes import allreduce_rank_sum, crash

    pool = RankPool(2, num_threads=1, timeout=120)
    try:
        assert pool.run(allreduce_rank_sum) == [1.0, 1.0]  # the ranks are connected (gloo's listeners exist)
        pids = [os.getpid()] + pool.pids
        assert not _off_host_listeners(pids), _off_host_listeners(pids)
        assert any(_socket_inodes(p) & set(_listening_sockets()) for p in pool.pids), \
            "found no gloo listener at all: the check looks at the wrong sockets"
        # The rendezvous file: in a private directory, gone when the pool is torn down, fresh on restart.
        first = getattr(pool, "store_path", None)
        assert first and stat.S_IMODE(os.stat(os.path.dirname(first)).st_mode) == 0o700
        with pytest.raises(RankFailure):
            pool.run(crash, {"rank": 1}, timeout=60)
        assert not os.path.exists(os.path.dirname(first)), "the store survived the teardown after a crash"
        assert pool.run(allreduce_rank_sum) == [1.0, 1.0]
        second = pool.store_path
        assert second and second != first and os.path.exists(second)
    finally:
        pool.close()
    assert not os.path.exists(os.path.dirname(second)), "the store survived close()"


# ---- report: traces, Markdown, figures ---------------------------------------------------------
HOSTILE_CASE = "mlp/<script>alert(1)</script>|x"
HOSTILE_RUN = "<img src=x onerror=alert(1)>"
HOSTILE_ERROR = "boom | <b>bold</b> [click](javascript:alert(1)) `tick`\nsecond line"


def _record(case, world=2, run_id="r1", status="ok", error=None, **metrics):
    from suite.results.records import CaseRecord

    base = {"samples_per_s": 100.0, "samples_per_s_ci": [90.0, 110.0], "step_time_s": {"median": 0.02},
            "step_times_s": [0.02, 0.021, 0.019, 0.02, 0.022]}
    return CaseRecord(case, case.split("/")[0], world, {"data_parallel": "suite"}, run_id, status=status,
                      verdict="pass" if status == "ok" else "error", metrics={**base, **metrics} if status == "ok"
                      else {}, metadata={"torch": "2.4.0", "cpu": "test cpu", "gpu": {"available": False}},
                      error=error)


def _unescaped_pipes(line: str) -> int:
    n, i = 0, 0
    while i < len(line):
        if line[i] == "\\":
            i += 2
            continue
        n += line[i] == "|"
        i += 1
    return n


def test_report_copies_only_traces_from_the_results_traces_folder(tmp_path, capsys):
    from suite.report.page import build_report

    secret = tmp_path / "secret.txt"
    secret.write_text("TOP SECRET")
    results = tmp_path / "results"
    (results / "traces" / "r1").mkdir(parents=True)
    (results / "traces" / "r1" / "ok@2.json").write_text('{"traceEvents": []}')
    os.symlink(secret, results / "traces" / "r1" / "link@2.json")
    records = [
        _record("mlp/ok", trace_file="traces/r1/ok@2.json"),
        _record("mlp/absolute", trace_file=str(secret)),
        _record("mlp/dotdot", trace_file="traces/../../secret.txt"),
        _record("mlp/symlink", trace_file="traces/r1/link@2.json"),
        _record("mlp/outside", trace_file="../secret.txt"),
    ]
    out = tmp_path / "report"
    data = build_report(records, str(out), str(results))
    err = capsys.readouterr().err
    copied = sorted(p.name for p in (out / "traces").iterdir())
    assert copied == ["ok@2.json"], copied
    for p in out.rglob("*"):
        if p.is_file() and p.suffix != ".png":
            assert "TOP SECRET" not in p.read_text(errors="replace"), p
    for case, path in [("mlp/absolute", str(secret)), ("mlp/dotdot", "traces/../../secret.txt"),
                       ("mlp/symlink", "traces/r1/link@2.json"), ("mlp/outside", "../secret.txt")]:
        line = [ln for ln in err.splitlines() if f"{case}@2" in ln]
        assert len(line) == 1 and repr(path) in line[0] and "warning" in line[0], err
    assert data["traces"] == ["traces/ok@2.json"]

    # traces/ itself a symlink out of the results directory: nothing in it is the results' own
    other = tmp_path / "other"
    (other / "traces").mkdir(parents=True)
    (other / "traces" / "x.json").write_text("TOP SECRET")
    results2 = tmp_path / "results2"
    results2.mkdir()
    os.symlink(other / "traces", results2 / "traces")
    data = build_report([_record("mlp/linkeddir", trace_file="traces/x.json")], str(tmp_path / "r2"), str(results2))
    assert data["traces"] == [] and "mlp/linkeddir@2" in capsys.readouterr().err


def test_report_markdown_and_html_show_hostile_names_as_text(tmp_path, capsys):
    from suite.report.page import build_report

    records = [_record(HOSTILE_CASE, run_id=HOSTILE_RUN),
               _record("mlp/plain", run_id=HOSTILE_RUN),
               _record("mlp/<img src=x onerror=alert(2)>", run_id="r2", status="error", error=HOSTILE_ERROR)]
    out = tmp_path / "report"
    build_report(records, str(out), str(tmp_path))
    md = (out / "summary.md").read_text()
    page = (out / "index.html").read_text()
    for text in (md, page):
        assert "<script" not in text and "<img src=x" not in text and "<b>" not in text, text
    assert not re.search(r"(?<!\\)\]\(javascript:", md), md  # the link is shown, not made
    table = [ln for ln in md.splitlines() if ln.startswith("|")]
    assert len({_unescaped_pipes(ln) for ln in table}) == 1, table  # no row got an extra cell
    assert "&lt;script&gt;alert(1)&lt;/script&gt;\\|x" in md
    errors = [ln for ln in md.splitlines() if ln.startswith("- error:")]
    assert len(errors) == 1 and "second line" not in md and "boom \\| &lt;b&gt;" in errors[0], md


def test_compare_markdown_escapes_case_names_and_verdicts(tmp_path, capsys):
    from suite.cli.main import main
    from suite.results.records import append_record

    base, head = tmp_path / "base.jsonl", tmp_path / "head.jsonl"
    for path in (base, head):
        append_record(str(path), _record(HOSTILE_CASE))
        append_record(str(path), _record("mlp/plain\nnext | line"))
        rec = _record("mlp/verdict")
        rec.verdict = "<img src=x onerror=alert(1)>|"
        append_record(str(path), rec)
    md_path = tmp_path / "cmp.md"
    assert main(["compare", str(base), str(head), "--markdown", str(md_path)]) in (0, 1)
    md = md_path.read_text()
    assert "<script" not in md and "<img" not in md, md
    lines = md.strip().splitlines()
    assert len(lines) == 2 + 3, lines  # header, rule, one line per case (the newline did not split a row)
    assert len({_unescaped_pipes(ln) for ln in lines}) == 1, lines
    assert "&lt;script&gt;alert(1)&lt;/script&gt;\\|x" in md


def test_figures_draw_dollar_signs_in_names_as_text(tmp_path):
    import matplotlib.pyplot as plt

    from suite.report import figures as F
    from suite.report.page import build_report

    names = ["mlp/$x^2$", "mlp/a$b", "mlp/$\\frac{$", "mlp/x\\$y$", "mlp/$_$"]
    records = [_record(n, world=w) for n in names for w in (1, 2)]
    records += [_record("mlp/$local_sgd$", world=2, losses=[1.0, 0.5]), _record("mlp/plain", world=2,
                                                                                losses=[1.0, 0.6])]
    build_report(records, str(tmp_path / "report"), str(tmp_path))  # mathtext raised here
    assert (tmp_path / "report" / "throughput_w2.png").exists()
    fig = F.throughput_figure(F.latest(records), 2)
    try:
        fig.canvas.draw()
        # what each tick label shows: (text, drawn as math?) as matplotlib decides it
        shown = sorted(t._preprocess_math(t.get_text()) for t in fig.axes[0].get_xticklabels())
        assert shown == sorted((r.case, False) for r in records if r.world_size == 2), shown
    finally:
        plt.close(fig)
