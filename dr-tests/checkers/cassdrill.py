"""The Cassandra recovery drill: group snapshots of two nodes on RBD,
replicated, drilled at DR (GCVM §4.5.3, Fig. 4.12; issue 8 item 3).

Flow, on a lab of its own (``LAB``: both Ceph clusters, two primary hosts,
two DR hosts, no tiny guests)::

    primary cluster: RBD images <prefix>-node1-cpclog, -node1-cpdata,
      -node2-cpclog, -node2-cpdata                (cutpoint.checkers.rbddrill)
    node1 on lab host primary-h1, node2 on primary-h2 (two VMs on two
      hosts); each node's tap (cpct1, cpct2) on its host namespace's lab
      bridge br0, addresses the lab's guest addresses 10.77.101.1/16 and
      10.77.101.2/16: node traffic crosses hosts through cpbr0 like the tiny
      guests'
    node1 (writer) and node2: Cassandra 5.0, RF 2, QEMU in its host's
      netns, each: local root overlay + cpclog (commit log, group sync; +
      the oplog on node1) + cpdata, both RBD
    the writer inserts unique values at CL=ALL and logs each ack (O_DSYNC)
    every <interval> s: one group snapshot of both VMs' four images: one
      cutpointd per primary host namespace (pgcoord.start_hosts; method
      rbd), one group file naming both agents, `cutpoint snapshot
      --group-file` prepares (pauses) both VMs on both hosts, then commits
      one librbd snapshot per image and resumes
    stop both VMs; the full operation log = node1's cpclog head on the
      primary cluster (rbd export to a temp raw file, its ext4 journal
      replayed with e2fsck -E journal_only, debugfs; never mounted)
    for each snapshot, in order:
      replicate_group(primary -> dr): one cutpoint-sync per image, the first
        full, the next incremental; every member verified (invariant 5)
      only the newest is drilled (every one with drill_all): two restores
        of a two-node cluster cost minutes each, and the older points are
        the bases the newest was replicated on
      the snapshot's operation log = node1's cpclog snapshot *at DR* (rbd
        export, debugfs)
      DR cluster: clone each member's DR snapshot; both nodes boot from the
        clones, node1 in netns dr-h1 and node2 in dr-h2 (both in dr-h1 on a
        lab of one DR host; cp.mode=check); wait for node1's CPCHECK;
        judge with cutpoint.checkers.cassandra; remove the clones
    finally: clones, DR replicas and snapshots, primary images removed; what
      is left with the drill's prefix on either cluster is in the report
      (``cleanup.left``; the test wants it empty); the taps are deleted

RTO: wall time from starting the two restored VMs to both nodes' "Startup
complete", and to a successful read at ALL (rejoined), and to the end of
the check.
"""

from __future__ import annotations

import argparse
import html
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cutpoint.checkers import pgcoord
from cutpoint.checkers.cassandra import check_cluster
from cutpoint.checkers.guestvm import DebianVM, GuestDisk, RbdImage
from cutpoint.checkers.pgdrill import LAB_MARK
from cutpoint.checkers.rbddrill import DrillImages
from cutpoint.lab import config as C
from cutpoint.lab.debian_image import Image, build, cached

# Two primary hosts (node1 on primary-h1, node2 on primary-h2), two DR
# hosts (the same split at DR), no tiny guests: the nodes take the lab's
# guest addresses 10.77.101.1 and .2 on the lab network (taps on each host
# namespace's br0, across hosts through cpbr0; LAB-NOTES/net.py).
LAB = {"hosts": 2, "vms_per_host": 0, "dr_hosts": 2}
PREFIX = C.PREFIX
NODES = (("node1", C.vm_addr(1), "-4611686018427387904", "cpct1"),
         ("node2", C.vm_addr(2), "4611686018427387904", "cpct2"))
GROUP = (("cpclog", 512), ("cpdata", 512))
BOOT_TIMEOUT = 2400.0
OPLOG = "/oplog"    # on node1's cpclog filesystem
VM_PREFIX = "cass-"  # the agent's VM names: cass-node1, cass-node2


def _sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    p = subprocess.run(list(argv), capture_output=True, text=True,
                       check=False)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} rc={p.returncode}: "
                           f"{p.stdout}{p.stderr}")
    return p


def net_up_argv(netns: str, tap: str) -> list[list[str]]:
    """The ``ip`` commands that give one node a tap on the lab host's own
    bridge ``br0`` inside ``netns`` (as ``cutpoint.lab.net.add_tap`` does for
    the tiny guests): node traffic to the other host leaves through the
    host's veth and crosses the lab bridge cpbr0."""
    ip = ["ip", "-n", netns]
    return [ip + ["tuntap", "add", "dev", tap, "mode", "tap"],
            ip + ["link", "set", tap, "master", "br0"],
            ip + ["link", "set", tap, "up"]]


def net_up(netns: str, tap: str) -> None:
    """The node's tap in the lab host namespace ``netns`` (QEMU runs there
    and opens it by name); refuses if the tap already exists there (another
    drill runs, or one left it)."""
    if _sh("ip", "-n", netns, "link", "show", tap,
           check=False).returncode == 0:
        raise RuntimeError(f"tap {tap} exists in netns {netns}: another "
                           f"Cassandra drill is running (or one left it; "
                           f"ip -n {netns} link del {tap})")
    try:
        for argv in net_up_argv(netns, tap):
            _sh(*argv)
    except BaseException:
        net_down(netns, tap)
        raise


def net_down(netns: str, tap: str) -> None:
    _sh("ip", "-n", netns, "link", "del", tap, check=False)


def site_hosts(status: dict[str, Any], site: str) -> list[dict[str, Any]]:
    """The lab hosts of ``site`` for node1 and node2: two distinct hosts
    when the lab has them, else the one host twice (a lab of one DR host:
    both restored nodes on it)."""
    hs = [h for h in status["hosts"] if h["site"] == site]
    if not hs:
        raise ValueError(f"the lab has no {site} host: {status['hosts']}")
    return [hs[0], hs[1] if len(hs) > 1 else hs[0]]


def node_vm(image: Image, workdir: Path, idx: int, mode: str,
            disks: list[GuestDisk], mem_mb: int, heap: str,
            netns: str | None = None,
            env: dict[str, str] | None = None) -> DebianVM:
    _name, ip, token, tap = NODES[idx]
    seeds = ",".join(n[1] for n in NODES)
    role = "writer" if idx == 0 else "replica"
    extra = (f"cp.mode={mode} cp.role={role} cp.ip={ip}/{PREFIX} "
             f"cp.seeds={seeds} cp.token={token} cp.heap={heap}")
    return DebianVM(image, workdir, disks, extra, mem_mb=mem_mb, extra_argv=[
        "-netdev", f"tap,id=n0,ifname={tap},script=no,downscript=no",
        "-device", f"virtio-net-pci,netdev=n0,mac={C.vm_mac(idx + 1)}"],
        netns=netns, env=env or {})


def member(node: str, serial: str) -> str:
    """The DrillImages key (and image suffix) of one node's group disk."""
    return f"{node}-{serial}"


def drill_images(status: dict[str, Any], prefix: str,
                 sync_dir: Path) -> DrillImages:
    """The four images of the group; each member's disk id is
    ``cass-<node>/diskN`` (the QEMU node the guest sees it on)."""
    sizes = {member(n[0], s): mb for n in NODES for s, mb in GROUP}
    nodes = {member(n[0], s): f"{VM_PREFIX}{n[0]}/disk{j + 1}"
             for n in NODES for j, (s, _) in enumerate(GROUP)}
    return DrillImages(status, prefix, sizes, "cass", nodes, sync_dir)


def node_disks(site: dict[str, Any], images: dict[str, str],
               node: str) -> list[GuestDisk]:
    """One node's group disks as RBD images of ``site``; ``images`` maps a
    member key (``node1-cpclog``) to its image there.  The serial stays
    ``cpclog``/``cpdata``: the guest finds its disks by serial."""
    return [GuestDisk(s, rbd=RbdImage(site, images[member(node, s)]))
            for s, _ in GROUP]


def read_oplog_raw(raw: Path) -> bytes:
    """The operation log out of a raw ext4 cpclog filesystem (a private
    copy), without mounting it: first replay its ext4 journal, as the
    guest's mount would (``e2fsck -E journal_only``, no other repair), then
    debugfs ``cat``.  Without the replay debugfs reads the inode as last
    checkpointed: the oplog is appended O_DSYNC, so its size lives in the
    journal, and a crash-consistent copy showed 57 of the 476 records the
    restored guest itself read (run of 2026-11-22 06:12)."""
    fsck = subprocess.run(["e2fsck", "-y", "-E", "journal_only", str(raw)],
                          capture_output=True, text=True, check=False)
    if fsck.returncode not in (0, 1):
        raise RuntimeError(f"e2fsck -y -E journal_only {raw}: rc="
                           f"{fsck.returncode} {fsck.stdout}{fsck.stderr}")
    p = subprocess.run(["debugfs", "-R", f"cat {OPLOG}", str(raw)],
                       capture_output=True, check=False)
    if p.returncode != 0 or b"File not found" in p.stderr:
        raise RuntimeError(f"debugfs cat {OPLOG} {raw}: rc={p.returncode}"
                           f" {p.stderr.decode(errors='replace')}")
    return p.stdout


def read_oplog(imgs: DrillImages, site: str, image: str,
               snap: str | None = None) -> bytes:
    """The operation log of ``image`` (at ``snap``, or its head) on ``site``:
    ``rbd export`` to a temp raw file, then debugfs."""
    src = imgs.spec(site, image) + (f"@{snap}" if snap else "")
    with tempfile.TemporaryDirectory(prefix="cpoplog.") as t:
        raw = Path(t) / "clog.raw"
        imgs.rbd(site, "export", "--no-progress", src, str(raw), timeout=300)
        return read_oplog_raw(raw)


@dataclass
class Snap:
    name: str
    taken_at: float
    paused_ms: dict[str, float]
    acked_before: int
    result: dict[str, Any]


def _acks(vm: DebianVM) -> int:
    found = re.findall(r"CPSTATE writer-ack (\d+)", vm.console_text())
    return int(found[-1]) if found else 0


def _mark(console: str, what: str) -> float | None:
    m = re.findall(rf"CPSTATE {what} ([0-9.]+)", console)
    return float(m[-1]) if m else None


def start_cluster(image: Image, workdir: Path, mode: str,
                  disks: list[list[GuestDisk]], mem_mb: int, heap: str,
                  netns: list[str],
                  env: dict[str, str] | None = None) -> list[DebianVM]:
    """Node i in network namespace ``netns[i]``."""
    vms: list[DebianVM] = []
    try:
        for i in range(len(NODES)):
            vm = node_vm(image, workdir / NODES[i][0], i, mode, disks[i],
                         mem_mb, heap, netns[i], env)
            vm.start()
            vms.append(vm)
    except BaseException:
        for vm in vms:
            vm.kill()
        raise
    return vms


def _wait_all(vms: list[DebianVM], pattern: str, t0: float,
              timeout: float) -> float | None:
    try:
        for vm in vms:
            vm.wait_console(pattern, timeout - (time.monotonic() - t0))
    except (TimeoutError, RuntimeError):
        return None
    return round(time.monotonic() - t0, 1)


def drill(image: Image, snap: Snap, disks: list[list[GuestDisk]],
          snap_oplog: bytes, full_oplog: bytes, workdir: Path, mem_mb: int,
          heap: str, netns: list[str],
          env: dict[str, str] | None = None) -> dict[str, Any]:
    """Boot both nodes from ``disks`` (check mode) and judge the consoles;
    the RTO clock starts with the first restored VM."""
    t0 = time.monotonic()
    vms = start_cluster(image, workdir, "check", disks, mem_mb, heap, netns,
                        env)
    try:
        t_startup = _wait_all(vms, r"Startup complete", t0, BOOT_TIMEOUT)
        t_readall = _wait_all(vms[:1], r"CPSTATE read-all-ok|CPCHECK", t0,
                              BOOT_TIMEOUT) if t_startup else None
        t_done = _wait_all(vms[:1], r"CPCHECK", t0,
                           BOOT_TIMEOUT) if t_startup else None
    finally:
        for vm in vms:
            vm.kill()
    consoles = {NODES[i][0]: vm.console_text() for i, vm in enumerate(vms)}
    res = check_cluster(consoles, {n[0]: n[1] for n in NODES}, snap_oplog,
                        full_oplog, "node1")
    return {
        "snapshot": {"name": snap.name, "paused_ms": snap.paused_ms,
                     "acked_before": snap.acked_before},
        "passed": res.passed, "reasons": res.reasons,
        "rto_startup_complete_s": t_startup,
        "rto_read_all_s": t_readall, "rto_check_done_s": t_done,
        "check": res.as_dict(),
        "consoles": {NODES[i][0]: str(vm.console) for i, vm in enumerate(vms)},
    }


def _take(ag: Any, writer: DebianVM) -> Snap:
    ts = time.monotonic()
    res = ag.snapshot()
    if res.get("state") != "committed":
        raise RuntimeError(f"group snapshot not committed: {res}")
    names = set(res["snapshots"].values())
    if len(names) != 1 or len(res["snapshots"]) != len(NODES) * len(GROUP):
        raise RuntimeError(f"unexpected members: {res['snapshots']}")
    return Snap(names.pop(), ts, {v["vm"]: float(v.get("paused_ms") or 0)
                                  for v in res["vms"]}, _acks(writer), res)


def run(status: dict[str, Any], workdir: Path, snapshots: int = 1,
        interval: float = 20.0, mem_mb: int = 1536, heap: str = "384m",
        verify_full: bool = True, drill_all: bool = False) -> dict[str, Any]:
    """The whole drill on the lab ``status`` (both sites up); returns the
    report, also written to ``workdir/report.json`` and ``report.html``."""
    if snapshots < 1:
        raise ValueError(f"need at least one snapshot, not {snapshots}")
    # cached() first: build() waits for the cache lock even when the image
    # is there, and another recipe may be building for minutes.
    image = cached("debian-cassandra") or build("debian-cassandra")
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    primary, dr = status["sites"]["primary"], status["sites"]["dr"]
    p_hosts = site_hosts(status, "primary")
    dr_hosts = site_hosts(status, "dr")
    if p_hosts[0] is p_hosts[1]:
        raise ValueError("the Cassandra drill needs two primary lab hosts "
                         f"(lab hosts=2): {status['hosts']}")
    p_ns = [str(h["netns"]) for h in p_hosts]
    dr_ns = [str(h["netns"]) for h in dr_hosts]
    env = {LAB_MARK: str(status["state_dir"])}
    prefix = f"cp-cassdrill-{os.getpid():x}{int(time.time()) % 65536:04x}"
    imgs = drill_images(status, prefix, workdir / "sync")
    keys = [member(n[0], s) for n in NODES for s, _ in GROUP]
    clog1 = member(NODES[0][0], "cpclog")
    vms: list[DebianVM] = []
    snaps: list[Snap] = []
    results: list[dict[str, Any]] = []
    not_drilled: list[dict[str, Any]] = []   # replicated only, as bases
    primary_info: dict[str, Any] = {}
    nets: list[tuple[str, str]] = []
    full = b""
    try:
        imgs.create()
        for hosts in (p_ns, dr_ns):
            for i, ns in enumerate(hosts):
                net_up(ns, NODES[i][3])
                nets.append((ns, NODES[i][3]))
        heads = {k: imgs.image(k) for k in keys}
        t0 = time.monotonic()
        ag = None
        try:
            vms = start_cluster(image, workdir / "primary", "load",
                                [node_disks(primary, heads, n[0])
                                 for n in NODES], mem_mb, heap, p_ns, env)
            t_startup = _wait_all(vms, r"Startup complete", t0, BOOT_TIMEOUT)
            vms[0].wait_console(r"CPSTATE writer-start",
                                BOOT_TIMEOUT - (time.monotonic() - t0))
            boot_s = time.monotonic() - t0
            # One cutpointd per primary host namespace, each driving the
            # node on its host; the group file names both agents.
            ag = pgcoord.start_hosts(workdir / "coord", {
                str(p_hosts[i]["name"]): (p_ns[i], str(p_hosts[i]["address"]), {
                    f"{VM_PREFIX}{NODES[i][0]}": (vm.qmp_agent_path, {
                        vm.node_of[d.serial]: f"rbd:{d.rbd.spec}"
                        for d in vm.disks if d.rbd is not None})})
                for i, vm in enumerate(vms)}, group="cass", ceph=primary,
                env=env)
            vms[0].wait_console(r"CPSTATE writer-ack", BOOT_TIMEOUT)
            for _ in range(snapshots):
                time.sleep(interval)
                snaps.append(_take(ag, vms[0]))
            time.sleep(interval)
            acks_at_end = _acks(vms[0])
        finally:
            if ag is not None:
                ag.stop()
            for vm in vms:
                vm.kill()
        consoles = {NODES[i][0]: vm.console_text() for i, vm in enumerate(vms)}
        full = read_oplog(imgs, "primary", imgs.image(clog1))
        primary_info = {
            "boot_to_startup_complete_s": t_startup,
            "boot_to_writer_s": round(boot_s, 1),
            "acks_seen": acks_at_end, "full_oplog_bytes": len(full),
            "full_oplog_records": len(full) // 33, "netns": p_ns,
            "agents": [str(h["name"]) for h in p_hosts],
            "guest_uptime_writer_start_s": _mark(consoles["node1"],
                                                 r"writer-start \d+"),
            "images": [imgs.spec("primary", heads[k]) for k in keys],
            "consoles": {NODES[i][0]: str(vm.console)
                         for i, vm in enumerate(vms)}}
        for k, s in enumerate(snaps):
            rep = imgs.replicate(s.name, verify_full=verify_full)
            if k < len(snaps) - 1 and not drill_all:
                not_drilled.append(rep)
                continue
            snap_oplog = read_oplog(imgs, "dr", imgs.image(clog1), s.name)
            t_clone = time.monotonic()
            clones = imgs.clone_at_dr(s.name, f"d{k}")
            clone_s = time.monotonic() - t_clone
            try:
                r = drill(image, s, [node_disks(dr, clones, n[0])
                                     for n in NODES], snap_oplog, full,
                          workdir / s.name, mem_mb, heap, dr_ns, env)
            finally:
                clone_errors = imgs.remove_clones()
            r.update(replication=rep, clone_errors=clone_errors,
                     dr_clones=[imgs.spec("dr", clones[k2]) for k2 in keys],
                     dr_clone_s=round(clone_s, 2), dr_netns=dr_ns)
            results.append(r)
            print(json.dumps({k2: r[k2] for k2 in (
                "passed", "reasons", "rto_startup_complete_s",
                "rto_read_all_s")} | {"snapshot": s.name,
                                      "bytes_shipped": rep["bytes_shipped"],
                                      "replication_s": rep["seconds"]}),
                  file=sys.stderr)
    finally:
        cleanup = imgs.cleanup()
        for ns, tap in nets:
            net_down(ns, tap)
        print(f"cassdrill cleanup: {cleanup}", file=sys.stderr)
    report = {
        "image": {"hash": image.hash, "dir": str(image.dir)},
        "primary": primary_info,
        "params": {"snapshots": snapshots, "interval_s": interval,
                   "mem_mb": mem_mb, "heap": heap, "rf": 2,
                   "commitlog_sync": "group (2ms)", "via": "coordinator",
                   "method": "rbd", "verify_full": verify_full,
                   "drill_all": drill_all,
                   "prefix": prefix, "primary_netns": p_ns,
                   "dr_netns": dr_ns},
        "drills": results,
        "replicated_not_drilled": not_drilled,
        "cleanup": cleanup,
    }
    (workdir / "report.json").write_text(json.dumps(report, indent=2))
    (workdir / "report.html").write_text(render_html(report))
    return report


def _replication_html(rep: dict[str, Any]) -> str:
    e = html.escape
    rows = "".join(
        f"<tr><td>{e(m['disk'])} ({e(m['image'])})</td>"
        f"<td>{'full' if m['full'] else 'incremental'}</td>"
        f"<td>{m['bytes_shipped']:,} B</td><td>{e(m['state'])}"
        f"{' (full SHA-256)' if m['verified_full'] else ''}</td>"
        f"<td>{m['seconds']} s</td></tr>" for m in rep["members"])
    return (f"<h3>Replication to DR (base {e(str(rep['base']))}): "
            f"{e(rep['state'])}, recovery point {rep['recovery_point']}, "
            f"{rep['bytes_shipped']:,} B ({rep['bytes_shipped'] / 1e6:.1f} MB)"
            f" in {rep['seconds']} s</h3><table border=1><tr><th>member</th>"
            f"<th>copy</th><th>shipped</th><th>state</th><th>time</th></tr>"
            f"{rows}</table>")


def render_html(report: dict[str, Any]) -> str:
    """One self-contained page: per snapshot the verdict, the RTO, the
    replication, the checks and Cassandra's own recovery lines."""
    e = html.escape
    rows = []
    for d in report["drills"]:
        s, c = d["snapshot"], d["check"]
        verdict = "PASS" if d["passed"] else "FAIL"
        logs = "".join(
            f"<h3>{e(n['name'])}: Cassandra's own recovery lines</h3>"
            f"<pre>{e(chr(10).join(n['recovery_log']))}</pre>"
            for n in c["nodes"])
        node_rows = "".join(
            f"<tr><td>{e(n['name'])} commit log replayed</td><td>"
            f"{n['replay_complete']} ({n['replayed_mutations']} mutations)"
            f"</td></tr><tr><td>{e(n['name'])} startup complete / saw UP"
            f"</td><td>{n['startup_complete']} / {e(', '.join(n['saw_up']))}"
            f"</td></tr>" for n in c["nodes"])
        repl = _replication_html(d["replication"]) if d.get("replication") \
            else ""
        dr_ns = d.get("dr_netns")
        dr_ns = ", ".join(dr_ns) if isinstance(dr_ns, list) else str(dr_ns)
        clones = (f"<p>Booted at DR (netns {e(dr_ns)}) from "
                  f"clones {e(', '.join(d['dr_clones']))}.</p>"
                  if d.get("dr_clones") else "")
        rows.append(
            f"<h2>{e(s['name'])}: {verdict}</h2>"
            f"<p>RTO to both nodes' Startup complete: "
            f"{d['rto_startup_complete_s']} s; to a read at ALL: "
            f"{d['rto_read_all_s']} s; to end of check: "
            f"{d['rto_check_done_s']} s. Paused ms per VM: "
            f"{e(json.dumps(s['paused_ms']))}.</p>{repl}{clones}"
            f"<table border=1><tr><th>check</th><th>result</th></tr>"
            f"{node_rows}"
            f"<tr><td>snapshot oplog (read from the DR copy) is a prefix of "
            f"the full oplog (cmp)</td>"
            f"<td>{c['oplog_prefix']} ({c['oplog_snapshot_bytes']} of "
            f"{c['oplog_full_bytes']} bytes)</td></tr>"
            f"<tr><td>logged writes 1..M</td><td>{c['oplog_last']}</td></tr>"
            f"<tr><td>read at ALL ok / rows</td><td>{c['read_all_ok']} / "
            f"{c['rows']}</td></tr><tr><td>missing / wrong value</td><td>"
            f"{c['missing']} / {c['wrong_value']}</td></tr></table>"
            f"<p>{'<br>'.join(e(r) for r in d['reasons'])}</p>{logs}")
    return ("<!doctype html><meta charset=utf-8><title>cutpoint Cassandra "
            "drill</title><h1>Cassandra drill at DR</h1><pre>"
            + e(json.dumps(report["primary"], indent=1)) + "</pre><pre>"
            + e(json.dumps(report["params"])) + "</pre>"
            + "".join("<h2>Replicated, not drilled (a base)</h2>"
                      + _replication_html(r)
                      for r in report.get("replicated_not_drilled", []))
            + "".join(rows) + "<h2>Cleanup</h2><pre>"
            + e(json.dumps(report.get("cleanup"), indent=1)) + "</pre>")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m cutpoint.checkers.cassdrill",
        description="Bring up the lab (both Ceph clusters, under the lab "
                    "lock), run the Cassandra drill at DR, take the lab down.")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/cp-cassdrill"))
    ap.add_argument("--snapshots", type=int, default=1)
    ap.add_argument("--interval", type=float, default=20.0)
    ap.add_argument("--mem-mb", type=int, default=1536)
    ap.add_argument("--heap", default="384m")
    ap.add_argument("--drill-all", action="store_true",
                    help="drill every snapshot, not only the newest")
    ap.add_argument("--no-verify-full", action="store_true",
                    help="replicate without the full SHA-256 comparison")
    ap.add_argument("--keep-lab", action="store_true",
                    help="leave the lab up afterwards")
    a = ap.parse_args(argv)
    if a.snapshots < 1:
        ap.error("--snapshots must be at least 1")
    from cutpoint.lab import config as C
    from cutpoint.lab import down as lab_down
    from cutpoint.lab import lock
    from cutpoint.lab import up as lab_up
    with lock.lab_lock(wait=True):
        status = lab_up.up(C.LabConfig(**LAB))
        try:
            rep = run(status, a.workdir, a.snapshots, a.interval, a.mem_mb,
                      a.heap, not a.no_verify_full, a.drill_all)
        finally:
            if not a.keep_lab:
                lab_down.down()
    print(json.dumps([{k: d[k] for k in ("passed", "reasons",
                                         "rto_startup_complete_s",
                                         "rto_read_all_s")}
                      | {"snapshot": d["snapshot"]["name"],
                         "bytes_shipped": d["replication"]["bytes_shipped"]}
                      for d in rep["drills"]] + [rep["cleanup"]], indent=1))
    left = any(rep["cleanup"]["left"].values())
    return 0 if rep["drills"] and not left and all(
        d["passed"] for d in rep["drills"]) else 1


if __name__ == "__main__":
    sys.exit(main())
