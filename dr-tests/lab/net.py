"""Lab networking: the bridge `cpbr0`, one namespace per host, taps for guests.

    root netns                         netns primary-h1
    cpbr0 10.77.0.1/16 (+ .2, .3 Ceph)
      |-- cpvp1 ======== veth ======== eth0 -- br0 10.77.1.1/16
      |                                        |-- tap1 -- guest primary-h1-vm1
      |-- cpvp2 ======== veth ======== (netns primary-h2 ...)
      '-- cpvd1 ======== veth ======== (netns dr-h1 ...)

Each host has its own bridge `br0` so that its guests' taps hang off the
host, as on a real hypervisor: guest traffic to another host's guest leaves
through the host's veth, crosses `cpbr0`, and enters the other namespace.
Ceph listens on addresses of `cpbr0`, because a namespace cannot reach the
root namespace's loopback.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from cutpoint.lab import config as C
from cutpoint.lab.proc import kill_pids, run

HOST_NS_RE = re.compile(r"^(primary|dr)-h\d+$")
VETH_RE = re.compile(r"^cpv[pd]\d+$")


def _batch(cmds: list[str], netns: str | None = None) -> None:
    argv = ["ip"] + (["-n", netns] if netns else []) + ["-batch", "-"]
    run(argv, input="\n".join(cmds) + "\n")


def netns_list() -> list[str]:
    out = run(["ip", "netns", "list"]).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def link_names() -> list[str]:
    out = run(["ip", "-o", "link", "show"]).stdout
    names = []
    for line in out.splitlines():
        parts = line.split(":", 2)
        if len(parts) >= 2:
            names.append(parts[1].strip().split("@")[0])
    return names


def setup_bridge() -> None:
    cmds = [f"link add {C.BRIDGE} type bridge",
            f"link set {C.BRIDGE} up",
            f"addr add {C.BRIDGE_ADDR}/{C.PREFIX} dev {C.BRIDGE}"]
    cmds += [f"addr add {a}/{C.PREFIX} dev {C.BRIDGE}" for a in C.SITE_ADDR.values()]
    _batch(cmds)
    # Bridged frames must not be filtered by iptables if br_netfilter is loaded.
    for f in ("bridge-nf-call-iptables", "bridge-nf-call-ip6tables"):
        p = Path("/proc/sys/net/bridge") / f
        if p.exists():
            p.write_text("0\n")


def setup_host(name: str, site: str, index: int) -> str:
    """Create netns `name` wired to cpbr0; returns its address."""
    veth = C.veth_name(site, index)
    addr = C.host_addr(site, index)
    run(["ip", "netns", "add", name])
    _batch([f"link add {veth} type veth peer name eth0 netns {name}",
            f"link set {veth} master {C.BRIDGE} up"])
    _batch(["link set lo up",
            "link add br0 type bridge",
            "link set eth0 master br0",
            "link set eth0 up",
            "link set br0 up",
            f"addr add {addr}/{C.PREFIX} dev br0"], netns=name)
    return addr


def add_tap(netns: str, tap: str) -> None:
    _batch([f"tuntap add dev {tap} mode tap",
            f"link set {tap} master br0 up"], netns=netns)


def leftovers() -> dict[str, list[str]]:
    """Lab network objects present now, found by name pattern."""
    ns = [n for n in netns_list() if HOST_NS_RE.match(n)]
    links = [link for link in link_names() if link == C.BRIDGE or VETH_RE.match(link)]
    mounts = []
    try:
        with open("/proc/mounts") as f:
            for line in f:
                mp = line.split()[1]
                if mp.startswith("/run/netns/") and HOST_NS_RE.match(os.path.basename(mp)):
                    mounts.append(mp)
    except OSError:
        pass
    return {"netns": ns, "links": links, "mounts": mounts}


def teardown(extra_netns: list[str] | None = None) -> list[str]:
    """Delete every lab namespace and link; returns what was removed."""
    removed = []
    left = leftovers()
    for n in sorted(set(left["netns"]) | set(extra_netns or [])):
        # Whatever still runs in a host namespace (a guest, an agent) would
        # keep the namespace alive after `ip netns del`: stop it first.
        out = run(["ip", "netns", "pids", n], check=False).stdout.split()
        pids = [int(p) for p in out if p.isdigit()]
        if pids:
            kill_pids(pids)
            removed += [f"process {p} in netns {n}" for p in pids]
        if run(["ip", "netns", "del", n], check=False).returncode == 0:
            removed.append(f"netns {n}")
    for mp in leftovers()["mounts"]:
        run(["umount", "-l", mp], check=False)
        removed.append(f"mount {mp}")
    for link in leftovers()["links"]:
        if run(["ip", "link", "del", link], check=False).returncode == 0:
            removed.append(f"link {link}")
    return removed
