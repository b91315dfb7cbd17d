"""A group through the control plane on the lab, for the failover and fencing
lab tests: register sites, hosts and the group, take and replicate group
snapshots, follow jobs, ask the agents what runs.  The sites are registered
through the API with their Ceph access (`register_lab_site`, as the control
plane's client.cutpoint), so the worker and the in-process API (a failover
request's preconditions) read the same sites from the plane's database."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cutpoint.api import services_local
from fastapi.testclient import TestClient
from plane import (  # api/tests/plane.py
    Plane,
    agent_vm_states,
    lab_pin,
    lab_plane,
    register_lab_site,
    wait_for,
)


@pytest.fixture(name="plane")
def dr_plane(lab: dict[str, Any], agents: list[dict[str, Any]], tmp_path: Path,
             local_services: services_local.Endpoints) -> Iterator[Plane]:
    """The `plane` of a DR lab test module (import it: `from labflow import
    dr_plane`): the lab's agents up, the plane of failover_plane."""
    with failover_plane(lab, tmp_path, local_services) as p:
        yield p


@contextlib.contextmanager
def failover_plane(lab: dict[str, Any], tmp_path: Path,
                   local_services: services_local.Endpoints) -> Iterator[Plane]:
    """The plane of a test module's `plane` fixture."""
    with lab_plane(lab, tmp_path, int(local_services.redis_port or 0),
                   CUTPOINT_AGENT_TIMEOUT_S="15",  # vm.stop waits for QEMU to exit
                   CUTPOINT_RETENTION_INTERVAL_S="3600", CUTPOINT_INVENTORY_INTERVAL_S="3600") as p:
        yield p


DONE = ("succeeded", "failed")


def finish(c: TestClient, job_id: str, what: str, plane: Plane, timeout: float = 300,
           follow: bool = False) -> dict[str, Any]:
    """Poll the job until it ends; with `follow`, print each new progress message."""
    seen = ""

    def done() -> bool:
        nonlocal seen
        j = c.get(f"/v1/jobs/{job_id}").json()
        if follow and j["message"] != seen:
            seen = j["message"]
            print(f"  job {j['state']} {j['progress']:.2f} {seen}", flush=True)
        return j["state"] in DONE

    wait_for(done, timeout, what, plane)
    return dict(c.get(f"/v1/jobs/{job_id}").json())


def register(c: TestClient, lab: dict[str, Any], plane: Plane) -> None:
    for site in ("primary", "dr"):
        register_lab_site(c, lab, site)
    for h in lab["hosts"]:
        r = c.post("/v1/hosts", json={"name": h["name"], "site": h["site"],
                                      "address": h["address"], "port": 7443,
                                      "cert_fingerprint": lab_pin(lab, h["name"])})
        assert r.status_code == 201, r.text
        job = c.post(f"/v1/hosts/{r.json()['id']}/sync").json()
        done = finish(c, job["id"], f"inventory sync of {h['name']}", plane, 60)
        assert done["state"] == "succeeded", done
    r = c.post("/v1/groups", json={"name": "app", "policy": {
        "lease_ms": 3000, "pause_budget_ms": 2000, "keep_last": 100,
        "replication_target": "dr"}})
    assert r.status_code == 201, r.text
    for vm in lab["vms"]:
        if vm["site"] == "primary":
            # The DR agent lists a standby of the same name: say which host.
            r = c.post("/v1/groups/app/members", json={"vm": vm["name"], "host": vm["host"]})
            assert r.status_code == 201, r.text


def snapshot_and_replicate(c: TestClient, plane: Plane) -> dict[str, Any]:
    """A group snapshot through the API; its replicate job makes it a recovery point."""
    job = c.post("/v1/groups/app/snapshots").json()
    done = finish(c, job["id"], "group snapshot", plane, 90)
    assert done["state"] == "succeeded", done
    sid = done["snapshot_id"]

    def verified() -> dict[str, Any] | None:
        rep = c.get(f"/v1/snapshots/{sid}/replication").json()
        assert rep["state"] != "failed", rep
        return rep if rep["recovery_point"] else None

    return dict(wait_for(verified, 300, f"replication of snapshot {sid}", plane, every=1))


def inventory_states(lab: dict[str, Any], plane: Plane, site: str = "primary") \
        -> dict[str, str]:
    """Each primary VM's state from the agents of `site` (not listed: 'absent')."""
    seen = agent_vm_states(lab, plane, site)
    return {v["name"]: seen.get(v["name"], "absent") for v in lab["vms"]
            if v["site"] == "primary"}


def lab_site(lab: dict[str, Any], name: str) -> Any:
    """Lab site `name` as a CephSite reached with the lab's own (admin)
    client: what the tests read to judge, not what the product used."""
    from cutpoint.lab.sites import ceph_site

    return ceph_site(lab, name, role="admin")


def writer_verdict(site: Any, images: list[str], snap: str | None) -> Any:
    """The writer checker's verdict on the images (in the site's pool `rbd`)."""
    from cutpoint.checkers.writer import RbdSpec, scan_specs

    return scan_specs([RbdSpec(site.pool("rbd"), i, snap, site.ceph_conf, site.client_id,
                               site.keyring) for i in images])
