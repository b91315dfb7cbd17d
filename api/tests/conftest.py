"""Fixtures: real Redis and PostgreSQL from cutpoint.api.services_local.

The services start once per test session in a private state directory on
free loopback ports and are stopped at the end.  Each database (SQLite file,
PostgreSQL) is migrated with Alembic once; each test then runs inside an
outer transaction that is rolled back (services commit to savepoints).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cutpoint.api import services_local
from cutpoint.api.app import create_app
from cutpoint.api.config import Settings
from cutpoint.api.db import get_engine
from cutpoint.api.migrate import upgrade
from cutpoint.api.models import Role
from cutpoint.api.services import tokens
from fastapi.testclient import TestClient
from sqlalchemy import Connection, create_engine, text
from sqlalchemy.orm import Session, sessionmaker

SECRET = "test-secret-0123456789abcdef"


@pytest.fixture(scope="session")
def local_services() -> Iterator[services_local.Endpoints]:
    state = tempfile.mkdtemp(prefix="cutpoint-test-svc-")
    try:
        yield services_local.start(state)
    finally:
        services_local.destroy(state)


@pytest.fixture(scope="session")
def sqlite_url() -> Iterator[str]:
    d = tempfile.mkdtemp(prefix="cutpoint-test-db-")
    url = f"sqlite:///{d}/cutpoint.db"
    upgrade(url)
    yield url
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="session")
def pg_url(local_services: services_local.Endpoints) -> str:
    url = local_services.database_url
    upgrade(url)
    return url


@pytest.fixture
def empty_db(local_services: services_local.Endpoints, tmp_path: Path) -> Callable[[str], str]:
    """A factory of empty, unmigrated databases of their own: empty_db("sqlite")
    is a new file under tmp_path, empty_db("postgresql") a new database on the
    test PostgreSQL server."""
    def make(kind: str) -> str:
        name = "empty_" + uuid.uuid4().hex[:8]
        if kind == "sqlite":
            return f"sqlite:///{tmp_path}/{name}.db"
        eng = create_engine(local_services.admin_url(), isolation_level="AUTOCOMMIT")
        with eng.connect() as c:
            c.execute(text(f"CREATE DATABASE {name}"))
        eng.dispose()
        return local_services.admin_url(name)
    return make


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest) -> str:
    name = "sqlite_url" if request.param == "sqlite" else "pg_url"
    return str(request.getfixturevalue(name))


@pytest.fixture
def connection(db_url: str) -> Iterator[Connection]:
    engine = get_engine(db_url)
    with engine.connect() as conn:
        outer = conn.begin()
        try:
            yield conn
        finally:
            outer.rollback()


@pytest.fixture
def session_factory(connection: Connection) -> sessionmaker[Session]:
    return sessionmaker(bind=connection, join_transaction_mode="create_savepoint",
                        expire_on_commit=False)


@pytest.fixture
def settings(db_url: str, local_services: services_local.Endpoints) -> Settings:
    return Settings(database_url=db_url, redis_url=local_services.redis_url,
                    token_secret=SECRET)  # type: ignore[arg-type]


@pytest.fixture
def app(settings: Settings, session_factory: sessionmaker[Session]) -> Any:
    return create_app(settings, session_factory)


@pytest.fixture
def tokens_by_role(session_factory: sessionmaker[Session]) -> dict[str, str]:
    out = {}
    with session_factory() as s:
        for role in Role:
            _, tok = tokens.create(s, f"test-{role.value}", role, SECRET)
            out[role.value] = tok
    return out


class Api:
    """A TestClient with a role: api.get(path) sends that role's token."""

    def __init__(self, client: TestClient, toks: dict[str, str], role: str = "admin") -> None:
        self.client, self.toks, self.role = client, toks, role

    def as_(self, role: str | None) -> Api:
        return Api(self.client, self.toks, role) if role else _Anon(self.client, self.toks)

    def _h(self, headers: dict[str, str] | None) -> dict[str, str]:
        h = dict(headers or {})
        h["Authorization"] = f"Bearer {self.toks[self.role]}"
        return h

    def request(self, method: str, path: str, **kw: Any) -> Any:
        kw["headers"] = self._h(kw.get("headers"))
        return self.client.request(method, path, **kw)

    def get(self, path: str, **kw: Any) -> Any:
        return self.request("GET", path, **kw)

    def post(self, path: str, **kw: Any) -> Any:
        return self.request("POST", path, **kw)

    def patch(self, path: str, **kw: Any) -> Any:
        return self.request("PATCH", path, **kw)

    def put(self, path: str, **kw: Any) -> Any:
        return self.request("PUT", path, **kw)

    def delete(self, path: str, **kw: Any) -> Any:
        return self.request("DELETE", path, **kw)


class _Anon(Api):
    def _h(self, headers: dict[str, str] | None) -> dict[str, str]:
        return dict(headers or {})


@pytest.fixture
def api(app: Any, tokens_by_role: dict[str, str]) -> Iterator[Api]:
    with TestClient(app, raise_server_exceptions=False) as client:
        yield Api(client, tokens_by_role)


@pytest.fixture
def inventory(session_factory: sessionmaker[Session]) -> dict[str, Any]:
    """Two hosts with two VMs of two disks each, as an agent inventory reply would give."""
    from cutpoint.api.models import Host, Site
    from cutpoint.api.services import inventory as inv

    with session_factory() as s:
        site = Site(name="primary")
        s.add(site)
        s.flush()
        out: dict[str, Any] = {"site_id": site.id, "hosts": []}
        for h in (1, 2):
            host = Host(name=f"primary-h{h}", site_id=site.id, address=f"10.77.1.{h}")
            s.add(host)
            s.flush()
            inv.apply(s, host, {"vms": [
                {"name": f"primary-h{h}-vm{v}", "driver": "qemu", "state": "running",
                 "disks": [{"id": f"primary-h{h}-vm{v}/disk{d}", "node": f"disk{d}",
                            "backend": "rbd", "pool": "rbd",
                            "image": f"primary-h{h}-vm{v}-disk{d}"} for d in (0, 1)]}
                for v in (1, 2)]})
            out["hosts"].append(host.id)
    return out


@pytest.fixture
def dr_snapshot(api: Api, session_factory: sessionmaker[Session],
                inventory: dict[str, Any]) -> Callable[..., int]:
    """Makes site "dr", group "app" replicating to it with primary-h1-vm1 (of
    `inventory`) as its member, and one committed group snapshot, txn "t1",
    cut 30 s ago, with a present member snapshot "cp.app.t1" of each disk
    number given; `dr_verified_after_s` marks it verified at DR that long after
    the cut.  Returns the snapshot's id."""
    import datetime as dt

    from cutpoint.api.models import (
        Disk,
        Group,
        GroupSnapshot,
        MemberSnapshot,
        SnapState,
        utcnow,
    )
    from sqlalchemy import select

    def make(disks: tuple[int, ...] = (0, 1), dr_verified_after_s: float | None = None) -> int:
        assert api.post("/v1/sites", json={"name": "dr"}).status_code == 201
        r = api.post("/v1/groups", json={"name": "app",
                                         "policy": {"replication_target": "dr"}})
        assert r.status_code == 201, r.text
        r = api.post("/v1/groups/app/members", json={"vm": "primary-h1-vm1"})
        assert r.status_code == 201, r.text
        with session_factory() as s:
            g = s.scalar(select(Group).where(Group.name == "app"))
            assert g is not None
            cut = utcnow() - dt.timedelta(seconds=30)
            verified = None if dr_verified_after_s is None \
                else cut + dt.timedelta(seconds=dr_verified_after_s)
            snap = GroupSnapshot(group_id=g.id, txn="t1", state=SnapState.committed,
                                 cut_at=cut, dr_verified_at=verified)
            s.add(snap)
            s.flush()
            for d in disks:
                key = f"primary-h1-vm1/disk{d}"
                s.add(MemberSnapshot(group_snapshot_id=snap.id, host="primary-h1",
                                     vm="primary-h1-vm1", disk=key, name="cp.app.t1",
                                     state="present",
                                     disk_id=s.scalar(select(Disk.id).where(Disk.key == key))))
            s.commit()
            return int(snap.id)
    return make


os.environ.setdefault("CUTPOINT_TOKEN_SECRET", SECRET)


# -- the lab ------------------------------------------------------------------
# The `lab` fixture belongs to the lab (dr-tests/tests/conftest.py); load that
# file under its own name and re-export its fixtures for the api-lab tests.
def _load_lab_fixtures() -> Any:
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "dr-tests" / "tests" / "conftest.py"
    spec = importlib.util.spec_from_file_location("cutpoint_lab_fixtures_api", path)
    if spec is None or spec.loader is None or not path.exists():
        return None
    mod = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(mod)
    except Exception:  # noqa: BLE001  the lab is optional for the API unit tests
        return None
    return mod


_lab = _load_lab_fixtures()
if _lab is not None:
    lab_session = _lab.lab_session
    lab = _lab.lab


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "lab_config(**params): parameters of the lab the `lab` fixture brings up")


@pytest.fixture
def client(plane: Any) -> Iterator[TestClient]:
    """An admin API client of the test module's own `plane` fixture (a
    plane.Plane with that test's settings)."""
    from plane import admin_client  # api/tests/plane.py

    with admin_client(plane) as c:
        yield c


@pytest.fixture
def agents(lab: dict[str, Any]) -> Iterator[list[dict[str, Any]]]:
    """One cutpointd per lab host, certificates from the lab's CA."""
    from cutpoint.lab.agents import start_agents, stop_agents

    recs = start_agents(lab, Path(lab["state_dir"]) / "certs")
    try:
        yield recs
    finally:
        stop_agents(lab)
