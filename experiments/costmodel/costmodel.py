"""Alpha-beta cost of the collectives over a cluster description.

A message of m bytes over a link costs ``alpha + m / B``: alpha is the per-message latency
(software and wire), B the link's bandwidth in bytes/s.  A cluster is N nodes of R ranks
(p = N·R ranks in all; nodes are consecutive blocks of ranks).  Every node has one link to
the switch, full duplex at ``inter_bw`` in each direction (a NIC); ranks of one node reach
each other at ``intra_bw`` per rank pair (NVLink/NVSwitch), or, with ``intra_shared``, over a
bus of ``intra_bw`` shared by all of the node's traffic (the emulated cluster's loopback).

Every formula below is for n bytes per rank (the size of the tensor being reduced) and
returns seconds.  Derivations are in each function's comments; the notation is
    S = number of sequential message steps,
    m = bytes each rank sends in one step,
    a step's time = alpha + (the most loaded link's bytes in that step) / (its bandwidth),
i.e. every step is as slow as its slowest link, and the steps do not overlap each other.

The bound quoted in the issue falls out of these: with a slow inter-node link, a flat ring
puts 2(p-1)/p·n bytes on each node link, the hierarchical allreduce 2(N-1)/N·n, so
hierarchical is faster by ((p-1)/p) / ((N-1)/N): 1.5x for 2x2, 1.75x for 2x4.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from suite.cluster.spec import ClusterSpec

__all__ = ["Cluster", "ring_allreduce", "hierarchical_allreduce", "hierarchical_allreduce_reduce_bcast",
           "broadcast", "allgather", "reduce_scatter", "ring_step_time", "hierarchical_speedup_bound",
           "allreduce", "tcp_payload_efficiency", "from_spec", "latency_bandwidth_split", "step_alpha",
           "without_latency", "comm_cpu_seconds", "interp_log"]


@dataclass(frozen=True)
class Cluster:
    nodes: int
    ranks_per_node: int
    inter_bw: float  # bytes/s, each direction of one node's link to the switch
    intra_bw: float = math.inf  # bytes/s between two ranks of a node (math.inf: free)
    inter_lat: float = 0.0  # alpha of a message step that crosses nodes, seconds
    intra_lat: float = 0.0  # alpha of a message step inside a node, seconds
    intra_shared: bool = False  # intra_bw is one bus per node (loopback) instead of per rank pair
    # Calibrated per-message latency (``experiments.costmodel.calibrate``): ((message bytes, seconds per step), …),
    # interpolated in log size; empty: ``inter_lat`` for every size.
    alpha_table: tuple = ()
    bcast_table: tuple = ()  # the same for a broadcast's tree steps; empty: max(inter_lat, intra_lat)
    bcast_tree: bool = False  # broadcast as a binomial tree (gloo) instead of a pipelined chain (NCCL)
    # CPU contention (emulated cluster): CPU seconds a rank spends per byte allreduced (flat / two-level),
    # and the cores every rank of the machine shares (math.inf: communication has its own, as on GPUs).
    cpu_per_byte: float = 0.0
    cpu_per_byte_hier: float = 0.0
    cores: float = math.inf
    # collectives one communicator progresses at once when launched asynchronously: 1 for NCCL (one
    # stream), 2 for gloo (ProcessGroupGloo runs two worker threads per process group)
    async_lanes: int = 1

    def __post_init__(self) -> None:
        for name in ("nodes", "ranks_per_node"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"Cluster.{name}={v!r}: must be a whole number >= 1")
        for name in ("inter_bw", "intra_bw"):
            v = getattr(self, name)
            if not (v > 0):
                raise ValueError(f"Cluster.{name}={v!r}: must be > 0 bytes/s (math.inf for free)")
        for name in ("inter_lat", "intra_lat", "cpu_per_byte", "cpu_per_byte_hier"):
            v = getattr(self, name)
            if not (v >= 0 and math.isfinite(v)):
                raise ValueError(f"Cluster.{name}={v!r}: must be a finite number >= 0")
        if not (isinstance(self.async_lanes, int) and self.async_lanes >= 1):
            raise ValueError(f"Cluster.async_lanes={self.async_lanes!r}: must be a whole number >= 1")
        if not (self.cores > 0):
            raise ValueError(f"Cluster.cores={self.cores!r}: must be > 0 (math.inf: no shared cores)")
        for name in ("alpha_table", "bcast_table"):
            for pt in getattr(self, name):
                if len(pt) != 2 or not all(math.isfinite(x) and x >= 0 for x in pt):
                    raise ValueError(f"Cluster.{name} entry {pt!r}: expected (bytes, seconds), finite, >= 0")

    @property
    def world(self) -> int:
        return self.nodes * self.ranks_per_node

    def with_(self, **changes) -> Cluster:
        return replace(self, **changes)


def tcp_payload_efficiency(mtu: int = 1500) -> float:
    """TCP payload per byte on an Ethernet link (what tbf counts): IPv4 20 + TCP 20 + timestamps 12
    bytes of headers in each MTU-sized packet, plus the 14-byte Ethernet header the qdisc sees."""
    return (mtu - 52) / (mtu + 14)


def from_spec(spec: ClusterSpec, *, mtu: int = 1500, intra_bw: float = math.inf, inter_lat: float = 1e-4,
              intra_lat: float = 5e-5) -> Cluster:
    """The model of an emulated cluster: the tbf rate times the TCP payload efficiency; an
    ``intra=RATE`` limit becomes a shared per-node bus (it is a tbf on the node's loopback)."""
    eff = tcp_payload_efficiency(mtu)
    if spec.intra_bps is not None:
        # loopback: the tbf sees a 65536-byte MTU, so its header overhead is negligible
        return Cluster(spec.nodes, spec.ranks_per_node, spec.inter_bps / 8 * eff, spec.intra_bps / 8,
                       inter_lat, intra_lat, intra_shared=True)
    return Cluster(spec.nodes, spec.ranks_per_node, spec.inter_bps / 8 * eff, intra_bw, inter_lat, intra_lat)


def interp_log(table, m: float) -> float:
    """Linear interpolation of ``((size, value), …)`` (sorted by size) in log size; held beyond the ends."""
    if not table:
        return 0.0
    if m <= table[0][0]:
        return float(table[0][1])
    if m >= table[-1][0]:
        return float(table[-1][1])
    for (x0, y0), (x1, y1) in zip(table, table[1:]):
        if x0 <= m <= x1:
            if x1 == x0:
                return float(y1)
            w = (math.log(m) - math.log(x0)) / (math.log(x1) - math.log(x0))
            return float(y0 + w * (y1 - y0))
    return float(table[-1][1])  # pragma: no cover


def step_alpha(cl: Cluster, m: float) -> float:
    """alpha of one message step of m bytes that crosses nodes: the calibrated table at m, or ``inter_lat``."""
    if cl.alpha_table:
        return interp_log(cl.alpha_table, m)
    return cl.inter_lat


def without_latency(cl: Cluster) -> Cluster:
    """The same cluster with every alpha 0 (what is left is moving bytes)."""
    return cl.with_(inter_lat=0.0, intra_lat=0.0, alpha_table=tuple((m, 0.0) for m, _ in cl.alpha_table),
                    bcast_table=tuple((m, 0.0) for m, _ in cl.bcast_table))


def _intra_time(cl: Cluster, m: float, edges: int) -> float:
    """Time for ``edges`` intra-node ring edges of one node to each carry m bytes at once."""
    if edges <= 0 or m <= 0:
        return 0.0
    load = m * edges if cl.intra_shared else m
    return load / cl.intra_bw


def ring_step_time(cl: Cluster, m: float) -> float:
    """One step of a ring over all p ranks in rank order, every rank sending m bytes to the next.

    With N > 1 the ring leaves each node once (last rank of node k -> first rank of node k+1)
    and enters it once, so each node link carries m bytes per direction; inside a node R-1
    ring edges carry m each.  The step waits for the slower of the two.
    """
    N, R = cl.nodes, cl.ranks_per_node
    if N > 1:
        inter = m / cl.inter_bw
        intra = _intra_time(cl, m, R - 1)
        return step_alpha(cl, m) + max(inter, intra)
    return cl.intra_lat + _intra_time(cl, m, R)


def ring_allreduce(n: float, cl: Cluster) -> float:
    """Flat ring allreduce (reduce-scatter then allgather around one ring of all p ranks).

    The tensor is cut into p chunks of n/p bytes.  Reduce-scatter: p-1 steps, in each every rank
    sends one chunk to its successor and adds the chunk it receives; allgather: p-1 more steps
    passing the reduced chunks on.  S = 2(p-1), m = n/p:
        T = 2(p-1) · (alpha + (n/p) / B_bottleneck)
    With a slow inter-node link the bandwidth term is 2(p-1)/p · n / inter_bw.
    (gloo's default allreduce and NCCL's ring are this algorithm.)
    """
    p = cl.world
    if p == 1 or n <= 0:
        return 0.0
    return 2 * (p - 1) * ring_step_time(cl, n / p)


def reduce_scatter(n: float, cl: Cluster) -> float:
    """Ring reduce-scatter over all p ranks: S = p-1, m = n/p; each rank ends with n/p reduced bytes."""
    p = cl.world
    if p == 1 or n <= 0:
        return 0.0
    return (p - 1) * ring_step_time(cl, n / p)


def allgather(n: float, cl: Cluster) -> float:
    """Ring allgather of an n-byte output (each rank contributes n/p): S = p-1, m = n/p."""
    return reduce_scatter(n, cl)


def broadcast(n: float, cl: Cluster) -> float:
    """Broadcast of n bytes from rank 0, pipelined along a chain of all p ranks (NCCL's ring
    broadcast): the message is cut into many chunks that follow each other down the chain, so
    after the pipeline fills (p-1 latencies) the time is set by the slowest link carrying all n
    bytes once:  T = (p-1)·alpha + n / B_bottleneck.  The chain crosses each node link once.
    """
    p, N, R = cl.world, cl.nodes, cl.ranks_per_node
    if p == 1 or n <= 0:
        return 0.0
    if cl.bcast_tree:
        # gloo: a binomial tree, ceil(log2 p) steps; each step's alpha calibrated (bcast_table), the
        # bytes cross a node link once (the tree's first step), the intra steps run at once
        steps = math.ceil(math.log2(p))
        alpha = interp_log(cl.bcast_table, n) if cl.bcast_table else max(cl.inter_lat, cl.intra_lat)
        move = n / cl.inter_bw if N > 1 else _intra_time(cl, n, 1)
        return steps * alpha + move
    if N > 1:
        return (p - 1) * max(cl.inter_lat, cl.intra_lat) + max(n / cl.inter_bw, _intra_time(cl, n, R - 1))
    return (p - 1) * cl.intra_lat + _intra_time(cl, n, R - 1)


def _node_only(cl: Cluster) -> Cluster:
    return cl.with_(nodes=1)


def hierarchical_allreduce(n: float, cl: Cluster) -> dict:
    """Two-level allreduce (Horovod's; the one the issue names): per node a ring reduce-scatter,
    then for each local index i an allreduce across nodes of shard i, then per node an allgather.

    1. intra reduce-scatter over R ranks: S = R-1, m = n/R:   (R-1)·(alpha_intra + (n/R)/B_intra)
       (all nodes do this at once, on their own links).
    2. inter allreduce: R allreduces at once (one per local index), each a ring over the N nodes
       of an n/R-byte shard: S = 2(N-1), m = n/(R·N) per flow.  All R flows of a node share the
       node's link, so a step moves R·n/(R·N) = n/N bytes per direction over it:
                                                                 2(N-1)·(alpha_inter + (n/N)/B_inter)
    3. intra allgather: as 1.
    Inter-node bytes per node link: 2(N-1)/N · n, against 2(p-1)/p · n for the flat ring.
    Returns the three phases and their sum ("total").
    """
    N, R = cl.nodes, cl.ranks_per_node
    if n <= 0 or cl.world == 1:
        return {"reduce_scatter": 0.0, "inter_allreduce": 0.0, "allgather": 0.0, "total": 0.0}
    node = _node_only(cl)
    rs = (R - 1) * ring_step_time(node, n / R) if R > 1 else 0.0
    # alpha at the message each of the R flows sends per step (n/(R·N)), as in the flat ring's table
    inter = 2 * (N - 1) * (step_alpha(cl, n / (R * N)) + (n / N) / cl.inter_bw) if N > 1 else 0.0
    ag = rs
    return {"reduce_scatter": rs, "inter_allreduce": inter, "allgather": ag, "total": rs + inter + ag}


def hierarchical_allreduce_reduce_bcast(n: float, cl: Cluster) -> dict:
    """Paddle's two-level allreduce: intra-node reduce to the node's first rank, allreduce of the
    whole tensor among the N first ranks, intra-node broadcast.

    1. intra reduce of n bytes, a pipelined chain of R ranks (the reverse of a broadcast):
       (R-1)·alpha_intra + n/B_intra
    2. inter ring allreduce of n bytes over N ranks, one flow per node link:
       2(N-1)·(alpha_inter + (n/N)/B_inter)   (the same inter-node bytes as the variant above)
    3. intra broadcast: as 1.
    The R-1 other ranks of a node idle during 2, and the intra phases move n instead of
    (R-1)/R·n, so with fast intra links both variants cost about the same.
    """
    N, R = cl.nodes, cl.ranks_per_node
    if n <= 0 or cl.world == 1:
        return {"reduce": 0.0, "inter_allreduce": 0.0, "broadcast": 0.0, "total": 0.0}
    node = _node_only(cl)
    red = broadcast(n, node) if R > 1 else 0.0
    inter = 2 * (N - 1) * (step_alpha(cl, n / N) + (n / N) / cl.inter_bw) if N > 1 else 0.0
    return {"reduce": red, "inter_allreduce": inter, "broadcast": red, "total": 2 * red + inter}


def allreduce(n: float, cl: Cluster, hierarchical: bool = False, variant: str = "rs_ag") -> float:
    """The allreduce a setting uses: flat ring, or two-level (``rs_ag`` or ``reduce_bcast``)."""
    if not hierarchical:
        return ring_allreduce(n, cl)
    if variant == "rs_ag":
        return hierarchical_allreduce(n, cl)["total"]
    if variant == "reduce_bcast":
        return hierarchical_allreduce_reduce_bcast(n, cl)["total"]
    raise ValueError(f"variant={variant!r}: allowed: rs_ag, reduce_bcast")


def latency_bandwidth_split(n: float, cl: Cluster, hierarchical: bool = False, variant: str = "rs_ag") -> tuple:
    """(latency part, bandwidth part) of :func:`allreduce`: the alpha terms at this size (they do not
    shrink when collectives share a link) and the rest, moving bytes (it does)."""
    if n <= 0:
        return 0.0, 0.0
    total = allreduce(n, cl, hierarchical, variant)
    bw = allreduce(n, without_latency(cl), hierarchical, variant)
    return max(0.0, total - bw), bw


def hierarchical_speedup_bound(cl: Cluster) -> float:
    """flat / hierarchical when only the inter-node link counts: ((p-1)/p) / ((N-1)/N)."""
    N, p = cl.nodes, cl.world
    if N < 2:
        return math.nan
    return ((p - 1) / p) / ((N - 1) / N)


def comm_cpu_seconds(n: float, cl: Cluster, hierarchical: bool = False) -> float:
    """CPU seconds one rank spends allreducing n bytes (the calibrated contention term; 0 without it)."""
    return n * (cl.cpu_per_byte_hier if hierarchical else cl.cpu_per_byte)
