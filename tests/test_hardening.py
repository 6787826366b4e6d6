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
import shutil
import signal
import socket
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
        if info["store"]:  # when the ranks were killed here (the test failed), their store is still there
            shutil.rmtree(os.path.dirname(info["store"]), ignore_errors=True)


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
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
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


def test_a_local_pool_binds_gloo_to_loopback_whatever_the_environment_says(monkeypatch):
    from suite.runtime import RankPool
    from suite.runtime.probes import allreduce_rank_sum

    others = [n for _, n in socket.if_nameindex() if n != "lo" and _ipv4_of(n)]
    if not others:
        pytest.skip("this machine has no network interface with an address besides loopback")
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", others[0])  # e.g. left over from a multi-node set-up
    pool = RankPool(2, num_threads=1, timeout=120)
    try:
        assert pool.run(allreduce_rank_sum) == [1.0, 1.0]
        assert not _off_host_listeners(pool.pids), _off_host_listeners(pool.pids)
    finally:
        pool.close()


def _ipv4_of(ifname: str):
    import fcntl
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:  # SIOCGIFADDR
            return fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", ifname.encode()[:15]))[20:24]
        except OSError:
            return None


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
    tables: list = []  # runs of consecutive table lines: the summary table, then the model's
    previous = False
    for ln in md.splitlines():
        row = ln.startswith("|")
        if row and not previous:
            tables.append([])
        if row:
            tables[-1].append(ln)
        previous = row
    assert len(tables) >= 2, md
    for table in tables:
        assert len({_unescaped_pipes(ln) for ln in table}) == 1, table  # no row got an extra cell
    assert "&lt;script&gt;alert(1)&lt;/script&gt;\\|x" in md
    errors = [ln for ln in md.splitlines() if ln.startswith("- error:")]
    assert len(errors) == 1 and "second line" not in md and "boom \\| &lt;b&gt;" in errors[0], md


def test_compare_markdown_escapes_case_names(tmp_path, capsys):
    from suite.cli.main import main
    from suite.results.records import append_record

    base, head = tmp_path / "base.jsonl", tmp_path / "head.jsonl"
    for path in (base, head):
        append_record(str(path), _record(HOSTILE_CASE))
        append_record(str(path), _record("mlp/plain\nnext | line"))
        append_record(str(path), _record("mlp/<img src=x onerror=alert(1)>"))
    md_path = tmp_path / "cmp.md"
    assert main(["compare", str(base), str(head), "--markdown", str(md_path)]) in (0, 1, 3)
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
    assert (tmp_path / "report" / "throughput_w2.svg").exists()
    fig = F.throughput_figure(F.latest(records), 2)
    try:
        fig.canvas.draw()
        # what each tick label shows (variants on the y axis: horizontal bars): (text, drawn as math?)
        shown = sorted(t._preprocess_math(t.get_text()) for t in fig.axes[0].get_yticklabels())
        assert shown == sorted((r.case.split("/", 1)[1], False) for r in records if r.world_size == 2), shown
    finally:
        plt.close(fig)


# ---- numbers and files checked before any rank starts ------------------------------------------
def _bad_inputs(tmp: Path) -> list:
    """(argv, words) for every bad numeric option and unusable file of comm, cluster, compare."""
    from suite.results.records import append_record

    good = tmp / "good.jsonl"
    append_record(str(good), _record("mlp/plain"))
    binary = tmp / "binary.json"
    binary.write_bytes(b"\xff\xfe\x00{not text")
    folder = tmp / "folder.json"
    folder.mkdir()
    C = ["compare", str(good), str(good)]
    cases = [
        (["comm", "--timeout", "-5"], ["--timeout -5", ">= 1"]),  # one bound (it was > 0 and >= 1, checked twice)
        (["comm", "--timeout", "nan"], ["--timeout nan", "finite"]),
        (["comm", "--timeout", "inf"], ["--timeout inf", "finite"]),
        (["comm", "--timeout", "0"], ["--timeout 0", ">= 1"]),
        (["comm", "-b", "64G"], ["--min-bytes 64G", "--max-bytes 16M"]),
        (["comm", "-b", "1024G", "-e", "1024G"], ["--max-bytes 1024G", "memory is available", "largest message"]),
        (["comm", "-e", "1024G"], ["--max-bytes 1024G", "memory is available"]),
        (["comm", "-e", "9" * 400 + "G"], ["--max-bytes 999", "too large"]),
        (["comm", "-b", "0.1"], ["--min-bytes 0.1", "at least 1 byte"]),
        (["comm", "-b", "nan"], ["--min-bytes nan", "expected a number of bytes"]),
        (["comm", "--nproc", "100000"], ["--nproc 100000", "local ranks on this machine"]),
        (["comm", "--nproc", "1"], ["--nproc 1", "at least 2"]),
        (["comm", "--inter-nranks", "0"], ["--inter-nranks 0", ">= 1"]),
        (["comm", "--inter-nranks", "-2"], ["--inter-nranks -2", ">= 1"]),
        (["comm", "-f", "1"], ["--step-factor 1", ">= 2"]),
        (["comm", "-n", "0"], ["--iters 0", ">= 1"]),
        (["comm", "-w", "-1"], ["--warmup -1", ">= 0"]),
        (["comm", "--cluster", "0x2:inter=1gbit"], ["--cluster '0x2:inter=1gbit'", "nodes=0"]),
        (["cluster", "up", "0x2:inter=1gbit"], ["'0x2:inter=1gbit'", "nodes=0"]),
        (["cluster", "up", "2x0:inter=1gbit"], ["'2x0:inter=1gbit'", "ranks per node=0"]),
        (["cluster", "up", "2x2:inter=nanmbit"], ["inter='nanmbit'"]),
        (["cluster", "up", "2x2:inter=-1gbit"], ["inter='-1gbit'"]),
        (["cluster", "up", "99x99:inter=1gbit"], ["'99x99:inter=1gbit'", "at most"]),
        (C + ["--threshold", "nan"], ["--threshold nan"]),
        (C + ["--threshold", "-1"], ["--threshold -1"]),
        (C + ["--threshold", "inf"], ["--threshold inf"]),
        (C + ["--alpha", "0"], ["--alpha 0"]),
        (C + ["--alpha", "nan"], ["--alpha nan"]),
        (C + ["--markdown", str(folder)], ["--markdown", "is a directory"]),
        (["compare", str(folder), str(good)], [str(folder), "directory"]),
        (["compare", str(good), str(binary)], [str(binary), "not a text file"]),
    ]
    return cases


def test_every_bad_number_or_file_is_one_line_exit_2_before_any_rank(tmp_path, monkeypatch, capsys):
    import suite.cluster.emulate
    import suite.runtime
    from suite.cli.main import main

    class NoRanks:
        def __init__(self, *a, **k):
            raise AssertionError("a rank pool was started despite bad input")

    monkeypatch.setattr(suite.runtime, "RankPool", NoRanks)
    # No cluster may come up: and a bad value must be named even where none could be emulated.
    monkeypatch.setattr(suite.cluster.emulate, "unavailable_reason", lambda: "not here (test)")
    problems = []
    for argv, words in _bad_inputs(tmp_path):
        shown = " ".join(a if len(a) < 60 else a[:20] + "…" for a in argv)
        try:
            code = main(argv)
        except BaseException as exc:  # noqa: BLE001 - a traceback is what this test looks for
            capsys.readouterr()
            problems.append(f"{shown}: raised {type(exc).__name__}: {str(exc)[:120]}")
            continue
        err = capsys.readouterr().err
        lines = [ln for ln in err.splitlines() if ln.strip()]
        if code != 2 or len(lines) != 1 or "Traceback" in err or not all(w in err for w in words):
            problems.append(f"{shown}: exit {code}, stderr {err[:300]!r}; expected one line with {words}")
    assert not problems, "\n".join(problems)


def test_an_interrupted_start_leaves_no_rank_and_no_store(monkeypatch):
    from suite.runtime import RankPool

    pool = RankPool(2, num_threads=1, timeout=120)
    seen = {}

    def interrupted(*a, **k):  # Ctrl-C while the ranks join the process group
        seen.update(pids=[p.pid for p in pool._procs], store=getattr(pool, "store_path", None))
        raise KeyboardInterrupt

    monkeypatch.setattr(pool, "_collect", interrupted)
    try:
        with pytest.raises(KeyboardInterrupt):
            pool.start()
        assert seen["pids"] and not [p for p in seen["pids"] if _alive(p)], seen
        assert seen["store"] and not os.path.exists(os.path.dirname(seen["store"])), seen
    finally:
        pool.close()
