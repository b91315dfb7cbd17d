"""The Cassandra drill checker (GCVM §4.5.3, Fig. 4.12; issue 8 item 3).

Inputs: the serial consoles of the two nodes booted from restored copies of
one group snapshot (each: commit-log disk + data disk), the operation log
as it was in the snapshot, and the full operation log (the writer node's
commit-log disk after the load stopped).  The writer node prints, once a
read at ALL succeeds, one ``CPCHECK {json}`` line with facts (see
``dr-tests/images/debian/cassandra/overlay/usr/local/sbin/cp-check``).

A drill passes iff all of:

1. both nodes replayed their commit logs (Cassandra's own ``Log replay
   complete, N replayed mutations``) and reached ``Startup complete``;
2. both rejoined: each node logged the other as UP (``InetAddress /IP is
   now UP``) and a read at consistency level ALL succeeded;
3. the snapshot's operation log is a byte prefix of the full operation log
   (the paper's ``cmp`` check: ``cmp`` reports EOF on the shorter file), it
   is well formed (records 1..M) and not empty; and
4. every logged write 1..M is readable at ALL with the value logged:
   ``missing == 0`` and ``wrong_value == 0``.

Rows beyond M are fine: a write can be durable in the commit logs before
the writer logged its acknowledgement.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

from cutpoint.checkers.console import recovery_lines
from cutpoint.checkers.postgres import CheckerInputError, parse_facts

# Cassandra's own recovery/rejoin log lines worth showing in a report.
RECOVERY_PATTERNS = (
    "Replaying /",
    "Log replay complete",
    "No commitlog files found",
    "skipping replay",
    "CommitLogReplayException",
    "is now UP",
    "is now DOWN",
    "is now part of the cluster",
    "Startup complete",
    "Exception encountered during startup",
    "ERROR",
)
_REPLAYED = re.compile(r"Log replay complete, (\d+) replayed mutations")
_UP = re.compile(r"InetAddress /?([0-9.]+)(?::\d+)? is now UP")

__all__ = ["CassCheck", "CheckerInputError", "check_cluster", "is_prefix"]


@dataclass
class NodeFacts:
    name: str
    replay_complete: bool
    replayed_mutations: int | None
    startup_complete: bool
    saw_up: list[str]
    recovery_log: list[str] = field(default_factory=list)


@dataclass
class CassCheck:
    passed: bool
    reasons: list[str]
    nodes: list[NodeFacts]
    oplog_prefix: bool
    oplog_snapshot_bytes: int
    oplog_full_bytes: int
    oplog_last: int | None
    read_all_ok: bool
    rows: int | None
    missing: int | None
    wrong_value: int | None
    facts: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def node_facts(name: str, console: str) -> NodeFacts:
    rec = recovery_lines(console, RECOVERY_PATTERNS)
    m = _REPLAYED.findall(console)
    return NodeFacts(
        name=name, replay_complete=bool(m),
        replayed_mutations=int(m[-1]) if m else None,
        startup_complete="Startup complete" in console,
        saw_up=sorted(set(_UP.findall(console))), recovery_log=rec)


def is_prefix(snap: bytes, full: bytes) -> bool:
    """``cmp snap full`` says EOF on snap (or nothing): snap is a prefix."""
    return full[:len(snap)] == snap


def check_cluster(consoles: dict[str, str], ips: dict[str, str],
                  snap_oplog: bytes, full_oplog: bytes,
                  writer: str) -> CassCheck:
    """``consoles``/``ips``: node name -> console text / address;
    ``writer``: the node whose console carries CPCHECK."""
    if writer not in consoles:
        raise CheckerInputError(f"writer node {writer!r} not among "
                                f"{sorted(consoles)}")
    reasons: list[str] = []
    nodes = [node_facts(n, c) for n, c in consoles.items()]
    for nf in nodes:
        if not nf.replay_complete:
            reasons.append(f"{nf.name}: no 'Log replay complete' (commit log "
                           f"not replayed)")
        if not nf.startup_complete:
            reasons.append(f"{nf.name}: Cassandra never logged 'Startup "
                           f"complete'")
        others = [ip for n, ip in ips.items() if n != nf.name]
        for ip in others:
            if ip not in nf.saw_up:
                reasons.append(f"{nf.name}: never saw {ip} come UP (no "
                               f"rejoin)")
    prefix = is_prefix(snap_oplog, full_oplog)
    if not prefix:
        at = next((i for i, (a, b) in enumerate(zip(snap_oplog, full_oplog))
                   if a != b), min(len(snap_oplog), len(full_oplog)))
        reasons.append(f"snapshot operation log ({len(snap_oplog)} bytes) is "
                       f"not a prefix of the full one ({len(full_oplog)} "
                       f"bytes): differs at byte {at}")
    facts = parse_facts(consoles[writer])
    if facts is None:
        reasons.append("no CPCHECK line: the in-guest check did not finish")
        return CassCheck(False, reasons, nodes, prefix, len(snap_oplog),
                         len(full_oplog), None, False, None, None, None, {})
    op = facts.get("oplog", {})
    last = int(op.get("last", -1))
    if int(op.get("bad", 0)) != 0:
        reasons.append(f"operation log malformed after record {last} "
                       f"(bad={op.get('bad')})")
    if last <= 0:
        reasons.append("operation log is empty: no acknowledged write was "
                       "captured by the snapshot")
    # The cmp check is only worth something if it compared the log the
    # restored node itself read: same number of complete records.
    host_records = snap_oplog.count(b"\n")
    if op.get("records") is not None and int(op["records"]) != host_records:
        reasons.append(f"the restored node read {op['records']} operation-log "
                       f"records, the snapshot's log read on the host has "
                       f"{host_records}: the cmp check did not compare the "
                       f"log the node checked")
    ra = facts.get("read_all", {})
    ok = bool(ra.get("ok"))
    missing = wrong = rows = None
    if not ok:
        reasons.append(f"read at ALL failed: {ra.get('error')}")
    else:
        missing, wrong = int(ra.get("missing", -1)), int(ra.get("wrong_value",
                                                                -1))
        rows = int(ra.get("rows", -1))
        if missing != 0:
            reasons.append(f"{missing} logged writes are not readable at ALL "
                           f"(first: {ra.get('missing_first')})")
        if wrong != 0:
            reasons.append(f"{wrong} logged writes read back with another "
                           f"value (first: {ra.get('wrong_first')})")
    return CassCheck(not reasons, reasons, nodes, prefix, len(snap_oplog),
                     len(full_oplog), last, ok, rows, missing, wrong, facts)
