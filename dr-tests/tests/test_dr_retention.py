"""Invariant 6 at both sites: retention never deletes a replication base and
always keeps the newest DR recovery point, whatever the policies say.

The policies are set to delete as much as they can (keep_last=1, no
keep_within) and the base is made the *oldest* snapshot, the first one any
age-based rule would drop.  A real SQLite database migrated with Alembic.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from cutpoint.api.db import get_sessionmaker
from cutpoint.api.migrate import upgrade
from cutpoint.api.models import (
    DrPolicy,
    Group,
    GroupSnapshot,
    Policy,
    SnapState,
    utcnow,
)
from cutpoint.api.services import replication, retention
from sqlalchemy.orm import Session


def _setup(tmp_path: Path):  # type: ignore[no-untyped-def]
    url = f"sqlite:///{tmp_path / 'cp.db'}"
    upgrade(url)
    return get_sessionmaker(url)


def _six_snapshots(s: Session, name: str, now: dt.datetime) -> tuple[Group, list[GroupSnapshot]]:
    """A group whose policies at both sites would keep only the newest
    snapshot, and six committed snapshots t0..t5 a minute apart, oldest first."""
    g = Group(name=name)
    g.policy = Policy(keep_last=1, keep_within_seconds=0)
    s.add(g)
    s.flush()
    s.add(DrPolicy(group_id=g.id, keep_last=1, keep_within_seconds=0))
    snaps = []
    for i in range(6):
        sn = GroupSnapshot(group_id=g.id, txn=f"t{i}", state=SnapState.committed,
                           cut_at=now - dt.timedelta(seconds=600 - 60 * i))
        s.add(sn)
        snaps.append(sn)
    s.flush()
    return g, snaps


def test_retention_never_deletes_a_replication_base_at_either_site(tmp_path: Path) -> None:
    sf = _setup(tmp_path)
    now = utcnow()
    with sf() as s:
        g, snaps = _six_snapshots(s, "ret", now)
        # t0: the base of an increment still running (the oldest point);
        # t1, t2: older DR points; t3: the newest DR point; t4, t5 not replicated.
        snaps[0].replication_base = True
        for i in (0, 1, 2, 3):
            snaps[i].dr_verified_at = snaps[i].cut_at + dt.timedelta(seconds=5)
        s.commit()
        primary = {x.txn for x in retention.plan(s, g, now)}
        dr = {x.txn for x in replication.dr_plan(s, g, now)}
    assert "t0" not in primary and "t0" not in dr, (primary, dr)
    assert "t3" not in primary and "t3" not in dr  # the newest DR recovery point
    assert "t5" not in primary  # the newest recovery point
    # The policies did delete what they may: the rules are not vacuous.
    assert dr == {"t1", "t2"}
    assert {"t1", "t2", "t4"} <= primary


def test_dr_retention_is_a_separate_policy(tmp_path: Path) -> None:
    sf = _setup(tmp_path)
    now = utcnow()
    with sf() as s:
        g = Group(name="sep")
        g.policy = Policy(keep_last=1, keep_within_seconds=0)
        s.add(g)
        s.flush()
        s.add(DrPolicy(group_id=g.id, keep_last=3, keep_within_seconds=0))
        for i in range(5):
            cut = now - dt.timedelta(seconds=500 - 60 * i)
            s.add(GroupSnapshot(group_id=g.id, txn=f"s{i}", state=SnapState.committed,
                                cut_at=cut, dr_verified_at=cut + dt.timedelta(seconds=3),
                                replication_base=(i == 4)))
        s.commit()
        dr = [x.txn for x in replication.dr_plan(s, g, now)]
        primary = [x.txn for x in retention.plan(s, g, now)]
    assert dr == ["s0", "s1"]  # keeps 3 at DR
    assert primary == ["s0", "s1", "s2", "s3"]  # keeps 1 at the primary


def test_a_copy_in_flight_keeps_its_base_and_source_whatever_the_flag(tmp_path: Path) -> None:
    """A copy from t1 to t3 runs while t2 holds the flag (a second replication
    that finished first, or a flag moved by hand): retention keeps t1 at both
    sites and t3 at the primary.  A stale attempt (t4: attempt 1 was copying
    when its worker died, attempt 2 failed) protects nothing."""
    from cutpoint.api.models import MemberReplication, MemberSnapshot

    sf = _setup(tmp_path)
    now = utcnow()
    with sf() as s:
        g, snaps = _six_snapshots(s, "fly", now)
        for i in (0, 1, 2):
            snaps[i].dr_verified_at = snaps[i].cut_at + dt.timedelta(seconds=5)
        snaps[2].replication_base = True
        for sn in snaps:
            s.add(MemberSnapshot(group_snapshot_id=sn.id, host="h1", vm="vm1",
                                 disk="vm1/disk0", name=f"cp.fly.{sn.txn}", state="present"))

        def row(snap: GroupSnapshot, attempt: int, base: str, state: str) -> None:
            s.add(MemberReplication(group_snapshot_id=snap.id, attempt=attempt,
                                    disk="vm1/disk0", pool="rbd", image="vm1-disk0",
                                    snap=f"cp.fly.{snap.txn}", base=base, target_site="dr",
                                    state=state))

        row(snaps[3], 1, "cp.fly.t1", "copying")         # in flight from t1
        row(snaps[4], 1, "cp.fly.t0", "copying")         # stale: attempt 2 failed
        row(snaps[4], 2, "cp.fly.t2", "failed")
        s.commit()
        sources, bases = replication.in_flight(s, g.id)
        assert (sources, bases) == ({snaps[3].id}, {snaps[1].id})
        primary = {x.txn for x in retention.plan(s, g, now)}
        dr = {x.txn for x in replication.dr_plan(s, g, now)}
    assert primary == {"t0", "t4"}, primary  # t1 base in flight, t2 flagged, t3 source, t5
    assert dr == {"t0"}, dr                  # t1 base in flight, t2 flagged and newest
