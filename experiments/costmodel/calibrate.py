"""Calibrating the cost model from collective micro-benchmarks (``python -m experiments.costmodel calibrate``).

Only micro-benchmarks feed the model, never the training runs it is checked against.  On the
ranks of an emulated cluster (:func:`calibration_on_rank`) each *kind* of collective the
training paths issue is timed over a sweep of sizes, back to back (``iters`` per block, a
barrier at each end of a block, ``rounds`` blocks; the parent takes the slowest rank per block
and the median over blocks), and the CPU time the rank process spent (all its threads, user +
system: ``time.process_time``) is read around each block:

- ``allreduce``: flat allreduce over the world (the plain and fused paths);
- ``broadcast``: from rank 0 over the world (the BatchNorm buffers before each forward);
- ``intra``: the two-level allreduce's node phases alone (reduce-scatter, then allgather on every
  node's group), every node at once, as the hierarchical path runs them: on one machine the
  emulated nodes share the cores, so a node measured alone would be faster than it is in the run;
- ``hier``: the whole two-level allreduce (only its CPU time is used: see ``cpu_per_byte``).

:func:`fit` turns the rows into the model's terms (:class:`Calibration`, JSON):

- ``intra_lat``, ``intra_bw``: least squares (relative) of the node phases'
  ``2(R-1)·intra_lat + 2(R-1)/R · n / intra_bw`` over the ``intra`` sizes;
- ``alpha_table``: per-message latency as a function of the message size.  For each allreduce
  size n the ring's 2(p-1) steps each move m = n/p bytes; what the measured time has beyond
  the link's (tbf rate x TCP payload efficiency) and the intra edges' share is divided over
  the steps: ``alpha(m) = (T - 2(p-1)·max(m/inter_bw, m/intra_bw)) / 2(p-1)``, floored at 0.
  The sizes whose bytes take under 10% of the time measure the same latency and share their
  median.  Between sizes it is interpolated linearly in log m, beyond the ends held constant
  (at the large sizes it also holds what the link delivers below its nominal rate);
- ``bcast_table``: the same for broadcast, ``ceil(log2 p)`` steps (gloo's broadcast is a tree),
  bandwidth part n/inter_bw;
- ``cpu_per_byte`` (flat) and ``cpu_per_byte_hier``: CPU seconds a rank spends per byte of
  tensor allreduced, the slope of CPU time against size over the sizes >= 1 MB.  This is the
  contention term: on the emulated cluster every rank computes and communicates on the same
  few cores, so what a collective costs in CPU is taken from the computation it overlaps
  (``experiments.costmodel.simulate``), shared over the cores (``cores``: the CPUs the ranks may use).
"""
from __future__ import annotations

import json
import math
import os
import statistics
from dataclasses import asdict, dataclass, field

from suite.cluster.spec import ClusterSpec

from . import costmodel as cm
from .costmodel import interp_log

__all__ = ["Calibration", "calibration_on_rank", "fit", "merge_rows", "DEFAULT_SIZES", "interp_log",
           "usable_cores", "calibrate_on_pool"]

KiB, MiB = 2**10, 2**20
DEFAULT_SIZES = {
    "allreduce": [KiB, 4 * KiB, 16 * KiB, 64 * KiB, 256 * KiB, MiB, 4 * MiB, 16 * MiB],
    "broadcast": [KiB, 8 * KiB, 64 * KiB],
    "intra": [256 * KiB, MiB, 4 * MiB, 16 * MiB],
    "hier": [MiB, 4 * MiB, 16 * MiB],
}
KINDS = ("allreduce", "broadcast", "intra", "hier")  # in this order, rows of suite.comm.table
CPU_FIT_MIN = MiB  # sizes from which CPU time is fitted as linear in bytes
GLOO_LANES = 2  # ProcessGroupGloo's worker threads per process group (torch's default Options._threads)


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _iters_for(size: int, iters: int) -> int:
    """Fewer back-to-back repetitions of the large sizes (one 16 MB allreduce at 100 Mbit/s takes 2 s), more of
    the small ones: a block starts at each rank's exit from a barrier, and the ranks leave it up to a few
    steps apart; that skew, charged to the first operation of the slowest rank's block, is spread over more."""
    if size >= 4 * MiB:
        return max(1, min(iters, 2))
    if size >= MiB:
        return max(1, min(iters, 4))
    if size < 256 * KiB:
        return 3 * iters
    return iters


def calibration_on_rank(sizes: dict, ranks_per_node: int, iters: int = 10, rounds: int = 3,
                        warmup: int = 1) -> dict:
    """Time every (kind, size) of ``sizes`` on this rank (see the module docstring)."""
    import functools

    import torch

    from suite.comm.table import COLLECTIVES, Layout
    from suite.measure.interleave import timed_block
    from suite.runtime.context import current

    ctx = current()
    device = ctx.platform.device
    rpn = max(1, ranks_per_node)
    rows = []
    for kind in (k for k in KINDS if sizes.get(k)):  # the rows of suite.comm.table of the same names
        build = COLLECTIVES[kind].build(Layout(ranks_per_node=rpn))
        for size in sizes[kind]:
            numel = max(rpn, int(size) // 4)
            numel -= numel % rpn
            run = functools.partial(build, torch.zeros(numel, device=device))
            n = _iters_for(int(size), iters)
            for _ in range(warmup):
                run()
            cpus: list[float] = []
            secs = [timed_block(run, n, ctx.platform, barriers="start", cpu_s=cpus) for _ in range(rounds)]
            rows.append({"kind": kind, "bytes": numel * 4, "seconds": secs, "cpu_seconds": cpus})
    return {"rank": ctx.rank, "world": ctx.world_size, "rows": rows}


def merge_rows(answers: list[dict]) -> list[dict]:
    """One row per (kind, size): the median over blocks of the slowest rank; CPU: the ranks' mean."""
    out = []
    for i, row in enumerate(answers[0]["rows"]):
        blocks = len(row["seconds"])
        slowest = [max(a["rows"][i]["seconds"][b] for a in answers) for b in range(blocks)]
        cpu = [statistics.fmean(a["rows"][i]["cpu_seconds"][b] for a in answers) for b in range(blocks)]
        out.append({"kind": row["kind"], "bytes": row["bytes"], "seconds": statistics.median(slowest),
                    "cpu_seconds": statistics.median(cpu)})
    return out


@dataclass
class Calibration:
    """The fitted terms of one emulated cluster (all seconds, bytes, bytes/s)."""

    cluster: str
    nodes: int
    ranks_per_node: int
    inter_bw: float
    intra_lat: float
    intra_bw: float
    alpha_table: list  # [[per-step message bytes, seconds], …]
    bcast_table: list  # [[message bytes, seconds per tree step], …]
    cpu_per_byte: float
    cpu_per_byte_hier: float
    cores: int
    rows: list = field(default_factory=list)  # the merged micro-benchmark rows it was fitted on

    def cluster_model(self) -> cm.Cluster:
        small = self.alpha_table[0][1] if self.alpha_table else 0.0
        return cm.Cluster(self.nodes, self.ranks_per_node, self.inter_bw, self.intra_bw, small, self.intra_lat,
                          alpha_table=tuple((float(m), float(a)) for m, a in self.alpha_table),
                          bcast_table=tuple((float(m), float(a)) for m, a in self.bcast_table),
                          cpu_per_byte=self.cpu_per_byte, cpu_per_byte_hier=self.cpu_per_byte_hier,
                          cores=float(self.cores), bcast_tree=True, async_lanes=GLOO_LANES)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_dict(cls, d: dict) -> Calibration:
        names = [f.name for f in cls.__dataclass_fields__.values()]
        missing = [n for n in names if n not in d and n != "rows"]
        if missing:
            raise ValueError(f"calibration: field(s) {', '.join(missing)} missing; written by python -m "
                             f"experiments.costmodel calibrate --cluster … --out FILE")
        c = cls(**{n: d[n] for n in names if n in d})  # other keys (e.g. a figure's notes) are ignored
        for name in ("inter_bw", "intra_bw", "cores"):
            v = getattr(c, name)
            if not (isinstance(v, (int, float)) and v > 0 and math.isfinite(v)):
                raise ValueError(f"calibration: {name}={v!r}: expected a finite number > 0")
        for name in ("intra_lat", "cpu_per_byte", "cpu_per_byte_hier"):
            v = getattr(c, name)
            if not (isinstance(v, (int, float)) and v >= 0 and math.isfinite(v)):
                raise ValueError(f"calibration: {name}={v!r}: expected a finite number >= 0")
        for name in ("alpha_table", "bcast_table"):
            for pt in getattr(c, name):
                if not (isinstance(pt, (list, tuple)) and len(pt) == 2
                        and all(isinstance(x, (int, float)) and math.isfinite(x) and x >= 0 for x in pt)):
                    raise ValueError(f"calibration: {name} entry {pt!r}: expected [bytes, seconds], finite, >= 0")
        return c


def _weighted_line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least squares y = a + b·x weighted by 1/y² (relative errors); a, b floored at 0."""
    if len(xs) == 1:
        return 0.0, max(0.0, ys[0] / xs[0]) if xs[0] > 0 else 0.0
    w = [1.0 / max(y, 1e-12) ** 2 for y in ys]
    sw = sum(w)
    mx = sum(wi * x for wi, x in zip(w, xs)) / sw
    my = sum(wi * y for wi, y in zip(w, ys)) / sw
    sxx = sum(wi * (x - mx) ** 2 for wi, x in zip(w, xs))
    b = sum(wi * (x - mx) * (y - my) for wi, x, y in zip(w, xs, ys)) / sxx if sxx > 0 else 0.0
    b = max(0.0, b)
    a = max(0.0, my - b * mx)
    return a, b


LATENCY_BOUND = 0.1  # sizes whose bytes take under this share of the time measure the latency alone


def _pool_latency_bound(pts: list[tuple]) -> list:
    """[[size, alpha]] from (size, residual alpha, share of the time spent moving bytes): the sizes where moving
    bytes is under LATENCY_BOUND of the time all measure the same per-step latency, so they share the median of
    their residuals (one noisy size cannot bend the small-message latency); the others keep their own, floored
    at 0."""
    small = [a for _, a, share in pts if share < LATENCY_BOUND]
    pooled = statistics.median(small) if small else None
    return [[m, max(0.0, pooled if (pooled is not None and share < LATENCY_BOUND) else a)] for m, a, share in pts]


def _cpu_slope(rows: list[dict]) -> float:
    pts = [(r["bytes"], r["cpu_seconds"]) for r in rows if r["bytes"] >= CPU_FIT_MIN]
    if len(pts) < 2:
        pts = [(r["bytes"], r["cpu_seconds"]) for r in rows]
    if not pts:
        return 0.0
    if len(pts) == 1:
        return max(0.0, pts[0][1] / pts[0][0])
    xs, ys = zip(*pts)
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    return max(0.0, sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx) if sxx > 0 else 0.0


def fit(spec: ClusterSpec, rows: list[dict], cores: int | None = None, mtu: int = 1500) -> Calibration:
    """The model's terms from merged micro-benchmark rows (see the module docstring)."""
    for r in rows:
        if not (math.isfinite(r["seconds"]) and r["seconds"] > 0 and math.isfinite(r["cpu_seconds"])):
            raise ValueError(f"calibration row {r!r}: time must be finite and > 0")
    N, R = spec.nodes, spec.ranks_per_node
    p = N * R
    inter_bw = spec.inter_bps / 8 * cm.tcp_payload_efficiency(mtu)
    by = {k: sorted((r for r in rows if r["kind"] == k), key=lambda r: r["bytes"])
          for k in KINDS}
    # intra-node phases: 2(R-1) steps of n/R bytes
    intra_lat, intra_bw = 0.0, math.inf
    if R > 1 and by["intra"]:
        steps = 2 * (R - 1)
        a, b = _weighted_line([steps / R * r["bytes"] for r in by["intra"]], [r["seconds"] for r in by["intra"]])
        intra_lat = a / steps
        intra_bw = 1.0 / b if b > 0 else math.inf
    if spec.intra_bps is not None:
        intra_bw = min(intra_bw, spec.intra_bps / 8)
    alpha_table = []
    if p > 1:
        steps = 2 * (p - 1)
        pts = []
        for r in by["allreduce"]:
            m = r["bytes"] / p
            move = m / inter_bw if N > 1 else 0.0
            move = max(move, m / intra_bw if R > 1 else 0.0)
            pts.append((m, (r["seconds"] - steps * move) / steps, steps * move / r["seconds"]))
        alpha_table = _pool_latency_bound(pts)
    bcast_table = []
    if p > 1:
        tree = math.ceil(math.log2(p))
        pts = []
        for r in by["broadcast"]:
            n = r["bytes"]
            move = n / inter_bw if N > 1 else (n / intra_bw if math.isfinite(intra_bw) else 0.0)
            pts.append((n, (r["seconds"] - move) / tree, move / r["seconds"]))
        bcast_table = _pool_latency_bound(pts)
    return Calibration(
        cluster=str(spec), nodes=N, ranks_per_node=R, inter_bw=inter_bw, intra_lat=intra_lat,
        intra_bw=intra_bw if math.isfinite(intra_bw) else 1e15,
        alpha_table=alpha_table, bcast_table=bcast_table,
        cpu_per_byte=_cpu_slope(by["allreduce"]),
        cpu_per_byte_hier=_cpu_slope(by["hier"]) if by["hier"] else _cpu_slope(by["allreduce"]),
        cores=cores or usable_cores(), rows=rows)


def calibrate_on_pool(pool, spec: ClusterSpec, sizes: dict | None = None, iters: int = 10, rounds: int = 3,
                      timeout: float | None = None) -> Calibration:
    """Run the micro-benchmarks on ``pool`` (ranks placed on the emulated cluster ``spec``) and fit."""
    sizes = dict(sizes or DEFAULT_SIZES)
    if spec.ranks_per_node < 2 or spec.nodes < 2:
        sizes.pop("hier", None)
    if spec.ranks_per_node < 2:
        sizes.pop("intra", None)
    kwargs = {"sizes": sizes, "ranks_per_node": spec.ranks_per_node, "iters": iters, "rounds": rounds}
    answers = pool.run(calibration_on_rank, kwargs, **({"timeout": timeout} if timeout else {}))
    return fit(spec, merge_rows(answers))
