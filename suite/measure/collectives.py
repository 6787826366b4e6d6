"""Collective micro-benchmarks in the manner of nccl-tests (``fleetbench comm``).

For each message size, the variants take turns (:func:`suite.measure.interleave.interleaved_rounds`: every
variant once per round, the order rotated round by round, so a noisy machine's drift hits them alike): in each of
``rounds`` rounds every rank times ``iters`` back-to-back allreduces of each variant (after ``warmup`` untimed ones
per variant, a barrier at each end of every timed block) and keeps the time per operation; a rank reports the
median round, the table takes the slowest rank.  Bandwidths use nccl-tests'
formulas (``doc/PERFORMANCE.md``): algbw = bytes / time; allreduce busbw = algbw · 2(n−1)/n
(every variant below computes an allreduce, so all use the allreduce factor).

Verification is exact, as in nccl-tests: a separate run of each variant on inputs whose sums
are exact in floating point (``suite.comm.table``'s: rank r holds (r+1)·((i mod 7)+1), small
integers), compared element by element with the known sum; the ``#wrong`` column counts
mismatches (must be 0).  The timed loop runs on zeros so repeated in-place sums cannot overflow.

Variants (rows of ``suite.comm.table``):
- ``flat``: one allreduce on one communicator (``comm0``; the table's ``allreduce``);
- ``hier``: ``suite.comm.hierarchical`` (intra reduce-scatter, inter allreduce, intra allgather);
- ``hier_reduce``: the same with Paddle's schedule (intra reduce, inter allreduce, intra broadcast);
  both need at least 2 nodes of at least 2 ranks (one node has no inter-node step: a reduce-scatter
  and an all-gather are not a hierarchical allreduce, and would be timed as one);
- ``commN``: the message cut into N equal pieces, each allreduced asynchronously on its own
  communicator, then all waited on (the table's ``allreduce_comms``).
"""
from __future__ import annotations

import statistics

import torch

from ..comm.table import COLLECTIVES, Collective, Layout, busbw_factor
from ..runtime.context import current
from ..runtime.groups import comm_groups
from .interleave import interleaved_rounds, timed_block

__all__ = ["allreduce_sweep_on_rank", "format_table", "merge", "parse_variant", "sizes_between", "one_node",
           "default_variants"]

DTYPES = {"float32": torch.float32, "float64": torch.float64}


def sizes_between(min_bytes: int, max_bytes: int, factor: int) -> list[int]:
    out, s = [], min_bytes
    while s <= max_bytes:
        out.append(s)
        s *= factor
    return out


def one_node(world: int, inter_nranks: int) -> str:
    """Why the hierarchical variants are not hierarchical at ``world`` ranks in nodes of ``inter_nranks``."""
    return (f"{world} ranks in nodes of {inter_nranks} make one node, a reduce-scatter and an all-gather with no "
            f"inter-node step (not a hierarchical allreduce); give --nproc {2 * inter_nranks} or more, or a smaller "
            f"--inter-nranks")


def default_variants(world: int, inter_nranks: int) -> tuple[list[str], str]:
    """The variants swept when none are named, and a note on what was left out (empty: nothing): the hierarchical
    ones only where ``world`` ranks make at least 2 nodes of ``inter_nranks``."""
    hier = inter_nranks >= 2 and world % inter_nranks == 0
    if hier and world // inter_nranks >= 2:
        return ["flat", "hier", "hier_reduce", "comm2", "comm3"], ""
    note = "hier and hier_reduce left out (they need at least 2 nodes): " + one_node(world, inter_nranks)
    return ["flat", "comm2", "comm3"], note if hier else ""


def parse_variant(name: str, world: int, inter_nranks: int) -> tuple[str, int]:
    """(kind, parameter) of a variant name; raises ValueError naming what is allowed."""
    if name == "flat":
        return "flat", 1
    if name in ("hier", "hier_reduce"):
        if inter_nranks < 2 or world % inter_nranks:
            raise ValueError(f"variant {name!r} needs --inter-nranks >= 2 dividing the world size {world}, "
                             f"got {inter_nranks}")
        if world // inter_nranks < 2:
            raise ValueError(f"variant {name!r} needs at least 2 nodes: {one_node(world, inter_nranks)}")
        return name, inter_nranks
    if name.startswith("comm") and name[4:].isdigit() and 1 <= int(name[4:]) <= 16:
        return "comm", int(name[4:])
    raise ValueError(f"variant {name!r} is unknown; allowed: flat, hier, hier_reduce, comm1..comm16")


def _collective(kind: str, param: int) -> tuple[Collective, Layout]:
    """The table's row and layout of a parsed variant (on a rank: the communicator is created here)."""
    if kind == "flat":
        return COLLECTIVES["allreduce"], Layout(group=comm_groups(1)[0])
    if kind in ("hier", "hier_reduce"):
        return COLLECTIVES[kind], Layout(ranks_per_node=param)
    return COLLECTIVES["allreduce_comms"], Layout(comms=param)


def allreduce_sweep_on_rank(sizes: list[int], variants: list[str], inter_nranks: int = 2, iters: int = 20,
                            warmup: int = 5, dtype: str = "float32", rounds: int = 3) -> dict:
    """Verify, then time every (size, variant) on this rank, the variants of a size interleaved over ``rounds``
    rounds; returns per row the median round's seconds per op, every round's, and #wrong."""
    ctx = current()
    world, rank, platform = ctx.world_size, ctx.rank, ctx.platform
    device = platform.device  # NCCL carries only tensors on the rank's GPU
    dt = DTYPES[dtype]
    esize = dt.itemsize
    pad = inter_nranks if any(v.startswith("hier") for v in variants) else 1  # the reduce-scatter needs it
    table = {v: _collective(*parse_variant(v, world, inter_nranks)) for v in variants}
    runners = {v: coll.build(layout) for v, (coll, layout) in table.items()}
    rows = []
    for size in sizes:
        count = max(pad, (size // esize) // pad * pad)  # whole elements, divisible by the node / piece counts
        # exact verification, each variant on its own run; the timing on zeros (no overflow of repeated sums)
        wrong = {v: table[v][0].wrong(runners[v], count, dt, device, table[v][1]) for v in variants}
        bufs = {v: torch.zeros(count, dtype=dt, device=device) for v in variants}

        def warm(v: str) -> None:
            for _ in range(warmup):
                runners[v](bufs[v])  # noqa: B023 - called at once, in this loop
            platform.synchronize()

        def block(v: str) -> float:  # a block between barriers, the clock stopped after a synchronize
            return timed_block(lambda: runners[v](bufs[v]), iters, platform)  # noqa: B023 - called at once

        spans = interleaved_rounds(variants, rounds, block, warmup=warm)
        for v, per_round in zip(variants, spans):
            rows.append({"bytes": count * esize, "count": count, "variant": v,
                         "seconds": statistics.median(per_round), "rounds": per_round, "wrong": wrong[v]})
    return {"rank": rank, "world": world, "rows": rows, "dtype": dtype}


def merge(answers: list[dict]) -> list[dict]:
    """One row per (size, variant): the slowest rank's time, bandwidths, the sum of wrong elements."""
    world = answers[0]["world"]
    out = []
    for i, row in enumerate(answers[0]["rows"]):
        t = max(a["rows"][i]["seconds"] for a in answers)
        algbw = row["bytes"] / t / 1e9 if t > 0 else float("nan")
        out.append({**row, "seconds": t, "algbw": algbw, "busbw": algbw * busbw_factor("all_reduce", world),
                    "wrong": sum(a["rows"][i]["wrong"] for a in answers), "dtype": answers[0]["dtype"]})
    return out


def format_table(rows: list[dict], world: int) -> str:
    head = ("| size (B) | count (elements) | type | variant | time (us) | algbw (GB/s) | busbw (GB/s) | #wrong |\n"
            "|---:|---:|---|---|---:|---:|---:|---:|")
    lines = [head]
    for r in rows:
        lines.append(f"| {r['bytes']} | {r['count']} | {r['dtype']} | {r['variant']} | {r['seconds'] * 1e6:.1f} | "
                     f"{r['algbw']:.3f} | {r['busbw']:.3f} | {r['wrong']} |")
    lines.append("")
    lines.append(f"busbw = algbw x 2(n-1)/n with n = {world} (nccl-tests' allreduce factor); time = the slowest "
                 "rank's median round (each round one block of the timed iterations per variant, the variants of a "
                 "size interleaved, their order rotated round by round); #wrong = elements differing from the exact "
                 "sum (must be 0).")
    return "\n".join(lines)
