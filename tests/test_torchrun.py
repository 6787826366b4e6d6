"""Under torchrun (suite/runtime/torchrun.py, launch.py): the public API from a user's own script, `fleetbench run`
as a torchrun job, two agents standing for two hosts, a rank error's report and the world rebuilt, the
environment torchrun leaves (a taken MASTER_PORT, stale variables)."""
from __future__ import annotations

import contextlib
import json
import math
import os
import socket
import subprocess
import sys

import pytest

from tests.clitools import HERE, ROOT, torchrun
from tests.clitools import cli as _cli
from tests.clitools import one_error as _one_error


# ---- the public API and `fleetbench run` as torchrun jobs ----------------------------------------------------------
@pytest.mark.heavy  # a second torchrun job, ~7 s: make test-slow
def test_user_script_with_its_own_model_under_torchrun(tmp_path):
    out = tmp_path / "result.json"
    proc = torchrun([os.path.join(HERE, "scripts", "user_script.py"), "--out", str(out)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = [json.loads((tmp_path / f"result.json.{r}").read_text()) for r in range(2)]
    # Rank 1 started from other weights; the engine's broadcast replaced them with rank 0's.
    assert results[0]["changed_by_broadcast"] is False
    assert results[1]["changed_by_broadcast"] is True
    for r in results:
        assert r["max_param_spread"] == 0.0, "ranks hold different parameters after training"
        assert all(math.isfinite(v) for v in r["losses"]) and len(r["losses"]) == 4
    # Each rank trains on its own shard: their losses differ.
    assert results[0]["losses"] != results[1]["losses"]


@pytest.mark.heavy  # a 2-rank torchrun job, ~12 s (the two-agent torchrun jobs below stay in make test): make test-slow
def test_fleetbench_run_under_torchrun(tmp_path):
    results = tmp_path / "runs.jsonl"
    proc = torchrun(["-m", "suite.cli.main", "run", "--case", "mlp/plain", "--case", "mlp/ddp", "--rounds", "2",
                     "--steps", "2", "--warmup", "1", "--results", str(results)])
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "fleetbench run" in proc.stdout and "mlp/ddp" in proc.stdout
    lines = results.read_text().splitlines()
    assert len(lines) == 2, "rank 0 alone writes one record per case"
    recs = [json.loads(x) for x in lines]
    assert {r["case"] for r in recs} == {"mlp/plain", "mlp/ddp"}
    assert all(r["verdict"] == "pass" and r["world_size"] == 2 for r in recs)
    assert all(r["metrics"]["samples_per_s"] > 0 for r in recs)


@pytest.mark.heavy  # a 4-rank torchrun job, ~10 s: make test-slow
def test_hierarchical_under_torchrun_takes_local_world_size_as_the_node(tmp_path):
    """The README's multi-node command: no inter_nranks given, so nodes are torchrun's machines."""
    results = tmp_path / "runs.jsonl"
    proc = torchrun(["-m", "suite.cli.main", "run", "--case", "mlp/overlap", "--set", "use_hierarchical_allreduce=true",
                     "--rounds", "1", "--steps", "2", "--warmup", "1", "--results", str(results)])
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    recs = [json.loads(x) for x in results.read_text().splitlines()]
    assert [r["case"] for r in recs] == ["mlp/overlap"]
    rec = recs[0]
    assert rec["verdict"] == "pass", rec.get("check")
    assert rec["config"]["use_hierarchical_allreduce"] is True
    assert rec["config"]["hierarchical_allreduce_inter_nranks"] is None  # resolved from LOCAL_WORLD_SIZE
    # One node of 2 ranks: the hierarchy's intra-node groups carry the gradients.
    calls = rec["metrics"]["comm_calls_per_step"]
    assert any(k.startswith("intra") for k in calls), calls


FAILING_SCRIPT = '''
import sys
import torch
import torch.distributed as dist
from suite.runtime.launch import init_from_env, shutdown
from suite.runtime.torchrun import TorchrunLauncher


def boom():
    if dist.get_rank() == 1:
        raise ValueError("boom on rank 1")
    t = torch.ones(1)
    dist.all_reduce(t)  # rank 0 waits in a collective that rank 1 never joins
    return t.item()


if __name__ == "__main__":
    ctx = init_from_env(device="cpu", pg_timeout=60)
    try:
        TorchrunLauncher(ctx, report_timeout=3).run(boom)
    finally:
        shutdown()
'''


def test_a_rank_that_raises_while_its_peer_is_in_a_collective_is_reported_at_once(tmp_path):
    """Issue 11, defect 6: the failing rank used to enter gather_object while rank 0 sat in an allreduce:
    the two collectives paired up (garbage on gloo, a hang on NCCL) and the error was never reported;
    the job ended at the process-group timeout.  Through the store, rank 1's traceback is printed and the
    job ends within seconds of the report deadline, long before the 60 s process-group timeout."""
    import time

    script = tmp_path / "failing.py"
    script.write_text(FAILING_SCRIPT)
    t0 = time.monotonic()
    proc = torchrun([str(script)], timeout=120)
    elapsed = time.monotonic() - t0
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    assert "ValueError: boom on rank 1" in out, out[-3000:]
    assert "rank 1 raised" in out, out[-3000:]
    assert elapsed < 45, f"took {elapsed:.0f} s: the report waited for the process-group timeout"


# ---- agreement across ranks and hosts: two agents as two hosts -----------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _two_agents(script_args: list[str], cwds: list, timeout: float = 180) -> list[str]:
    """Two torchrun agents on this machine standing for two hosts (one rank each, node ranks 0 and 1),
    each in its own working directory; every agent's output, after both ended (asserted status 0)."""
    port = _free_port()
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1",
               GLOO_SOCKET_IFNAME=os.environ.get("GLOO_SOCKET_IFNAME", "lo"))
    agents = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node_rank", str(node),
         "--nproc_per_node", "1", "--master_addr", "127.0.0.1", "--master_port", str(port), *script_args],
        cwd=str(cwds[node]), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for node in (0, 1)]
    try:
        logs = [a.communicate(timeout=timeout)[0] for a in agents]
    finally:
        for a in agents:
            if a.poll() is None:
                a.kill()
                a.wait()
    assert all(a.returncode == 0 for a in agents), "\n".join(log[-2000:] for log in logs)
    return logs


def test_two_hosts_with_different_free_memory_build_the_same_groups(tmp_path):
    """Two torchrun agents ("hosts", one rank each) whose free-memory probes differ by a factor of 2**40:
    each used to split the variants by its own memory (one group on host 0, one variant per group on host
    1: different engines, collectives out of order).  Both now time the groups the tightest host allows."""
    out = tmp_path / "groups"
    _two_agents([os.path.join(HERE, "scripts", "two_hosts.py"), str(out)], [ROOT, ROOT])
    got = [json.loads((tmp_path / f"groups.{r}").read_text()) for r in range(2)]
    assert {g["host"] for g in got} == {"0", "1"}
    expected = [["plain", "ddp"], ["plain", "fusion"], ["plain", "overlap"]]  # host 1 holds one engine besides
    assert got[0]["groups"] == got[1]["groups"] == expected, got
    assert got[0]["gathered"] == ["0", "1"] and got[1]["gathered"] is None  # every node's value on rank 0


def test_a_rank_error_rebuilds_the_world_so_no_orphaned_collective_pairs_with_the_next(tmp_path):
    """Rank 0 leaves an allreduce queued (as an NCCL rank does: collectives are asynchronous) while rank 1
    raises.  Reusing the process group, the next call's allreduce pairs with the orphan (gloo here fails or
    hangs until its timeout); after the rebuild the next allreduce sums what this call sent.  The rebuild is the
    launcher's default under gloo as under NCCL."""
    out = tmp_path / "sums.json"
    proc = torchrun([os.path.join(HERE, "scripts", "rebuild.py"), str(out)], timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    got = json.loads(out.read_text())
    assert got == {"sums": [3.0, 3.0], "rebuilds": 1}, got


@pytest.mark.heavy  # two torchrun jobs, ~15 s: make test-slow
def test_resume_under_torchrun_is_decided_by_rank_0_not_by_each_hosts_results_file(tmp_path):
    """`fleetbench run --resume FILE` on two hosts: only rank 0's host holds the results file.  Each rank used
    to read its own host's (the other host's rank stopped: no such file) and so select other cases; now rank
    0 decides and every rank runs what is left, the same cases."""
    from suite.results.records import CaseRecord, append_record

    hosts = [tmp_path / "host0", tmp_path / "host1"]
    for h in hosts:
        h.mkdir()
    append_record(str(hosts[0] / "runs.jsonl"), CaseRecord("mlp/plain", "mlp", 2, {}, "run-x", verdict="pass"))
    _two_agents(["-m", "suite.cli.main", "run", "--case", "mlp/plain", "--case", "mlp/ddp", "--size", "tiny",
                 "--resume", "runs.jsonl", "--rounds", "1", "--steps", "1", "--warmup", "0", "--no-check",
                 "--no-utilization"], hosts)
    recs = [json.loads(line) for line in (hosts[0] / "runs.jsonl").read_text().splitlines()]
    assert [(r["case"], r["run_id"]) for r in recs] == [("mlp/plain", "run-x"), ("mlp/ddp", "run-x")], recs
    assert not (hosts[1] / "runs.jsonl").exists()  # rank 1 writes nothing


# ---- the environment torchrun leaves: a taken MASTER_PORT, stale variables -----------------------------------------
@contextlib.contextmanager
def _taken_port():
    """A loopback port another process (this one) listens on."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    try:
        yield s.getsockname()[1]
    finally:
        s.close()


def test_a_taken_master_port_under_torchrun_is_one_line_naming_the_address(tmp_path, monkeypatch, capsys):
    """The probe: MASTER_PORT taken ended in a traceback.  Under torchrun (its agent's TORCHELASTIC_RUN_ID set),
    rank 0 cannot listen on the port: one line naming the address and the port, nothing recorded."""
    import torch.distributed as dist

    with _taken_port() as port:
        for k, v in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                     "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "TORCHELASTIC_RUN_ID": "probe"}.items():
            monkeypatch.setenv(k, v)
        results = tmp_path / "runs.jsonl"
        code, _, err = _cli(["run", "--case", "mlp/plain", "--size", "tiny", "--results", results,
                             "--no-utilization"], capsys)
    _one_error(code, err, f"MASTER_ADDR=127.0.0.1 MASTER_PORT={port}", "address already in use",
               "is the port taken")
    assert not dist.is_initialized() and not results.exists()


@pytest.mark.heavy  # a real run's rank (about 10 s): make test-slow
@pytest.mark.timeout(300)
def test_a_local_run_with_a_taken_master_port_in_the_environment_runs_on_its_own_port(tmp_path):
    """The same probe without torchrun: a local run's ranks meet at a store of their own on a free loopback port,
    so MASTER_ADDR/MASTER_PORT left in the shell (the port taken) change nothing: exit 0, no traceback, a record."""
    with _taken_port() as port:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path), "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(port)}
        proc = subprocess.run([sys.executable, "-m", "suite.cli.main", "run", "--case", "mlp/plain", "--size", "tiny",
                               "--nproc", "1", "--steps", "1", "--rounds", "1", "--warmup", "0", "--no-check",
                               "--no-utilization", "--results", str(tmp_path / "runs.jsonl")], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert len((tmp_path / "runs.jsonl").read_text().splitlines()) == 1


def test_stale_torchrun_variables_are_refused_unless_torchruns_agent_set_them(monkeypatch, capsys, no_ranks):
    """The probe: `RANK=0 WORLD_SIZE=2 … MASTER_ADDR=127.0.0.1 fleetbench run …` listened on *:29778 for 20 s."""
    for k, v in {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2",
                 "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29778"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    code, _, err = _cli(["run", "--case", "mlp/plain", "--size", "tiny"], capsys)
    _one_error(code, err, "RANK='0'", "TORCHELASTIC_RUN_ID", "unset them")
    from suite.runtime.launch import torchrun_env

    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job-1")  # torchrun's agent: the world is real
    assert torchrun_env().world_size == 2
