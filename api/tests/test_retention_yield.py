"""A retention run gives the group lock up to a waiting capture
(services/retention.py): at a short RPO a run had many snapshots to delete
and held the group's captures back for 10-28 s in a lab run.

Real databases (SQLite and PostgreSQL) and an in-process agent peer with
real mutual TLS (api/tests/peergroup.py); the deletes go through it."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from cutpoint.api import services_local
from cutpoint.api.models import (
    GroupSnapshot,
    Host,
    MemberSnapshot,
    Policy,
    SnapState,
    utcnow,
)
from cutpoint.api.services import retention
from peergroup import PeerGroup  # api/tests/peergroup.py
from sqlalchemy import select


def test_a_run_stops_for_a_waiting_capture_and_the_next_finishes(
        db_url: str, local_services: services_local.Endpoints, tmp_path: Path) -> None:
    with PeerGroup(db_url, local_services.redis_url, tmp_path,
                   {"h1": {"vm1": ["disk0"]}}) as pg:
        peer = pg.peers["h1"]
        vm = next(iter(peer.vms))
        with pg.sf() as s:
            host = s.scalar(select(Host).where(Host.site_id == pg.site_id))
            pol = s.get(Policy, pg.gid)
            assert host is not None and pol is not None
            pol.keep_last = 1
            for i in (1, 2, 3, 4):
                snap = GroupSnapshot(group_id=pg.gid, txn=f"t{i}-{pg.tag}",
                                     state=SnapState.committed,
                                     cut_at=utcnow() - dt.timedelta(minutes=10 - i))
                snap.members.append(MemberSnapshot(host=host.name, vm=vm, disk=f"{vm}/disk0",
                                                   name=f"cp.g.t{i}", state="present"))
                s.add(snap)
                peer.vms[vm].snapshots["disk0"].add(f"cp.g.t{i}")
            s.commit()

        def states() -> list[str]:
            with pg.sf() as s:
                return [x.state.value for x in s.scalars(
                    select(GroupSnapshot).where(GroupSnapshot.group_id == pg.gid,
                                                GroupSnapshot.txn.like("t%"))
                    .order_by(GroupSnapshot.cut_at))]

        def waiting(s: object) -> bool:
            return retention.capture_waiting(s, pg.gid)  # type: ignore[arg-type]

        with pg.sf() as s:
            assert not waiting(s)
        pg.request()  # a capture of the group is requested: it waits for the lock
        with pg.sf() as s:
            assert waiting(s)
        # The run deletes one (a run always makes progress), then gives way.
        out = retention.apply(pg.sf, pg.settings, pg.gid, stop=waiting)
        assert out == {"deleted": 1, "yielded": True}, out
        assert states() == ["deleted", "deleting", "deleting", "committed"]
        assert peer.cmds().count("snapshot.delete") == 1
        assert peer.vms[vm].snapshots["disk0"] == {"cp.g.t2", "cp.g.t3", "cp.g.t4"}
        # The next run, with no capture waiting, finishes what was marked.
        out = retention.apply(pg.sf, pg.settings, pg.gid, stop=lambda s: False)
        assert out == {"deleted": 2}, out
        assert states() == ["deleted", "deleted", "deleted", "committed"]
        assert peer.vms[vm].snapshots["disk0"] == {"cp.g.t4"}


def test_the_tick_queues_no_second_job_for_a_group(
        db_url: str, local_services: services_local.Endpoints, tmp_path: Path) -> None:
    """A group with a retention job queued or running gets no other from the
    tick; one queued longer than RUNNING_JOB_FRESH_S ago is taken for lost."""
    from cutpoint.api.models import Job, JobState

    with PeerGroup(db_url, local_services.redis_url, tmp_path,
                   {"h1": {"vm1": ["disk0"]}}) as pg:
        now = utcnow()
        with pg.sf() as s:
            pol = s.get(Policy, pg.gid)
            assert pol is not None
            pol.keep_last = 1
            for i in (1, 2):
                s.add(GroupSnapshot(group_id=pg.gid, txn=f"t{i}-{pg.tag}",
                                    state=SnapState.committed,
                                    cut_at=now - dt.timedelta(minutes=10 - i)))
            s.commit()

            def mine() -> bool:
                return pg.gid in [g.id for g in retention.groups_to_run(s, now)]

            assert mine()  # t1 is to go
            job = Job(id=f"ret-{pg.tag}", kind="retention", state=JobState.queued,
                      group_id=pg.gid, created_at=now - dt.timedelta(seconds=10))
            s.add(job)
            s.commit()
            assert not mine()
            job.state = JobState.running
            s.commit()
            assert not mine()
            job.created_at = now - dt.timedelta(seconds=retention.RUNNING_JOB_FRESH_S + 1)
            s.commit()
            assert mine()
            job.created_at, job.state = now, JobState.succeeded
            s.commit()
            assert mine()
            s.delete(job)
            s.commit()
