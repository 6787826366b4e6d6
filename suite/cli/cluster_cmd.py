"""`fleetbench cluster`: the emulated cluster by hand (its --help: ``ABOUT``).

The namespaces are ``suite.cluster``'s; runs bring their own clusters up and down through
``suite.cluster.launch``."""
from __future__ import annotations

import json

from ..cluster.emulate import ClusterUnavailable, EmulatedCluster, cleanup, list_namespaces, unavailable_reason
from ..cluster.spec import ClusterSpecError, parse_cluster
from . import error, helps

# --help's description: what the command does, for its users (the docstring above is for developers)
ABOUT = """`fleetbench cluster up|down|cleanup|status`: the emulated cluster by hand.

`up SPEC` leaves a cluster standing (owned by no process, so `cleanup` removes it) and prints its
namespaces; run a program in a node with `ip netns exec fbc-…-n0 …`.  `fleetbench run --cluster` and
`fleetbench comm --cluster` bring their own clusters up and down themselves."""


def add_parser(sub) -> None:
    p = sub.add_parser("cluster", help="emulated multi-node cluster (network namespaces): up, down, cleanup, status",
                       **helps(ABOUT, """
                           fleetbench cluster up 2x2:inter=200mbit,intra=10gbit
                           fleetbench cluster status
                           fleetbench cluster cleanup"""))
    csub = p.add_subparsers(dest="action", metavar="ACTION")

    def action(name: str, text: str):
        return csub.add_parser(name, help=text, description=text[:1].upper() + text[1:] + ".")

    up = action("up", "bring a cluster up and leave it (NxR:inter=RATE[,intra=RATE]); needs root")
    up.add_argument("spec", help="N nodes x R ranks and the link rates, e.g. 2x2:inter=200mbit")
    up.add_argument("--json", action="store_true", help="print the read-back state as JSON")
    down = action("down", "remove the cluster with this run id")
    down.add_argument("run_id", help="the run id `up` printed (`fleetbench cluster status` lists them)")
    clean = action("cleanup", "remove leftover clusters (whose owner process is gone)")
    clean.add_argument("--all", action="store_true", help="also clusters of live runs")
    action("status", "list fleetbench cluster namespaces")
    p.set_defaults(func=main)


def main(args) -> int:
    if args.action is None:
        return error("cluster", "give an action: up, down, cleanup, status")
    if args.action == "status":
        rows = list_namespaces()
        for name, rid, owner in rows:
            print(f"{name}\trun {rid}\towner pid {owner or 'none'}")
        if not rows:
            print("no fleetbench cluster namespaces")
        return 0
    spec = None
    if args.action == "up":  # a bad value is named even where no cluster can be emulated
        try:
            spec = parse_cluster(args.spec)
        except ClusterSpecError as exc:
            return error("cluster", exc)
    reason = unavailable_reason()
    if reason:
        return error("cluster", f"cannot emulate a cluster here: {reason}")
    if args.action == "up":
        assert spec is not None  # parsed above for "up"
        try:
            cl = EmulatedCluster(spec, owner_pid=0, remove_at_exit=False).up()
        except ClusterUnavailable as exc:
            return error("cluster", exc)
        if args.json:
            print(json.dumps({"run_id": cl.run_id, **cl.readback()}, indent=1))
        else:
            print(f"cluster {spec} up, run id {cl.run_id}")
            for n in cl.nodes:
                print(f"  node {n.index}: netns {n.netns}, {n.ifname} {n.address}/24")
            print(f"  switch: netns {cl.switch_ns}")
            print(f"remove with: fleetbench cluster down {cl.run_id}   (or: fleetbench cluster cleanup)")
        return 0
    if args.action == "down":
        removed = cleanup(run_id=args.run_id)
        print("\n".join(f"removed {n}" for n in removed) or f"no namespaces of run {args.run_id!r}")
        return 0 if removed else 1
    if args.action == "cleanup":
        removed = cleanup(all_runs=args.all)
        print("\n".join(f"removed {n}" for n in removed) or "nothing to remove")
        return 0
    return 2
