"""Unit tests of the PostgreSQL drill checker on a recorded console.

``data/pg_drill_console.log`` is the serial console of a real drill VM
(Debian image, PostgreSQL 15 recovering from a coordinated group snapshot
under pgbench + ledger load), trimmed to PostgreSQL's lines and the
CPSTATE/CPCHECK lines.  Each failing case injects exactly one fault into it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from cutpoint.checkers.postgres import CheckerInputError, check_console

GOOD = (Path(__file__).parent / "data" / "pg_drill_console.log").read_text()


def _facts(text: str) -> dict:
    return json.loads(re.search(r"CPCHECK (\{.*\})", text).group(1))


def _with_facts(text: str, **change: object) -> str:
    f = _facts(text)
    for key, val in change.items():
        outer, _, inner = key.partition("__")
        if inner:
            f[outer][inner] = val
        else:
            f[outer] = val
    return re.sub(r"CPCHECK \{.*\}", lambda _m: "CPCHECK " + json.dumps(f), text)


def test_recorded_drill_passes() -> None:
    r = check_console(GOOD)
    assert r.passed, r.reasons
    assert r.redo_done and r.ready and r.amcheck_rc == 0
    assert r.journal_last and r.journal_last > 0 and r.missing == 0
    assert any("automatic recovery in progress" in ln for ln in r.recovery_log)
    assert any("redo done at" in ln for ln in r.recovery_log)


def test_no_redo_done_fails() -> None:
    text = "\n".join(ln for ln in GOOD.splitlines() if "redo done" not in ln)
    r = check_console(text)
    assert not r.passed
    want = ("PostgreSQL log has no 'redo done' (no completed "
            "automatic recovery)")
    assert r.reasons == [want]


def test_amcheck_failure_fails() -> None:
    r = check_console(_with_facts(GOOD, amcheck_rc=2,
                                  amcheck_output="btree index corrupt"))
    assert not r.passed
    assert len(r.reasons) == 1 and r.reasons[0].startswith("pg_amcheck exited 2")


def test_one_acknowledged_transaction_missing_fails() -> None:
    f = _facts(GOOD)
    last = f["journal"]["last"]
    r = check_console(_with_facts(GOOD, ledger__covered=last - 1))
    assert not r.passed and r.missing == 1
    assert len(r.reasons) == 1 and "1 acknowledged ledger" in r.reasons[0]


def test_extra_unjournaled_rows_are_fine() -> None:
    f = _facts(GOOD)
    r = check_console(_with_facts(GOOD, ledger__rows=f["ledger"]["rows"] + 5,
                                  ledger__max=f["ledger"]["max"] + 5))
    assert r.passed, r.reasons


def test_malformed_journal_fails() -> None:
    r = check_console(_with_facts(GOOD, journal__bad=1))
    assert not r.passed
    assert len(r.reasons) == 1 and "journal malformed" in r.reasons[0]


def test_missing_check_line_fails() -> None:
    text = "\n".join(ln for ln in GOOD.splitlines() if "CPCHECK" not in ln)
    r = check_console(text)
    assert not r.passed
    assert r.reasons == ["no CPCHECK line: the in-guest check did not run"]


def test_garbled_check_line_is_a_typed_error() -> None:
    with pytest.raises(CheckerInputError, match="not JSON"):
        check_console(GOOD.replace("CPCHECK {", "CPCHECK {{", 1))
