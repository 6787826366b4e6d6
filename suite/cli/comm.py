"""`fleetbench comm`: allreduce micro-benchmarks in the manner of nccl-tests (flat, hierarchical, N communicators)."""
from __future__ import annotations

import re
import sys

_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}


def parse_size(text: str) -> int:
    """'8', '1K', '16M', '1GiB' -> bytes."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([KMG]?)(?:I?B)?\s*", text.upper())
    if not m:
        raise ValueError(f"size {text!r}: expected a number of bytes with an optional K, M or G suffix")
    value = int(float(m.group(1)) * _UNITS[m.group(2)])
    if value < 1:
        raise ValueError(f"size {text!r}: must be at least 1 byte")
    return value


def add_parser(sub) -> None:
    p = sub.add_parser("comm", help="allreduce micro-benchmarks (nccl-tests style): time, algbw, busbw, exact check")
    p.add_argument("--nproc", type=int, default=2, help="ranks (default 2)")
    p.add_argument("-b", "--min-bytes", default="1K", help="smallest message (default 1K)")
    p.add_argument("-e", "--max-bytes", default="16M", help="largest message (default 16M)")
    p.add_argument("-f", "--step-factor", type=int, default=4, help="size multiplier between rows (default 4)")
    p.add_argument("--variants", default=None,
                   help="comma list of flat, hier, hier_reduce, commN (default: flat,hier,hier_reduce,comm2,comm3; "
                        "hier* only when --inter-nranks divides --nproc)")
    p.add_argument("--inter-nranks", type=int, default=2, help="ranks per emulated node for hier (default 2)")
    p.add_argument("-n", "--iters", type=int, default=20, help="timed iterations per row (default 20)")
    p.add_argument("-w", "--warmup", type=int, default=5, help="untimed iterations per row (default 5)")
    p.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    p.add_argument("--timeout", type=float, default=1800.0, help="bound on the whole sweep, seconds")
    p.add_argument("--cluster", metavar="NxR:inter=RATE[,intra=RATE]",
                   help="run the ranks on an emulated cluster (network namespaces; root): N nodes of R ranks; "
                        "sets --nproc to N*R and --inter-nranks to R")
    p.set_defaults(func=main)


def main(args) -> int:
    from ..comm.microbench import format_table, merge, parse_variant, sizes_between

    def fail(msg: str) -> int:
        print(f"fleetbench comm: error: {msg}", file=sys.stderr)
        return 2

    cluster_spec = None
    if getattr(args, "cluster", None):
        from ..cluster.launch import apply_cluster_args
        from ..config import ConfigError

        try:
            cluster_spec = apply_cluster_args(args)
        except ConfigError as exc:
            return fail(str(exc))
        args.inter_nranks = cluster_spec.ranks_per_node
    if args.nproc < 2:
        return fail(f"--nproc {args.nproc}: an allreduce needs at least 2 ranks")
    try:
        lo, hi = parse_size(args.min_bytes), parse_size(args.max_bytes)
    except ValueError as exc:
        return fail(str(exc))
    if lo > hi:
        return fail(f"--min-bytes {args.min_bytes} is larger than --max-bytes {args.max_bytes}")
    if args.step_factor < 2:
        return fail(f"--step-factor {args.step_factor}: must be >= 2")
    if args.iters < 1 or args.warmup < 0:
        return fail(f"--iters {args.iters} / --warmup {args.warmup}: need iters >= 1, warmup >= 0")
    hier_ok = args.inter_nranks >= 2 and args.nproc % args.inter_nranks == 0
    if args.variants:
        variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    else:
        variants = ["flat"] + (["hier", "hier_reduce"] if hier_ok else []) + ["comm2", "comm3"]
    try:
        for v in variants:
            parse_variant(v, args.nproc, args.inter_nranks)
    except ValueError as exc:
        return fail(str(exc))
    from ..measure.metadata import machine_line
    from ..runtime import RankPool

    sizes = sizes_between(lo, hi, args.step_factor)
    cluster, pool_kw = None, {}
    if cluster_spec is not None:
        from ..cluster.launch import start_cluster

        cluster, pool_kw = start_cluster(cluster_spec)
    from ..comm.microbench import allreduce_sweep_on_rank

    try:
        with RankPool(args.nproc, timeout=args.timeout, **pool_kw) as pool:
            answers = pool.run(allreduce_sweep_on_rank,
                               dict(sizes=sizes, variants=variants, inter_nranks=args.inter_nranks, iters=args.iters,
                                    warmup=args.warmup, dtype=args.dtype))
    finally:
        if cluster is not None:
            cluster.down()
    rows = merge(answers)
    print(f"# fleetbench comm: allreduce, {args.nproc} ranks, variants {', '.join(variants)}"
          + (f", emulated nodes of {args.inter_nranks} ranks" if hier_ok else "")
          + (f", on the emulated cluster {cluster_spec}" if cluster_spec is not None else ""))
    print(format_table(rows, args.nproc))
    print(f"\n_{machine_line(args.nproc)}_")
    wrong = sum(r["wrong"] for r in rows)
    if wrong:
        print(f"fleetbench comm: {wrong} wrong element(s): an allreduce path is broken", file=sys.stderr)
        return 1
    return 0
