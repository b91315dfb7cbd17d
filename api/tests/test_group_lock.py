"""The group lock: one writer per group, even when Redis fails its holder.

Real Redis (the project's own, through a CutProxy where a test takes the
network away from one holder) and real databases (SQLite and PostgreSQL,
committed through their own connections, as two workers would).  Each test
starts with one holder, injects one fault, and checks who may still write.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from cutpoint.agentclient.testing import AgentPeer, make_pki
from cutpoint.api import services_local
from cutpoint.api.db import get_sessionmaker
from cutpoint.api.models import Group
from cutpoint.api.tasks import GroupLock
from cutproxy import CutProxy  # api/tests/cutproxy.py
from peergroup import fingerprint  # api/tests/peergroup.py
from plane import Plane, wait_for  # api/tests/plane.py
from redis.backoff import NoBackoff
from redis.retry import Retry
from sqlalchemy.orm import Session, sessionmaker


def _direct(port: int) -> redis.Redis:
    """A client that reports the first error instead of retrying it, so the
    lock's heartbeat is the one that sees the outage."""
    return redis.Redis(port=port, socket_timeout=1, socket_connect_timeout=1,
                       retry=Retry(NoBackoff(), 0))


def _gid() -> int:
    """A group id no other test (or worker) locks."""
    return 10_000_000 + uuid.uuid4().int % 10_000_000


@pytest.fixture
def redis_port(local_services: services_local.Endpoints) -> int:
    return int(local_services.redis_port or 0)


@pytest.fixture
def group(db_url: str) -> Iterator[tuple[sessionmaker[Session], int]]:
    """A committed group row (the thing both holders write), on its own
    connections; removed afterwards."""
    sf = get_sessionmaker(db_url)
    with sf() as s:
        g = Group(name=f"lock-{uuid.uuid4().hex[:8]}", description="")
        s.add(g)
        s.commit()
        gid = g.id
    yield sf, gid
    with sf() as s:
        g2 = s.get(Group, gid)
        if g2 is not None:
            s.delete(g2)
            s.commit()


def _describe(sf: sessionmaker[Session], gid: int, text: str) -> None:
    with sf() as s:
        g = s.get(Group, gid)
        assert g is not None
        g.description = text
        s.commit()


def _description(db_url: str, gid: int) -> str:
    with get_sessionmaker(db_url)() as s:
        g = s.get(Group, gid)
        assert g is not None
        return g.description


def test_heartbeat_outlives_a_transient_redis_outage(redis_port: int) -> None:
    """One failed refresh must not end the heartbeat: the lock is kept
    across an outage shorter than its TTL."""
    ttl = 6.0
    gid = _gid()
    with CutProxy(redis_port) as proxy:
        r1 = _direct(proxy.port)
        r2 = redis.Redis(port=redis_port)
        first = GroupLock(r1, gid, ttl)
        assert first.acquire()
        try:
            proxy.cut()          # the refresh at ttl/3 fails
            time.sleep(ttl / 3 + 0.5)
            proxy.restore()      # back before the key could expire
            time.sleep(ttl + 1)  # without refreshes the key would be gone now
            second = GroupLock(r2, gid, ttl)
            assert not second.acquire(), \
                "the first holder's lock expired after one failed heartbeat"
        finally:
            first.release()
        assert GroupLock(r2, gid, ttl).acquire()
        r2.delete(f"cutpoint:lock:group:{gid}")


def test_a_stale_holder_is_refused_by_the_fencing_token(
        redis_port: int, db_url: str, group: tuple[sessionmaker[Session], int]) -> None:
    """The first holder's key is deleted while it works; it has not noticed
    yet (its next refresh is 10 s away) and writes again after a second
    holder took the lock: the database refuses the stale token."""
    from cutpoint.api.grouplock import LockLost

    sf, gid = group
    r = redis.Redis(port=redis_port)
    first = GroupLock(r, gid, 30.0)
    assert first.acquire()
    second = GroupLock(r, gid, 30.0)
    try:
        sf1 = first.fence(sf)
        _describe(sf1, gid, "first")
        r.delete(first.key)
        assert second.acquire()
        assert second.token > first.token
        sf2 = second.fence(sf)
        assert not first.lost.is_set()  # it does not know yet
        with pytest.raises(LockLost, match="token"):
            _describe(sf1, gid, "stale write of the first holder")
        assert _description(db_url, gid) == "first"
        _describe(sf2, gid, "second")
        assert _description(db_url, gid) == "second"
    finally:
        first.release()   # not its lock any more: must not free the second's
        assert r.exists(second.key)
        second.release()


def test_a_holder_cut_off_from_redis_stops_before_its_key_expires(
        redis_port: int, db_url: str, group: tuple[sessionmaker[Session], int]) -> None:
    """Redis unreachable for the holder longer than the TTL: the heartbeat
    gives up by the time the key can expire, and from then on the holder's
    writes are refused (it stops working) even before anyone else writes."""
    from cutpoint.api.grouplock import LockLost

    sf, gid = group
    ttl = 3.0
    with CutProxy(redis_port) as proxy:
        r1 = _direct(proxy.port)
        r2 = redis.Redis(port=redis_port)
        first = GroupLock(r1, gid, ttl)
        assert first.acquire()
        sf1 = first.fence(sf)
        _describe(sf1, gid, "first")
        t_cut = time.monotonic()
        proxy.cut()
        assert first.lost.wait(ttl + 2), "the heartbeat never gave up"
        gave_up = time.monotonic() - t_cut
        # Redis still has the key (the holder could not delete it), so the
        # holder gave up no later than the key's expiry.
        still = r2.pttl(first.key)
        print(f"\nheartbeat gave up {gave_up:.2f} s after the cut; "
              f"key expires {still} ms later")
        assert still > 0 and gave_up < ttl
        with pytest.raises(LockLost, match="heartbeat"):
            _describe(sf1, gid, "write after the lock was lost")
        assert _description(db_url, gid) == "first"
        first.release()
        second = GroupLock(r2, gid, ttl)
        deadline = time.monotonic() + ttl + 2
        while not second.acquire():
            assert time.monotonic() < deadline, "the lost lock never expired"
            time.sleep(0.2)
        second.release()


def test_tokens_only_grow(redis_port: int) -> None:
    r = redis.Redis(port=redis_port)
    gid = _gid()
    seen = []
    for _ in range(3):
        lock = GroupLock(r, gid, 5.0)
        assert lock.acquire()
        seen.append(lock.token)
        lock.release()
    assert seen == sorted(seen) and len(set(seen)) == 3, seen
    # The replicate lock of the same group counts on its own.
    rep = GroupLock(r, gid, 5.0, kind="replicate")
    assert rep.acquire()
    rep.release()




# -- the same through a real worker: two retention runs of one group ---------


@pytest.fixture
def peer_plane(tmp_path: Path, local_services: services_local.Endpoints,
               empty_db: Callable[[str], str]) -> Iterator[tuple[AgentPeer, Plane, str]]:
    """Two Celery workers on PostgreSQL (where two workers' transactions do
    run side by side) and an in-process agent peer holding the group's VM."""
    pki = make_pki(tmp_path / "pki", {"agent": ["127.0.0.1"], "coordinator": []})
    loop = asyncio.new_event_loop()
    t = threading.Thread(target=loop.run_forever, daemon=True)
    t.start()
    peer = AgentPeer("h1", {"vm1": ["disk0"]}, ca=pki["ca"]["cert"],
                     cert=pki["agent"]["cert"], key=pki["agent"]["key"])
    asyncio.run_coroutine_threadsafe(peer.start(), loop).result(10)
    certs = {"CUTPOINT_AGENT_CA": pki["ca"]["cert"],
             "CUTPOINT_AGENT_CERT": pki["coordinator"]["cert"],
             "CUTPOINT_AGENT_KEY": pki["coordinator"]["key"]}
    try:
        # TTL 30 s: the first run's heartbeat is 10 s away when its key goes.
        with Plane(tmp_path, int(local_services.redis_port or 0), certs,
                   db=empty_db("postgresql"), CUTPOINT_GROUP_LOCK_TTL_S="30", CUTPOINT_AGENT_TIMEOUT_S="8",
                   CUTPOINT_RETENTION_INTERVAL_S="3600",
                   CUTPOINT_INVENTORY_INTERVAL_S="3600") as p:
            p.start("worker")
            p.start("worker2")
            yield peer, p, fingerprint(pki["agent"]["cert"])
    finally:
        asyncio.run_coroutine_threadsafe(peer.stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)


def test_a_retention_run_that_lost_its_lock_stops_and_says_so(
        peer_plane: tuple[AgentPeer, Plane, str]) -> None:
    """Retention job 1 deletes snapshot t1 through the agent, which does not
    answer; meanwhile its lock key is deleted and retention job 2 takes the
    group and deletes t1 and t2.  When job 1's call gives up, its write is
    refused: job 1 ends failed `lock_lost` and sends nothing more to the
    agent.  (Without the fence job 1 went on: it wrote t2's row a second
    time and ended `succeeded`, as if it alone had done the work.)"""
    from cutpoint.api.models import (
        GroupSnapshot,
        Host,
        Job,
        MemberSnapshot,
        Policy,
        Site,
        SnapState,
        utcnow,
    )
    from cutpoint.api.schemas.groups import GroupCreate, MemberAdd
    from cutpoint.api.services import groups, inventory, jobs
    from cutpoint.api.worker import send

    peer, plane, pin = peer_plane
    with plane.sf() as s:
        site = Site(name="p")
        s.add(site)
        s.flush()
        host = Host(name="h1", site_id=site.id, address="127.0.0.1", port=peer.port,
                    cert_fingerprint=pin)
        s.add(host)
        s.flush()
        inventory.apply(s, host, {"vms": [{"name": "vm1", "state": "running", "disks": [
            {"id": "vm1/disk0", "node": "disk0", "backend": "rbd", "pool": "rbd",
             "image": "vm1-disk0"}]}]})
        g = groups.create(s, GroupCreate(name="g"))
        groups.add_member(s, g, MemberAdd(vm="vm1"))
        pol = s.get(Policy, g.id)
        assert pol is not None
        pol.keep_last = 1
        for i in (1, 2, 3):
            snap = GroupSnapshot(group_id=g.id, txn=f"t{i}", state=SnapState.committed,
                                 cut_at=utcnow() - dt.timedelta(minutes=10 - i))
            snap.members.append(MemberSnapshot(host="h1", vm="vm1", disk="vm1/disk0",
                                               name=f"cp.g.t{i}", state="present"))
            s.add(snap)
            peer.vms["vm1"].snapshots["disk0"].add(f"cp.g.t{i}")
        s.commit()
        gid = g.id

    def new_job() -> str:
        with plane.sf() as s:
            job = jobs.create(s, "retention", actor="test", group_id=gid,
                              params={"group_id": gid})
        send("retention", job.id, plane.settings)
        return job.id

    def deletes() -> int:
        return peer.cmds().count("snapshot.delete")

    def job(job_id: str) -> Job:
        with plane.sf() as s:
            j = s.get(Job, job_id)
            assert j is not None
            return j

    peer.hang = {"snapshot.delete"}
    j1 = new_job()
    wait_for(lambda: deletes() == 1, 60, "job 1's snapshot.delete", plane)
    r = redis.Redis.from_url(plane.settings.redis_url)
    assert r.delete(f"cutpoint:lock:group:{gid}") == 1  # job 1's lock is gone
    peer.hang = set()
    j2 = new_job()
    wait_for(lambda: job(j2).state.value in ("succeeded", "failed"), 60, "job 2", plane)
    wait_for(lambda: job(j1).state.value in ("succeeded", "failed"), 60, "job 1", plane)
    one, two = job(j1), job(j2)
    print(f"\njob 1: {one.state.value} {one.error_code}: {one.error}"
          f"\njob 2: {two.state.value} {two.result}; snapshot.delete sent: {deletes()}")
    assert two.state.value == "succeeded" and two.result == {"deleted": 2, "dr_deleted": []}
    assert one.state.value == "failed" and one.error_code == "lock_lost", one.error
    assert "fencing token" in (one.error or "")
    assert deletes() == 3, peer.requests  # job 1's hung one, then job 2's two
    with plane.sf() as s:
        states = {sn.txn: sn.state.value for sn in s.query(GroupSnapshot)}
    assert states == {"t1": "deleted", "t2": "deleted", "t3": "committed"}


def test_a_snapshot_whose_lock_is_taken_mid_prepare_is_aborted(
        db_url: str, local_services: services_local.Endpoints, tmp_path: Path) -> None:
    """A group snapshot whose holder loses the group while its agent
    prepares: the holder's next write is refused, so it never records the
    commit decision, and it aborts (the VM runs again, no member snapshot).
    It writes nothing more: the log keeps the txn undecided (PREPARING) and
    the snapshot row as it was, for the new holder to resolve."""
    from cutpoint.api.grouplock import LockLost
    from cutpoint.api.models import GroupSnapshot
    from cutpoint.api.services import capture
    from cutpoint.coordinator.txlog import TxLogRefused
    from peergroup import PeerGroup  # api/tests/peergroup.py

    with PeerGroup(db_url, local_services.redis_url, tmp_path,
                   {"h1": {"vm1": ["disk0", "disk1"]}}) as pg:
        _, sid = pg.request()
        peer = pg.peers["h1"]
        r = redis.Redis.from_url(local_services.redis_url)
        first, second = GroupLock(r, pg.gid, 30.0), GroupLock(r, pg.gid, 30.0)
        assert first.acquire()
        fsf = first.fence(pg.sf)

        def takeover(req: dict[str, object]) -> None:
            if req.get("cmd") == "prepare":
                r.delete(first.key)
                assert second.acquire()
                second.fence(pg.sf)
        peer.on_request = takeover
        try:
            # Refused at its first write after the takeover: the commit
            # decision (the log's guard wraps the LockLost in TxLogRefused).
            with pytest.raises((LockLost, TxLogRefused), match="fencing token"):
                capture.run(fsf, pg.settings, sid)
        finally:
            first.release()
            second.release()
        print(f"\nagent saw: {peer.cmds()}")
        assert "commit" not in peer.cmds() and "abort" in peer.cmds()
        assert all(v.state == "running" for v in peer.vms.values())
        assert not any(peer.all_snapshots().values())
        with pg.sf() as s:
            snap = s.get(GroupSnapshot, sid)
            assert snap is not None
            txn, state = snap.txn, snap.state.value
        rec = capture.txlog_for(db_url).get(txn)
        assert rec is not None and rec.state == "preparing", rec
        assert state == "preparing"
