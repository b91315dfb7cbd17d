"""Concurrent POST /snapshots on one group: exactly one is accepted (202),
the others are refused with 409 snapshot_in_flight, on SQLite and on
PostgreSQL, through real engines and real threads (no shared savepoint)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from cutpoint.api import services_local
from cutpoint.api.app import create_app
from cutpoint.api.config import Settings
from cutpoint.api.db import get_sessionmaker
from cutpoint.api.migrate import upgrade
from cutpoint.api.models import GroupSnapshot, Host, Job, Role, Site
from cutpoint.api.schemas.groups import GroupCreate, MemberAdd
from cutpoint.api.services import groups, inventory, tokens
from fastapi.testclient import TestClient
from sqlalchemy import func, select

SECRET = "concurrency-secret-0123456789"


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_concurrent_snapshot_requests(kind: str, local_services: services_local.Endpoints,
                                      empty_db: Callable[[str], str]) -> None:
    url = empty_db(kind)
    upgrade(url)
    sf = get_sessionmaker(url)
    with sf() as s:
        site = Site(name="p")
        s.add(site)
        s.flush()
        host = Host(name="h", site_id=site.id, address="127.0.0.1", port=1)
        s.add(host)
        s.flush()
        inventory.apply(s, host, {"vms": [{"name": "vm", "disks": [
            {"id": "vm/disk0", "node": "disk0", "backend": "rbd"}]}]})
        g = groups.create(s, GroupCreate(name="g"))
        groups.add_member(s, g, MemberAdd(vm="vm"))
        _, tok = tokens.create(s, "op", Role.operator, SECRET)
    settings = Settings(database_url=url, redis_url=local_services.redis_url,
                        token_secret=SECRET)  # type: ignore[arg-type]
    app = create_app(settings)
    n = 8
    barrier = threading.Barrier(n)
    codes: list[int] = []
    bodies: list[Any] = []
    lock = threading.Lock()

    def post() -> None:
        with TestClient(app) as c:
            barrier.wait()
            r = c.post("/v1/groups/g/snapshots", headers={"Authorization": f"Bearer {tok}"})
            with lock:
                codes.append(r.status_code)
                bodies.append(r.json())

    threads = [threading.Thread(target=post) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(codes) == [202] + [409] * (n - 1), bodies
    assert {b["code"] for b in bodies if "code" in b} == {"snapshot_in_flight"}
    with sf() as s:
        assert s.scalar(select(func.count()).select_from(GroupSnapshot)) == 1
        assert s.scalar(select(func.count()).select_from(Job)) == 1
