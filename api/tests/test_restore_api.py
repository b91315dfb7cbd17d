"""Restore requests over a real database, without a Ceph cluster: every
refusal is a problem that names what is wrong, and no job is created.  The
restores themselves, on the lab's Ceph with its VMs, are test_restore_lab.py."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cutpoint.api.models import Job
from sqlalchemy import select

KEY = "AQBVNyRpAAAAABAAc2mVdTq3e0A4dUW3w/7h9Q=="


@pytest.fixture
def keyring(tmp_path: Path) -> str:
    p = tmp_path / "ceph.client.cutpoint.keyring"
    p.write_text(f"[client.cutpoint]\n\tkey = {KEY}\n")
    p.chmod(0o600)
    return str(p)


def problem(r: Any, status: int, code: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/problem+json"), r.headers
    body = dict(r.json())
    assert body["code"] == code, body
    return body


def restore_jobs(session_factory: Any) -> list[Job]:
    with session_factory() as s:
        return list(s.scalars(select(Job).where(Job.kind == "restore")))


def unreachable_ceph(api: Any, site: str, keyring: str) -> None:
    sid = next(s["id"] for s in api.get("/v1/sites").json()["items"] if s["name"] == site)
    r = api.patch(f"/v1/sites/{sid}", json={"check": False, "ceph": {
        "mon_host": ["127.0.0.1:1"], "keyring": keyring, "pools": {"rbd": "rbd"},
        "connect_timeout_s": 2}})
    assert r.status_code == 200, r.text


def test_the_snapshot_must_exist_and_be_committed(api: Any, session_factory: Any,
                                                  dr_snapshot: Callable[..., int]) -> None:
    dr_snapshot(disks=(0, 1))
    problem(api.post("/v1/groups/app/restore/clone", json={"snapshot": "t9"}), 404,
            "snapshot_not_found")
    problem(api.post("/v1/groups/app/restore/in-place", json={"snapshot": "424242"}), 404,
            "snapshot_not_found")
    problem(api.post("/v1/groups/nosuch/restore/clone", json={"snapshot": "t1"}), 404,
            "group_not_found")
    assert restore_jobs(session_factory) == []


def test_at_dr_only_a_verified_recovery_point(api: Any, session_factory: Any,
                                              dr_snapshot: Callable[..., int]) -> None:
    dr_snapshot(disks=(0, 1))  # committed, never verified at DR
    body = problem(api.post("/v1/groups/app/restore/clone",
                            json={"snapshot": "t1", "site": "dr"}), 409,
                   "not_a_recovery_point")
    assert "not verified at DR" in body["detail"]
    assert restore_jobs(session_factory) == []


def test_a_site_that_is_not_the_groups(api: Any, session_factory: Any,
                                       dr_snapshot: Callable[..., int]) -> None:
    dr_snapshot(disks=(0, 1), dr_verified_after_s=5)
    assert api.post("/v1/sites", json={"name": "elsewhere"}).status_code == 201
    body = problem(api.post("/v1/groups/app/restore/in-place",
                            json={"snapshot": "t1", "site": "elsewhere"}), 409,
                   "not_a_group_site")
    assert "primary" in body["detail"] and "elsewhere" in body["detail"]
    problem(api.post("/v1/groups/app/restore/in-place",
                     json={"snapshot": "t1", "site": "nosuch"}), 409, "not_a_group_site")
    assert restore_jobs(session_factory) == []


def test_a_site_without_ceph_access_says_how_to_set_it(
        api: Any, session_factory: Any, dr_snapshot: Callable[..., int]) -> None:
    dr_snapshot(disks=(0, 1), dr_verified_after_s=5)
    for site in ("primary", "dr"):
        body = problem(api.post("/v1/groups/app/restore/clone",
                                json={"snapshot": "t1", "site": site}), 409,
                       "site_has_no_ceph")
        assert "cutpoint site update" in body["detail"], body
    assert restore_jobs(session_factory) == []


def test_clone_names_are_checked(api: Any, session_factory: Any, keyring: str,
                                 dr_snapshot: Callable[..., int]) -> None:
    dr_snapshot(disks=(0, 1))
    unreachable_ceph(api, "primary", keyring)
    body = problem(api.post("/v1/groups/app/restore/clone", json={
        "snapshot": "t1", "names": {"other-vm/disk0": "x"}}), 400, "bad_names")
    assert "primary-h1-vm1/disk0" in body["detail"]
    r = api.post("/v1/groups/app/restore/clone", json={
        "snapshot": "t1", "names": {"primary-h1-vm1/disk0": "../etc"}})
    assert r.status_code == 422, r.text
    r = api.post("/v1/groups/app/restore/clone", json={"snapshot": "t1", "suffix": "a b"})
    assert r.status_code == 422, r.text
    assert restore_jobs(session_factory) == []


def test_an_unreachable_ceph_is_a_503_within_the_deadline(
        api: Any, session_factory: Any, keyring: str,
        dr_snapshot: Callable[..., int]) -> None:
    dr_snapshot(disks=(0, 1))
    unreachable_ceph(api, "primary", keyring)
    t0 = time.monotonic()
    body = problem(api.post("/v1/groups/app/restore/clone", json={"snapshot": "latest"}),
                   503, "ceph_unreachable")
    assert time.monotonic() - t0 < 15
    assert body["site"] == "primary", body
    assert restore_jobs(session_factory) == []


def test_in_place_needs_an_answer_from_every_agent_of_the_site(
        api: Any, session_factory: Any, keyring: str,
        dr_snapshot: Callable[..., int]) -> None:
    """The inventory's hosts (10.77.1.x) answer nothing: whether the member VM
    runs cannot be told, so the in-place restore is refused (503) naming the
    hosts; nothing is rolled back."""
    dr_snapshot(disks=(0, 1))
    unreachable_ceph(api, "primary", keyring)
    t0 = time.monotonic()
    body = problem(api.post("/v1/groups/app/restore/in-place", json={"snapshot": "t1"}),
                   503, "agents_unreachable")
    assert time.monotonic() - t0 < 20
    assert {h["host"] for h in body["hosts"]} == {"primary-h1", "primary-h2"}, body
    assert restore_jobs(session_factory) == []
