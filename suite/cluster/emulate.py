"""An emulated cluster: one network namespace per node, joined through a switch namespace.

Topology of ``NxR:inter=RATE[,intra=RATE]`` (run id ``ID``)::

    fbc-ID-n0  [fbnet 169.254.77.1/24] ──veth── [p0 ┐
    fbc-ID-n1  [fbnet 169.254.77.2/24] ──veth── [p1 ┼ bridge fbsw]  fbc-ID-sw
    …                                                ┘

- Each node's link is a veth pair: ``fbnet`` in the node's namespace, port ``pK`` in the
  switch's.  A ``tbf`` qdisc on ``fbnet`` limits what the node sends, one on ``pK`` what it
  receives, so the link is full duplex at RATE, like a NIC.  ``netem`` (latency) is not in
  this kernel (``tc`` answers "Specified qdisc kind is unknown"), so the emulation is
  bandwidth only; the latency of a hop is whatever veth and TCP give (tens of µs).
- Ranks of one node talk to each other through the node's own address, which the kernel
  delivers over the node's loopback: unlimited, or limited by ``intra=RATE`` (a ``tbf`` on
  the node's ``lo``; loopback carries both directions, so it is a bus shared by the node).
- Addresses exist only inside the namespaces made here (link-local 169.254.77.0/24); no
  interface of the host is created or changed.  Namespace names carry ``fbc-<owner pid>-<4
  hex>``; they are removed on :meth:`EmulatedCluster.down`, on leaving the ``with`` block,
  at interpreter exit (atexit) and on SIGTERM/SIGHUP.  :func:`cleanup` removes the ones
  whose owner process is gone (``fleetbench cluster cleanup``).
"""
from __future__ import annotations

import atexit
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import threading
from dataclasses import dataclass

from .spec import ClusterSpec

__all__ = ["EmulatedCluster", "ClusterUnavailable", "unavailable_reason", "cleanup", "list_namespaces",
           "NODE_IF", "BRIDGE", "SUBNET", "PREFIX"]

PREFIX = "fbc"
NODE_IF = "fbnet"
BRIDGE = "fbsw"
SUBNET = "169.254.77"  # link-local; node k is SUBNET.(k+1)/24
CMD_TIMEOUT = 20.0
_NAME_RE = re.compile(rf"^{PREFIX}-(\d+)-([0-9a-f]{{4}})-(sw|n\d+)$")


class ClusterUnavailable(RuntimeError):
    """Network namespaces cannot be made here (not root / no CAP_NET_ADMIN / no `ip` or `tc`)."""


def _has_cap_net_admin() -> bool:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("CapEff:"):
                    caps = int(line.split()[1], 16)
                    return bool(caps & (1 << 12)) and bool(caps & (1 << 21))  # CAP_NET_ADMIN, CAP_SYS_ADMIN
    except OSError:
        pass
    return os.geteuid() == 0


def unavailable_reason() -> str | None:
    """Why an emulated cluster cannot be made here, or None when it can."""
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"`{tool}` (iproute2) is not installed"
    if not _has_cap_net_admin():
        return ("network namespaces need root or CAP_NET_ADMIN and CAP_SYS_ADMIN "
                f"(this process runs as uid {os.geteuid()} without them)")
    return None


def _run(args: list[str], check: bool = True) -> subprocess.CompletedProcess:
    try:
        p = subprocess.run(args, capture_output=True, text=True, timeout=CMD_TIMEOUT)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"`{' '.join(args)}` did not finish within {CMD_TIMEOUT:.0f} s") from None
    if check and p.returncode != 0:
        raise RuntimeError(f"`{' '.join(args)}` failed ({p.returncode}): {p.stderr.strip()}")
    return p


def _json(args: list[str]):
    out = _run(args).stdout.strip()
    return json.loads(out) if out else []


def list_namespaces() -> list[tuple[str, str, int]]:
    """fleetbench cluster namespaces on this machine: (name, run id, owner pid)."""
    p = _run(["ip", "netns", "list"], check=False)
    out = []
    for line in p.stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        m = _NAME_RE.match(name)
        if m:
            out.append((name, f"{m.group(1)}-{m.group(2)}", int(m.group(1))))
    return out


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def cleanup(run_id: str | None = None, all_runs: bool = False) -> list[str]:
    """Remove leftover namespaces: those of ``run_id``, every fleetbench one (``all_runs``), or by
    default those whose owner process is gone (clusters of a live run are left alone)."""
    removed = []
    for name, rid, owner in list_namespaces():
        if run_id is not None and rid != run_id:
            continue
        if run_id is None and not all_runs and _pid_alive(owner):
            continue
        if _run(["ip", "netns", "del", name], check=False).returncode == 0:
            removed.append(name)
    return removed


# ---- always remove: atexit and signals ------------------------------------------------
_ACTIVE: dict[str, EmulatedCluster] = {}
_LOCK = threading.Lock()
_HOOKS_INSTALLED = False
_PREVIOUS: dict[int, object] = {}


def _down_all() -> None:
    for cluster in list(_ACTIVE.values()):
        try:
            cluster.down()
        except Exception:  # noqa: BLE001 - best effort at exit
            pass


def _on_signal(signum, frame) -> None:
    _down_all()
    prev = _PREVIOUS.get(signum, signal.SIG_DFL)
    if callable(prev):
        prev(signum, frame)
        return
    if prev == signal.SIG_IGN:
        return
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _install_hooks() -> None:
    global _HOOKS_INSTALLED
    with _LOCK:
        if _HOOKS_INSTALLED:
            return
        atexit.register(_down_all)
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGHUP):
                try:
                    _PREVIOUS[sig] = signal.getsignal(sig)
                    signal.signal(sig, _on_signal)
                except (ValueError, OSError):
                    pass
        _HOOKS_INSTALLED = True


@dataclass
class NodeInfo:
    index: int
    netns: str
    ifname: str
    address: str


class EmulatedCluster:
    """``with EmulatedCluster(parse_cluster("2x2:inter=200mbit")) as cl: ...``

    ``owner_pid`` is written into the namespace names (default: this process) so that
    :func:`cleanup` can tell a live run's cluster from a leftover; ``owner_pid=0`` (used by
    ``fleetbench cluster up``) marks a cluster no process owns: ``cleanup`` removes it.
    """

    def __init__(self, spec: ClusterSpec, *, owner_pid: int | None = None, mtu: int = 1500,
                 tbf_latency_ms: float = 50.0, remove_at_exit: bool = True):
        self.spec = spec
        owner = os.getpid() if owner_pid is None else owner_pid
        self.run_id = f"{owner}-{secrets.token_hex(2)}"
        self.mtu = mtu
        self.tbf_latency_ms = tbf_latency_ms
        self.remove_at_exit = remove_at_exit
        self.switch_ns = f"{PREFIX}-{self.run_id}-sw"
        self.nodes = [NodeInfo(k, f"{PREFIX}-{self.run_id}-n{k}", NODE_IF, f"{SUBNET}.{k + 1}")
                      for k in range(spec.nodes)]
        self.is_up = False

    # ---- names -----------------------------------------------------------------------
    @property
    def namespaces(self) -> list[str]:
        return [self.switch_ns] + [n.netns for n in self.nodes]

    def node_of_rank(self, rank: int) -> NodeInfo:
        return self.nodes[self.spec.node_of(rank)]

    @property
    def master_address(self) -> str:
        return self.nodes[0].address

    # ---- life cycle --------------------------------------------------------------------
    def _tbf(self, ns: str, dev: str, bps: int) -> None:
        # burst: 4 ms of the rate, at least 64 KiB (one TSO segment passes without being split).
        burst = max(int(bps / 8 * 0.004), 65536)
        _run(["tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "tbf", "rate", f"{bps}bit",
              "burst", str(burst), "latency", f"{self.tbf_latency_ms:g}ms"])

    def up(self) -> EmulatedCluster:
        if self.is_up:
            return self
        reason = unavailable_reason()
        if reason:
            raise ClusterUnavailable(f"cannot emulate a cluster here: {reason}")
        if self.remove_at_exit:
            _install_hooks()
            _ACTIVE[self.run_id] = self
        self.is_up = True  # from here on, down() removes whatever exists
        try:
            sw = self.switch_ns
            _run(["ip", "netns", "add", sw])
            _sysctls(sw)
            _run(["ip", "-n", sw, "link", "add", "name", BRIDGE, "type", "bridge"])
            _run(["ip", "-n", sw, "link", "set", BRIDGE, "up"])
            for node in self.nodes:
                ns, port = node.netns, f"p{node.index}"
                _run(["ip", "netns", "add", ns])
                _sysctls(ns)
                _run(["ip", "link", "add", "name", NODE_IF, "netns", ns, "mtu", str(self.mtu), "type", "veth",
                      "peer", "name", port, "netns", sw, "mtu", str(self.mtu)])
                _run(["ip", "-n", sw, "link", "set", port, "master", BRIDGE])
                _run(["ip", "-n", sw, "link", "set", port, "up"])
                _run(["ip", "-n", ns, "addr", "add", f"{node.address}/24", "dev", NODE_IF])
                _run(["ip", "-n", ns, "link", "set", "lo", "up"])
                _run(["ip", "-n", ns, "link", "set", NODE_IF, "up"])
                self._tbf(ns, NODE_IF, self.spec.inter_bps)  # node -> switch
                self._tbf(sw, port, self.spec.inter_bps)  # switch -> node
                if self.spec.intra_bps is not None:
                    self._tbf(ns, "lo", self.spec.intra_bps)
        except BaseException:
            self.down()
            raise
        return self

    def set_rates(self, inter_bps: int, intra_bps: int | None = None) -> None:
        """Change the link rates of a running cluster (ranks keep running)."""
        from dataclasses import replace

        for node in self.nodes:
            self._tbf(node.netns, NODE_IF, inter_bps)
            self._tbf(self.switch_ns, f"p{node.index}", inter_bps)
            if intra_bps is not None:
                self._tbf(node.netns, "lo", intra_bps)
            elif self.spec.intra_bps is not None:
                _run(["tc", "-n", node.netns, "qdisc", "del", "dev", "lo", "root"], check=False)
        self.spec = replace(self.spec, inter_bps=inter_bps, intra_bps=intra_bps)

    def down(self) -> list[str]:
        """Remove every namespace of this run (idempotent); returns the ones removed."""
        removed = []
        present = {name for name, rid, _ in list_namespaces() if rid == self.run_id}
        for ns in [n.netns for n in self.nodes] + [self.switch_ns]:
            if ns in present and _run(["ip", "netns", "del", ns], check=False).returncode == 0:
                removed.append(ns)
        self.is_up = False
        _ACTIVE.pop(self.run_id, None)
        return removed

    def __enter__(self) -> EmulatedCluster:
        return self.up()

    def __exit__(self, *exc) -> None:
        self.down()

    # ---- what the kernel says ------------------------------------------------------------
    def readback(self) -> dict:
        """Namespaces, links, addresses and qdisc rates as `ip` and `tc` report them."""
        present = sorted(name for name, rid, _ in list_namespaces() if rid == self.run_id)
        out: dict = {"namespaces": present, "nodes": [], "switch": {}}
        for node in self.nodes:
            links = {link["ifname"]: link for link in _json(["ip", "-j", "-n", node.netns, "addr", "show"])}
            nic = links.get(NODE_IF, {})
            addrs = [f"{a['local']}/{a['prefixlen']}" for a in nic.get("addr_info", []) if a.get("family") == "inet"]
            out["nodes"].append({
                "netns": node.netns,
                "links": sorted(links),
                "addresses": addrs,
                "up": "UP" in nic.get("flags", []),
                "mtu": nic.get("mtu"),
                "egress_rate_bps": _tbf_rate(node.netns, NODE_IF),
                "lo_rate_bps": _tbf_rate(node.netns, "lo"),
            })
        sw_links = _json(["ip", "-j", "-n", self.switch_ns, "link", "show"])
        out["switch"] = {
            "netns": self.switch_ns,
            "bridge": [link["ifname"] for link in sw_links if link.get("linkinfo", {}).get("info_kind") == "bridge"
                       or link["ifname"] == BRIDGE],
            "ports": {link["ifname"]: link.get("master") for link in sw_links if link["ifname"].startswith("p")},
            "port_rates_bps": {f"p{n.index}": _tbf_rate(self.switch_ns, f"p{n.index}") for n in self.nodes},
        }
        return out


def _tbf_rate(ns: str, dev: str) -> int | None:
    """The tbf rate on ``dev`` in bit/s (tc -j reports bytes/s), None without a tbf."""
    for q in _json(["tc", "-j", "-n", ns, "qdisc", "show", "dev", dev]):
        if q.get("kind") == "tbf" and q.get("root", False):
            return int(q["options"]["rate"]) * 8
    return None


def _sysctls(ns: str) -> None:
    # No IPv6 in the emulated nodes: no router solicitations or DAD chatter on the links.
    _run(["ip", "netns", "exec", ns, "sysctl", "-q", "-w", "net.ipv6.conf.all.disable_ipv6=1"], check=False)
    _run(["ip", "netns", "exec", ns, "sysctl", "-q", "-w", "net.ipv6.conf.default.disable_ipv6=1"], check=False)
