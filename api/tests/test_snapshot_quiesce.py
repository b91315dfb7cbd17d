"""Group policy quiesce → coordinator spec, and the level reached per member
→ member_snapshots → GET /snapshots/{id}.

The coordinator's per-VM facts are built from the real agent replies
recorded in coordinator/tests/data/quiesce_replies.json (a guest agent that
froze, and one stopped inside the guest that did not answer).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from cutpoint.api.models import Group, GroupSnapshot, SnapState
from cutpoint.api.schemas.groups import GroupCreate, MemberAdd
from cutpoint.api.schemas.policy import PolicyUpdate
from cutpoint.api.services import capture, groups
from cutpoint.coordinator.results import GroupSnapshotResult, VMTiming
from sqlalchemy.orm import Session, sessionmaker

DATA = Path(__file__).resolve().parents[2] / "coordinator" / "tests" / "data" / \
    "quiesce_replies.json"


def _timing(vm: str, which: str) -> VMTiming:
    reply = json.loads(DATA.read_text())[which]["commit"]["vms"][0]
    t = VMTiming(vm=vm, agent="primary-h1")
    t.update({**reply, "vm": vm, "disks": []})
    return t


def _group(sf: sessionmaker[Session], quiesce: str, host: int = 1) -> tuple[int, int]:
    with sf() as s:
        g = groups.create(s, GroupCreate(name=f"db-{quiesce}",
                                         policy=PolicyUpdate(quiesce=quiesce)))  # type: ignore[arg-type]
        for vm in (f"primary-h{host}-vm1", f"primary-h{host}-vm2"):
            groups.add_member(s, g, MemberAdd(vm=vm))
        snap = GroupSnapshot(group_id=g.id, txn=f"qz{quiesce}", state=SnapState.pending,
                             trigger="manual")
        s.add(snap)
        s.commit()
        return g.id, snap.id


def _settings(settings: Any, tmp_path: Path) -> Any:
    return settings.model_copy(update={"agent_ca": tmp_path / "ca.pem",
                                       "agent_cert": tmp_path / "c.pem",
                                       "agent_key": tmp_path / "c.key"})


def _plan(session_factory: sessionmaker[Session], gid: int, settings: Any,
          tmp_path: Path) -> Any:
    """What the capture task would send for group gid."""
    with session_factory() as s:
        g = s.get(Group, gid)
        assert g is not None
        return capture.build_spec(s, g, _settings(settings, tmp_path))


def test_policy_quiesce_reaches_the_spec(session_factory: sessionmaker[Session],
                                         inventory: dict[str, Any], settings: Any,
                                         tmp_path: Path) -> None:
    gid, _ = _group(session_factory, "fs-freeze")
    plan = _plan(session_factory, gid, settings, tmp_path)
    assert plan.spec.quiesce == "fs-freeze"
    assert plan.spec.prepare_wait_ms > plan.spec.effective_prepare_timeout_ms
    gid2, _ = _group(session_factory, "crash", host=2)
    assert _plan(session_factory, gid2, settings, tmp_path).spec.quiesce == "crash"


def test_member_levels_are_recorded_and_shown(session_factory: sessionmaker[Session],
                                              inventory: dict[str, Any], settings: Any,
                                              api: Any, tmp_path: Path) -> None:
    gid, sid = _group(session_factory, "fs-freeze")
    plan = _plan(session_factory, gid, settings, tmp_path)
    with session_factory() as s:
        snap = s.get(GroupSnapshot, sid)
        assert snap is not None
        snap.quiesce = plan.spec.quiesce
        s.commit()
    res = GroupSnapshotResult(
        txn="qzfs-freeze", group="db-fs-freeze", state="committed", quiesce="fs-freeze",
        vms=[_timing("primary-h1-vm1", "live"), _timing("primary-h1-vm2", "dead")],
        timings={"total_ms": 1.0})
    out = capture.record(session_factory, sid, plan, res, 1.0)
    assert out["consistency"] == "crash" and out["quiesce"] == "fs-freeze"
    r = api.get(f"/v1/snapshots/{sid}")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["quiesce"] == "fs-freeze" and body["consistency"] == "crash"
    by_vm: dict[str, set[tuple[Any, ...]]] = {}
    for m in body["members"]:
        by_vm.setdefault(m["vm"], set()).add(
            (m["consistency"], m["freeze_error"] is None, m["freeze_ms"] is not None,
             m["thaw_ms"] is not None))
    assert by_vm["primary-h1-vm1"] == {("fs-freeze", True, True, True)}
    assert by_vm["primary-h1-vm2"] == {("crash", False, True, True)}
    errs = {m["freeze_error"] for m in body["members"] if m["vm"] == "primary-h1-vm2"}
    assert all("guest-sync-delimited" in e for e in errs)


THAW_DATA = DATA.parent / "thaw_failed_replies.json"


def test_failed_thaw_is_stored_and_shown(session_factory: sessionmaker[Session],
                                         inventory: dict[str, Any], settings: Any,
                                         api: Any, tmp_path: Path) -> None:
    """A member whose thaw failed after the snapshot (recorded cutpointd
    commit reply) is committed, and GET /v1/snapshots/{id} shows why the
    guest may still be frozen; a member whose thaw worked shows null."""
    gid, sid = _group(session_factory, "fs-freeze")
    plan = _plan(session_factory, gid, settings, tmp_path)
    reply = json.loads(THAW_DATA.read_text())["thaw_failed"]["commit"]["vms"][0]
    bad = VMTiming(vm="primary-h1-vm2", agent="primary-h1")
    bad.update({**reply, "vm": "primary-h1-vm2", "disks": []})
    assert bad.thaw_error
    res = GroupSnapshotResult(
        txn="qzfs-freeze", group="db-fs-freeze", state="committed", quiesce="fs-freeze",
        vms=[_timing("primary-h1-vm1", "live"), bad], timings={"total_ms": 1.0})
    assert capture.record(session_factory, sid, plan, res, 1.0)["state"] == "committed"
    r = api.get(f"/v1/snapshots/{sid}")
    assert r.status_code == 200, r.text
    got = {(m["vm"], m["thaw_error"]) for m in r.json()["members"]}
    assert got == {("primary-h1-vm1", None), ("primary-h1-vm2", reply["thaw_error"])}


def test_all_frozen_group_is_fs_freeze(session_factory: sessionmaker[Session],
                                       inventory: dict[str, Any], settings: Any,
                                       tmp_path: Path) -> None:
    gid, sid = _group(session_factory, "fs-freeze")
    plan = _plan(session_factory, gid, settings, tmp_path)
    res = GroupSnapshotResult(
        txn="qzfs-freeze", group="db-fs-freeze", state="committed", quiesce="fs-freeze",
        vms=[_timing("primary-h1-vm1", "live"), _timing("primary-h1-vm2", "live")])
    assert capture.record(session_factory, sid, plan, res, 1.0)["consistency"] == "fs-freeze"


@pytest.mark.lab
def test_api_snapshot_through_cutpointd_records_fallback(tmp_path: Path) -> None:
    """The control plane's snapshot path end to end with the real agent: a
    group whose policy says fs-freeze, inventory from cutpointd, the capture
    task's `run`; vm1's guest agent does not answer and vm2 has none, so
    both members are crash with the reason, visible in GET /v1/snapshots/{id}."""
    import asyncio
    import tempfile

    from cutpoint.agentclient import AgentClient
    from cutpoint.agentclient.tls import client_context
    from cutpoint.api.app import create_app
    from cutpoint.api.config import Settings
    from cutpoint.api.db import get_engine
    from cutpoint.api.migrate import upgrade
    from cutpoint.api.models import Host, Site
    from cutpoint.api.services import inventory, snapshots
    from cutpoint.bench.quiesce import start_local_rig
    from fastapi.testclient import TestClient
    SECRET = "quiesce-test-secret-0123456789"

    rig = start_local_rig(Path(tempfile.mkdtemp(prefix="cpqa.", dir="/tmp")))
    try:
        c = rig.certs
        db = f"sqlite:///{tmp_path}/cp.db"
        upgrade(db)
        settings = Settings(database_url=db, token_secret=SECRET,  # type: ignore[arg-type]
                            agent_ca=c / "ca.pem", agent_cert=c / "coordinator.pem",
                            agent_key=c / "coordinator.key")
        sf = sessionmaker(bind=get_engine(db), expire_on_commit=False)

        async def inv() -> dict[str, Any]:
            async with AgentClient("127.0.0.1", rig.port, ssl_context=client_context(
                    str(c / "ca.pem"), str(c / "coordinator.pem"),
                    str(c / "coordinator.key"))) as a:
                return await a.inventory()
        with sf() as s:
            site = Site(name="primary")
            s.add(site)
            s.flush()
            host = Host(name="local", site_id=site.id, address="127.0.0.1", port=rig.port)
            s.add(host)
            s.flush()
            inventory.apply(s, host, asyncio.run(inv()))
            g = groups.create(s, GroupCreate(name="db", policy=PolicyUpdate(
                quiesce="fs-freeze", lease_ms=3000)))
            for vm in ("vm1", "vm2"):
                groups.add_member(s, g, MemberAdd(vm=vm))
            job = snapshots.request(s, g, trigger="manual", actor=None)
            sid = job.snapshot_id
        assert sid is not None
        out = capture.run(sf, settings, sid)
    finally:
        log = rig.stop()
    assert out["state"] == "committed", (out, log[-2000:])
    assert out["quiesce"] == "fs-freeze" and out["consistency"] == "crash"
    from cutpoint.api.models import Role
    from cutpoint.api.services import tokens
    with sf() as s:
        _, tok = tokens.create(s, "viewer", Role.viewer, SECRET)
    with TestClient(create_app(settings, sf)) as client:
        body = client.get(f"/v1/snapshots/{sid}",
                          headers={"Authorization": f"Bearer {tok}"}).json()
    assert body["quiesce"] == "fs-freeze" and body["consistency"] == "crash"
    m = {x["vm"]: x for x in body["members"]}
    assert m["vm1"]["consistency"] == "crash"
    assert "guest-sync-delimited" in m["vm1"]["freeze_error"]
    assert m["vm1"]["freeze_ms"] >= 999
    assert m["vm2"]["freeze_error"] == "no qga socket configured for vm vm2"
    # A freeze that never got past the sync cannot have frozen the guest, so
    # no thaw is sent (docs/agent-protocol.md, guest freeze): none recorded.
    assert m["vm1"]["thaw_ms"] is None and m["vm1"]["thaw_error"] is None
    assert m["vm2"]["thaw_error"] is None
