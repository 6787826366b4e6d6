"""Agreement across ranks and hosts (issue 22, item 5): decisions that shape engines or collective order
are made once and shared, and a rank error under NCCL leaves no orphaned collective for the next case."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from tests.test_public_api import HERE, ROOT, torchrun


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


def test_hierarchical_cases_under_torchrun_take_the_nodes_from_local_world_size():
    """`*/hierarchical` emulates two nodes of half the ranks on one machine (8 ranks: 4 + 4); under torchrun
    (LOCAL_WORLD_SIZE known) its nodes are the real machines: 4 hosts of 2 ranks -> inter_nranks 2, not 4; a
    --set value still wins (with a warning when it differs from LOCAL_WORLD_SIZE)."""
    from suite.run_spec import Selection
    from suite.selection import base_cases, resolve_at

    sel = Selection(cases=("mlp/hierarchical",), size="tiny")
    (local,) = resolve_at(sel, base_cases(sel, "tiny"), 8)
    assert local.config.resolve_inter_nranks(8) == 4 and local.skip is None
    (multi,) = resolve_at(sel, base_cases(sel, "tiny"), 8, local_world=2)
    assert multi.config.resolve_inter_nranks(8, 2) == 2 and multi.skip is None
    given = Selection(cases=("mlp/hierarchical",), size="tiny", sets=("hierarchical_allreduce_inter_nranks=4",))
    (rc,) = resolve_at(given, base_cases(given, "tiny"), 8, local_world=2)
    assert rc.config.hierarchical_allreduce_inter_nranks == 4
    with pytest.warns(UserWarning, match="differs from torchrun's LOCAL_WORLD_SIZE=2"):
        rc.config.check_world(8, 2, torchrun=True)


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


_PENDING: list = []


def leave_one_queued_on_rank() -> int:
    """Rank 0 queues an allreduce rank 1 never joins (as an NCCL rank's asynchronous launch leaves it)."""
    import torch
    import torch.distributed as dist

    if dist.get_rank() == 0:
        _PENDING.append(dist.all_reduce(torch.full((1,), 100.0), async_op=True))
        return 0
    raise ValueError("boom on rank 1")


def reduce_rank_on_rank() -> float:
    import torch
    import torch.distributed as dist

    t = torch.full((1,), float(dist.get_rank() + 1))
    dist.all_reduce(t)
    return t.item()


def test_a_rank_pool_world_is_rebuilt_in_place_after_a_rank_error():
    """The rank pool's side (the single-host GPU nightly): `rebuild_world_on_rank` on every rank, then the next
    allreduce sums what it was sent.  A pool of its own: the orphaned collective must not reach the session's."""
    from suite.runtime import RankPool
    from suite.runtime.pool import RankError
    from suite.runtime.torchrun import rebuild_world_on_rank

    pool = RankPool(2, timeout=120, pg_timeout=20, num_threads=1)
    try:
        with pytest.raises(RankError, match="boom on rank 1"):
            pool.run(leave_one_queued_on_rank)
        assert pool.run(rebuild_world_on_rank, {"tag": "test"}) == [True, True]
        assert pool.run(reduce_rank_on_rank, timeout=60) == [3.0, 3.0]
    finally:
        pool.close()


def test_the_runner_rebuilds_the_world_after_a_rank_error_under_nccl_and_gloo():
    from suite.measure.timing import rebuild_on_rank
    from suite.run_spec import RunFacts, RunOptions
    from suite.runner import CaseRunner
    from suite.runtime.pool import RankError
    from tests.test_runner import FakeLauncher, _rc

    class Launcher(FakeLauncher):
        def run(self, fn, kwargs=None, timeout=None):
            if fn is rebuild_on_rank:
                self.calls.append("rebuild")
                return [True, True]
            names = [v["name"] for v in kwargs["variants"]] if kwargs and "variants" in kwargs else []
            if len(names) > 2:
                self.calls.append(names)
                raise RankError("time_on_rank raised on rank(s) [1]", {1: "boom"})
            return super().run(fn, kwargs, timeout)

    for backend in ("nccl", "gloo"):  # gloo too: an orphaned collective breaks its world (tests/test_recover.py)
        launcher = Launcher()
        runner = CaseRunner(launcher, 2, RunOptions(check=False, utilization=False), metadata={},
                            facts=RunFacts(backend=backend))
        runner.run_model([_rc("mlp/plain"), _rc("mlp/overlap"), _rc("mlp/fusion")], lambda *a: None)
        assert launcher.calls[0] == ["plain", "overlap", "fusion"]
        assert launcher.calls[1] == "rebuild", (backend, launcher.calls)  # before the next call
