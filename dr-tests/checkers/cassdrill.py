"""The Cassandra recovery drill on plain qcow2 files (no Ceph needed).

Flow (GCVM §4.5.3, Fig. 4.12; issue 8 item 3)::

    bridge cpcbr0 10.79.0.1/24 + taps cpct1, cpct2      (our own subnet)
    node1 10.79.0.11 (writer), node2 10.79.0.12: Cassandra 5.0, RF 2,
      each: root overlay + cpclog (commit log, group sync; + oplog on
      node1) + cpdata
    the writer inserts unique values at CL=ALL and logs each ack (O_DSYNC)
    every <interval> s: one group snapshot of both VMs' four disks through
      cutpointd + `cutpoint snapshot --group-file` (cutpoint.checkers.pgcoord)
    stop both VMs; the full operation log = node1's cpclog now (debugfs)
    for each snapshot: qemu-img convert -> copies; read the snapshot's
      operation log from the copy (debugfs, never mounted); boot both nodes
      from the copies (cp.mode=check); wait for node1's CPCHECK; judge
      with cutpoint.checkers.cassandra.

RTO: wall time from starting the two restored VMs to both nodes' "Startup
complete", and to a successful read at ALL (rejoined), and to the end of
the check.
"""

from __future__ import annotations

import argparse
import html
import json
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
from cutpoint.checkers.guestvm import DebianVM, GuestDisk
from cutpoint.checkers.pgdrill import restore
from cutpoint.lab.debian_image import Image, build, cached

BRIDGE, SUBNET_HOST = "cpcbr0", "10.79.0.1/24"
NODES = (("node1", "10.79.0.11", "-4611686018427387904", "cpct1"),
         ("node2", "10.79.0.12", "4611686018427387904", "cpct2"))
GROUP = (("cpclog", 512), ("cpdata", 512))
BOOT_TIMEOUT = 2400.0
OPLOG = "/oplog"    # on node1's cpclog filesystem


def _sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    p = subprocess.run(list(argv), capture_output=True, text=True,
                       check=False)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} rc={p.returncode}: "
                           f"{p.stdout}{p.stderr}")
    return p


def net_up() -> None:
    """Our own bridge and two taps; refuses if the bridge already exists
    (another drill runs) so two drills never share a network."""
    if _sh("ip", "link", "show", BRIDGE, check=False).returncode == 0:
        raise RuntimeError(f"bridge {BRIDGE} exists: another Cassandra drill "
                           f"is running (or one left it; ip link del {BRIDGE})")
    _sh("ip", "link", "add", BRIDGE, "type", "bridge")
    _sh("ip", "addr", "add", SUBNET_HOST, "dev", BRIDGE)
    _sh("ip", "link", "set", BRIDGE, "up")
    for _n, _ip, _t, tap in NODES:
        _sh("ip", "tuntap", "add", "dev", tap, "mode", "tap")
        _sh("ip", "link", "set", tap, "master", BRIDGE)
        _sh("ip", "link", "set", tap, "up")


def net_down() -> None:
    for _n, _ip, _t, tap in NODES:
        _sh("ip", "link", "del", tap, check=False)
    _sh("ip", "link", "del", BRIDGE, check=False)


def node_vm(image: Image, workdir: Path, idx: int, mode: str,
            disks: list[GuestDisk], mem_mb: int, heap: str) -> DebianVM:
    _name, ip, token, tap = NODES[idx]
    seeds = ",".join(n[1] for n in NODES)
    role = "writer" if idx == 0 else "replica"
    extra = (f"cp.mode={mode} cp.role={role} cp.ip={ip}/24 cp.seeds={seeds} "
             f"cp.token={token} cp.heap={heap}")
    return DebianVM(image, workdir, disks, extra, mem_mb=mem_mb, extra_argv=[
        "-netdev", f"tap,id=n0,ifname={tap},script=no,downscript=no",
        "-device", f"virtio-net-pci,netdev=n0,mac=52:54:00:79:00:{idx + 11:02x}"])


def group_disks(workdir: Path) -> list[GuestDisk]:
    return [GuestDisk(s, workdir / f"{s}.qcow2", mb) for s, mb in GROUP]


def read_oplog(qcow2: Path) -> bytes:
    """The operation log out of a cpclog disk, without mounting it:
    qemu-img convert to raw, then debugfs ``cat``."""
    with tempfile.TemporaryDirectory(prefix="cpoplog.") as t:
        raw = Path(t) / "clog.raw"
        _sh("qemu-img", "convert", "-O", "raw", str(qcow2), str(raw))
        p = subprocess.run(["debugfs", "-R", f"cat {OPLOG}", str(raw)],
                           capture_output=True, check=False)
        if p.returncode != 0:
            raise RuntimeError(f"debugfs cat {OPLOG} {raw}: rc={p.returncode}"
                               f" {p.stderr.decode(errors='replace')}")
        return p.stdout


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
                  disks: list[list[GuestDisk]], mem_mb: int,
                  heap: str) -> list[DebianVM]:
    vms: list[DebianVM] = []
    try:
        for i in range(len(NODES)):
            vm = node_vm(image, workdir / NODES[i][0], i, mode, disks[i],
                         mem_mb, heap)
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


def drill(image: Image, snap: Snap, copies: list[list[GuestDisk]],
          full_oplog: bytes, workdir: Path, mem_mb: int,
          heap: str) -> dict[str, Any]:
    snap_oplog = read_oplog(copies[0][0].file)
    t0 = time.monotonic()
    vms = start_cluster(image, workdir, "check", copies, mem_mb, heap)
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


def run(workdir: Path, snapshots: int, interval: float, mem_mb: int = 1536,
        heap: str = "384m", keep: bool = False) -> dict[str, Any]:
    # cached() first: build() waits for the cache lock even when the image
    # is there, and another recipe may be building for minutes.
    image = cached("debian-cassandra") or build("debian-cassandra")
    if workdir.exists() and not keep:
        shutil.rmtree(workdir)
    prim = workdir / "primary"
    net_up()
    vms: list[DebianVM] = []
    ag = None
    snaps: list[Snap] = []
    try:
        t0 = time.monotonic()
        pdisks = [group_disks(prim / n[0]) for n in NODES]
        for d in pdisks:
            d[0].file.parent.mkdir(parents=True, exist_ok=True)
        vms = start_cluster(image, prim, "load", pdisks, mem_mb, heap)
        t_startup = _wait_all(vms, r"Startup complete", t0, BOOT_TIMEOUT)
        vms[0].wait_console(r"CPSTATE writer-start",
                            BOOT_TIMEOUT - (time.monotonic() - t0))
        boot_s = time.monotonic() - t0
        ag = pgcoord.start_many(workdir / "coord", {
            f"cass-{NODES[i][0]}": (vm.qmp_agent_path,
                                    {vm.node_of[d.serial]: d.file
                                     for d in vm.disks})
            for i, vm in enumerate(vms)}, group="cass")
        vms[0].wait_console(r"CPSTATE writer-ack", BOOT_TIMEOUT)
        for _ in range(snapshots):
            time.sleep(interval)
            ts = time.monotonic()
            res = ag.snapshot()
            if res.get("state") != "committed":
                raise RuntimeError(f"group snapshot not committed: {res}")
            names = set(res["snapshots"].values())
            if len(names) != 1 or len(res["snapshots"]) != 2 * len(GROUP):
                raise RuntimeError(f"unexpected members: {res['snapshots']}")
            snaps.append(Snap(names.pop(), ts,
                              {v["vm"]: float(v.get("paused_ms") or 0)
                               for v in res["vms"]}, _acks(vms[0]), res))
        time.sleep(interval)
        acks_at_end = _acks(vms[0])
    finally:
        if ag is not None:
            ag.stop()
        for vm in vms:
            vm.kill()
    try:
        full = read_oplog(pdisks[0][0].file)
        primary_consoles = {NODES[i][0]: vm.console_text()
                            for i, vm in enumerate(vms)}
        results = []
        for s in snaps:
            copies = [restore(pdisks[i], s.name,
                              workdir / s.name / NODES[i][0] / "disks")
                      for i in range(len(NODES))]
            r = drill(image, s, copies, full, workdir / s.name, mem_mb, heap)
            results.append(r)
            print(json.dumps({k: r[k] for k in (
                "passed", "reasons", "rto_startup_complete_s",
                "rto_read_all_s")} | {"snapshot": s.name}), file=sys.stderr)
    finally:
        net_down()
    report = {
        "image": {"hash": image.hash, "dir": str(image.dir)},
        "primary": {
            "boot_to_startup_complete_s": t_startup,
            "boot_to_writer_s": round(boot_s, 1),
            "acks_seen": acks_at_end, "full_oplog_bytes": len(full),
            "full_oplog_records": len(full) // 33,
            "guest_uptime_writer_start_s": _mark(primary_consoles["node1"],
                                                 r"writer-start \d+"),
            "consoles": {NODES[i][0]: str(vm.console)
                         for i, vm in enumerate(vms)}},
        "params": {"snapshots": snapshots, "interval_s": interval,
                   "mem_mb": mem_mb, "heap": heap, "rf": 2,
                   "commitlog_sync": "group (2ms)", "via": "coordinator"},
        "drills": results,
    }
    (workdir / "report.json").write_text(json.dumps(report, indent=2))
    (workdir / "report.html").write_text(render_html(report))
    return report


def render_html(report: dict[str, Any]) -> str:
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
        rows.append(
            f"<h2>{e(s['name'])}: {verdict}</h2>"
            f"<p>RTO to both nodes' Startup complete: "
            f"{d['rto_startup_complete_s']} s; to a read at ALL: "
            f"{d['rto_read_all_s']} s; to end of check: "
            f"{d['rto_check_done_s']} s. Paused ms per VM: "
            f"{e(json.dumps(s['paused_ms']))}.</p>"
            f"<table border=1><tr><th>check</th><th>result</th></tr>"
            f"{node_rows}"
            f"<tr><td>snapshot oplog is a prefix of the full oplog (cmp)</td>"
            f"<td>{c['oplog_prefix']} ({c['oplog_snapshot_bytes']} of "
            f"{c['oplog_full_bytes']} bytes)</td></tr>"
            f"<tr><td>logged writes 1..M</td><td>{c['oplog_last']}</td></tr>"
            f"<tr><td>read at ALL ok / rows</td><td>{c['read_all_ok']} / "
            f"{c['rows']}</td></tr><tr><td>missing / wrong value</td><td>"
            f"{c['missing']} / {c['wrong_value']}</td></tr></table>"
            f"<p>{'<br>'.join(e(r) for r in d['reasons'])}</p>{logs}")
    return ("<!doctype html><meta charset=utf-8><title>cutpoint Cassandra "
            "drill</title><h1>Cassandra drill</h1><pre>"
            + e(json.dumps(report["primary"], indent=1)) + "</pre><pre>"
            + e(json.dumps(report["params"])) + "</pre>" + "".join(rows))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m cutpoint.checkers.cassdrill")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/cp-cassdrill"))
    ap.add_argument("--snapshots", type=int, default=1)
    ap.add_argument("--interval", type=float, default=20.0)
    ap.add_argument("--mem-mb", type=int, default=1536)
    ap.add_argument("--heap", default="384m")
    a = ap.parse_args(argv)
    if a.snapshots < 1:
        ap.error("--snapshots must be at least 1")
    rep = run(a.workdir, a.snapshots, a.interval, a.mem_mb, a.heap)
    print(json.dumps([{k: d[k] for k in ("passed", "reasons",
                                         "rto_startup_complete_s",
                                         "rto_read_all_s")}
                      | {"snapshot": d["snapshot"]["name"]}
                      for d in rep["drills"]], indent=1))
    return 0 if rep["drills"] and all(d["passed"] for d in rep["drills"]) \
        else 1


if __name__ == "__main__":
    sys.exit(main())
