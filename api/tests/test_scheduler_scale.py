"""The scheduler at scale (issue 19, goal 7): many groups created together
are captured spread over their RPO, not as one burst, and a tick that
starts many captures writes them in one transaction.

Real databases (SQLite and PostgreSQL, each a fresh one) and the real
Redis broker; the scheduler's clock is given, so nothing here waits.
"""

from __future__ import annotations

import datetime as dt
import itertools
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from cutpoint.api import services_local
from cutpoint.api.config import Settings
from cutpoint.api.db import get_engine, get_sessionmaker
from cutpoint.api.migrate import upgrade
from cutpoint.api.models import Group, GroupSnapshot, Host, Site, utcnow
from cutpoint.api.schemas.groups import GroupCreate, MemberAdd
from cutpoint.api.schemas.policy import PolicyUpdate
from cutpoint.api.services import groups, inventory, rpo, scheduler
from sqlalchemy import event, func, select, update
from sqlalchemy.orm import Session, sessionmaker

N = 30
RPO = 60


@pytest.fixture(params=["sqlite", "postgresql"])
def many_groups(request: pytest.FixtureRequest, empty_db: Any,
                local_services: services_local.Endpoints) \
        -> Iterator[tuple[sessionmaker[Session], Settings, dt.datetime]]:
    """N groups of one VM each, RPO 60 s, all created at the same instant T;
    yields (session factory, settings, T)."""
    url = empty_db(request.param)
    upgrade(url)
    sf = get_sessionmaker(url)
    created = utcnow().replace(microsecond=0)
    with sf() as s:
        site = Site(name="primary")
        s.add(site)
        s.flush()
        host = Host(name="h1", site_id=site.id, address="127.0.0.1", port=1)
        s.add(host)
        s.flush()
        inventory.apply(s, host, {"vms": [
            {"name": f"vm{i}", "state": "running",
             "disks": [{"id": f"vm{i}/disk0", "node": "disk0", "backend": "rbd"}]}
            for i in range(N)]})
        for i in range(N):
            g = groups.create(s, GroupCreate(name=f"g{i}", policy=PolicyUpdate(rpo_seconds=RPO)))
            groups.add_member(s, g, MemberAdd(vm=f"vm{i}"))
        s.execute(update(Group).values(created_at=created))
        s.commit()
    settings = Settings(database_url=url, redis_url=local_services.redis_url,
                        token_secret="test-secret-0123456789abcdef")  # type: ignore[arg-type]
    yield sf, settings, created
    get_engine(url).dispose()


def _snapshots(sf: sessionmaker[Session]) -> int:
    with sf() as s:
        return s.scalar(select(func.count()).select_from(GroupSnapshot)) or 0


def test_groups_created_together_are_first_captured_spread_over_their_rpo(
        many_groups: tuple[sessionmaker[Session], Settings, dt.datetime]) -> None:
    sf, settings, created = many_groups
    r = redis.Redis.from_url(settings.redis_url)
    margin = settings.capture_head_start_s
    window = RPO - rpo.DEFAULT_DURATION_S - margin
    with sf() as s:
        gs = rpo.scheduled(s)
        due = sorted((a.due_at - created).total_seconds()
                     for a in rpo.assess_many(s, gs, created, margin).values()
                     if a.due_at is not None)
    print(f"first captures of {N} groups due at (s after creation): "
          f"{[round(x, 1) for x in due]}")
    # Every group's first capture is due within the window its RPO allows
    # (never later), and the N are spread over it: no two closer than a
    # third of an even share, no gap wider than three shares.
    assert len(due) == N
    assert 0 <= due[0] and due[-1] <= window, due
    gaps = [b - a for a, b in itertools.pairwise(due)]
    share = window / N
    assert min(gaps) >= share / 3 and max(gaps) <= 3 * share, gaps
    # So the first tick starts about one capture per share of the window
    # elapsed, not all N at once (without the spread: N at the first tick).
    stats = scheduler.tick(sf, settings, r, now=created + dt.timedelta(seconds=1))
    assert stats["errors"] == 0, stats
    assert stats["enqueued"] <= 2, stats
    # Half-way through the window, about half have been asked for ...
    stats = scheduler.tick(sf, settings, r, now=created + dt.timedelta(seconds=window / 2))
    assert abs(_snapshots(sf) - N / 2) <= 2, (stats, _snapshots(sf))
    # ... and at its end every group has its first capture in flight, well
    # before its RPO (counted from creation) runs out: no miss.
    stats = scheduler.tick(sf, settings, r, now=created + dt.timedelta(seconds=window))
    assert _snapshots(sf) == N and stats["misses"] == 0, stats


def test_a_tick_requests_every_due_capture_in_one_commit(
        many_groups: tuple[sessionmaker[Session], Settings, dt.datetime]) -> None:
    sf, settings, created = many_groups
    r = redis.Redis.from_url(settings.redis_url)
    engine = sf.kw["bind"]
    commits: list[int] = []
    listener = lambda _conn: commits.append(1)
    event.listen(engine, "commit", listener)
    try:
        # One RPO after creation every group is due (and late): each gets
        # its capture requested in the same single write transaction.
        stats = scheduler.tick(sf, settings, r, now=created + dt.timedelta(seconds=RPO - 3))
    finally:
        event.remove(engine, "commit", listener)
    print(f"tick: {stats}, commits: {len(commits)}")
    assert stats["enqueued"] == N and stats["errors"] == 0, stats
    assert _snapshots(sf) == N
    # Before: one commit per group (N), plus the reads' transactions.
    assert len(commits) <= 2, len(commits)
