"""Retention planning: keep_last, keep_within, and invariant 6 (never the
newest recovery point, the newest DR recovery point or a replication base)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from cutpoint.api.models import Group, GroupSnapshot, Policy, SnapState, utcnow
from cutpoint.api.services import retention


def _group(s: Any, keep_last: int, keep_within: int = 0) -> Group:
    g = Group(name=f"r{keep_last}-{keep_within}")
    g.policy = Policy(keep_last=keep_last, keep_within_seconds=keep_within)
    s.add(g)
    s.flush()
    return g


def _snaps(s: Any, g: Group, ages_s: list[int], now: dt.datetime,
           **flags: dict[int, Any]) -> list[GroupSnapshot]:
    out = []
    for i, age in enumerate(ages_s):
        sn = GroupSnapshot(group_id=g.id, txn=f"{g.name}-{i}", state=SnapState.committed,
                           cut_at=now - dt.timedelta(seconds=age))
        for k, per in flags.items():
            if i in per:
                setattr(sn, k, per[i])
        s.add(sn)
        out.append(sn)
    s.flush()
    return out


def test_keep_last(session_factory: Any) -> None:
    now = utcnow()
    with session_factory() as s:
        g = _group(s, keep_last=2)
        sn = _snaps(s, g, [50, 40, 30, 20, 10], now)
        doomed = retention.plan(s, g, now)
        assert [d.txn for d in doomed] == [sn[0].txn, sn[1].txn, sn[2].txn]


def test_keep_within_keeps_young_ones(session_factory: Any) -> None:
    now = utcnow()
    with session_factory() as s:
        g = _group(s, keep_last=1, keep_within=35)
        sn = _snaps(s, g, [50, 40, 30, 20, 10], now)
        assert [d.txn for d in retention.plan(s, g, now)] == [sn[0].txn, sn[1].txn]


def test_invariant_6_protections(session_factory: Any) -> None:
    now = utcnow()
    with session_factory() as s:
        g = _group(s, keep_last=1)
        sn = _snaps(s, g, [50, 40, 30, 20, 10], now,
                    replication_base={1: True},
                    dr_verified_at={2: now - dt.timedelta(seconds=5)})
        doomed = [d.txn for d in retention.plan(s, g, now)]
        # 4 is the newest (keep_last=1), 2 the newest DR recovery point,
        # 1 a replication base: only 0 and 3 may go.
        assert doomed == [sn[0].txn, sn[3].txn]


def test_only_committed_snapshots_are_candidates(session_factory: Any) -> None:
    now = utcnow()
    with session_factory() as s:
        g = _group(s, keep_last=1)
        sn = _snaps(s, g, [50, 40, 30], now)
        sn[0].state = SnapState.aborted
        s.flush()
        assert [d.txn for d in retention.plan(s, g, now)] == [sn[1].txn]
