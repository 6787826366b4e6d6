"""The emulated cluster: --cluster parsing, namespaces/links/rates as asked (read back with ip and
tc), ranks placed in their nodes, everything removed afterwards (also when a rank is killed),
the two-level allreduce exact across the nodes, and a flat allreduce that takes about what the
ring formula says (a loose band: this checks the emulation, not the speed of our code).
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from suite.cluster.emulate import NODE_IF, EmulatedCluster, cleanup, list_namespaces, unavailable_reason
from suite.cluster.launch import cluster_pool, pool_kwargs
from suite.cluster.spec import ClusterSpec, ClusterSpecError, parse_cluster, parse_rate
from suite.measure.collectives import allreduce_sweep_on_rank
from suite.runtime.pool import RankFailure
from suite.runtime.probes import crash

_REASON = unavailable_reason()


def _need_netns():
    if _REASON:
        print(f"SKIP emulated cluster: {_REASON}", file=sys.stderr)
        pytest.skip(f"emulated cluster unavailable: {_REASON}")


# ---- parsing (no namespaces needed) ------------------------------------------------------
def test_parse_cluster_values():
    s = parse_cluster("2x4:inter=200mbit,intra=1.5gbit")
    assert (s.nodes, s.ranks_per_node, s.inter_bps, s.intra_bps) == (2, 4, 200_000_000, 1_500_000_000)
    assert s.world_size == 8 and s.node_of(3) == 0 and s.node_of(4) == 1
    assert parse_cluster("3X1:inter=10MBIT") == ClusterSpec(3, 1, 10_000_000, None)
    assert parse_cluster(str(s)) == s
    assert parse_rate("2gbit") == 2_000_000_000 and parse_rate("1500kbit") == 1_500_000


@pytest.mark.parametrize("text, words", [
    ("2x2", ["inter", "missing"]),
    ("2:inter=1gbit", ["'2'", "NxR"]),
    ("0x2:inter=1gbit", ["nodes=0"]),
    ("2x2:inter=100mbps", ["'mbps'", "bit, kbit, mbit, gbit"]),
    ("2x2:inter=fast", ["'fast'", "unit"]),
    ("2x2:speed=1gbit", ["'speed'", "inter, intra"]),
    ("2x2:intra=1gbit", ["inter=RATE is required"]),
    ("8x8:inter=1gbit", ["64 ranks", "at most"]),
    ("2x2:inter=10kbit", ["between"]),
])
def test_parse_cluster_errors_name_the_value(text, words):
    with pytest.raises(ClusterSpecError) as err:
        parse_cluster(text)
    msg = str(err.value)
    assert repr(text) in msg or text in msg
    for w in words:
        assert w in msg, (w, msg)


# ---- namespaces --------------------------------------------------------------------------
def _host_state() -> tuple:
    links = json.loads(subprocess.run(["ip", "-j", "addr", "show"], capture_output=True, text=True).stdout)
    return sorted((link["ifname"], link.get("mtu"), tuple(sorted(a["local"] for a in link.get("addr_info", []))))
                  for link in links)


def test_cluster_up_readback_and_down():
    _need_netns()
    host_before = _host_state()
    spec = parse_cluster("3x2:inter=150mbit,intra=2gbit")
    cl = EmulatedCluster(spec)
    try:
        cl.up()
        rb = cl.readback()
        assert rb["namespaces"] == sorted(cl.namespaces) and len(cl.namespaces) == 4
        for k, node in enumerate(rb["nodes"]):
            assert node["links"] == sorted(["lo", NODE_IF]), node
            assert node["addresses"] == [f"169.254.77.{k + 1}/24"]
            assert node["up"]
            assert node["egress_rate_bps"] == 150_000_000
            assert node["lo_rate_bps"] == 2_000_000_000
        sw = rb["switch"]
        assert sw["bridge"] == ["fbsw"]
        assert sw["ports"] == {"p0": "fbsw", "p1": "fbsw", "p2": "fbsw"}
        assert sw["port_rates_bps"] == {"p0": 150_000_000, "p1": 150_000_000, "p2": 150_000_000}
        assert _host_state() == host_before  # nothing on the host's own interfaces changed
        # pool placement: ranks 0,1 on node 0, ranks 2,3 on node 1, …; store on node 0's address
        kw = pool_kwargs(cl)
        assert kw["rank_netns"] == [cl.nodes[r // 2].netns for r in range(6)]
        assert all(e["GLOO_SOCKET_IFNAME"] == NODE_IF for e in kw["rank_env"])
        assert kw["store_host"] == "169.254.77.1" and kw["store_netns"] == cl.nodes[0].netns
    finally:
        removed = cl.down()
    assert sorted(removed) == sorted(cl.namespaces)
    assert not [n for n, rid, _ in list_namespaces() if rid == cl.run_id]
    assert cl.down() == []  # idempotent


def test_cleanup_removes_only_leftovers():
    _need_netns()
    spec = parse_cluster("1x1:inter=100mbit")
    orphan = EmulatedCluster(spec, owner_pid=0, remove_at_exit=False).up()  # no owner: a leftover
    mine = EmulatedCluster(spec).up()  # owned by this live process
    try:
        removed = cleanup()
        assert sorted(orphan.namespaces) == sorted(n for n in removed if orphan.run_id in n)
        assert not any(mine.run_id in n for n in removed)
        assert {n for n, rid, _ in list_namespaces() if rid == mine.run_id} == set(mine.namespaces)
    finally:
        orphan.down()
        mine.down()


def test_interrupted_process_leaves_nothing():
    """A process killed by SIGTERM with a cluster up removes it (signal handler + atexit)."""
    _need_netns()
    code = (
        "import os, signal, sys, time\n"
        "from suite.cluster.emulate import EmulatedCluster\n"
        "from suite.cluster.spec import parse_cluster\n"
        "cl = EmulatedCluster(parse_cluster('2x1:inter=100mbit')).up()\n"
        "print(cl.run_id, flush=True)\n"
        "os.kill(os.getpid(), signal.SIGTERM)\n"
        "time.sleep(30)\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    run_id = p.stdout.strip()
    assert run_id, p.stderr
    assert p.returncode == -15, (p.returncode, p.stderr)
    assert not [n for n, rid, _ in list_namespaces() if rid == run_id]


def test_flat_allreduce_follows_ring_formula_and_teardown_after_kill():
    """2x2 at 100 Mbit/s (`fleetbench comm`'s sweep on the cluster's ranks): the two-level allreduce is exact
    across the nodes; a 1 MB flat allreduce takes about 2(p-1)/p·n/B (loose band, the emulation's check);
    killing a rank still leaves nothing."""
    _need_netns()
    spec = parse_cluster("2x2:inter=100mbit")
    n = 1_000_000
    with cluster_pool(spec, timeout=120, pg_timeout=60, start_timeout=120, num_threads=1) as (cl, pool):
        names = set(cl.namespaces)
        assert {n_ for n_, rid, _ in list_namespaces() if rid == cl.run_id} == names
        res = pool.run(allreduce_sweep_on_rank, {"sizes": [n], "variants": ["flat", "hier", "hier_reduce"],
                                                 "inter_nranks": 2, "iters": 3, "warmup": 1})
        rows = {r["variant"]: r for r in res[0]["rows"]}
        assert rows["flat"]["bytes"] == n and rows["hier"]["bytes"] == n, rows
        wrong = {v: sum(a["rows"][i]["wrong"] for a in res) for i, v in enumerate(("flat", "hier", "hier_reduce"))}
        assert wrong == {"flat": 0, "hier": 0, "hier_reduce": 0}, wrong  # exact sums across the emulated nodes
        measured = max(a["rows"][0]["seconds"] for a in res)  # the slowest rank's mean over 3 allreduces
        # hand calculation: 2·3/4 · 1e6 B / (12.5e6 B/s · 1448/1514), the TCP payload share of a 1514-byte frame
        predicted = 2 * 3 / 4 * n / (100e6 / 8 * 1448 / 1514)
        assert abs(predicted - 0.1255) < 0.001
        ratio = measured / predicted
        assert math.isfinite(ratio) and 0.5 <= ratio <= 2.0, (measured, predicted)
        with pytest.raises(RankFailure):
            pool.run(crash, {"rank": 1}, timeout=60)
    assert not [n_ for n_, rid, _ in list_namespaces() if rid == cl.run_id]
