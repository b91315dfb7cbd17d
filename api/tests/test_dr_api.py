"""DR endpoints over a real database (SQLite and PostgreSQL): replication
state per group snapshot and member, DR policy, and the refusals of drills
and failover.  The lab runs of the same paths are dr-tests/tests/test_dr_*.py."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

from cutpoint.api.models import GroupSnapshot, MemberReplication


def test_replication_state_per_snapshot_and_member(api: Any, session_factory: Any,
                                                   dr_snapshot: Callable[..., int]) -> None:
    snap_id, txn = dr_snapshot(disks=(0, 1)), "t1"
    doc = api.get("/v1/groups/app/replication").json()
    assert doc["target_site"] == "dr" and doc["newest_recovery_point"] is None
    assert doc["snapshots"][0]["state"] == "not_replicated"
    assert doc["achieved_dr_rpo_s"] is None
    # One member verified, one failed: not a recovery point (invariant 5).
    with session_factory() as s:
        snap = s.get(GroupSnapshot, snap_id)
        for d, state in ((0, "verified"), (1, "failed")):
            s.add(MemberReplication(group_snapshot_id=snap_id, attempt=1,
                                    disk=f"primary-h1-vm1/disk{d}", pool="rbd",
                                    image=f"primary-h1-vm1-disk{d}", snap="cp.app.t1",
                                    target_site="dr", state=state, full=True,
                                    bytes_shipped=4 << 20, bytes_changed=4 << 20, seconds=2.0,
                                    throughput_mbps=2.1, finished_at=snap.cut_at
                                    + dt.timedelta(seconds=5),
                                    error=None if state == "verified" else "rc=4"))
        s.commit()
    one = api.get(f"/v1/snapshots/{snap_id}/replication").json()
    assert one["state"] == "failed" and one["recovery_point"] is False
    assert [m["state"] for m in one["members"]] == ["verified", "failed"]
    assert one["members"][1]["error"] == "rc=4"
    # A drill needs a recovery point.
    r = api.post("/v1/groups/app/drills", json={"recovery_point": txn})
    assert r.status_code == 409 and r.json()["code"] == "not_a_recovery_point", r.text
    r = api.post("/v1/groups/app/drills", json={})
    assert r.status_code == 404 and r.json()["code"] == "no_recovery_point", r.text
    # Second attempt: both verified -> recovery point, lag from cut to verified.
    with session_factory() as s:
        snap = s.get(GroupSnapshot, snap_id)
        for d in (0, 1):
            s.add(MemberReplication(group_snapshot_id=snap_id, attempt=2,
                                    disk=f"primary-h1-vm1/disk{d}", pool="rbd",
                                    image=f"primary-h1-vm1-disk{d}", snap="cp.app.t1",
                                    target_site="dr", state="verified", full=False,
                                    bytes_shipped=1000, bytes_changed=1000, seconds=1.0,
                                    throughput_mbps=0.001,
                                    finished_at=snap.cut_at + dt.timedelta(seconds=12)))
        snap.dr_verified_at = snap.cut_at + dt.timedelta(seconds=12)
        snap.replication_base = True
        s.commit()
    doc = api.get("/v1/groups/app/replication").json()
    assert doc["newest_recovery_point"] == txn
    assert abs(doc["replication_lag_s"] - 12.0) < 0.01
    assert doc["achieved_dr_rpo_s"] >= 29
    s0 = doc["snapshots"][0]
    assert s0["state"] == "verified" and s0["attempts"] == 2 and s0["bytes_shipped"] == 2000
    assert all(abs(m["lag_s"] - 12.0) < 0.01 for m in s0["members"])
    # A recovery point now; but the product's booter (the default) cannot
    # boot a drill's clones: refused before any job or clone exists.
    jobs_before = api.get("/v1/jobs").json()["items"]
    r = api.post("/v1/groups/app/drills", json={"recovery_point": txn})
    assert r.status_code == 409 and r.json()["code"] == "drill_boot_unsupported", r.text
    assert "captured definition" in r.json()["detail"], r.text
    assert api.get("/v1/jobs").json()["items"] == jobs_before


def test_dr_policy_and_refusals(api: Any, dr_snapshot: Callable[..., int]) -> None:
    dr_snapshot(disks=(0, 1))
    assert api.get("/v1/groups/app/dr-policy").json() == {"keep_last": 48, "keep_within": 0}
    r = api.request("PUT", "/v1/groups/app/dr-policy", json={"keep_last": 3})
    assert r.status_code == 200 and r.json()["keep_last"] == 3
    assert api.request("PUT", "/v1/groups/app/dr-policy",
                       json={"keep_last": 0}).status_code == 422
    assert api.as_("operator").request("PUT", "/v1/groups/app/dr-policy",
                                       json={"keep_last": 5}).status_code == 403
    r = api.post("/v1/groups/app/failover", json={"mode": "sideways"})
    assert r.status_code == 422
    r = api.post("/v1/groups/app/failover", json={"mode": "unplanned"})
    assert r.status_code == 404 and r.json()["code"] == "no_recovery_point"
    r = api.post("/v1/groups/app/drills", json={"checks": ["nosuch"]})
    assert r.status_code == 400 and r.json()["code"] == "unknown_check"


def test_newest_recovery_point_whatever_the_listing_limit(api: Any, session_factory: Any,
                                                          dr_snapshot: Callable[..., int]) \
        -> None:
    """Captures queued behind a slow copy are newer than every point at DR:
    the group's newest recovery point is still the verified one, whether or
    not the listing's `limit` reaches it (a `?limit=1` poll once saw none
    while 115 points were verified)."""
    snap_id = dr_snapshot(disks=(0,), dr_verified_after_s=5)
    with session_factory() as s:
        first = s.get(GroupSnapshot, snap_id)
        for i in (2, 3):
            s.add(GroupSnapshot(group_id=first.group_id, txn=f"t{i}", state=first.state,
                                cut_at=first.cut_at + dt.timedelta(seconds=10 * i)))
        s.commit()
    for limit in (1, 2, 20):
        doc = api.get(f"/v1/groups/app/replication?limit={limit}").json()
        assert [x["txn"] for x in doc["snapshots"]] == ["t3", "t2", "t1"][:limit]
        assert doc["newest_recovery_point"] == "t1", (limit, doc)
