"""Sites and their Ceph access through the API, with no Ceph cluster up.

What needs no cluster: the schemas (a keyring is a path, never a key, and
a refusal does not repeat what was sent), the check refusing a site whose
ceph.conf is missing or whose mons do not answer (each failing step named,
with its Ceph code), `check: false`, changes and removal, and the check
route keeping its result.  `test_sites_lab.py` does the same against the
lab's clusters.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

KEY = "AQBmDUlnAAAAABAAp9n3yQ4bC4YVb9QkzQ3xYw=="


@pytest.fixture
def keyring(tmp_path: Path) -> str:
    """A keyring file with a key of the right form (no cluster knows it)."""
    p = tmp_path / "ceph.client.cutpoint.keyring"
    p.write_text(f"[client.cutpoint]\n\tkey = {KEY}\n")
    p.chmod(0o600)
    return str(p)


def ceph(**kw: Any) -> dict[str, Any]:
    return {"ceph_conf": "/nonexistent/dr/ceph.conf", "pools": {"rbd": "rbd"}, **kw}


def problem(r: Any, status: int, code: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/problem+json"), r.headers
    body = dict(r.json())
    assert body["code"] == code and body["status"] == status, body
    return body


def test_a_site_without_ceph_access(api: Any) -> None:
    r = api.post("/v1/sites", json={"name": "plain"})
    assert r.status_code == 201, r.text
    assert r.json()["ceph"] is None and r.json()["last_check"] is None
    sid = r.json()["id"]
    problem(api.post(f"/v1/sites/{sid}/check"), 409, "site_has_no_ceph")


def test_registration_runs_the_check_and_refuses_a_missing_ceph_conf(api: Any) -> None:
    body = problem(api.post("/v1/sites", json={"name": "dr", "ceph": ceph()}), 422,
                   "site_check_failed")
    assert (body["failed_check"], body["ceph_code"], body["errno"]) == \
        ("connect", "ceph_not_found", 2)
    assert "/nonexistent/dr/ceph.conf" in body["detail"]
    assert body["checks"][0]["status"] == "fail"
    assert all(s["status"] == "skip" for s in body["checks"][1:])
    assert {s["name"] for s in body["checks"][1:]} >= {"pool_exists", "create_image"}
    assert api.get("/v1/sites").json()["items"] == []  # nothing stored


def test_unreachable_mons_are_503_naming_connect(api: Any, keyring: str) -> None:
    access = {"mon_host": ["127.0.0.1:1"], "keyring": keyring, "pools": {"rbd": "rbd"},
              "connect_timeout_s": 2}
    body = problem(api.post("/v1/sites", json={"name": "far", "ceph": access}), 503,
                   "site_check_failed")
    assert (body["failed_check"], body["ceph_code"]) == ("connect", "ceph_unreachable")
    # Set up before its cluster answers: stored unchecked, then checked on demand.
    r = api.post("/v1/sites", json={"name": "far", "ceph": access, "check": False})
    assert r.status_code == 201, r.text
    site = r.json()
    assert site["ceph"]["mon_host"] == ["127.0.0.1:1"] and site["last_check"] is None
    body = problem(api.post(f"/v1/sites/{site['id']}/check"), 503, "site_check_failed")
    assert body["failed_check"] == "connect"
    last = api.get(f"/v1/sites/{site['id']}").json()["last_check"]
    assert last["ok"] is False and last["failed_check"] == "connect" and last["checked_at"]


def test_the_keyring_is_a_path_and_no_key_goes_out(api: Any, keyring: str,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    texts = []
    for bad in (KEY, f"[client.cutpoint]\n\tkey = {KEY}\n", f"/etc/ceph/x\nkey = {KEY}"):
        r = api.post("/v1/sites", json={"name": "k", "ceph": ceph(keyring=bad)})
        problem(r, 422, "validation_error")
        assert r.json()["errors"][0]["loc"][-1] == "keyring", r.json()
        texts.append(r.text)
    # A good one: stored and returned as the path.
    r = api.post("/v1/sites", json={"name": "k", "check": False,
                                    "ceph": {"mon_host": ["127.0.0.1:1"], "keyring": keyring,
                                             "pools": {"rbd": "rbd"},
                                             "connect_timeout_s": 1}})
    assert r.status_code == 201 and r.json()["ceph"]["keyring"] == keyring, r.text
    texts += [r.text, api.get("/v1/sites").text]
    texts.append(api.post(f"/v1/sites/{r.json()['id']}/check").text)
    texts.append(api.get("/v1/audit").text)
    texts.append(caplog.text)
    assert keyring in texts[3]
    for t in texts:
        assert KEY not in t and KEY[:20] not in t


@pytest.mark.parametrize("access, field", [
    ({"pools": {"rbd": "rbd"}}, "ceph"),  # neither ceph_conf nor mon_host
    (ceph(mon_host=["10.0.0.1:3300"]), "ceph"),  # both
    (ceph(pools={}), "pools"),
    (ceph(client_id="client.cutpoint"), "client_id"),
    (ceph(ceph_conf="etc/ceph/ceph.conf"), "ceph_conf"),  # not absolute
    (ceph(op_timeout_s=0), "op_timeout_s"),
    (ceph(secret="x"), "secret"),
])
def test_bad_ceph_access_is_refused_before_any_check(api: Any, access: dict[str, Any],
                                                     field: str) -> None:
    r = api.post("/v1/sites", json={"name": "bad", "ceph": access})
    body = problem(r, 422, "validation_error")
    assert any(field in e["loc"] for e in body["errors"]), body
    assert api.get("/v1/sites").json()["items"] == []


def test_default_client_is_cutpoint_not_admin(api: Any) -> None:
    r = api.post("/v1/sites", json={"name": "d", "ceph": ceph(), "check": False})
    assert r.status_code == 201, r.text
    assert r.json()["ceph"]["client_id"] == "cutpoint"
    assert r.json()["ceph"]["op_timeout_s"] == 30


def test_update_checks_a_changed_access_and_keeps_the_old_one_on_failure(api: Any,
                                                                        keyring: str) -> None:
    r = api.post("/v1/sites", json={"name": "u", "description": "a", "check": False,
                                    "ceph": ceph(keyring=keyring)})
    sid, etag = r.json()["id"], r.headers["ETag"]
    # The description alone: no check needed.
    r = api.patch(f"/v1/sites/{sid}", json={"description": "b"}, headers={"If-Match": etag})
    assert r.status_code == 200 and r.json()["description"] == "b", r.text
    before = r.json()
    # A changed access is checked, and the failure changes nothing.
    body = problem(api.patch(f"/v1/sites/{sid}", json={"ceph": {"op_timeout_s": 20}}), 422,
                   "site_check_failed")
    assert body["failed_check"] == "connect"
    assert api.get(f"/v1/sites/{sid}").json() == before
    # Unchecked: stored; a move from a ceph.conf to mon addresses.
    r = api.patch(f"/v1/sites/{sid}", json={"check": False, "ceph": {
        "ceph_conf": None, "mon_host": ["v2:10.0.0.1:3300"], "op_timeout_s": 20}})
    assert r.status_code == 200, r.text
    c = r.json()["ceph"]
    assert (c["ceph_conf"], c["mon_host"], c["op_timeout_s"], c["keyring"]) == \
        (None, ["v2:10.0.0.1:3300"], 20, keyring)
    # Both ways to the mons at once cannot be handed to cutpoint-sync.
    problem(api.patch(f"/v1/sites/{sid}", json={"check": False, "ceph": {
        "ceph_conf": "/etc/ceph/x.conf"}}), 422, "bad_site_ceph")
    # Removal.
    r = api.patch(f"/v1/sites/{sid}", json={"ceph": None})
    assert r.status_code == 200 and r.json()["ceph"] is None, r.text
    # A site with no access yet must be given all of it.
    problem(api.patch(f"/v1/sites/{sid}", json={"ceph": {"op_timeout_s": 5}}), 422,
            "bad_site_ceph")


def test_a_site_without_ceph_fails_replication_with_its_code(
        api: Any, session_factory: Any, dr_snapshot: Any, settings: Any) -> None:
    """The replicate job names the site without Ceph access, not a missing file."""
    from cutpoint.api.models import Disk, MemberSnapshot, Vm
    from cutpoint.api.services import replication
    from sqlalchemy import select

    snap_id = dr_snapshot(disks=(0,))
    with session_factory() as s:  # the member is the inventory's disk0 (an RBD image)
        disk = s.scalar(select(Disk).join(Vm).where(Vm.name == "primary-h1-vm1",
                                                    Disk.node == "disk0"))
        m = s.scalar(select(MemberSnapshot).where(MemberSnapshot.group_snapshot_id == snap_id))
        assert disk is not None and m is not None
        m.disk_id = disk.id
        s.commit()
    with pytest.raises(replication.ReplicationFailed) as ei:
        replication.run(session_factory, settings, snap_id)
    assert ei.value.code == "site_has_no_ceph", ei.value
    assert "primary" in str(ei.value) and "PATCH /v1/sites/" in str(ei.value)


def test_the_openapi_document_has_the_site_routes(api: Any) -> None:
    doc = api.get("/v1/openapi.json").json()
    assert "post" in doc["paths"]["/v1/sites/{site_id}/check"]
    props = doc["components"]["schemas"]["CephAccess"]["properties"]
    assert set(props) >= {"ceph_conf", "mon_host", "client_id", "keyring", "pools"}
    assert props["client_id"]["default"] == "cutpoint"
    assert "key" not in json.dumps(sorted(props)).replace("keyring", "")
