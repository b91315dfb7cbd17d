"""Group-level replication through the control plane.

`run(sf, settings, snapshot_id)` replicates every member disk of one
committed group snapshot to its group's replication target site with
`cutpoint.coordinator.dr.replicate.replicate_group` (cutpoint-sync, parallel,
bounded), records one `member_replications` row per member and attempt,
and only when *every* member is verified sets `dr_verified_at` (the group
snapshot is now a DR recovery point, invariant 5) and moves the
`replication_base` flag to it.  The previous base keeps its flag until the
new one is verified, so the base an increment is running from is never
deletable (invariant 6).

Where the Ceph clusters are: each site's Ceph access, set through the API
(`services.sites.ceph_site`); a member's pool is mapped by each site.

DR retention (`dr_plan` / `dr_apply`) is a separate policy (`dr_policies`)
applied to the DR copies: it keeps the `keep_last` newest DR recovery
points, those younger than `keep_within_seconds`, the newest DR recovery
point, every replication base, and the base of any copy running now
(`in_flight`).  The `retention` task applies it after the primary's.

One replication per group at a time: the `replicate` task holds a Redis
lock per group with a lease (tasks.ReplicationLock); a second job waits,
queued, with a message naming the job it waits for.

Fencing (fencing.py): once a failover made the target the group's active
site, a copy into it would overwrite the live copy.  `request` refuses it
(409 `fenced` / `epoch_moved`), `run` refuses it again before anything is
copied (the job may have been queued before the failover), and every copy
runs cutpoint-sync with `--epoch` = the group's epoch, so the engine itself
refuses a DR image that is live since that epoch or a newer one.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Callable
from typing import Any

from cutpoint.api.models import (
    Disk,
    DrPolicy,
    Group,
    GroupSnapshot,
    Job,
    MemberReplication,
    SnapState,
    utcnow,
)
from sqlalchemy import func, select
from sqlalchemy.orm import Session


class ReplicationFailed(Exception):
    def __init__(self, code: str, message: str) -> None:
        self.code = code
        super().__init__(message)


def site_of(s: Session, name: str, *, timeout_s: int | None = None) -> Any:
    """The CephSite of site `name` (timeouts capped at `timeout_s`, see
    sites.ceph_site); ReplicationFailed with the API's code when it has none."""
    from cutpoint.api.errors import ApiError
    from cutpoint.api.services.sites import ceph_site

    try:
        return ceph_site(s, name, timeout_s=timeout_s)
    except ApiError as exc:
        raise ReplicationFailed(exc.code, exc.detail) from exc


def default_rate_mbps() -> float | None:
    """The replication rate limit (MB/s) when a job names none:
    `CUTPOINT_REPLICATION_RATE_MBPS`, unset or empty for no limit."""
    raw = os.environ.get("CUTPOINT_REPLICATION_RATE_MBPS", "").strip()
    if not raw:
        return None
    try:
        rate = float(raw)
    except ValueError:
        rate = -1.0
    if not rate > 0:
        raise ReplicationFailed("bad_rate", "CUTPOINT_REPLICATION_RATE_MBPS must be a "
                                f"positive number of MB/s, got {raw!r}")
    return rate


# DR retention of a group that has no policy of its own.
DR_KEEP_LAST = 48


def request(s: Session, snap: GroupSnapshot, *, verify_full: bool, jobs: int,
            actor: str | None) -> Job:
    """The replicate job of one committed group snapshot (409 if it is not committed)."""
    from cutpoint.api.errors import Conflict
    from cutpoint.api.services import fencing
    from cutpoint.api.services import jobs as job_service

    if snap.state != SnapState.committed:
        raise Conflict(f"snapshot {snap.txn} is {snap.state.value}, not committed",
                       code="not_committed")
    g = s.get(Group, snap.group_id)
    target = g.policy.replication_target if g is not None and g.policy else None
    refusal = fencing.replication_refusal(s, snap, target.name) if target else None
    if refusal is not None:
        raise Conflict(refusal[1], code=refusal[0])
    return job_service.create(s, "replicate", actor=actor, group_id=snap.group_id,
                              snapshot_id=snap.id,
                              params={"verify_full": verify_full, "jobs": jobs,
                                      "epoch": fencing.current_epoch(s, snap.group_id)})


def dr_policy(s: Session, g: Group) -> DrPolicy:
    """The group's DR retention policy, or the default one (not stored)."""
    return s.get(DrPolicy, g.id) or DrPolicy(group_id=g.id, keep_last=DR_KEEP_LAST,
                                             keep_within_seconds=0)


def set_dr_policy(s: Session, g: Group, *, keep_last: int | None,
                  keep_within_s: int | None) -> DrPolicy:
    """Change the fields given (None: keep) of the group's DR retention policy."""
    p = s.get(DrPolicy, g.id)
    if p is None:
        p = DrPolicy(group_id=g.id, keep_last=DR_KEEP_LAST, keep_within_seconds=0)
        s.add(p)
    if keep_last is not None:
        p.keep_last = keep_last
    if keep_within_s is not None:
        p.keep_within_seconds = keep_within_s
    s.commit()
    return p


def base_for(s: Session, snap: GroupSnapshot) -> GroupSnapshot | None:
    """The newest DR recovery point of the group older than `snap` (the increment's base)."""
    return s.scalar(select(GroupSnapshot).where(
        GroupSnapshot.group_id == snap.group_id, GroupSnapshot.id != snap.id,
        GroupSnapshot.state == SnapState.committed,
        GroupSnapshot.dr_verified_at.is_not(None),
        GroupSnapshot.cut_at <= snap.cut_at)
        .order_by(GroupSnapshot.cut_at.desc(), GroupSnapshot.id.desc()).limit(1))


def in_flight(s: Session, group_id: int) -> tuple[set[int], set[int]]:
    """(sources, bases) of the group's copies that are running now.

    A copy is running when its snapshot is not a DR recovery point yet and
    the latest attempt of that snapshot has a member still `copying`.  Its
    source must stay at the primary until it is verified (it becomes the
    next base), and the snapshot it copies *from* must stay at both sites:
    retention keeps both whatever the `replication_base` flag says, so a
    copy whose base lost the flag (a worker killed mid-run, a lock lease
    that ran out) still finds its base (invariant 6).  A killed worker's
    stale `copying` rows keep their snapshots until a retry of that
    snapshot verifies it: that costs space, never data.
    """
    from cutpoint.api.models import MemberSnapshot

    latest = (select(MemberReplication.group_snapshot_id,
                     func.max(MemberReplication.attempt).label("attempt"))
              .join(GroupSnapshot, GroupSnapshot.id == MemberReplication.group_snapshot_id)
              .where(GroupSnapshot.group_id == group_id,
                     GroupSnapshot.dr_verified_at.is_(None))
              .group_by(MemberReplication.group_snapshot_id).subquery())
    rows = s.execute(select(MemberReplication.group_snapshot_id, MemberReplication.base)
                     .join(latest, (latest.c.group_snapshot_id
                                    == MemberReplication.group_snapshot_id)
                           & (latest.c.attempt == MemberReplication.attempt))
                     .where(MemberReplication.state == "copying")).all()
    sources = {r[0] for r in rows}
    names = {r[1] for r in rows if r[1]}
    bases: set[int] = set()
    if names:
        bases = set(s.scalars(select(MemberSnapshot.group_snapshot_id).join(
            GroupSnapshot, GroupSnapshot.id == MemberSnapshot.group_snapshot_id).where(
            GroupSnapshot.group_id == group_id, MemberSnapshot.name.in_(names))))
    return sources, bases


def run(sf: Any, settings: Any, snapshot_id: int, *, jobs: int = 2,
        verify_full: bool = False, rate_mbps: float | None = None,
        state_dir: str | None = None, expected_epoch: int | None = None) -> dict[str, Any]:
    """Copy the snapshot's members to the target.  `expected_epoch`: the fencing
    epoch the job was queued under (refused if the group's moved since)."""
    from cutpoint.api.services import fencing
    from cutpoint.coordinator.dr.replicate import MemberCopy, replicate_group

    if rate_mbps is None:
        rate_mbps = default_rate_mbps()
    with sf() as s:
        snap = s.get(GroupSnapshot, snapshot_id)
        if snap is None:
            raise ReplicationFailed("snapshot_not_found", f"no group snapshot {snapshot_id}")
        if snap.state != SnapState.committed:
            raise ReplicationFailed("not_committed",
                                    f"group snapshot {snap.txn} is {snap.state.value}")
        g = s.get(Group, snap.group_id)
        assert g is not None
        target = g.policy.replication_target if g.policy else None
        if target is None:
            raise ReplicationFailed("no_target", f"group {g.name} has no replication target")
        refusal = fencing.replication_refusal(s, snap, target.name, expected_epoch)
        if refusal is not None:
            raise ReplicationFailed(*refusal)
        epoch = fencing.current_epoch(s, g.id)
        if snap.dr_verified_at is not None:
            return summary(s, snap)
        base = base_for(s, snap)
        base_names = {m.disk: m.name for m in base.members} if base else {}
        copies, src_name = [], None
        for m in snap.members:
            disk = s.get(Disk, m.disk_id) if m.disk_id else None
            if disk is None or disk.backend != "rbd" or not disk.image:
                raise ReplicationFailed("not_replicable", f"member {m.disk} is not an RBD disk")
            site = disk.vm.host.site.name
            if src_name not in (None, site):
                raise ReplicationFailed("mixed_sites", f"members at {src_name} and {site}")
            src_name = site
            copies.append(MemberCopy(disk.image, m.name, base_names.get(m.disk), m.disk,
                                     pool=disk.pool or "rbd"))
        if src_name is None:
            raise ReplicationFailed("no_members", f"group snapshot {snap.txn} has no member "
                                    "snapshots to replicate")
        src, dst = site_of(s, src_name), site_of(s, target.name)
        for c in copies:
            for site_ in (src, dst):
                if c.pool not in site_.pools:
                    raise ReplicationFailed("pool_not_mapped", f"site {site_.name} maps no "
                                            f"pool {c.pool!r} (member {c.disk}); its pools: "
                                            f"{sorted(site_.pools)}")
        attempt = (s.scalar(select(func.max(MemberReplication.attempt)).where(
            MemberReplication.group_snapshot_id == snap.id)) or 0) + 1
        rows = []
        for c in copies:
            row = MemberReplication(group_snapshot_id=snap.id, attempt=attempt, disk=c.disk,
                                    pool=c.pool, image=c.image, snap=c.snap, base=c.base,
                                    target_site=target.name, state="copying",
                                    started_at=utcnow())
            s.add(row)
            rows.append(row)
        s.commit()
        rep = replicate_group(src, dst, copies, jobs=jobs,
                              verify_full=verify_full, rate_mbps=rate_mbps,
                              state_dir=state_dir or "/var/lib/cutpoint/sync", epoch=epoch)
        now = utcnow()
        for row, r in zip(rows, rep.members, strict=True):
            row.state, row.full, row.error = r.state, r.full, r.error
            row.bytes_shipped, row.bytes_changed = r.bytes_shipped, r.bytes_changed
            row.seconds, row.throughput_mbps = round(r.seconds, 3), round(r.throughput_mbps, 3)
            row.finished_at = now
        if rep.recovery_point:
            snap.dr_verified_at = now
            s.flush()
            # The base of the next increment is the newest DR point by cut
            # (a late-finishing older copy does not take the flag away).
            newest = s.scalar(select(GroupSnapshot).where(
                GroupSnapshot.group_id == snap.group_id,
                GroupSnapshot.dr_verified_at.is_not(None))
                .order_by(GroupSnapshot.cut_at.desc(), GroupSnapshot.id.desc()).limit(1))
            for old in s.scalars(select(GroupSnapshot).where(
                    GroupSnapshot.group_id == snap.group_id,
                    GroupSnapshot.replication_base.is_(True))):
                if newest is None or old.id != newest.id:
                    old.replication_base = False
            if newest is not None:
                newest.replication_base = True
        s.commit()
        out = summary(s, snap)
        if not rep.recovery_point:
            failed = [f"{r.disk}: {r.error}" for r in rep.members if r.state != "verified"]
            fenced = any(r.fenced for r in rep.members)
            raise ReplicationFailed("fenced" if fenced else "replication_failed",
                                    "; ".join(failed))
        return out


def summary(s: Session, snap: GroupSnapshot) -> dict[str, Any]:
    """The replication state of one group snapshot, from its latest attempt."""
    rows = list(s.scalars(select(MemberReplication).where(
        MemberReplication.group_snapshot_id == snap.id).order_by(
        MemberReplication.attempt.desc(), MemberReplication.id)))
    latest = [r for r in rows if rows and r.attempt == rows[0].attempt]
    if snap.dr_verified_at is not None:
        state = "verified"
    elif not latest:
        state = "not_replicated"
    elif any(r.state == "copying" for r in latest):
        state = "copying"
    elif all(r.state == "dr_deleted" for r in latest):
        state = "dr_deleted"  # was a DR recovery point; DR retention removed it
    else:
        state = "failed"
    shipped = sum(r.bytes_shipped for r in latest)
    secs = max((r.seconds or 0.0 for r in latest), default=0.0)
    lag = ((snap.dr_verified_at - snap.cut_at).total_seconds()
           if snap.dr_verified_at and snap.cut_at else None)
    return {
        "snapshot_id": snap.id, "txn": snap.txn, "state": state,
        "recovery_point": snap.dr_verified_at is not None,
        "dr_verified_at": snap.dr_verified_at.isoformat() if snap.dr_verified_at else None,
        "replication_base": snap.replication_base, "attempts": rows[0].attempt if rows else 0,
        "bytes_shipped": shipped, "seconds": secs,
        "throughput_mbps": round(shipped / 1e6 / secs, 3) if secs else None, "lag_s": lag,
        "members": [{"disk": r.disk, "image": f"{r.pool}/{r.image}", "snap": r.snap,
                     "base": r.base, "target_site": r.target_site, "state": r.state,
                     "full": r.full, "bytes_shipped": r.bytes_shipped,
                     "bytes_changed": r.bytes_changed, "seconds": r.seconds,
                     "throughput_mbps": r.throughput_mbps, "error": r.error,
                     "lag_s": ((r.finished_at - snap.cut_at).total_seconds()
                               if r.finished_at and snap.cut_at and r.state == "verified"
                               else None)}
                    for r in latest],
    }


def replication_lag_s(s: Session, group_id: int) -> float | None:
    """Lag of the newest DR recovery point: cut to verified at DR (seconds)."""
    snap = s.scalar(select(GroupSnapshot).where(
        GroupSnapshot.group_id == group_id, GroupSnapshot.dr_verified_at.is_not(None))
        .order_by(GroupSnapshot.dr_verified_at.desc()).limit(1))
    if snap is None or snap.cut_at is None or snap.dr_verified_at is None:
        return None
    return float((snap.dr_verified_at - snap.cut_at).total_seconds())


def achieved_dr_rpo_s(s: Session, group_id: int, now: dt.datetime) -> float | None:
    """Data lost if the primary died now: now minus the cut of the newest DR recovery point."""
    cut = s.scalar(select(func.max(GroupSnapshot.cut_at)).where(
        GroupSnapshot.group_id == group_id, GroupSnapshot.dr_verified_at.is_not(None)))
    if cut is None:
        return None
    if cut.tzinfo is None:
        cut = cut.replace(tzinfo=dt.UTC)
    return float((now - cut).total_seconds())


def dr_plan(s: Session, g: Group, now: dt.datetime) -> list[GroupSnapshot]:
    """DR copies to delete now, oldest first: never a base (flagged, or the base
    of a copy running now), never the newest DR point."""
    pol = dr_policy(s, g)
    snaps = list(s.scalars(select(GroupSnapshot).where(
        GroupSnapshot.group_id == g.id, GroupSnapshot.dr_verified_at.is_not(None))
        .order_by(GroupSnapshot.cut_at.desc(), GroupSnapshot.id.desc())))
    if not snaps:
        return []
    keep = {x.id for x in snaps[: pol.keep_last]} | {snaps[0].id}
    keep.update(x.id for x in snaps if x.replication_base)
    keep.update(in_flight(s, g.id)[1])
    if pol.keep_within_seconds:
        cutoff = now - dt.timedelta(seconds=pol.keep_within_seconds)
        keep.update(x.id for x in snaps if x.cut_at is not None and x.cut_at >= cutoff)
    doomed = [x for x in snaps if x.id not in keep]
    doomed.reverse()
    return doomed


class _Sessions:
    """One Ceph session per target site for a run of deletes; a site that
    cannot be reached fails each of its deletes with the same error."""

    def __init__(self, s: Session) -> None:
        self.s = s
        self.open: dict[str, Any] = {}
        self.refused: dict[str, ReplicationFailed] = {}

    def get(self, name: str) -> Any:
        from cutpoint.coordinator.dr.ceph_errors import CephError
        from cutpoint.coordinator.dr.site import CephConnection

        if name in self.refused:
            raise self.refused[name]
        if name not in self.open:
            try:
                site = site_of(self.s, name)
                # End the read before the network: on SQLite an open
                # transaction holds the database's write lock, and every
                # other writer (captures, the scheduler) waits behind it.
                self.s.commit()
                conn = CephConnection(site)
                conn.connect()
            except CephError as exc:
                self.refused[name] = ReplicationFailed(exc.code, str(exc))
                raise self.refused[name] from exc
            except ReplicationFailed as exc:
                self.refused[name] = exc
                raise
            self.open[name] = conn
        return self.open[name]

    def close(self) -> None:
        for conn in self.open.values():
            conn.close()


def dr_apply(sf: Any, group_id: int, stop: Callable[[Session], bool] | None = None) \
        -> dict[str, Any]:
    """Delete the DR copies `dr_plan` selects (their snapshots at the target site).

    After each group snapshot's copies, `stop(session)` true ends the run
    early (`yielded` in the result; the next run plans again), as
    `retention.apply` does for a capture that waits."""
    from cutpoint.coordinator.dr.ceph_errors import CephError, CephNotFound

    deleted, failed = [], []
    with sf() as s:
        g = s.get(Group, group_id)
        if g is None:
            return {"deleted": []}
        doomed = dr_plan(s, g, utcnow())
        if not doomed:
            return {"deleted": []}
        ceph = _Sessions(s)
        try:
            for i, snap in enumerate(doomed):
                if i and stop is not None and stop(s):
                    return {"deleted": deleted, "yielded": True,
                            **({"failed": failed} if failed else {})}
                rows = list(s.scalars(select(MemberReplication).where(
                    MemberReplication.group_snapshot_id == snap.id,
                    MemberReplication.state == "verified")))
                s.commit()  # no transaction open across Ceph's calls (see _Sessions.get)
                ok = True
                for r in rows:
                    try:
                        ceph.get(r.target_site).remove_snapshot(r.pool, r.image, r.snap)
                    except CephNotFound as exc:
                        if exc.op == "open pool":  # no pool is no proof the copy is gone
                            ok = False
                            failed.append(f"{snap.txn} {r.disk}: {exc}")
                            continue
                    except (ReplicationFailed, CephError) as exc:
                        ok = False
                        failed.append(f"{snap.txn} {r.disk}: {exc}")
                        continue
                    r.state = "dr_deleted"
                if ok:
                    snap.dr_verified_at = None
                    deleted.append(snap.txn)
                s.commit()
        finally:
            ceph.close()
    return {"deleted": deleted, **({"failed": failed} if failed else {})}
