"""Group policy quiesce → coordinator spec, and the level reached per member
→ member_snapshots → GET /snapshots/{id} (issue 8 item 4).

The coordinator's per-VM facts are built from the real agent replies
recorded in coordinator/tests/data/quiesce_replies.json (a guest agent that
froze, and one stopped inside the guest that did not answer).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

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


def test_policy_quiesce_reaches_the_spec(session_factory: sessionmaker[Session],
                                         inventory: dict[str, Any], settings: Any,
                                         tmp_path: Path) -> None:
    gid, _ = _group(session_factory, "fs-freeze")
    with session_factory() as s:
        g = s.get(Group, gid)
        assert g is not None
        plan = capture.build_spec(s, g, _settings(settings, tmp_path))
    assert plan.spec.quiesce == "fs-freeze"
    assert plan.spec.prepare_wait_ms > plan.spec.effective_prepare_timeout_ms
    gid2, _ = _group(session_factory, "crash", host=2)
    with session_factory() as s:
        g2 = s.get(Group, gid2)
        assert g2 is not None
        assert capture.build_spec(s, g2, _settings(settings, tmp_path)).spec.quiesce == "crash"


def test_member_levels_are_recorded_and_shown(session_factory: sessionmaker[Session],
                                              inventory: dict[str, Any], settings: Any,
                                              api: Any, tmp_path: Path) -> None:
    gid, sid = _group(session_factory, "fs-freeze")
    with session_factory() as s:
        g = s.get(Group, gid)
        assert g is not None
        plan = capture.build_spec(s, g, _settings(settings, tmp_path))
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


def test_all_frozen_group_is_fs_freeze(session_factory: sessionmaker[Session],
                                       inventory: dict[str, Any], settings: Any,
                                       tmp_path: Path) -> None:
    gid, sid = _group(session_factory, "fs-freeze")
    with session_factory() as s:
        g = s.get(Group, gid)
        assert g is not None
        plan = capture.build_spec(s, g, _settings(settings, tmp_path))
    res = GroupSnapshotResult(
        txn="qzfs-freeze", group="db-fs-freeze", state="committed", quiesce="fs-freeze",
        vms=[_timing("primary-h1-vm1", "live"), _timing("primary-h1-vm2", "live")])
    assert capture.record(session_factory, sid, plan, res, 1.0)["consistency"] == "fs-freeze"
