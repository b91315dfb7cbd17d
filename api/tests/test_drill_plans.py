"""Recovery plans and drill requests through the API, over a real database
(SQLite and PostgreSQL): plans stored and versioned and checked against
the group; drill requests with checks and their parameters, readiness
rules and a plan of their own; and one drill per group kept by the
database even when two requests both saw none in progress."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cutpoint.api.config import DefinitionTarget, Settings
from cutpoint.api.models import Group, Job
from sqlalchemy import select, text

PLAN = {"boot_groups": [
    {"name": "db", "vms": [{"vm": "primary-h1-vm1", "readiness": {"kind": "guest-ping"},
                            "delay_s": 2}],
     "post": [{"kind": "guest-exec", "vm": "primary-h1-vm1", "path": "/bin/true"}]}],
    "networks": {"failover": {"br-prod": "br-dr"}, "drill": "cpdrill1"},
    "drill_checks": [{"name": "guest-exec", "params": {"path": "/bin/true"}}]}


@pytest.fixture
def settings(settings: Settings, tmp_path: Path) -> Settings:
    """The conftest's, with what drills through the agents need at site dr."""
    key = tmp_path / "sign.pem"
    key.write_bytes(Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    return settings.model_copy(update={
        "definition_signing_key": key, "agent_ca": tmp_path / "ca.pem",
        "agent_cert": tmp_path / "c.pem", "agent_key": tmp_path / "c.key",
        "definition_targets": {"dr": DefinitionTarget(
            host="dr-h1", auth_user="cutpoint", secret_uuid="0b7e3c1a-2f45-4e8a-9d61-"
            "3c2a5e7f9b10", mon_hosts=["10.77.0.3:6790"], drill_network="cpdrill0")}})


def test_plans_are_versioned_and_checked(api: Any, dr_snapshot: Callable[..., int]) -> None:
    dr_snapshot(disks=(0,), dr_verified_after_s=5)
    r = api.get("/v1/groups/app/plan")
    assert r.status_code == 404 and r.json()["code"] == "no_plan", r.text
    r = api.put("/v1/groups/app/plan", json=PLAN)
    assert r.status_code == 200 and r.json()["version"] == 1, r.text
    assert api.put("/v1/groups/app/plan", json=PLAN).json()["version"] == 1  # same: same one
    two = {**PLAN, "networks": {"drill": "cpdrill2"}}
    assert api.put("/v1/groups/app/plan", json=two).json()["version"] == 2
    assert api.get("/v1/groups/app/plan").json()["body"] == two
    assert api.get("/v1/groups/app/plan?version=1").json()["body"] == PLAN
    assert [p["version"] for p in api.get("/v1/groups/app/plan/versions").json()] == [2, 1]
    for body, code in (({"boot_groups": [{"vms": []}]}, "bad_plan"),
                       ({"boot_order": []}, "bad_plan"),
                       ({"boot_groups": [{"vms": ["a"]}, {"vms": ["a"]}]}, "bad_plan"),
                       ({"boot_groups": [{"vms": [{"vm": "primary-h1-vm1",
                                                   "readiness": {"kind": "console"}}]}]},
                        "bad_plan"),
                       ({"boot_groups": [{"vms": ["primary-h2-vm1"]}]}, "plan_unknown_vm")):
        r = api.put("/v1/groups/app/plan", json=body)
        assert r.status_code == 400 and r.json()["code"] == code, (body, r.text)
    api.role = "viewer"
    assert api.get("/v1/groups/app/plan").status_code == 200
    assert api.put("/v1/groups/app/plan", json=PLAN).status_code == 403


def test_drill_request_carries_checks_readiness_and_plan(
        api: Any, session_factory: Any, dr_snapshot: Callable[..., int]) -> None:
    dr_snapshot(disks=(0,), dr_verified_after_s=5)
    body = {"checks": ["writer", {"name": "guest-exec", "timeout_s": 30,
                                  "params": {"path": "/bin/sh", "args": ["-c", "exit 0"],
                                             "regex": "x"}}],
            "readiness": {"primary-h1-vm1": {"kind": "tcp", "port": 22,
                                             "address": "10.99.0.11"}},
            "plan": PLAN}
    r = api.post("/v1/groups/app/drills", json=body)
    assert r.status_code == 202, r.text
    with session_factory() as s:
        job = s.get(Job, r.json()["id"])
        assert job.params["checks"] == ["writer", {"name": "guest-exec", "timeout_s": 30.0,
                                                   "params": body["checks"][1]["params"]}]
        assert job.params["readiness"] == {"primary-h1-vm1": {
            "kind": "tcp", "port": 22, "address": "10.99.0.11"}}
        assert job.params["plan"] == PLAN and job.params["plan_version"] is None
        job.state = job.state.failed  # done: the next request may run
        s.commit()
    # no checks asked: the group's plan's
    assert api.put("/v1/groups/app/plan", json=PLAN).status_code == 200
    r = api.post("/v1/groups/app/drills", json={})
    assert r.status_code == 202, r.text
    with session_factory() as s:
        job = s.get(Job, r.json()["id"])
        assert job.params["checks"] == [{"name": "guest-exec", "params": {"path": "/bin/true"},
                                         "timeout_s": 300.0}]
        assert job.params["plan"] is None and job.params["plan_version"] == 1
        job.state = job.state.failed
        s.commit()
    for bad, status, code in (
            ({"checks": [{"name": "nosuch"}]}, 400, "unknown_check"),
            ({"checks": [{"name": "tcp", "timeout_s": 0}]}, 422, None),
            ({"readiness": {"primary-h1-vm1": {"kind": "tcp"}}}, 400, "bad_readiness"),
            ({"plan": {"boot_groups": "db"}}, 400, "bad_plan")):
        r = api.post("/v1/groups/app/drills", json=bad)
        assert r.status_code == status and (code is None or r.json()["code"] == code), \
            (bad, r.text)


def test_a_site_without_a_drill_network_is_refused(api: Any, settings: Settings,
                                                   dr_snapshot: Callable[..., int]) -> None:
    dr_snapshot(disks=(0,), dr_verified_after_s=5)
    settings.definition_targets["dr"] = settings.definition_targets["dr"].model_copy(
        update={"drill_network": None})
    r = api.post("/v1/groups/app/drills", json={})
    assert r.status_code == 409 and r.json()["code"] == "drill_boot_unsupported", r.text
    assert "no drill_network" in r.json()["detail"]
    # a plan that names the drill bridge is enough
    assert api.put("/v1/groups/app/plan", json={"networks": {"drill": "cpdrill9"}}) \
        .status_code == 200
    assert api.post("/v1/groups/app/drills", json={}).status_code == 202


def test_two_requests_that_both_saw_no_drill_make_one(
        session_factory: Any, settings: Settings, dr_snapshot: Callable[..., int],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The interleaving of two requests of one group: each looked for a drill
    in progress before either inserted (in_progress patched to see none, as
    the second would have).  The database's index refuses the second:
    409 drill_in_progress.  Negative control: without the index, the same
    interleaving makes two active drills of the group."""
    from cutpoint.api.errors import Conflict
    from cutpoint.api.services import drill_schedule, drills

    dr_snapshot(disks=(0,), dr_verified_after_s=5)
    monkeypatch.setattr(drill_schedule, "in_progress", lambda s, g: None)
    with session_factory() as s:
        g = s.scalar(select(Group).where(Group.name == "app"))
        first = drills.request(s, g, "latest", None, "a", "agent", settings)
        with pytest.raises(Conflict) as exc:
            drills.request(s, g, "latest", None, "b", "agent", settings)
        assert exc.value.code == "drill_in_progress", exc.value
        assert [j.id for j in s.scalars(select(Job).where(Job.kind == "drill"))] == [first.id]
        s.execute(text("DROP INDEX uq_jobs_one_active_drill"))
        drills.request(s, g, "latest", None, "b", "agent", settings)
        assert len(list(s.scalars(select(Job).where(Job.kind == "drill")))) == 2
        s.rollback()


def test_text_no_database_stores_is_refused(api: Any, dr_snapshot: Callable[..., int]) -> None:
    """A lone surrogate or a NUL in a plan or a check's params is a 400, not
    a database error (PostgreSQL's json refuses both)."""
    dr_snapshot(disks=(0,), dr_verified_after_s=5)
    for bad in ('{"drill_checks": [{"name": "tcp", "params": {"x": "\\ud800"}}]}',
                '{"drill_checks": [{"name": "tcp", "params": {"x": "a\\u0000"}}]}'):
        r = api.put("/v1/groups/app/plan", content=bad,
                    headers={"Content-Type": "application/json"})
        assert r.status_code == 400 and r.json()["code"] == "bad_plan", r.text
    r = api.post("/v1/groups/app/drills", content='{"checks": [{"name": "tcp", "params": '
                 '{"address": "\\ud800"}}]}', headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["code"] == "bad_check", r.text
