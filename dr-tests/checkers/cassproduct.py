"""The Cassandra drill through the product (issue 18 item 4; `make drills`).

Two Cassandra 5.0 nodes of `debian-cassandra` (RF 2, fixed tokens, the
commit log and the operation log on `cpclog`, the data on `cpdata`) run at
the primary as libvirt domains with RBD disks, node 1 on primary-h1 and
node 2 on primary-h2 (dbdrill.DbDrillBed), on the lab network (the hosts'
bridges, joined by cpbr0) with the lab's guest addresses.  They boot with
cp.mode=idle; the CL=ALL writer (`cp-writer`) is started on node 1 through
the agent's vm.guest_exec.  One group snapshot of both VMs through the
product (both agents, one two-phase commit), replicated and drilled by the
control plane's drill job, asked for by `cutpoint drill run`:

    plan    one boot group `cassandra`: both nodes, ready by guest-ping,
            then a post hook that waits until `nodetool status` lists both
            nodes UN (their commit logs replayed, gossip settled).  Both
            copies run on the isolated drill bridge with the addresses of
            their kernel command line, so they find each other there.
    checks  cassandra (node 1): `nodetool status` all UN, and the
              operator's CQL query `SELECT count(*) FROM cp.ops` prints a
              count > 0 (the image's cqlsh wrapper, Python driver)
            guest-exec `cp-check` (node 1): the operation log's records are
              1..M in order and every one reads back at ALL with its value
              (the in-guest half of cutpoint.checkers.cassandra)
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from cutpoint.checkers.cassdrill import GROUP, NODES
from cutpoint.checkers.dbdrill import DbDrillBed, DbVM, breakdown
from cutpoint.lab import config as C
from cutpoint.lab.debian_image import build

LAB = {"hosts": 2, "vms_per_host": 0, "driver": "libvirt"}
VMS = ("cass-node1", "cass-node2")
OPLOG = "/srv/clog/oplog"
# Both nodes Up/Normal in node 1's view, now (one try).
UN_BOTH_NOW = "[ \"$(nodetool status 2>/dev/null | grep -c '^UN')\" = 2 ]"
UN_BOTH = f"n=0; until {UN_BOTH_NOW}; do n=$((n + 1)); sleep 5; done; nodetool status"

PLAN = {"boot_groups": [{
    "name": "cassandra",
    "vms": [{"vm": v, "readiness": {"kind": "guest-ping", "timeout_s": 600}} for v in VMS],
    "post": [{"kind": "guest-exec", "vm": VMS[0], "path": "/bin/sh", "timeout_s": 1800,
              "args": ["-c", UN_BOTH]}]}]}

# cp-check prints one line CPCHECK {"oplog": {...}, "peers": [...],
# "read_all": {...}} (json.dumps, keys in that order).
CPCHECK_OK = (r'CPCHECK \{"oplog": \{"records": [1-9][0-9]*, "last": [0-9]+, "bad": 0, '
              r'"torn_bytes": [0-9]+\}.*"read_all": \{"ok": true, "rows": [0-9]+, '
              r'"max_id": [0-9]+, "missing": 0, "missing_first": \[\], "wrong_value": 0,')

CHECKS: list[Any] = [
    {"name": "cassandra", "timeout_s": 900,
     "params": {"vm": VMS[0], "query": "SELECT count(*) FROM cp.ops",
                "expect": r"^\s*[1-9][0-9]*\s*$"}},
    {"name": "guest-exec", "timeout_s": 1500,
     "params": {"vm": VMS[0], "path": "/usr/local/sbin/cp-check", "regex": CPCHECK_OK}},
]


def node(i: int, host: str) -> DbVM:
    _name, ip, token, _tap = NODES[i]
    seeds = ",".join(n[1] for n in NODES)
    role = "writer" if i == 0 else "replica"
    return DbVM(VMS[i], host, dict(GROUP), memory_mb=1536, mac=C.vm_mac(i + 1),
                cmdline=(f"cp.mode=idle cp.role={role} cp.ip={ip}/{C.PREFIX} "
                         f"cp.seeds={seeds} cp.token={token} cp.heap=384m"))


def oplog_records(bed: DbDrillBed, vm: DbVM) -> int:
    r = bed.guest(vm, f"stat -c %s {OPLOG} 2>/dev/null || echo 0", 30)
    return int(r.stdout.strip() or 0) // 33 if r.exitcode == 0 else 0


def wait_both(bed: DbDrillBed, vms: list[DbVM], timeout_s: float, what: str,
              script: str = UN_BOTH_NOW) -> None:
    """bed.wait_guest on node 1; on timeout the error adds node 1's
    `nodetool status` and node 2's console tail."""
    from cutpoint.coordinator.dr.guest import GuestError

    try:
        bed.wait_guest(vms[0], script, timeout_s, what)
    except TimeoutError as exc:
        try:
            status = bed.guest(vms[0], "nodetool status 2>&1 | tail -8", 120).stdout
        except (GuestError, OSError) as e:  # the guest agent itself may be the problem
            status = f"(not read: {e})"
        raise TimeoutError(f"{exc}\nnodetool status on {vms[0].name}: {status}\n"
                           f"{vms[1].name} console tail: "
                           f"{bed.console(vms[1].name)[-2500:]}") from None


def run(status: dict[str, Any], workdir: Path, interval: float = 20.0) -> dict[str, Any]:
    """One coordinated snapshot of both nodes under the writer, replicated and
    drilled through the control plane; the report is also written to
    workdir/report.json."""
    image = build("debian-cassandra")
    workdir.mkdir(parents=True, exist_ok=True)
    hosts = [h["name"] for h in status["hosts"] if h["site"] == "primary"]
    if len(hosts) < 2:
        raise ValueError(f"the Cassandra drill needs two primary hosts: {hosts}")
    vms = [node(0, hosts[0]), node(1, hosts[1])]
    prefix = f"cp-casp-{os.getpid():x}{int(time.time()) % 65536:04x}"
    bed = DbDrillBed(status, workdir, image, vms, "cass", prefix)
    primary: dict[str, Any] = {}
    drills: list[dict[str, Any]] = []
    try:
        primary["import_roots_s"] = round(bed.make_images(), 1)
        t0 = time.monotonic()
        bed.start_vms()
        bed.start_agents()
        bed.control_plane()
        bed.wait_guest(vms[0], "cqlsh -e 'SELECT release_version FROM system.local' "
                       ">/dev/null 2>&1", 900, "node 1's CQL")
        primary["boot_to_cql_s"] = round(time.monotonic() - t0, 1)
        # The writer writes at ALL: until node 2 is UN in node 1's view every
        # write is refused, so wait for that first, and show both nodes if
        # it does not come (a CI run spent 1200 s on refused writes, with
        # only node 1's console to show for it).
        wait_both(bed, vms, 900, "both nodes UN in node 1's nodetool status")
        primary["boot_to_both_un_s"] = round(time.monotonic() - t0, 1)
        r = bed.guest(vms[0], "setsid /usr/local/sbin/cp-writer </dev/null >/dev/console 2>&1 &"
                      " echo started", 60)
        if r.exitcode != 0:
            raise RuntimeError(f"starting the writer failed: {r.as_dict()}")
        wait_both(bed, vms, 300, "the operation log's first record", f"test -s {OPLOG}")
        primary["boot_to_writer_s"] = round(time.monotonic() - t0, 1)
        time.sleep(interval)
        res = bed.snapshot_coordinated()
        snap = {"name": res["name"], "txn": res["txn"], "mode": "coordinated",
                "paused_ms": {v["vm"]: v.get("paused_ms") for v in res["vms"]},
                "oplog_before": oplog_records(bed, vms[0])}
        bed.record(res["name"], res["txn"])
        time.sleep(5)
        primary["oplog_records_at_end"] = oplog_records(bed, vms[0])
        bed.stop_vms()
        rep = bed.replicate(snap["name"], snap["txn"])
        report, ev = bed.drill(snap["txn"], PLAN, CHECKS)
        tag = f"drill-{report.get('drill_id')}"
        d = {"snapshot": snap, "replication": rep, "verdict": report.get("verdict"),
             "error": report.get("error"), "drill_id": report.get("drill_id"),
             "rto_s": ev.get("rto_s"), "point_age_s": ev.get("point_age_s"),
             "breakdown": breakdown(report),
             "checks": [{k: c.get(k) for k in ("name", "ok", "summary", "seconds", "nodes")}
                        for c in report.get("checks") or []],
             "outputs": [c.get("output", "") for c in report.get("checks") or []],
             "boot_order": report.get("boot_order"), "cleanup": report.get("cleanup"),
             "left": bed.leftovers(tag), "report_html": report.get("report_html"),
             "vms": ev.get("vms")}
        drills.append(d)
        print(json.dumps({k: d[k] for k in ("verdict", "rto_s", "breakdown", "checks",
                                            "left")}), file=sys.stderr)
    finally:
        cleanup = bed.cleanup()
        print(f"cassandra product drill cleanup: {cleanup}", file=sys.stderr)
    out = {"image": {"hash": image.hash}, "primary": primary, "drills": drills,
           "cleanup": cleanup, "params": {"interval_s": interval, "prefix": prefix}}
    (workdir / "report.json").write_text(json.dumps(out, indent=1, default=str))
    return out
