"""``python -m experiments.costmodel COMMAND`` (from the repository root, as root for anything emulated):

- ``predict``: predicted step time per communication setting on a cluster (``predict.py``; was ``fleetbench
  predict``);
- ``calibrate --cluster SPEC --out FILE``: the model's terms fitted on an emulated cluster (was ``fleetbench comm
  --cluster SPEC --calibrate FILE``);
- ``extrapolate``: the model's tables for real clusters (was ``fleetbench cluster extrapolate``);
- ``figure``: docs/figures/cluster.md (was ``python -m experiments.costmodel figure``).
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from suite.cli import error
from suite.cli.checks import MAX_ROUNDS, MAX_STEPS, WEEK, require_writable
from suite.config import ConfigError
from suite.outputs import InputError, OutputError, write_atomic

from . import predict


def _csv(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def calibrate_main(args) -> int:
    """The calibration micro-benchmarks on the emulated cluster, fitted, written to ``--out``."""
    from suite.cluster.launch import cluster_option, start_cluster
    from suite.runtime import RankPool

    from .calibrate import calibrate_on_pool

    cluster_spec = cluster_option(args.cluster)
    require_writable("--out", args.out)
    for option, value, lo, hi in (("--iters", args.iters, 1, MAX_STEPS), ("--rounds", args.rounds, 1, MAX_ROUNDS),
                                  ("--timeout", args.timeout, 1.0, WEEK)):
        if not (lo <= value <= hi):  # nan fails too
            raise ConfigError(f"{option} {value}: must be >= {lo} and <= {hi}")
    cluster, pool_kw = start_cluster(cluster_spec)
    try:
        with RankPool(cluster_spec.world_size, timeout=args.timeout, num_threads=1, **pool_kw) as pool:
            cal = calibrate_on_pool(pool, cluster_spec, iters=args.iters, rounds=args.rounds)
    finally:
        cluster.down()
    write_atomic(args.out, cal.to_json())
    print(f"# calibration: {cluster_spec}, {args.rounds} blocks per size (medians of the slowest rank)")
    print("| kind | bytes | time (us) | CPU per rank (us) |\n|---|---:|---:|---:|")
    for r in cal.rows:
        print(f"| {r['kind']} | {r['bytes']} | {r['seconds'] * 1e6:.1f} | {r['cpu_seconds'] * 1e6:.1f} |")
    print(f"\nintra-node phases: alpha {cal.intra_lat * 1e6:.0f} us per step, {cal.intra_bw / 1e6:.0f} MB/s per edge; "
          f"link {cal.inter_bw / 1e6:.1f} MB/s payload; CPU {cal.cpu_per_byte * 1e9:.2f} ns/B flat, "
          f"{cal.cpu_per_byte_hier * 1e9:.2f} ns/B two-level, {cal.cores} cores")
    print("alpha per ring step (message bytes: us): "
          + ", ".join(f"{int(m)}: {a * 1e6:.0f}" for m, a in cal.alpha_table))
    print(f"fitted terms written to {args.out}")
    return 0


def extrapolate_main(args) -> int:
    from .extrapolate import extrapolation_markdown

    print(extrapolation_markdown())
    return 0


FIGURE_FIELDS: dict[str, Callable[[str], Any]] = {
    "rounds": int, "steps": int, "timeout": float, "sizes": lambda t: tuple(int(float(x)) for x in _csv(t)),
    "rates": _csv, "shapes": _csv, "models": _csv, "rechecks": int, "save": str, "load": str}


def figure_main(args) -> int:
    """docs/figures/cluster.md: ``figure.measure`` (its own emulated clusters and pools), then ``figure.render``."""
    from suite.measure.metadata import machine_line

    from . import figure

    require_writable("--out", args.out)
    require_writable("--save", args.save)
    given = {k: getattr(args, k) for k in FIGURE_FIELDS if getattr(args, k) is not None}
    try:
        opts = figure.Options(**given)
    except ValueError as exc:
        return error("costmodel figure", exc)
    raw = figure.measure(opts)
    text = f"{figure.render(raw, opts)}\n\n_{machine_line(None)}_\n"
    print(text)
    if args.out:
        write_atomic(args.out, text)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m experiments.costmodel", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    predict.add_parser(sub)
    cal = sub.add_parser("calibrate", help="fit the model's terms on an emulated cluster (root)")
    cal.add_argument("--cluster", required=True, metavar="NxR:inter=RATE[,intra=RATE]")
    cal.add_argument("--out", required=True, metavar="FILE", help="the fitted terms, JSON (predict --calibration)")
    cal.add_argument("-n", "--iters", type=int, default=20, help="timed iterations per block (default 20)")
    cal.add_argument("--rounds", type=int, default=5, help="timed blocks per size, median taken (default 5)")
    cal.add_argument("--timeout", type=float, default=1800.0, help="bound on the whole calibration, seconds")
    cal.set_defaults(func=calibrate_main)
    ext = sub.add_parser("extrapolate", help="the model's tables for real clusters (no measurement)")
    ext.set_defaults(func=extrapolate_main)
    fig = sub.add_parser("figure", help="docs/figures/cluster.md: the model against emulated clusters (root)")
    for name, kind in FIGURE_FIELDS.items():
        fig.add_argument("--" + name, type=kind, default=None, help=f"figure.Options.{name}")
    fig.add_argument("--out", help="also write the Markdown here")
    fig.set_defaults(func=figure_main)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if not args.command:
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except (ConfigError, OutputError, InputError) as exc:
        return error(args.command, exc)


if __name__ == "__main__":
    sys.exit(main())
