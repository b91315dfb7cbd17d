"""The PostgreSQL recovery drill: group snapshots on RBD, replicated, drilled
at DR (GCVM §4.5.3; issue 8 item 2).

Flow, on a lab with two Ceph clusters (``LAB``: one primary host, one DR
host, no tiny guests)::

    primary cluster: RBD images <prefix>-cpwal, -cpdata, -cpjournal
    primary VM (cp.mode=load, netns primary-h1): local qcow2 root overlay +
      the three RBD images; pgbench -R <rate> and the ledger client run
    every <interval> s: a group snapshot of the three images
      coordinated:   cutpoint snapshot --group-file against a cutpointd
                     whose config names the RBD disks (method rbd): pause,
                     one librbd snapshot per disk, resume (invariant 1)
      uncoordinated: rbd snap create of cpwal; sleep <delay>; then cpdata
                     and cpjournal, no pause            (negative control)
    quit the primary
    for each snapshot:
      replicate_group(primary -> dr): one cutpoint-sync per member, the
        first full, the next incremental; every member verified (inv. 5)
      DR cluster: clone each member's DR snapshot into a scratch image
      drill VM (cp.mode=check, netns dr-h1) boots from the DR clones;
        PostgreSQL recovers; cp-check runs pg_amcheck and the ledger check;
        the console is judged by cutpoint.checkers.postgres.check_console
      the scratch clones are removed
    finally: clones, DR replicas and snapshots, primary images are removed,
      and what is left with the drill's prefix on either cluster is listed
      in the report (``cleanup.left``; the test wants it empty)

The RTO reported is wall time from starting the DR drill VM to PostgreSQL
accepting connections after its own recovery, and to the check's end.
Replication figures (bytes shipped, per member full/incremental and
verified) are reported per snapshot.

``group_disks`` (qcow2 files) stays for the quiesce prototype and bench,
which run on local files; ``restore`` (qcow2 internal snapshot ->
standalone copy) has no caller left.  The Cassandra drill runs on RBD at
DR, like this one (``cassdrill``).
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
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cutpoint.checkers.guestvm import DebianVM, GuestDisk, RbdImage
from cutpoint.checkers.postgres import check_console
from cutpoint.checkers.rbddrill import DrillImages
from cutpoint.lab.debian_image import Image, build

GROUP = (("cpwal", 256), ("cpdata", 512), ("cpjournal", 64))
BOOT_TIMEOUT = 900.0
VM_NAME = "cp-pg"
# The lab of test_sync.py: both Ceph clusters, one host per site, no tiny
# guests (their CPU would slow the TCG Debian guest).
LAB = {"hosts": 1, "vms_per_host": 0}
LAB_MARK = "CUTPOINT_LAB_MARK"   # cutpoint.lab.proc.MARK: `lab down` finds strays


@dataclass
class Snap:
    name: str
    mode: str            # coordinator | uncoordinated
    taken_at: float      # monotonic
    pause_ms: float      # the agent's paused_ms (coordinator) or 0
    spread_ms: float     # first member snapshot .. last member snapshot
    acked_before: int    # ledger acks seen on the console before it (approx)
    # Consistency level reached per member disk (crash | fs-freeze) and the
    # agent's quiesce figures when fs-freeze was asked for.
    members: dict[str, str] | None = None
    quiesce: dict[str, Any] | None = None


def group_disks(workdir: Path) -> list[GuestDisk]:
    """The three group disks as local qcow2 files (quiesce bench/prototype)."""
    return [GuestDisk(s, workdir / f"{s}.qcow2", mb) for s, mb in GROUP]


def rbd_disks(site: dict[str, Any], images: dict[str, str]) -> list[GuestDisk]:
    """The three group disks as RBD images of ``site`` (serial -> image)."""
    return [GuestDisk(s, rbd=RbdImage(site, images[s])) for s, _ in GROUP]


def snapshot_by_coordinator(vm: DebianVM, ag: Any) -> Snap:
    """A real group snapshot: ``cutpoint snapshot --group-file`` against a
    ``cutpointd`` that drives this VM (cutpoint.checkers.pgcoord)."""
    t0 = time.monotonic()
    res = ag.snapshot()
    if res.get("state") != "committed":
        raise RuntimeError(f"group snapshot not committed: {res}")
    names = set(res["snapshots"].values())
    if len(names) != 1 or len(res["snapshots"]) != len(GROUP):
        raise RuntimeError(f"unexpected member snapshots: {res['snapshots']}")
    v = res["vms"][0]
    level = str(v.get("consistency") or "crash")
    quiesce = {k: v.get(k) for k in ("freeze_ms", "thaw_ms", "freeze_error")
               if v.get(k) is not None} or None
    return Snap(names.pop(), "coordinator", t0, float(v.get("paused_ms") or 0),
                float(v.get("snapshot_ms") or 0), _acks(vm),
                {s: level for s, _ in GROUP}, quiesce)


def snapshot_uncoordinated(vm: DebianVM, imgs: DrillImages, name: str,
                           delay: float) -> Snap:
    """WAL image first, then -- ``delay`` seconds later, while the database
    keeps committing -- the data and journal images.  No pause: plain
    ``rbd snap create``, not through the coordinator."""
    t0 = time.monotonic()
    imgs.snap_create("cpwal", name)
    time.sleep(delay)
    for s in ("cpdata", "cpjournal"):
        imgs.snap_create(s, name)
    t1 = time.monotonic()
    return Snap(name, "uncoordinated", t0, 0.0, (t1 - t0) * 1e3, _acks(vm))


def _acks(vm: DebianVM) -> int:
    found = re.findall(r"CPSTATE ledger-ack (\d+)", vm.console_text())
    return int(found[-1]) if found else 0


def _uptime_mark(console: str, what: str) -> float | None:
    m = re.findall(rf"CPSTATE {what} ([0-9.]+)", console)
    return float(m[-1]) if m else None


def drill(image: Image, disks: list[GuestDisk], workdir: Path,
          netns: str | None = None, env: dict[str, str] | None = None,
          ) -> dict[str, Any]:
    """Boot ``disks`` in check mode and judge the console; the RTO clock
    starts with the drill VM."""
    vm = DebianVM(image, workdir, disks, "cp.mode=check", netns=netns,
                  env=env or {})
    t0 = time.monotonic()
    vm.start()
    try:
        try:
            vm.wait_console(r"CPSTATE pg-ready", BOOT_TIMEOUT)
            t_ready: float | None = time.monotonic() - t0
        except (TimeoutError, RuntimeError):
            t_ready = None
        if t_ready is not None:
            vm.wait_console(r"CPSTATE check-done", BOOT_TIMEOUT)
        t_done = time.monotonic() - t0
        try:
            vm.wait_exit(120)
        except subprocess.TimeoutExpired:
            pass
    finally:
        vm.kill()
    console = vm.console_text()
    res = check_console(console)
    return {
        "passed": res.passed, "reasons": res.reasons,
        "rto_pg_ready_s": round(t_ready, 1) if t_ready else None,
        "rto_check_done_s": round(t_done, 1),
        "guest_uptime_pg_ready_s": _uptime_mark(console, "pg-ready"),
        "check": res.as_dict(), "console": str(vm.console),
    }


def start_primary(image: Image, workdir: Path, disks: list[GuestDisk],
                  rate: int = 20, netns: str | None = None,
                  env: dict[str, str] | None = None) -> DebianVM:
    vm = DebianVM(image, workdir, disks,
                  f"cp.mode=load cp.pgbench_rate={rate}", netns=netns,
                  env=env or {})
    vm.start()
    try:
        vm.wait_console(r"CPSTATE ledger-start", BOOT_TIMEOUT)
    except BaseException:
        vm.kill()
        raise
    return vm


def _host(status: dict[str, Any], site: str) -> str:
    for h in status["hosts"]:
        if h["site"] == site:
            return str(h["netns"])
    raise ValueError(f"the lab has no {site} host: {status['hosts']}")


def run(status: dict[str, Any], workdir: Path, coordinated: int = 1,
        uncoordinated: int = 0, interval: float = 6.0, delay: float = 3.0,
        rate: int = 20, quiesce_mode: str = "crash",
        verify_full: bool = True) -> dict[str, Any]:
    """The whole drill on the lab ``status`` (both sites up); returns the
    report, also written to ``workdir/report.json`` and ``report.html``."""
    from cutpoint.checkers import pgcoord
    if quiesce_mode not in ("crash", "fs-freeze"):
        raise ValueError(f"quiesce must be crash or fs-freeze, not {quiesce_mode!r}")
    image = build("debian-pg")
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    primary, dr = status["sites"]["primary"], status["sites"]["dr"]
    p_host, dr_host = _host(status, "primary"), _host(status, "dr")
    env = {LAB_MARK: str(status["state_dir"])}
    prefix = f"cp-pgdrill-{os.getpid():x}{int(time.time()) % 65536:04x}"
    nodes = {s: f"disk{i + 1}" for i, (s, _) in enumerate(GROUP)}
    imgs = DrillImages(status, prefix, dict(GROUP), VM_NAME, nodes,
                       workdir / "sync")
    snaps: list[Snap] = []
    results: list[dict[str, Any]] = []
    primary_info: dict[str, Any] = {}
    try:
        imgs.create()
        t0 = time.monotonic()
        vm = start_primary(image, workdir / "primary",
                           rbd_disks(primary, {s: imgs.image(s) for s, _ in GROUP}),
                           rate, p_host, env)
        boot_s = time.monotonic() - t0
        ag = None
        try:
            ag = pgcoord.start(
                workdir / "coord", VM_NAME, vm.qmp_agent_path,
                {vm.node_of[s]: f"rbd:{imgs.spec('primary', imgs.image(s))}"
                 for s, _ in GROUP}, ceph=primary,
                qga=vm.qga_path if quiesce_mode != "crash" else None,
                quiesce=quiesce_mode)
            time.sleep(interval)
            for _ in range(coordinated):
                snaps.append(snapshot_by_coordinator(vm, ag))
                time.sleep(interval)
            for i in range(uncoordinated):
                snaps.append(snapshot_uncoordinated(vm, imgs, f"cp.pg.u{i}",
                                                    delay))
                time.sleep(interval)
            acks_at_end = _acks(vm)
        finally:
            if ag is not None:
                ag.stop()
            vm.kill()
        console = vm.console_text()
        primary_info = {"boot_to_ledger_s": round(boot_s, 1),
                        "guest_uptime_pg_ready_s":
                            _uptime_mark(console, "pg-ready"),
                        "acks_seen": acks_at_end, "netns": p_host,
                        "images": [imgs.spec("primary", imgs.image(s))
                                   for s, _ in GROUP],
                        "console": str(vm.console)}
        for k, s in enumerate(snaps):
            rep = imgs.replicate(s.name, verify_full=verify_full)
            t_clone = time.monotonic()
            clones = imgs.clone_at_dr(s.name, f"d{k}")
            clone_s = time.monotonic() - t_clone
            r = drill(image, rbd_disks(dr, clones), workdir / s.name,
                      dr_host, env)
            r["clone_errors"] = imgs.remove_clones()
            r.update(snapshot=s.__dict__, replication=rep,
                     dr_clones=[imgs.spec("dr", c) for c in clones.values()],
                     dr_clone_s=round(clone_s, 2), dr_netns=dr_host)
            results.append(r)
            print(json.dumps({"snapshot": s.name, "mode": s.mode,
                              "passed": r["passed"], "reasons": r["reasons"],
                              "bytes_shipped": rep["bytes_shipped"],
                              "replication_s": rep["seconds"],
                              "rto_pg_ready_s": r["rto_pg_ready_s"]}),
                  file=sys.stderr)
    finally:
        cleanup = imgs.cleanup()
        print(f"pgdrill cleanup: {cleanup}", file=sys.stderr)
    report = {
        "image": {"hash": image.hash, "dir": str(image.dir)},
        "primary": primary_info,
        "params": {"interval_s": interval, "delay_s": delay,
                   "pgbench_rate": rate, "quiesce": quiesce_mode,
                   "verify_full": verify_full, "prefix": prefix},
        "drills": results,
        "cleanup": cleanup,
    }
    (workdir / "report.json").write_text(json.dumps(report, indent=2))
    (workdir / "report.html").write_text(render_html(report))
    return report


def _bytes(n: int) -> str:
    return f"{n:,} B ({n / 1e6:.1f} MB)"


def render_html(report: dict[str, Any]) -> str:
    """One self-contained page: per snapshot the verdict, the RTO, the
    replication, the check results and PostgreSQL's own recovery log."""
    e = html.escape
    rows = []
    for d in report["drills"]:
        s, c, rep = d["snapshot"], d["check"], d["replication"]
        verdict = "PASS" if d["passed"] else "FAIL"
        reps = "".join(
            f"<tr><td>{e(m['disk'])} ({e(m['image'])})</td>"
            f"<td>{'full' if m['full'] else 'incremental'}</td>"
            f"<td>{_bytes(m['bytes_shipped'])}</td><td>{e(m['state'])}"
            f"{' (full SHA-256)' if m['verified_full'] else ''}</td>"
            f"<td>{m['seconds']} s</td></tr>" for m in rep["members"])
        rows.append(
            f"<h2>{e(s['name'])} ({e(s['mode'])}): {verdict}</h2>"
            f"<p>RTO from starting the DR drill VM to PostgreSQL ready: "
            f"{d['rto_pg_ready_s']} s; to end of check: "
            f"{d['rto_check_done_s']} s. Pause {s['pause_ms']:.1f} ms, "
            f"member spread {s['spread_ms']:.1f} ms. Consistency per member: "
            f"{e(json.dumps(s.get('members')))}.</p>"
            f"<h3>Replication to DR (base {e(str(rep['base']))}): "
            f"{e(rep['state'])}, recovery point {rep['recovery_point']}, "
            f"{_bytes(rep['bytes_shipped'])} in {rep['seconds']} s</h3>"
            f"<table border=1><tr><th>member</th><th>copy</th><th>shipped"
            f"</th><th>state</th><th>time</th></tr>{reps}</table>"
            f"<p>Booted at DR from clones {e(', '.join(d['dr_clones']))}.</p>"
            f"<table border=1><tr><th>check</th><th>result</th></tr>"
            f"<tr><td>redo done</td><td>{c['redo_done']}</td></tr>"
            f"<tr><td>pg_amcheck rc</td><td>{c['amcheck_rc']}</td></tr>"
            f"<tr><td>journal acknowledged 1..M</td><td>{c['journal_last']}"
            f"</td></tr><tr><td>ledger rows covering 1..M</td><td>"
            f"{c['ledger_covered']}</td></tr><tr><td>missing</td><td>"
            f"{c['missing']}</td></tr></table>"
            f"<p>{'<br>'.join(e(r) for r in d['reasons'])}</p>"
            f"<pre>{e(chr(10).join(c['recovery_log']))}</pre>")
    return ("<!doctype html><meta charset=utf-8><title>cutpoint PostgreSQL "
            "drill</title><h1>PostgreSQL drill at DR</h1><pre>"
            + e(json.dumps(report["primary"], indent=1)) + "</pre>"
            + "".join(rows)
            + "<h2>Cleanup</h2><pre>"
            + e(json.dumps(report.get("cleanup"), indent=1)) + "</pre>")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m cutpoint.checkers.pgdrill",
        description="Bring up the lab (both Ceph clusters, under the lab "
                    "lock), run the PostgreSQL drill at DR, take the lab down.")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/cp-pgdrill"))
    ap.add_argument("--coordinated", type=int, default=2)
    ap.add_argument("--uncoordinated", type=int, default=0)
    ap.add_argument("--interval", type=float, default=5.0)
    ap.add_argument("--delay", type=float, default=3.0,
                    help="uncoordinated: seconds between WAL and data snaps")
    ap.add_argument("--rate", type=int, default=20, help="pgbench -R")
    ap.add_argument("--quiesce", default="crash", choices=["crash", "fs-freeze"],
                    help="guest fs-freeze around the pause (through cutpointd)")
    ap.add_argument("--no-verify-full", action="store_true",
                    help="replicate without the full SHA-256 comparison")
    ap.add_argument("--keep-lab", action="store_true",
                    help="leave the lab up afterwards")
    a = ap.parse_args(argv)
    if a.coordinated < 0 or a.uncoordinated < 0 or a.coordinated + a.uncoordinated == 0:
        ap.error("need at least one snapshot (--coordinated/--uncoordinated >= 0)")
    from cutpoint.lab import config as C
    from cutpoint.lab import down as lab_down
    from cutpoint.lab import lock
    from cutpoint.lab import up as lab_up
    with lock.lab_lock(wait=True):
        status = lab_up.up(C.LabConfig(**LAB))
        try:
            rep = run(status, a.workdir, a.coordinated, a.uncoordinated,
                      a.interval, a.delay, a.rate, a.quiesce,
                      not a.no_verify_full)
        finally:
            if not a.keep_lab:
                lab_down.down()
    print(json.dumps([{k: d[k] for k in ("passed", "reasons",
                                         "rto_pg_ready_s")}
                      | {"snapshot": d["snapshot"]["name"],
                         "bytes_shipped": d["replication"]["bytes_shipped"]}
                      for d in rep["drills"]] + [rep["cleanup"]], indent=1))
    left = any(rep["cleanup"]["left"].values())
    return 0 if not left and all(d["passed"] for d in rep["drills"]
                                 if d["snapshot"]["mode"] != "uncoordinated") else 1


if __name__ == "__main__":
    sys.exit(main())
