"""The PostgreSQL recovery drill on plain qcow2 files (no Ceph needed).

Flow (GCVM §4.5.3; issue 8 item 2)::

    primary VM (cp.mode=load): root overlay + cpwal + cpdata + cpjournal
      pgbench -R <rate> and the ledger client run
      every <interval> s: group snapshot of the three disks
        coordinated:   QMP stop; transaction{blockdev-snapshot-internal-sync
                       x3}; cont                      (the cut, invariant 1)
        uncoordinated: snapshot cpwal; sleep <delay>; snapshot cpdata and
                       cpjournal                     (negative control)
    quit the primary
    for each snapshot: qemu-img convert -l snapshot.name=... -> copies,
      boot a drill VM (cp.mode=check) from the copies, wait for it to power
      off, and judge its console with cutpoint.checkers.postgres.

The RTO reported is wall time from starting the drill VM to PostgreSQL
accepting connections after its recovery, and to the check's end.
"""

from __future__ import annotations

import argparse
import html
import json
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cutpoint.checkers.guestvm import DebianVM, GuestDisk
from cutpoint.checkers.postgres import check_console
from cutpoint.lab.debian_image import Image, build

GROUP = (("cpwal", 256), ("cpdata", 512), ("cpjournal", 64))
BOOT_TIMEOUT = 900.0


@dataclass
class Snap:
    name: str
    mode: str            # coordinated | uncoordinated
    taken_at: float      # monotonic
    pause_ms: float      # stop..cont (coordinated) or 0
    spread_ms: float     # first member snapshot .. last member snapshot
    acked_before: int    # ledger acks seen on the console before it (approx)
    # Consistency level reached per member disk (crash | fs-freeze) and the
    # quiesce record when fs-freeze was asked for.
    members: dict[str, str] | None = None
    quiesce: dict[str, Any] | None = None


def group_disks(workdir: Path) -> list[GuestDisk]:
    return [GuestDisk(s, workdir / f"{s}.qcow2", mb) for s, mb in GROUP]


def snapshot_coordinated(vm: DebianVM, name: str,
                         quiesce_mode: str = "crash") -> Snap:
    """Pause, one QMP transaction over the three disks, resume; with
    ``quiesce_mode="fs-freeze"`` inside a guest fs-freeze (with fallback)."""
    assert vm.qmp is not None
    if quiesce_mode != "crash":
        from cutpoint.checkers.quiesce import quiesced_snapshot
        qmp = vm.qmp

        def snap() -> None:
            qmp.execute("transaction", {"actions": [
                {"type": "blockdev-snapshot-internal-sync",
                 "data": {"device": vm.node_of[s], "name": name}}
                for s, _ in GROUP]})
        t0 = time.monotonic()
        rec = quiesced_snapshot(qmp.execute, vm.qga_path, snap,
                                mode=quiesce_mode)
        return Snap(name, "coordinated", t0, rec.pause_ms, rec.snapshot_ms,
                    _acks(vm), {s: rec.consistency for s, _ in GROUP},
                    rec.as_dict())
    t0 = time.monotonic()
    vm.qmp.execute("stop")
    t1 = time.monotonic()
    vm.qmp.execute("transaction", {"actions": [
        {"type": "blockdev-snapshot-internal-sync",
         "data": {"device": vm.node_of[s], "name": name}}
        for s, _ in GROUP]})
    t2 = time.monotonic()
    vm.qmp.execute("cont")
    t3 = time.monotonic()
    return Snap(name, "coordinated", t0, (t3 - t0) * 1e3, (t2 - t1) * 1e3,
                _acks(vm), {s: "crash" for s, _ in GROUP})


def snapshot_uncoordinated(vm: DebianVM, name: str, delay: float) -> Snap:
    """WAL disk first, then -- ``delay`` seconds later, while the database
    keeps committing -- the data and journal disks.  No pause."""
    assert vm.qmp is not None
    t0 = time.monotonic()
    vm.qmp.execute("blockdev-snapshot-internal-sync",
                   {"device": vm.node_of["cpwal"], "name": name})
    time.sleep(delay)
    vm.qmp.execute("transaction", {"actions": [
        {"type": "blockdev-snapshot-internal-sync",
         "data": {"device": vm.node_of[s], "name": name}}
        for s in ("cpdata", "cpjournal")]})
    t1 = time.monotonic()
    return Snap(name, "uncoordinated", t0, 0.0, (t1 - t0) * 1e3, _acks(vm))


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
    return Snap(names.pop(), "coordinator", t0, float(v.get("paused_ms") or 0),
                float(v.get("snapshot_ms") or 0), _acks(vm),
                {s: "crash" for s, _ in GROUP})


def _acks(vm: DebianVM) -> int:
    found = re.findall(r"CPSTATE ledger-ack (\d+)", vm.console_text())
    return int(found[-1]) if found else 0


def restore(src: list[GuestDisk], snap: str, dest: Path) -> list[GuestDisk]:
    """Copies of one snapshot of each disk, as new standalone qcow2 files."""
    dest.mkdir(parents=True, exist_ok=True)
    out = []
    for d in src:
        f = dest / d.file.name
        f.unlink(missing_ok=True)
        subprocess.run(["qemu-img", "convert", "-l", f"snapshot.name={snap}",
                        "-O", "qcow2", str(d.file), str(f)], check=True,
                       capture_output=True)
        out.append(GuestDisk(d.serial, f, d.size_mb))
    return out


def _uptime_mark(console: str, what: str) -> float | None:
    m = re.findall(rf"CPSTATE {what} ([0-9.]+)", console)
    return float(m[-1]) if m else None


def drill(image: Image, disks: list[GuestDisk], workdir: Path,
          snap: Snap | None = None) -> dict[str, Any]:
    """Boot the copies in check mode and judge the console."""
    vm = DebianVM(image, workdir, disks, "cp.mode=check")
    t0 = time.monotonic()
    vm.start()
    try:
        try:
            vm.wait_console(r"CPSTATE pg-ready", BOOT_TIMEOUT)
            t_ready = time.monotonic() - t0
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
        "snapshot": snap.__dict__ if snap else None,
        "passed": res.passed, "reasons": res.reasons,
        "rto_pg_ready_s": round(t_ready, 1) if t_ready else None,
        "rto_check_done_s": round(t_done, 1),
        "guest_uptime_pg_ready_s": _uptime_mark(console, "pg-ready"),
        "check": res.as_dict(), "console": str(vm.console),
    }


def start_primary(image: Image, workdir: Path, rate: int = 20) -> DebianVM:
    vm = DebianVM(image, workdir, group_disks(workdir),
                  f"cp.mode=load cp.pgbench_rate={rate}")
    vm.start()
    try:
        vm.wait_console(r"CPSTATE ledger-start", BOOT_TIMEOUT)
    except BaseException:
        vm.kill()
        raise
    return vm


def run(workdir: Path, coordinated: int, uncoordinated: int,
        interval: float, delay: float, rate: int,
        keep: bool = False, via: str = "qmp",
        quiesce_mode: str = "crash") -> dict[str, Any]:
    """``via``: ``qmp`` (pause + QMP transaction from here) or
    ``coordinator`` (cutpointd + ``cutpoint snapshot --group-file``)."""
    if via not in ("qmp", "coordinator"):
        raise ValueError(f"via must be qmp or coordinator, not {via!r}")
    image = build("debian-pg")
    if workdir.exists() and not keep:
        shutil.rmtree(workdir)
    prim = workdir / "primary"
    t0 = time.monotonic()
    vm = start_primary(image, prim, rate)
    boot_s = time.monotonic() - t0
    snaps: list[Snap] = []
    ag = None
    try:
        if via == "coordinator":
            from cutpoint.checkers import pgcoord
            ag = pgcoord.start(workdir / "coord", "cp-pg",
                               vm.qmp_agent_path,
                               {vm.node_of[d.serial]: d.file
                                for d in vm.disks})
        time.sleep(interval)
        for i in range(coordinated):
            snaps.append(snapshot_by_coordinator(vm, ag) if ag else
                         snapshot_coordinated(vm, f"cp.pg.c{i}",
                                              quiesce_mode))
            time.sleep(interval)
        for i in range(uncoordinated):
            snaps.append(snapshot_uncoordinated(vm, f"cp.pg.u{i}", delay))
            time.sleep(interval)
        acks_at_end = _acks(vm)
    finally:
        if ag is not None:
            ag.stop()
        vm.kill()
    primary_console = vm.console_text()
    results = []
    for s in snaps:
        copies = restore(vm.disks, s.name, workdir / s.name / "disks")
        r = drill(image, copies, workdir / s.name)
        r["snapshot"] = s.__dict__
        results.append(r)
        print(json.dumps({"snapshot": s.name, "mode": s.mode,
                          "passed": r["passed"], "reasons": r["reasons"],
                          "rto_pg_ready_s": r["rto_pg_ready_s"]}),
              file=sys.stderr)
    report = {
        "image": {"hash": image.hash, "dir": str(image.dir)},
        "primary": {"boot_to_ledger_s": round(boot_s, 1),
                    "guest_uptime_pg_ready_s":
                        _uptime_mark(primary_console, "pg-ready"),
                    "acks_seen": acks_at_end,
                    "console": str(vm.console)},
        "params": {"interval_s": interval, "delay_s": delay,
                   "pgbench_rate": rate, "via": via,
                   "quiesce": quiesce_mode},
        "drills": results,
    }
    (workdir / "report.json").write_text(json.dumps(report, indent=2))
    (workdir / "report.html").write_text(render_html(report))
    return report


def render_html(report: dict[str, Any]) -> str:
    """One self-contained page: per snapshot the verdict, the RTO, the
    check results and PostgreSQL's own recovery log lines."""
    e = html.escape
    rows = []
    for d in report["drills"]:
        s, c = d["snapshot"], d["check"]
        verdict = "PASS" if d["passed"] else "FAIL"
        rows.append(
            f"<h2>{e(s['name'])} ({e(s['mode'])}): {verdict}</h2>"
            f"<p>RTO to PostgreSQL ready: {d['rto_pg_ready_s']} s; to end of "
            f"check: {d['rto_check_done_s']} s. Pause {s['pause_ms']:.1f} ms, "
            f"member spread {s['spread_ms']:.1f} ms. Consistency per member: "
            f"{e(json.dumps(s.get('members')))}.</p>"
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
            "drill</title><h1>PostgreSQL drill</h1><pre>"
            + e(json.dumps(report["primary"], indent=1)) + "</pre>"
            + "".join(rows))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m cutpoint.checkers.pgdrill")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/cp-pgdrill"))
    ap.add_argument("--coordinated", type=int, default=2)
    ap.add_argument("--uncoordinated", type=int, default=0)
    ap.add_argument("--interval", type=float, default=5.0)
    ap.add_argument("--delay", type=float, default=3.0,
                    help="uncoordinated: seconds between WAL and data snaps")
    ap.add_argument("--rate", type=int, default=20, help="pgbench -R")
    ap.add_argument("--via", default="qmp", choices=["qmp", "coordinator"])
    ap.add_argument("--quiesce", default="crash", choices=["crash", "fs-freeze"],
                    help="--via qmp only: guest fs-freeze around the pause")
    a = ap.parse_args(argv)
    if a.quiesce != "crash" and a.via != "qmp":
        ap.error("--quiesce fs-freeze needs --via qmp (the drill's cutpointd "
                 "config has no guest-agent socket yet; see cutpoint bench quiesce)")
    rep = run(a.workdir, a.coordinated, a.uncoordinated, a.interval,
              a.delay, a.rate, via=a.via, quiesce_mode=a.quiesce)
    print(json.dumps([{k: d[k] for k in ("passed", "reasons",
                                         "rto_pg_ready_s")}
                      | {"snapshot": d["snapshot"]["name"]}
                      for d in rep["drills"]], indent=1))
    return 0 if all(d["passed"] for d in rep["drills"]
                    if d["snapshot"]["mode"] != "uncoordinated") else 1


if __name__ == "__main__":
    sys.exit(main())
