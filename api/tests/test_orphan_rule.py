"""The sweeper's decision rule (services/orphans.py) on agent replies.

`data/orphans/snapshot-list-lab.json` is what two real cutpointd answered
to `snapshot.list` for their four RBD disks during a run of
test_sweeper_lab.py (recorded with the lab's coordinator certificate):
txn 1a210c57b1079fcd4 was a committed group snapshot, 1a210c57e64944868 an
aborted one whose late creates tagged themselves after the abort (the
orphan), `by-hand` and `cp.app.tf1d695ad` were made with `rbd snap create`.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from cutpoint.api.models import Group, GroupSnapshot, SnapState
from cutpoint.api.services.orphans import (
    DELETE,
    KEEP,
    Found,
    TxnFacts,
    decide,
    load_facts,
)
from sqlalchemy.orm import Session, sessionmaker

REPLY = json.loads((Path(__file__).parent / "data" / "orphans"
                    / "snapshot-list-lab.json").read_text())
COMMITTED, ORPHAN = "1a210c57b1079fcd4", "1a210c57e64944868"
HOUR = 3600.0


def _found() -> list[Found]:
    out = []
    for key, reply in REPLY.items():
        host, disk = key.split(" ")
        out += [Found.from_reply(host, disk, item) for item in reply["snapshots"]]
    return out


def _at(ts: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(ts, dt.UTC)


FACTS = {COMMITTED: TxnFacts(db_state="committed", log_state="committed"),
         ORPHAN: TxnFacts(db_state="aborted", log_state="aborted")}


def test_recorded_reply_old_enough() -> None:
    found = _found()
    newest = max(f.created or 0 for f in found)
    verdicts = [decide(f, FACTS, _at(newest + HOUR + 1), HOUR) for f in found]
    got = {(v.snap.host, v.snap.disk, v.snap.name): (v.action, v.reason) for v in verdicts}
    assert len(got) == 10
    for (_h, _d, name), verdict in got.items():
        if name == f"cp.app.{ORPHAN}":
            assert verdict == (DELETE, "orphan")
        elif name == f"cp.app.{COMMITTED}":
            assert verdict == (KEEP, "committed")
        else:
            assert name in ("by-hand", "cp.app.tf1d695ad")
            assert verdict == (KEEP, "not_cutpoints")
    assert sum(a == DELETE for a, _ in got.values()) == 4


def test_recorded_reply_too_young() -> None:
    found = _found()
    newest = max(f.created or 0 for f in found)
    verdicts = [decide(f, FACTS, _at(newest + 10), HOUR) for f in found]
    assert not [v for v in verdicts if v.action == DELETE]
    assert {v.reason for v in verdicts if v.snap.owner == ORPHAN} == {"too_young"}


def _orphan_snap(**kw: Any) -> Found:
    base: dict[str, Any] = {"host": "h1", "disk": "vm1/disk0", "name": f"cp.app.{ORPHAN}",
                            "id": 12, "owner": ORPHAN, "created": 1_000_000}
    return Found(**{**base, **kw})


OLD = _at(1_000_000 + 2 * HOUR)
NOW_STARTED = OLD - dt.timedelta(hours=2)


@pytest.mark.parametrize("facts,snap,want", [
    # the txn ended without a recovery point, long enough ago
    (TxnFacts("aborted", False, "aborted"), {}, (DELETE, "orphan")),
    (TxnFacts("failed", False, None), {}, (DELETE, "orphan")),
    (TxnFacts("deleted", False, None), {}, (DELETE, "orphan")),
    (TxnFacts(None, False, "aborted"), {}, (DELETE, "orphan")),
    # age from the txn when the agent gave no creation time
    (TxnFacts("aborted", False, "aborted", NOW_STARTED), {"created": None},
     (DELETE, "orphan")),
    (TxnFacts("aborted", False, "aborted", OLD - dt.timedelta(seconds=5)),
     {"created": None}, (KEEP, "too_young")),
    (TxnFacts("aborted", False, "aborted"), {"created": None}, (KEEP, "age_unknown")),
    # never the sweeper's
    (TxnFacts("committed", False, "committed"), {}, (KEEP, "committed")),
    (TxnFacts("deleting", False, "committed"), {}, (KEEP, "committed")),
    (TxnFacts("aborted", True, "aborted"), {}, (KEEP, "dr_reference")),
    (TxnFacts("aborting", False, "aborting"), {}, (KEEP, "in_doubt")),
    (TxnFacts("committing", False, "committing"), {}, (KEEP, "in_doubt")),
    (TxnFacts("failed", False, "preparing"), {}, (KEEP, "in_doubt")),
    (TxnFacts("pending", False, None), {}, (KEEP, "in_flight")),
    (TxnFacts("aborting", False, "aborted"), {}, (KEEP, "in_flight")),
    (TxnFacts(None, False, "committed"), {}, (KEEP, "committed_in_log")),
    (TxnFacts(None, False, None), {}, (KEEP, "unknown_txn")),
    (None, {}, (KEEP, "unknown_txn")),
    (TxnFacts("aborted", False, "aborted"), {"owner": None}, (KEEP, "not_cutpoints")),
    (TxnFacts("aborted", False, "aborted"), {"owner_error": "rbd_metadata_get: EIO"},
     (KEEP, "owner_unreadable")),
    (TxnFacts("aborted", False, "aborted"), {"id": None}, (KEEP, "no_snap_id")),
])
def test_rule(facts: TxnFacts | None, snap: dict[str, Any], want: tuple[str, str]) -> None:
    f = _orphan_snap(**snap)
    v = decide(f, {ORPHAN: facts} if facts else {}, OLD, HOUR)
    assert (v.action, v.reason) == want, v.detail


def test_grace_is_exclusive_at_the_boundary() -> None:
    f = _orphan_snap()
    facts = {ORPHAN: TxnFacts("aborted", False, "aborted")}
    assert decide(f, facts, _at(1_000_000 + HOUR - 1), HOUR).reason == "too_young"
    assert decide(f, facts, _at(1_000_000 + HOUR), HOUR).action == DELETE


@pytest.mark.parametrize("item,reason", [
    ({"name": "x", "id": "12", "owner": ORPHAN, "created": 1}, "no_snap_id"),
    ({"name": "x", "id": True, "owner": ORPHAN, "created": 1}, "no_snap_id"),
    ({"name": "x", "id": 3, "owner": 7, "created": 1}, "not_cutpoints"),
    ({"name": "x", "id": 3, "owner": ORPHAN, "owner_error": "ERANGE"}, "owner_unreadable"),
])
def test_odd_entries_are_kept(item: dict[str, Any], reason: str) -> None:
    v = decide(Found.from_reply("h", "vm/disk0", item),
               {ORPHAN: TxnFacts("aborted", False, "aborted")}, OLD, 0)
    assert (v.action, v.reason) == (KEEP, reason)


def test_load_facts(session_factory: sessionmaker[Session]) -> None:
    now = dt.datetime.now(dt.UTC)
    with session_factory() as s:
        g = Group(name="g")
        s.add(g)
        s.flush()
        s.add_all([
            GroupSnapshot(group_id=g.id, txn="ab", state=SnapState.aborted, requested_at=now),
            GroupSnapshot(group_id=g.id, txn="drp", state=SnapState.aborted,
                          dr_verified_at=now),
            GroupSnapshot(group_id=g.id, txn="base", state=SnapState.failed,
                          replication_base=True),
            GroupSnapshot(group_id=g.id, txn="fly", state=SnapState.preparing),
        ])
        s.commit()
    log = {"ab": "aborted", "fly": "preparing", "cli": "committed"}
    txlog = SimpleNamespace(get=lambda t: SimpleNamespace(state=log[t]) if t in log else None)
    with session_factory() as s:
        facts = load_facts(s, txlog, ["ab", "drp", "base", "fly", "cli", "nobody", "ab"])
    assert facts["ab"] == TxnFacts("aborted", False, "aborted", facts["ab"].started_at)
    assert facts["ab"].started_at is not None
    assert facts["drp"].dr_reference and facts["base"].dr_reference
    assert facts["fly"].db_state == "preparing" and facts["fly"].log_state == "preparing"
    assert facts["cli"] == TxnFacts(None, False, "committed", None)
    assert facts["nobody"] == TxnFacts()
