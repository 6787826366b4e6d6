"""Starting ranks inside the nodes of an emulated cluster.

:func:`pool_kwargs` is the hook: the keyword arguments that make a :class:`RankPool` start rank
r inside its node's network namespace (nodes are consecutive blocks of ranks), with gloo (and
NCCL) bound to the node's interface, and the rendezvous store listening on node 0's address in
node 0's namespace.  :func:`cluster_pool` brings a cluster up with such a pool and takes both
down again, whatever happens.

The emulated cluster runs on CPU (gloo) only.  Its links are rate-limited veth pairs between
network namespaces; NCCL on one host would move the data through shared memory, P2P or NVLink and
bypass them, so the figures would describe the GPU box, not the cluster.  The ranks get an empty
``CUDA_VISIBLE_DEVICES`` (they see no GPU, so the platform is CPU/gloo), and ``--device cuda`` with
``--cluster`` is refused before anything starts.

    with cluster_pool(parse_cluster("2x2:inter=200mbit"), timeout=300) as (cluster, pool):
        pool.run(timed_allreduce, {...})
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

from ..config import ConfigError
from ..runtime.pool import RankPool
from .emulate import NODE_IF, EmulatedCluster
from .spec import ClusterSpec, ClusterSpecError, parse_cluster

__all__ = ["pool_kwargs", "cluster_pool", "rank_env", "cluster_option", "cluster_sets", "start_cluster", "refuse_cuda"]


def rank_env(cluster: EmulatedCluster, rank: int) -> dict:
    node = cluster.node_of_rank(rank)
    return {
        "GLOO_SOCKET_IFNAME": NODE_IF,
        "NCCL_SOCKET_IFNAME": NODE_IF,
        "FLEETBENCH_CLUSTER": str(cluster.spec),
        "FLEETBENCH_NODE": str(node.index),
        "FLEETBENCH_RANKS_PER_NODE": str(cluster.spec.ranks_per_node),
        "CUDA_VISIBLE_DEVICES": "",  # CPU/gloo: NCCL would bypass the emulated links (module docstring)
    }


def pool_kwargs(cluster: EmulatedCluster) -> dict:
    """``RankPool(cluster.spec.world_size, **pool_kwargs(cluster), …)`` places the ranks on the nodes."""
    world = cluster.spec.world_size
    return {
        "rank_netns": [cluster.node_of_rank(r).netns for r in range(world)],
        "rank_env": [rank_env(cluster, r) for r in range(world)],
        "store_host": cluster.master_address,
        "store_netns": cluster.nodes[0].netns,
    }


@contextlib.contextmanager
def cluster_pool(spec: ClusterSpec, **pool_options) -> Iterator[tuple]:
    """An emulated cluster and a started rank pool on it; the pool is closed before the cluster goes."""

    refuse_cuda(pool_options.get("device"))
    cluster = EmulatedCluster(spec)
    pool = None
    try:
        cluster.up()
        pool = RankPool(spec.world_size, **pool_kwargs(cluster), **pool_options)
        pool.start()
        yield cluster, pool
    finally:
        try:
            if pool is not None:
                pool.close()
        finally:
            cluster.down()


def cluster_option(text: str, device: str | None = None, under_torchrun: bool = False) -> ClusterSpec:
    """A command's ``--cluster`` value parsed and checked before any rank starts (errors as ConfigError naming
    it): not under torchrun, not with ``device`` cuda, and only where a cluster can be emulated.  The command
    takes its world size from it (``spec.world_size``) and its hierarchy from :func:`cluster_sets`."""
    from .emulate import unavailable_reason  # at call time: tests replace it

    try:
        spec = parse_cluster(text)
    except ClusterSpecError as exc:
        raise ConfigError(str(exc)) from None
    if under_torchrun:
        raise ConfigError(f"--cluster {text!r}: not under torchrun (the real machines are the cluster)")
    try:
        refuse_cuda(device)
    except ValueError as exc:
        raise ConfigError(f"--cluster {text!r}: {exc}") from None
    reason = unavailable_reason()
    if reason:
        raise ConfigError(f"--cluster {text!r}: cannot emulate a cluster here: {reason}")
    return spec


def cluster_sets(spec: ClusterSpec, sets: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """``sets`` (``--set`` values) with the hierarchical split of the cluster's nodes
    (``hierarchical_allreduce_inter_nranks`` = ranks per node) unless they give it."""
    sets = tuple(sets)
    if spec.ranks_per_node > 1 and not any(s.split("=", 1)[0].strip() == "hierarchical_allreduce_inter_nranks"
                                           for s in sets):
        sets += (f"hierarchical_allreduce_inter_nranks={spec.ranks_per_node}",)
    return sets


def refuse_cuda(device) -> None:
    """The emulated cluster is CPU-only (see the module docstring)."""
    if device == "cuda":
        raise ValueError("an emulated cluster runs on CPU (gloo): NCCL on one host would bypass its rate-limited "
                         "links (shared memory, P2P, NVLink); drop --device cuda, or run on real nodes under torchrun")


def start_cluster(spec: ClusterSpec) -> tuple:
    """Bring an emulated cluster up; returns (cluster, RankPool keyword arguments).  The caller
    closes its pool and then calls ``cluster.down()`` (atexit and SIGTERM also take it down)."""
    cluster = EmulatedCluster(spec).up()
    return cluster, pool_kwargs(cluster)
