"""The PostgreSQL drill checker (GCVM §4.5.3, Figs. 4.10-4.11).

Input is the serial console of a VM booted from restored copies of a group
snapshot (root overlay + WAL disk + data disk + ledger journal disk).  The
guest prints PostgreSQL's own log (systemd forwards it to the console) and,
once PostgreSQL accepts connections, one ``CPCHECK {json}`` line with facts
(see ``dr-tests/images/debian/pg/overlay/usr/local/sbin/cp-check``).

A drill passes iff all of:

1. PostgreSQL ran automatic crash recovery and finished it: its log shows
   ``redo done`` (and it reached "ready to accept connections");
2. ``pg_amcheck --all --heapallindexed`` exited 0;
3. the ledger journal is well formed (consecutive numbers 1..M; a torn
   tail record is tolerated and not counted), and
4. every journaled (acknowledged) ledger number 1..M is a row of the
   ``ledger`` table: ``covered == M``.

Rows beyond M are fine: a commit can be durable in the WAL before the
client journaled its acknowledgement.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from cutpoint.checkers.console import recovery_lines

# PostgreSQL's recovery log lines worth showing in a drill report.
RECOVERY_PATTERNS = (
    "database system was interrupted",
    "database system was not properly shut down",
    "automatic recovery in progress",
    "redo starts at",
    "redo done at",
    "redo is not required",
    "invalid record length",
    "invalid magic number",
    "record with incorrect prev-link",
    "checkpoint starting: end-of-recovery",
    "database system is ready to accept connections",
    "could not locate a valid checkpoint record",
    "PANIC",
    "FATAL",
)
_CPCHECK = re.compile(r"^.*CPCHECK (\{.*\})\s*$", re.MULTILINE)


class CheckerInputError(ValueError):
    """The console text does not contain what the checker needs."""


@dataclass
class PgCheck:
    passed: bool
    reasons: list[str]
    redo_done: bool
    ready: bool
    amcheck_rc: int | None
    journal_last: int | None
    ledger_covered: int | None
    ledger_rows: int | None
    ledger_max: int | None
    missing: int | None
    recovery_log: list[str] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def parse_facts(console: str) -> dict[str, Any] | None:
    """The last CPCHECK JSON on the console, or None if there is none."""
    found = _CPCHECK.findall(console)
    if not found:
        return None
    try:
        facts: dict[str, Any] = json.loads(found[-1])
    except json.JSONDecodeError as e:
        raise CheckerInputError(f"CPCHECK line is not JSON: {found[-1]!r}: "
                                f"{e}") from e
    return facts


def check_console(console: str) -> PgCheck:
    """Decide the drill from one console log (see the module docstring)."""
    rec = recovery_lines(console, RECOVERY_PATTERNS)
    redo_done = any("redo done at" in line for line in rec)
    ready = any("ready to accept connections" in line for line in rec)
    facts = parse_facts(console)
    reasons: list[str] = []
    if not redo_done:
        reasons.append("PostgreSQL log has no 'redo done' (no completed "
                       "automatic recovery)")
    if not ready:
        reasons.append("PostgreSQL never reported 'ready to accept "
                       "connections'")
    if facts is None:
        reasons.append("no CPCHECK line: the in-guest check did not run")
        return PgCheck(False, reasons, redo_done, ready, None, None, None,
                       None, None, None, rec, {})
    am = int(facts.get("amcheck_rc", -1))
    if am != 0:
        reasons.append(f"pg_amcheck exited {am}: "
                       f"{str(facts.get('amcheck_output', ''))[:300]}")
    j = facts.get("journal", {})
    led = facts.get("ledger", {})
    last = int(j.get("last", -1))
    if int(j.get("bad", 0)) != 0:
        reasons.append(f"ledger journal malformed after record {last} "
                       f"(bad={j.get('bad')})")
    covered = int(led.get("covered", -1))
    missing = None
    if int(led.get("query_rc", 1)) != 0:
        reasons.append(f"ledger query failed: {led.get('error')}")
    else:
        missing = last - covered
        if missing != 0:
            reasons.append(f"{missing} acknowledged ledger transactions are "
                           f"missing: journal shows 1..{last}, table has "
                           f"{covered} of them (max id {led.get('max')})")
    return PgCheck(not reasons, reasons, redo_done, ready, am, last, covered,
                   int(led.get("rows", -1)), int(led.get("max", -1)), missing,
                   rec, facts)
