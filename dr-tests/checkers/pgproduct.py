"""The PostgreSQL drill through the product (issue 18 item 4; `make drills`).

The PostgreSQL VM of `debian-pg` runs at the primary as a libvirt domain
with RBD disks (dbdrill.DbDrillBed: the root and the three group disks
cpwal, cpdata, cpjournal of GCVM Fig. 4.10); the load (pgbench and the
ledger client, as `cp-workload load` runs them) is started through the
agent's vm.guest_exec once PostgreSQL is up.  Group snapshots are taken
through the product (or, for the negative control, uncoordinated: the WAL
disk first, the others `delay` s later), replicated by the product,
recorded as the group's recovery points, and drilled by the control
plane's drill job with this plan and these checks:

    plan    one boot group `db`: cp-pg ready by guest-ping, then a
            guest-exec post hook that waits for `pg_isready` (PostgreSQL
            has finished its crash recovery)
    checks  postgres: pg_isready, pg_amcheck --all --heapallindexed, and the
              operator's query LEDGER_QUERY: every journaled ledger number
              1..M is a row of `ledger` (the journal is read in the guest by
              PostgreSQL itself, pg_read_binary_file) -> 'ledger-prefix-ok'
            guest-exec `journal-records`: M > 0 (the load ran)
            guest-exec `recovery-log`: PostgreSQL's own log of this boot,
              kept in the report (`redo done at ...`)

The proof is the ledger check of cutpoint.checkers.pgdrill (`cp-check`),
now an operator query run by the product's `postgres` check.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from cutpoint.checkers.dbdrill import DbDrillBed, DbVM, breakdown
from cutpoint.checkers.pgdrill import GROUP
from cutpoint.lab.debian_image import build

VM = "cp-pg"
JOURNAL = "/srv/journal/ledger.journal"
PG = "PGHOST=/run/postgresql PGUSER=postgres PGDATABASE=postgres"

# What `cp-workload load` does, started through qemu-ga: the ledger and
# pgbench tables once, then pgbench and the ledger client detached (no
# output pipe left open: guest-exec returns at once).
LOAD = f"""set -eu
export {PG}
psql -qX -v ON_ERROR_STOP=1 -c 'CREATE TABLE IF NOT EXISTS ledger (id bigint PRIMARY KEY, at timestamptz NOT NULL DEFAULT now())'
psql -qXAt -c "SELECT 1 FROM pg_tables WHERE tablename = 'pgbench_accounts'" | grep -q 1 || pgbench -i -q -s 1 >/dev/null 2>&1
touch {JOURNAL}; chown postgres:postgres {JOURNAL}
setsid pgbench -n -c 1 -R %d -T 1000000 </dev/null >/dev/null 2>&1 &
setsid runuser -u postgres -- /usr/local/sbin/cp-ledger {JOURNAL} </dev/null >/dev/console 2>&1 &
echo load started
"""

# The ledger check as an operator's query: the journal's records are
# 1, 2, ..., M in order (a torn last record is not one), M > 0, and every
# one is a row of `ledger`.  encode(.., 'escape') keeps a torn tail's NUL
# bytes out of the text.
LEDGER_QUERY = (
    "WITH j AS (SELECT n::bigint AS id, k FROM regexp_split_to_table(encode("
    f"pg_read_binary_file('{JOURNAL}'), 'escape'), E'\\n') WITH ORDINALITY AS t(n, k) "
    "WHERE n ~ '^[0-9]{15}$') "
    "SELECT CASE WHEN count(*) > 0 AND bool_and(j.id = j.k) AND count(l.id) = count(*) "
    "THEN 'ledger-prefix-ok' ELSE format('ledger-prefix-bad journal=%s in-order=%s "
    "missing=%s', count(*), coalesce(bool_and(j.id = j.k), false), count(*) - count(l.id)) "
    "END FROM j LEFT JOIN ledger l ON l.id = j.id")

# The post hook: PostgreSQL accepts connections (its crash recovery done),
# or its unit failed (a PANIC in recovery: the drill fails at once, not at
# the hook's timeout).
WAIT_PG = ("until pg_isready -q -h /run/postgresql; do "
           "if systemctl -q is-failed cp-postgres.service; then "
           "journalctl -b -o cat --no-pager -u cp-postgres.service | tail -5 >&2; exit 1; fi; "
           "sleep 1; done")

PLAN = {"boot_groups": [{
    "name": "db",
    "vms": [{"vm": VM, "readiness": {"kind": "guest-ping", "timeout_s": 600}}],
    "post": [{"kind": "guest-exec", "vm": VM, "path": "/bin/sh", "timeout_s": 900,
              "args": ["-c", WAIT_PG]}]}]}

CHECKS: list[Any] = [
    {"name": "postgres", "timeout_s": 600,
     "params": {"vm": VM, "query": LEDGER_QUERY, "expect": "ledger-prefix-ok"}},
    {"name": "guest-exec", "timeout_s": 60,
     "params": {"vm": VM, "path": "/bin/sh", "regex": r"^[1-9][0-9]* records$",
                "args": ["-c", f"echo $(( $(stat -c %s {JOURNAL}) / 16 )) records"]}},
    {"name": "guest-exec", "timeout_s": 60,
     "params": {"vm": VM, "path": "/bin/sh", "regex": r"ready to accept connections",
                "args": ["-c", ("journalctl -b -o cat --no-pager -u cp-postgres.service "
                         "| grep -E 'interrupted|not properly|redo|ready to accept|PANIC|FATAL'")]}},
]


def journal_records(bed: DbDrillBed, vm: DbVM) -> int:
    r = bed.guest(vm, f"stat -c %s {JOURNAL}", 30)
    return int(r.stdout.strip() or 0) // 16 if r.exitcode == 0 else 0


def _check(report: dict[str, Any], i: int) -> dict[str, Any]:
    c = (report.get("checks") or [{}] * 3)[i]
    return {"ok": c.get("ok"), "summary": c.get("summary"), "seconds": c.get("seconds")}


def run(status: dict[str, Any], workdir: Path, coordinated: int = 1,
        uncoordinated: int = 0, interval: float = 6.0, delay: float = 3.0,
        rate: int = 20) -> dict[str, Any]:
    """The whole run on the lab `status`; the report is also written to
    workdir/report.json."""
    image = build("debian-pg")
    workdir.mkdir(parents=True, exist_ok=True)
    host = next(h["name"] for h in status["hosts"] if h["site"] == "primary")
    vm = DbVM(VM, host, dict(GROUP))
    prefix = f"cp-pgp-{os.getpid():x}{int(time.time()) % 65536:04x}"
    bed = DbDrillBed(status, workdir, image, [vm], "pg", prefix)
    primary: dict[str, Any] = {}
    snaps: list[dict[str, Any]] = []
    drills: list[dict[str, Any]] = []
    try:
        primary["import_root_s"] = round(bed.make_images(), 1)
        t0 = time.monotonic()
        bed.start_vms()
        bed.start_agents()
        bed.control_plane()
        bed.wait_guest(vm, "pg_isready -q -h /run/postgresql", 900, "PostgreSQL ready")
        primary["boot_to_pg_ready_s"] = round(time.monotonic() - t0, 1)
        r = bed.guest(vm, LOAD % rate, 300)
        if r.exitcode != 0:
            raise RuntimeError(f"starting the load failed: {r.as_dict()}")
        bed.wait_guest(vm, f"test -s {JOURNAL}", 300, "the ledger's first record")
        primary["boot_to_ledger_s"] = round(time.monotonic() - t0, 1)
        time.sleep(interval)
        for _ in range(coordinated):
            before = journal_records(bed, vm)
            res = bed.snapshot_coordinated()
            v = res["vms"][0]
            snaps.append({"name": res["name"], "txn": res["txn"], "mode": "coordinated",
                          "pause_ms": v.get("paused_ms"), "spread_ms": v.get("snapshot_ms"),
                          "journal_before": before})
            bed.record(res["name"], res["txn"])
            time.sleep(interval)
        for i in range(uncoordinated):
            name = f"cp.pg.u{i}"
            before = journal_records(bed, vm)
            spread = bed.snapshot_uncoordinated(name, [f"{VM}-cpwal"], delay)
            snaps.append({"name": name, "txn": f"u{i}", "mode": "uncoordinated",
                          "pause_ms": 0.0, "spread_ms": round(spread, 1),
                          "journal_before": before})
            bed.record(name, f"u{i}")
            time.sleep(interval)
        primary["journal_records_at_end"] = journal_records(bed, vm)
        primary["definition_captured"] = bed.definition(VM)[:200]
        bed.stop_vms()  # the primary's part is done: its CPU goes to the drills
        primary["console"] = str(bed.consoles[VM])
        for s in snaps:
            rep = bed.replicate(s["name"], s["txn"])
            report, ev = bed.drill(s["txn"], PLAN, CHECKS)
            tag = f"drill-{report.get('drill_id')}"
            d = {"snapshot": s, "replication": rep, "verdict": report.get("verdict"),
                 "error": report.get("error"), "drill_id": report.get("drill_id"),
                 "rto_s": ev.get("rto_s"), "point_age_s": ev.get("point_age_s"),
                 "breakdown": breakdown(report),
                 "checks": [_check(report, i) for i in range(len(CHECKS))],
                 "outputs": [c.get("output", "") for c in report.get("checks") or []],
                 "boot_order": report.get("boot_order"), "cleanup": report.get("cleanup"),
                 "left": bed.leftovers(tag), "report_html": report.get("report_html"),
                 "vms": ev.get("vms")}
            drills.append(d)
            print(json.dumps({k: d[k] for k in ("verdict", "rto_s", "breakdown", "checks",
                                                "left")} | {"snapshot": s["name"]}),
                  file=sys.stderr)
    finally:
        cleanup = bed.cleanup()
        print(f"pg product drill cleanup: {cleanup}", file=sys.stderr)
    report = {"image": {"hash": image.hash}, "primary": primary, "drills": drills,
              "cleanup": cleanup,
              "params": {"interval_s": interval, "delay_s": delay, "rate": rate,
                         "prefix": prefix}}
    (workdir / "report.json").write_text(json.dumps(report, indent=1, default=str))
    return report
