"""The cluster value ``NxR:inter=RATE[,intra=RATE]``, parsed in this one place.

``2x2:inter=200mbit`` is 2 nodes of 2 ranks, each node's link to the switch limited to
200 Mbit/s in each direction; ``intra=RATE`` also limits the traffic between the ranks of
one node (unlimited otherwise).  Rates are written as tc writes them: a number and one of
``bit``, ``kbit``, ``mbit``, ``gbit`` (decimal: 1 mbit = 10^6 bit/s), case-insensitive.

Errors name the value, what was wrong and what is allowed, before anything starts.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["ClusterSpec", "ClusterSpecError", "parse_cluster", "parse_rate", "format_rate", "MAX_RANKS"]

RATE_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9}
MIN_RATE = 10**6  # 1 mbit: below that a step of the smallest case takes minutes
MAX_RATE = 100 * 10**9
MAX_RANKS = 32  # ranks are processes on a small machine
KEYS = ("inter", "intra")
FORMAT = "NxR:inter=RATE[,intra=RATE] (for example 2x2:inter=200mbit)"


class ClusterSpecError(ValueError):
    """A --cluster value that cannot be used (the message says which part and what is allowed)."""


@dataclass(frozen=True)
class ClusterSpec:
    nodes: int
    ranks_per_node: int
    inter_bps: int  # bit/s, each direction of a node's link to the switch
    intra_bps: int | None = None  # bit/s shared by the ranks of one node; None = unlimited

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks_per_node

    def node_of(self, rank: int) -> int:
        """Nodes are consecutive blocks of ranks (as ``suite.runtime.groups.node_groups`` assumes)."""
        return rank // self.ranks_per_node

    def __str__(self) -> str:
        s = f"{self.nodes}x{self.ranks_per_node}:inter={format_rate(self.inter_bps)}"
        if self.intra_bps is not None:
            s += f",intra={format_rate(self.intra_bps)}"
        return s


def parse_rate(text: str, what: str = "rate", max_rate: int = MAX_RATE) -> int:
    """``'200mbit'`` -> 200_000_000 (bit/s)."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]+)\s*", text or "")
    units = ", ".join(RATE_UNITS)
    if not m:
        raise ClusterSpecError(f"{what}={text!r}: expected a number and a unit ({units}), e.g. 200mbit")
    unit = m.group(2).lower()
    if unit not in RATE_UNITS:
        raise ClusterSpecError(f"{what}={text!r}: unit {m.group(2)!r} is unknown; allowed: {units} "
                               f"(bits per second, decimal)")
    bps = int(round(float(m.group(1)) * RATE_UNITS[unit]))
    if not MIN_RATE <= bps <= max_rate:
        raise ClusterSpecError(f"{what}={text!r}: must be between {format_rate(MIN_RATE)} and "
                               f"{format_rate(max_rate)}")
    return bps


def format_rate(bps: float) -> str:
    for unit, f in (("gbit", 10**9), ("mbit", 10**6), ("kbit", 10**3)):
        if bps >= f and (bps / f) == int(bps / f):
            return f"{int(bps // f)}{unit}"
    for unit, f in (("gbit", 10**9), ("mbit", 10**6), ("kbit", 10**3)):
        if bps >= f:
            return f"{bps / f:g}{unit}"
    return f"{int(bps)}bit"


def parse_cluster(text: str, emulate: bool = True) -> ClusterSpec:
    """Parse ``NxR:inter=RATE[,intra=RATE]``; raise :class:`ClusterSpecError` naming the bad part.

    ``emulate=False`` (a cluster only to be modelled, not emulated here) lifts the limits of this
    machine: any number of ranks, rates up to 10 tbit (NVLink-class links)."""
    max_ranks = MAX_RANKS if emulate else 10**7
    max_rate = MAX_RATE if emulate else 10**13
    if not isinstance(text, str) or not text.strip():
        raise ClusterSpecError(f"--cluster {text!r}: expected {FORMAT}")
    shape, sep, opts = text.strip().partition(":")
    m = re.fullmatch(r"([0-9]+)[xX]([0-9]+)", shape.strip())
    if not m:
        raise ClusterSpecError(f"--cluster {text!r}: the shape {shape!r} is not NxR (nodes x ranks per node); "
                               f"expected {FORMAT}")
    nodes, rpn = int(m.group(1)), int(m.group(2))
    if nodes < 1:
        raise ClusterSpecError(f"--cluster {text!r}: nodes={nodes}: must be >= 1")
    if rpn < 1:
        raise ClusterSpecError(f"--cluster {text!r}: ranks per node={rpn}: must be >= 1")
    if nodes * rpn > max_ranks:
        raise ClusterSpecError(f"--cluster {text!r}: {nodes}x{rpn} = {nodes * rpn} ranks; at most {max_ranks} "
                               f"ranks (processes) on one machine")
    if not sep or not opts.strip():
        raise ClusterSpecError(f"--cluster {text!r}: the inter-node rate is missing; expected {FORMAT}")
    values: dict[str, str] = {}
    for item in opts.split(","):
        key, eq, val = item.partition("=")
        key = key.strip().lower()
        if not eq:
            raise ClusterSpecError(f"--cluster {text!r}: {item!r} is not KEY=RATE; allowed keys: {', '.join(KEYS)}")
        if key not in KEYS:
            raise ClusterSpecError(f"--cluster {text!r}: key {key!r} is unknown; allowed keys: {', '.join(KEYS)}")
        if key in values:
            raise ClusterSpecError(f"--cluster {text!r}: {key} is given twice")
        values[key] = val
    if "inter" not in values:
        raise ClusterSpecError(f"--cluster {text!r}: inter=RATE is required; expected {FORMAT}")
    try:
        inter = parse_rate(values["inter"], "inter", max_rate)
        intra = parse_rate(values["intra"], "intra", max_rate) if "intra" in values else None
    except ClusterSpecError as exc:
        raise ClusterSpecError(f"--cluster {text!r}: {exc}") from None
    return ClusterSpec(nodes, rpn, inter, intra)
