"""`fleetbench comm`: the allreduce micro-benchmarks' command line (its --help: ``ABOUT``); the sweep is
``suite.comm``'s, the emulated cluster ``suite.cluster.launch``'s."""
from __future__ import annotations

import functools
import re
import sys
from dataclasses import dataclass

from ..cluster.launch import cluster_option, start_cluster
from ..measure.metadata import machine_line
from ..runtime.pool import RankError, RankFailure
from ..validate import spec
from . import error, helps
from .checks import MAX_ROUNDS, MAX_STEPS, WEEK, available_memory, require_nproc
from .options import add_fields, add_shared, from_args

_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}
MAX_SIZE = 2**50  # a message size past any memory: refused while parsing (the memory bound comes later)
# Bytes a rank holds per byte of the largest message: the exact-check input and its expected values,
# the timing buffer, and the int64 index temporaries that build them (8-byte integers per element).
_HELD_PER_BYTE = {"float32": 3 + 2 * 8 / 4, "float64": 3 + 2 * 8 / 8}
fail = functools.partial(error, "comm")


@dataclass(frozen=True)
class CommOptions:
    """`fleetbench comm`'s options, each declared once: its flag, default, help and bounds (checked by
    ``from_args``: ``--iters 0: must be >= 1 and <= 1000000``)."""

    nproc: int = spec(2, "ranks (default 2)")  # at least 2 and what this machine runs: checked in main
    min_bytes: str = spec("1K", "smallest message (default 1K)", short="-b")
    max_bytes: str = spec("16M", "largest message (default 16M)", short="-e")
    step_factor: int = spec(4, "size multiplier between rows (default 4)", ge=2, short="-f")
    variants: str | None = spec(None, "comma list of flat, hier, hier_reduce, commN (default: "
                                "flat,hier,hier_reduce,comm2,comm3; hier* only when --inter-nranks divides --nproc)")
    inter_nranks: int = spec(2, "ranks per emulated node for hier (default 2)", ge=1)
    iters: int = spec(20, "timed iterations per row and round (default 20)", ge=1, le=MAX_STEPS, short="-n")
    rounds: int = spec(3, "rounds in which the variants of a size take turns, the order rotated round by round; a "
                       "row is the median round (default 3)", ge=1, le=MAX_ROUNDS)
    warmup: int = spec(5, "untimed iterations per row (default 5)", ge=0, le=MAX_STEPS, short="-w")
    dtype: str = spec("float32", "element type of the messages (default float32; the sizes are bytes either way)",
                      choices=("float32", "float64"))
    timeout: float = spec(1800.0, "bound on the whole sweep, seconds", ge=1.0, le=float(WEEK), unit="seconds",
                          note="the bound on the whole sweep")



def format_bytes(n: float) -> str:
    for unit, f in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= f:
            return f"{n / f:.1f} {unit}"
    return f"{int(n)} B"


def parse_size(text: str, option: str | None = None) -> int:
    """'8', '1K', '16M', '1GiB' -> bytes; errors name ``option`` when given."""
    what = f"{option} {text}" if option else f"size {text!r}"
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([KMG]?)(?:I?B)?\s*", text.upper())
    if not m:
        raise ValueError(f"{what}: expected a number of bytes with an optional K, M or G suffix")
    value = float(m.group(1)) * _UNITS[m.group(2)]
    if not value <= MAX_SIZE:  # also inf from a number too long for a float
        raise ValueError(f"{what}: too large; at most {MAX_SIZE // 2**30}G (and what the memory holds)")
    value = int(value)
    if value < 1:
        raise ValueError(f"{what}: must be at least 1 byte")
    return value


# --help's description: what the command does, for its users (the docstring above is for developers)
ABOUT = """`fleetbench comm`: allreduce micro-benchmarks in the manner of nccl-tests (flat, hierarchical, N
communicators).

One row per message size (from -b to -e, times -f each row) and variant, the variants of a size taking turns
in --rounds rounds (the median round kept): the time of one allreduce,
algbw (bytes / time) and busbw (algbw x 2(n-1)/n, comparable across rank counts), each row's result
checked exactly against integers summed on every rank.  --cluster runs the ranks on an emulated
multi-node cluster."""


def add_parser(sub) -> None:
    p = sub.add_parser("comm", help="allreduce micro-benchmarks (nccl-tests style): time, algbw, busbw, exact check",
                       **helps(ABOUT, """
                           fleetbench comm --nproc 4 -b 1K -e 64M
                           fleetbench comm --nproc 4 --variants flat,comm2 --dtype float64 -n 50
                           fleetbench comm --cluster 2x2:inter=200mbit"""))
    add_fields(p, CommOptions, "nproc", "min_bytes", "max_bytes", "step_factor", "variants", "inter_nranks", "iters",
               "rounds", "warmup", "dtype", "timeout")
    add_shared(p, cluster="run the ranks on an emulated cluster (network namespaces; root): N nodes of R ranks; "
                          "sets --nproc to N*R and --inter-nranks to R")
    p.set_defaults(func=main)


def main(args) -> int:
    from ..measure.collectives import default_variants, format_table, merge, parse_variant, sizes_between

    # the cluster's shape: its world size and ranks per node (the command line's own otherwise)
    cluster_spec = cluster_option(args.cluster) if getattr(args, "cluster", None) else None
    opts = from_args(CommOptions, args)  # every option's bounds, before anything starts
    nproc = cluster_spec.world_size if cluster_spec else opts.nproc
    inter_nranks = cluster_spec.ranks_per_node if cluster_spec else opts.inter_nranks
    if nproc < 2:
        return fail(f"--nproc {nproc}: an allreduce needs at least 2 ranks")
    require_nproc(nproc)
    if inter_nranks > nproc:
        return fail(f"--inter-nranks {inter_nranks}: must be <= --nproc ({nproc})")
    try:
        lo, hi = parse_size(opts.min_bytes, "--min-bytes"), parse_size(opts.max_bytes, "--max-bytes")
    except ValueError as exc:
        return fail(str(exc))
    if lo > hi:
        return fail(f"--min-bytes {opts.min_bytes} is larger than --max-bytes {opts.max_bytes}")
    largest = max(sizes_between(lo, hi, opts.step_factor))
    avail = available_memory()
    need = nproc * _HELD_PER_BYTE[opts.dtype] * largest
    if avail is not None and need > avail:
        fits = int(avail / (nproc * _HELD_PER_BYTE[opts.dtype]))
        return fail(f"--max-bytes {opts.max_bytes}: {nproc} ranks each hold about "
                    f"{_HELD_PER_BYTE[opts.dtype]:g}x the largest message ({format_bytes(largest)}) as {opts.dtype}, "
                    f"{format_bytes(need)} in all, but {format_bytes(avail)} of memory is available; the largest "
                    f"message that fits is about {format_bytes(fits)}")
    left_out = ""
    if opts.variants:
        variants = [v.strip() for v in opts.variants.split(",") if v.strip()]
    else:
        variants, left_out = default_variants(nproc, inter_nranks)
    try:
        for v in variants:
            parse_variant(v, nproc, inter_nranks)
    except ValueError as exc:
        return fail(str(exc))
    from ..runtime import RankPool  # at call time: tests replace it

    sizes = sizes_between(lo, hi, opts.step_factor)
    cluster, pool_kw = None, {}
    if cluster_spec is not None:
        cluster, pool_kw = start_cluster(cluster_spec)
    from ..measure.collectives import allreduce_sweep_on_rank

    try:
        with RankPool(nproc, timeout=opts.timeout, **pool_kw) as pool:
            answers = pool.run(allreduce_sweep_on_rank,
                               dict(sizes=sizes, variants=variants, inter_nranks=inter_nranks, iters=opts.iters,
                                    warmup=opts.warmup, dtype=opts.dtype, rounds=opts.rounds))
    except (RankFailure, RankError) as exc:  # a sweep past --timeout, a rank that died: said, not a traceback
        lines = [ln for ln in str(exc).splitlines() if ln.strip()]
        return fail(f"the sweep did not finish (--timeout {opts.timeout:g} s): {lines[0]}"
                    + (f" ... {lines[-1].strip()}" if len(lines) > 1 else ""))
    finally:
        if cluster is not None:
            cluster.down()
    rows = merge(answers)
    print(f"# fleetbench comm: allreduce, {nproc} ranks, variants {', '.join(variants)}"
          + (f", emulated nodes of {inter_nranks} ranks" if any(v.startswith("hier") for v in variants) else "")
          + (f", on the emulated cluster {cluster_spec}" if cluster_spec is not None else ""))
    print(format_table(rows, nproc))
    if left_out:
        print(f"\n{left_out}")
    print(f"\n_{machine_line(nproc)}_")
    wrong = sum(r["wrong"] for r in rows)
    if wrong:
        print(f"fleetbench comm: {wrong} wrong element(s): an allreduce path is broken", file=sys.stderr)
        return 1
    return 0
