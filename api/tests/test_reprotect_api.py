"""Re-protect and failback requests over a real database, without a lab:
what is refused (and that no job is made), and the turn-around itself: the
group's members become the VMs the DR agent lists under the same names, and
the group replicates to the site it left.  The round trip on the lab is
test_roundtrip_lab.py."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cutpoint.api.models import FencingEpoch, Group, Host, Job, Site
from cutpoint.api.services import inventory as inv
from cutpoint.api.services import reprotect
from sqlalchemy import select


def _jobs(session_factory: Any, kind: str) -> list[Job]:
    with session_factory() as s:
        return list(s.scalars(select(Job).where(Job.kind == kind)))


def _failed_over(session_factory: Any, standbys: tuple[str, ...] = ("primary-h1-vm1",)) -> None:
    """Epoch 1 active at "dr" (as a failover records it), and a DR host whose
    agent lists `standbys` (what the failover booted there)."""
    with session_factory() as s:
        g = s.scalar(select(Group).where(Group.name == "app"))
        dr = s.scalar(select(Site).where(Site.name == "dr"))
        assert g is not None and dr is not None
        s.add(FencingEpoch(group_id=g.id, epoch=1, active_site="dr", fenced_site="primary"))
        host = Host(name="dr-h1", site_id=dr.id, address="10.77.2.1", port=7443,
                    cert_fingerprint="ab" * 32)
        s.add(host)
        s.flush()
        inv.apply(s, host, {"vms": [
            {"name": n, "driver": "qmp", "state": "running",
             "disks": [{"id": f"{n}/disk{d}", "node": f"disk{d}", "backend": "rbd",
                        "pool": "rbd", "image": f"{n}-disk{d}"} for d in (0, 1)]}
            for n in standbys]})
        s.commit()


def test_re_protect_needs_a_failover(api: Any, session_factory: Any,
                                     dr_snapshot: Callable[..., int]) -> None:
    dr_snapshot(disks=(0, 1), dr_verified_after_s=5)
    r = api.post("/v1/groups/app/re-protect")
    assert r.status_code == 409 and r.json()["code"] == "not_failed_over", r.text
    assert "protected from primary to dr" in r.json()["detail"]
    r = api.post("/v1/groups/app/failback", json={})
    assert r.status_code == 409 and r.json()["code"] == "not_reprotected", r.text
    assert "cutpoint dr re-protect app" in r.json()["detail"]
    assert _jobs(session_factory, "reprotect") == _jobs(session_factory, "failback") == []


def test_re_protect_names_members_without_a_vm_at_the_active_site(
        api: Any, session_factory: Any, dr_snapshot: Callable[..., int]) -> None:
    dr_snapshot(disks=(0, 1), dr_verified_after_s=5)
    _failed_over(session_factory, standbys=("some-other-vm",))
    r = api.post("/v1/groups/app/re-protect")
    assert r.status_code == 409, r.text
    body = r.json()
    assert body["code"] == "no_counterpart" and body["vms"] == ["primary-h1-vm1 (0 at dr)"], body
    assert _jobs(session_factory, "reprotect") == []


def test_the_turn_around(api: Any, session_factory: Any,
                         dr_snapshot: Callable[..., int]) -> None:
    """reverse_direction: the member is DR's VM (its disks), the target is the
    primary; then re-protect is refused as done, and failback is allowed to
    check its own preconditions (here: the primary has no Ceph access)."""
    dr_snapshot(disks=(0, 1), dr_verified_after_s=5)
    _failed_over(session_factory)
    with session_factory() as s:
        g = s.scalar(select(Group).where(Group.name == "app"))
        assert g is not None
        moved = reprotect.reverse_direction(s, g, "dr", "primary")
        s.commit()
        assert moved == [{"vm": "primary-h1-vm1", "from": "primary-h1", "to": "dr-h1",
                          "disks": ["primary-h1-vm1/disk0", "primary-h1-vm1/disk1"]}]
        members_at, target, st = reprotect.direction(s, g)
        assert (members_at, target, st.active_site) == ("dr", "primary", "dr")
    group = api.get("/v1/groups/app").json()
    assert group["policy"]["replication_target"] == "primary", group
    assert [(m["vm"], m["host"], m["disks"]) for m in group["members"]] == [
        ("primary-h1-vm1", "dr-h1", ["primary-h1-vm1/disk0", "primary-h1-vm1/disk1"])], group
    r = api.post("/v1/groups/app/re-protect")
    assert r.status_code == 409 and r.json()["code"] == "already_protected", r.text
    r = api.post("/v1/groups/app/failback", json={})
    assert r.status_code in (409, 503), r.text
    assert r.json()["code"] != "not_reprotected", r.text
    assert _jobs(session_factory, "failback") == []
