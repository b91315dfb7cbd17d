from __future__ import annotations

from typing import Any


def test_health_and_ready(api: Any) -> None:
    assert api.client.get("/healthz").json() == {"status": "ok"}
    r = api.client.get("/readyz")
    assert r.status_code == 200, r.text
    assert r.json()["checks"] == {"database": "ok", "broker": "ok"}


def test_group_lifecycle(api: Any, inventory: dict[str, Any]) -> None:
    r = api.post("/v1/groups", json={"name": "app", "policy": {"rpo_seconds": 10}})
    assert r.status_code == 201, r.text
    g = r.json()
    assert g["policy"]["rpo_seconds"] == 10
    assert r.headers["ETag"]
    r = api.post("/v1/groups/app/members", json={"vm": "primary-h1-vm1"})
    assert r.status_code == 201, r.text
    assert r.json()["disks"] == ["primary-h1-vm1/disk0", "primary-h1-vm1/disk1"]
    r = api.post("/v1/groups/app/members", json={"disk": "primary-h2-vm1/disk1"})
    assert r.status_code == 201, r.text
    g = api.get("/v1/groups/app").json()
    assert [m["kind"] for m in g["members"]] == ["vm", "disk"]


def test_disk_in_at_most_one_group(api: Any, inventory: dict[str, Any]) -> None:
    api.post("/v1/groups", json={"name": "a"})
    api.post("/v1/groups", json={"name": "b"})
    assert api.post("/v1/groups/a/members", json={"disk": "primary-h1-vm1/disk0"}).status_code \
        == 201
    r = api.post("/v1/groups/b/members", json={"vm": "primary-h1-vm1"})
    assert r.status_code == 409
    body = r.json()
    assert body["code"] == "disk_in_other_group"
    assert r.headers["content-type"].startswith("application/problem+json")
    assert "primary-h1-vm1/disk0 in a" in body["detail"]


def test_etag_if_match(api: Any) -> None:
    r = api.post("/v1/groups", json={"name": "e"})
    tag = r.headers["ETag"]
    r = api.patch("/v1/groups/e/policy", json={"keep_last": 3})
    ptag = r.headers["ETag"]
    r = api.patch("/v1/groups/e/policy", json={"keep_last": 4}, headers={"If-Match": '"nope"'})
    assert r.status_code == 412 and r.json()["code"] == "etag_mismatch"
    r = api.patch("/v1/groups/e/policy", json={"keep_last": 4}, headers={"If-Match": ptag})
    assert r.status_code == 200 and r.json()["keep_last"] == 4
    r = api.patch("/v1/groups/e", json={"description": "x"}, headers={"If-Match": tag})
    assert r.status_code == 200
    r = api.patch("/v1/groups/e", json={"description": "y"}, headers={"If-Match": tag})
    assert r.status_code == 412


def test_pagination(api: Any) -> None:
    for i in range(5):
        assert api.post("/v1/sites", json={"name": f"s{i}"}).status_code == 201
    seen, cursor = [], None
    while True:
        r = api.get("/v1/sites", params={"limit": 2, **({"cursor": cursor} if cursor else {})})
        body = r.json()
        seen += [s["name"] for s in body["items"]]
        cursor = body["next_cursor"]
        if cursor is None:
            break
    assert seen == [f"s{i}" for i in range(5)]
    assert api.get("/v1/sites", params={"cursor": "abc"}).status_code == 422


def test_snapshot_request_is_exclusive(api: Any, inventory: dict[str, Any]) -> None:
    api.post("/v1/groups", json={"name": "x"})
    assert api.post("/v1/groups/x/snapshots").json()["code"] == "group_empty"
    api.post("/v1/groups/x/members", json={"vm": "primary-h1-vm2"})
    r = api.as_("operator").post("/v1/groups/x/snapshots")
    assert r.status_code == 202, r.text
    job = r.json()
    assert job["kind"] == "group_snapshot" and job["state"] == "queued"
    r2 = api.as_("operator").post("/v1/groups/x/snapshots")
    assert r2.status_code == 409 and r2.json()["code"] == "snapshot_in_flight"
    assert r2.json()["job_id"] == job["id"]
    snaps = api.get("/v1/groups/x/snapshots").json()["items"]
    assert [s["state"] for s in snaps] == ["pending"]


def test_audit_records_mutations(api: Any) -> None:
    api.post("/v1/sites", json={"name": "aud"})
    api.as_(None).post("/v1/sites", json={"name": "anon"})
    api.as_("viewer").post("/v1/sites", json={"name": "view"})
    rows = api.get("/v1/audit").json()["items"]
    got = [(r["method"], r["path"], r["status"], r["actor"]) for r in rows[:3]]
    assert got == [("POST", "/v1/sites", 403, "test-viewer"),
                   ("POST", "/v1/sites", 401, None),
                   ("POST", "/v1/sites", 201, "test-admin")]


def test_taken_and_unknown_names(api: Any) -> None:
    """A name already taken is 409 `<kind>_exists` (the unique constraint,
    rolled back), an unknown one 404 `<kind>_not_found`, for every kind that
    looks rows up or creates them by name."""
    def problem(r: Any, status: int, code: str, detail: str) -> None:
        assert r.status_code == status, r.text
        assert r.json()["code"] == code and r.json()["detail"] == detail, r.text

    assert api.post("/v1/sites", json={"name": "s"}).status_code == 201
    problem(api.post("/v1/sites", json={"name": "s"}), 409, "site_exists",
            "site 's' already exists")
    host = {"name": "h", "site": "s", "address": "10.0.0.1", "port": 7443,
            "cert_fingerprint": "0f" * 32}
    problem(api.post("/v1/hosts", json={**host, "site": "nowhere"}), 404, "site_not_found",
            "site 'nowhere' does not exist")
    assert api.post("/v1/hosts", json=host).status_code == 201
    problem(api.post("/v1/hosts", json=host), 409, "host_exists", "host 'h' already exists")
    assert api.post("/v1/tokens", json={"name": "t", "role": "viewer"}).status_code == 201
    problem(api.post("/v1/tokens", json={"name": "t", "role": "admin"}), 409, "token_exists",
            "token 't' already exists")
    problem(api.get("/v1/groups/nope"), 404, "group_not_found", "group 'nope' does not exist")
    # the clash rolled back only itself: the site list is as before
    assert [s["name"] for s in api.get("/v1/sites").json()["items"]] == ["s"]
