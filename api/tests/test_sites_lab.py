"""Site registration against the lab's two Ceph clusters (cephx on, no VMs).

The API runs the site check before it stores a site's Ceph access: with the
lab's `client.cutpoint` every step passes (201); with `client.cutpoint-ro`
the check stops at `create_image` with `ceph_permission_denied`, and with a
pool map naming a pool that does not exist at `pool_exists` with
`ceph_not_found` (422 problems naming the check; nothing stored).  The
keyring's key appears in no response and no log line.  The same through
the CLI against a real API process.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from apiserver import api_server  # api/tests/apiserver.py
from cutpoint.coordinator.dr.site import CephConnection
from cutpoint.coordinator.dr.site_check import SCRATCH_PREFIX
from cutpoint.lab.sites import access, ceph_site, cli_args, registration

pytestmark = [pytest.mark.lab, pytest.mark.lab_config(hosts=1, vms_per_host=0)]

STEPS = ["connect", "pool_exists", "create_image", "create_snapshot", "snapshot_latency",
         "write", "diff", "remove_snapshot", "remove_image"]


def keys(lab: dict[str, Any]) -> list[str]:
    """Every key of the lab clients the control plane is given (both sites)."""
    out = []
    for site in lab["sites"].values():
        for c in site["clients"].values():
            out += [line.split("=", 1)[1].strip() for line in
                    Path(c["keyring"]).read_text().splitlines()
                    if line.strip().startswith("key")]
    assert len(out) == 4
    return out


def no_scratch_left(lab: dict[str, Any]) -> None:
    for name in ("primary", "dr"):
        with CephConnection(ceph_site(lab, name)) as c:
            assert not [i for i in c.list_images("rbd") if i.startswith(SCRATCH_PREFIX)]


def problem(r: Any, status: int, code: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    body = dict(r.json())
    assert body["code"] == code and body["status"] == status, body
    return body


def test_registration_with_the_cutpoint_client_passes_its_check(
        lab: dict[str, Any], api: Any, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    texts = []
    for name in ("primary", "dr"):
        r = api.post("/v1/sites", json=registration(lab, name))
        assert r.status_code == 201, r.text
        texts.append(r.text)
        s = r.json()
        want = access(lab, name)
        assert s["ceph"]["client_id"] == "cutpoint" and s["ceph"]["keyring"] == want["keyring"]
        check = s["last_check"]
        assert check["ok"] and check["failed_check"] is None and check["checked_at"]
        assert [st["name"] for st in check["steps"]] == STEPS
        assert all(st["status"] == "pass" for st in check["steps"]), check
        r = api.post(f"/v1/sites/{s['id']}/check")
        assert r.status_code == 200 and r.json()["ok"], r.text
        texts.append(r.text)
    texts += [api.get("/v1/sites").text, caplog.text]
    for key in keys(lab):
        assert not any(key in t for t in texts)
    no_scratch_left(lab)


def test_the_read_only_client_is_refused_naming_create_image(lab: dict[str, Any],
                                                             api: Any) -> None:
    r = api.post("/v1/sites", json=registration(lab, "dr", role="readonly"))
    body = problem(r, 422, "site_check_failed")
    assert (body["failed_check"], body["failed_pool"], body["ceph_code"]) == \
        ("create_image", "rbd", "ceph_permission_denied")
    assert body["errno"] in (1, 13)
    assert [st["status"] for st in body["checks"][:3]] == ["pass", "pass", "fail"]
    assert "create_image" in body["detail"] and "client" not in body.get("keyring", "")
    assert api.get("/v1/sites").json()["items"] == []
    for key in keys(lab):
        assert key not in r.text
    no_scratch_left(lab)


def test_a_missing_pool_is_refused_naming_pool_exists(lab: dict[str, Any], api: Any) -> None:
    body_in = registration(lab, "dr")
    body_in["ceph"]["pools"] = {"rbd": "rbd", "db": "no-such-pool"}
    body = problem(api.post("/v1/sites", json=body_in), 422, "site_check_failed")
    assert (body["failed_check"], body["failed_pool"], body["ceph_code"]) == \
        ("pool_exists", "db", "ceph_not_found")
    assert "no-such-pool" in body["detail"]
    assert all(st["status"] == "pass" for st in body["checks"] if st["pool"] == "rbd")
    assert api.get("/v1/sites").json()["items"] == []


def test_a_change_to_a_client_without_caps_is_refused_and_changes_nothing(
        lab: dict[str, Any], api: Any) -> None:
    r = api.post("/v1/sites", json=registration(lab, "dr"))
    assert r.status_code == 201, r.text
    before = r.json()
    ro = access(lab, "dr", "readonly")
    r = api.patch(f"/v1/sites/{before['id']}", json={"ceph": {
        "client_id": ro["client_id"], "keyring": ro["keyring"]}})
    body = problem(r, 422, "site_check_failed")
    assert (body["failed_check"], body["ceph_code"]) == ("create_image",
                                                          "ceph_permission_denied")
    assert api.get(f"/v1/sites/{before['id']}").json() == before
    r = api.patch(f"/v1/sites/{before['id']}", json={"ceph": {"op_timeout_s": 20}})
    assert r.status_code == 200, r.text
    assert r.json()["ceph"]["op_timeout_s"] == 20 and r.json()["last_check"]["ok"]
    assert r.json()["version"] == before["version"] + 1


def test_the_site_commands_on_the_lab(lab: dict[str, Any], tmp_path: Path) -> None:
    with api_server(tmp_path) as srv:
        outs = []

        def shown(args: list[str], r: Any) -> None:  # for docs/dr.md (-s)
            print(f"$ cutpoint {' '.join(args)}\n{r.stdout}{r.stderr}(exit {r.returncode})")

        args = ["site", "add", "dr", *cli_args(lab, "dr")]
        r = srv.cli(*args)
        shown(args, r)
        outs.append(r.stdout + r.stderr)
        assert r.returncode == 0, outs[-1]
        assert "client.cutpoint at" in r.stdout and "check ok" in r.stdout, r.stdout
        args = ["site", "add", "dr-ro", *cli_args(lab, "dr", role="readonly")]
        r = srv.cli(*args)
        shown(args, r)
        outs.append(r.stdout + r.stderr)
        assert r.returncode == 1, outs[-1]
        assert "site_check_failed" in r.stderr and "create_image" in r.stderr
        assert "ceph_permission_denied" in r.stderr
        r = srv.cli("site", "check", "dr")
        shown(["site", "check", "dr"], r)
        outs.append(r.stdout + r.stderr)
        assert r.returncode == 0 and "check passed" in r.stdout, outs[-1]
        for step in STEPS:
            assert step in r.stdout
        r = srv.cli("site", "update", "dr", "--op-timeout", "20")
        outs.append(r.stdout + r.stderr)
        assert r.returncode == 0 and "v2" in r.stdout, outs[-1]
        r = srv.cli("site", "show", "dr")
        shown(["site", "show", "dr"], r)
        outs.append(r.stdout + r.stderr)
        assert f"keyring: {access(lab, 'dr')['keyring']}" in r.stdout, r.stdout
        assert "op_timeout_s: 20" in r.stdout and "last check: ok" in r.stdout
        r = srv.cli("site", "list")
        outs.append(r.stdout + r.stderr)
        assert "dr-ro" not in r.stdout and "client.cutpoint at" in r.stdout
        outs.append(srv.log())
    for key in keys(lab):
        assert not any(key in t for t in outs)
    no_scratch_left(lab)
