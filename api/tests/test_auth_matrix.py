"""401 and 403 for every route: each route's required role is listed here, and
the test fails when a route exists that the table does not name."""

from __future__ import annotations

from typing import Any

REQUIRED = {
    ("GET", "/v1/sites"): "viewer",
    ("POST", "/v1/sites"): "admin",
    ("GET", "/v1/sites/{site_id}"): "viewer",
    ("PATCH", "/v1/sites/{site_id}"): "admin",
    ("DELETE", "/v1/sites/{site_id}"): "admin",
    ("POST", "/v1/sites/{site_id}/check"): "operator",
    ("GET", "/v1/hosts"): "viewer",
    ("POST", "/v1/hosts"): "admin",
    ("GET", "/v1/hosts/{host_id}"): "viewer",
    ("PATCH", "/v1/hosts/{host_id}"): "admin",
    ("DELETE", "/v1/hosts/{host_id}"): "admin",
    ("POST", "/v1/hosts/{host_id}/sync"): "operator",
    ("GET", "/v1/vms"): "viewer",
    ("GET", "/v1/vms/{vm_id}"): "viewer",
    ("GET", "/v1/vms/{vm_id}/definitions"): "viewer",
    ("GET", "/v1/vms/{vm_id}/definitions/{version}"): "viewer",
    ("GET", "/v1/disks"): "viewer",
    ("GET", "/v1/disks/{disk_id}"): "viewer",
    ("GET", "/v1/groups"): "viewer",
    ("POST", "/v1/groups"): "admin",
    ("GET", "/v1/groups/{group}"): "viewer",
    ("PATCH", "/v1/groups/{group}"): "admin",
    ("DELETE", "/v1/groups/{group}"): "admin",
    ("GET", "/v1/groups/{group}/policy"): "viewer",
    ("PATCH", "/v1/groups/{group}/policy"): "admin",
    ("POST", "/v1/groups/{group}/members"): "admin",
    ("DELETE", "/v1/groups/{group}/members/{member_id}"): "admin",
    ("POST", "/v1/groups/{group}/snapshots"): "operator",
    ("GET", "/v1/groups/{group}/snapshots"): "viewer",
    ("GET", "/v1/groups/{group}/rpo"): "viewer",
    ("GET", "/v1/groups/{group}/rpo/misses"): "viewer",
    ("POST", "/v1/groups/{group}/retention"): "operator",
    ("GET", "/v1/snapshots/{snapshot_id}"): "viewer",
    ("GET", "/v1/orphans"): "admin",
    ("POST", "/v1/orphans/sweep"): "admin",
    # DR
    ("GET", "/v1/groups/{group}/replication"): "viewer",
    ("GET", "/v1/snapshots/{snapshot_id}/replication"): "viewer",
    ("POST", "/v1/snapshots/{snapshot_id}/replicate"): "operator",
    ("GET", "/v1/groups/{group}/dr-policy"): "viewer",
    ("PUT", "/v1/groups/{group}/dr-policy"): "admin",
    ("POST", "/v1/groups/{group}/drills"): "operator",
    ("GET", "/v1/drills/{job_id}/report"): "viewer",
    ("PUT", "/v1/groups/{group}/plan"): "operator",
    ("GET", "/v1/groups/{group}/plan"): "viewer",
    ("GET", "/v1/groups/{group}/plan/versions"): "viewer",
    ("POST", "/v1/groups/{group}/failover"): "admin",
    ("POST", "/v1/groups/{group}/re-protect"): "admin",
    ("POST", "/v1/groups/{group}/failback"): "admin",
    ("POST", "/v1/groups/{group}/restore/clone"): "admin",
    ("POST", "/v1/groups/{group}/restore/in-place"): "admin",
    ("GET", "/v1/jobs"): "viewer",
    ("GET", "/v1/jobs/{job_id}"): "viewer",
    ("GET", "/v1/jobs/{job_id}/events"): "viewer",
    ("GET", "/v1/audit"): "admin",
    ("GET", "/v1/tokens"): "admin",
    ("POST", "/v1/tokens"): "admin",
    ("DELETE", "/v1/tokens/{token_id}"): "admin",
    ("GET", "/v1/webhooks"): "viewer",
    ("POST", "/v1/webhooks"): "admin",
    ("GET", "/v1/webhooks/events"): "viewer",
    ("DELETE", "/v1/webhooks/{webhook}"): "admin",
    ("GET", "/v1/webhooks/{webhook}/deliveries"): "viewer",
}
PUBLIC = {("GET", "/healthz"), ("GET", "/readyz"), ("GET", "/metrics")}
RANK = {"viewer": 0, "operator": 1, "admin": 2}


def _routes(app: Any) -> set[tuple[str, str]]:
    """Every operation the OpenAPI document publishes."""
    return {(m.upper(), path) for path, ops in app.openapi()["paths"].items() for m in ops}


def _fill(path: str) -> str:
    return (path.replace("{group}", "999999").replace("{job_id}", "nope")
            .replace("{site_id}", "999999").replace("{host_id}", "999999")
            .replace("{vm_id}", "999999").replace("{disk_id}", "999999")
            .replace("{member_id}", "999999").replace("{snapshot_id}", "999999")
            .replace("{token_id}", "999999").replace("{version}", "1"))


def test_every_route_is_in_the_table(app: Any) -> None:
    assert _routes(app) - PUBLIC == set(REQUIRED)


def test_auth_matrix(api: Any) -> None:
    failures = []
    for (method, path), need in sorted(REQUIRED.items()):
        url = _fill(path)
        r = api.as_(None).request(method, url, json={})
        if r.status_code != 401 or r.json().get("code") != "token_missing":
            failures.append((method, path, "anonymous", r.status_code))
        r = api.as_(None).request(method, url, json={},
                                  headers={"Authorization": "Bearer cp_not-a-token"})
        if r.status_code != 401 or r.json().get("code") != "token_invalid":
            failures.append((method, path, "bad token", r.status_code))
        for role in ("viewer", "operator", "admin"):
            r = api.as_(role).request(method, url, json={})
            allowed = RANK[role] >= RANK[need]
            if allowed and r.status_code in (401, 403):
                failures.append((method, path, role, r.status_code))
            if not allowed and (r.status_code != 403 or r.json()["code"] != "role_insufficient"):
                failures.append((method, path, role, r.status_code))
    assert failures == []


def test_public_routes_need_no_token(api: Any) -> None:
    for method, path in PUBLIC:
        assert api.as_(None).request(method, path).status_code == 200, path


def test_revoked_token_is_refused(api: Any) -> None:
    made = api.post("/v1/tokens", json={"name": "temp", "role": "viewer"}).json()
    hdr = {"Authorization": f"Bearer {made['token']}"}
    assert api.client.get("/v1/groups", headers=hdr).status_code == 200
    assert api.delete(f"/v1/tokens/{made['id']}").status_code == 200
    r = api.client.get("/v1/groups", headers=hdr)
    assert r.status_code == 401 and r.json()["code"] == "token_invalid"


def test_tokens_are_stored_hashed(api: Any, session_factory: Any) -> None:
    from cutpoint.api.models import ApiToken
    from sqlalchemy import select

    made = api.post("/v1/tokens", json={"name": "h", "role": "viewer"}).json()
    with session_factory() as s:
        stored = s.scalar(select(ApiToken).where(ApiToken.name == "h"))
        assert stored is not None
        assert made["token"] not in stored.token_hash and len(stored.token_hash) == 64
