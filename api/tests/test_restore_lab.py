"""Restore of a group snapshot through the API, against the lab.

A 2-VM writer group (2 primary hosts x 1 guest x 2 RBD disks, the writer
ring across both guests) takes a group snapshot, replicated to DR, while
the guests write.  Then, checked against Ceph itself:

- restore as clones at the primary: every clone reads exactly as its
  member snapshot (SHA-256), the writer checker passes on the clones, the
  originals still run and keep their snapshot; asking again with the same
  names is refused (`clone_exists`) and creates nothing;
- restore as clones at DR from the recovery point: the same, on DR's copies;
- restore in place while the guests run: refused (`vms_running`) naming
  both VMs, nothing rolled back (the images keep changing);
- after `vm.stop` of both guests: restore in place succeeds, every image
  reads as its snapshot again and the writer checker passes on the heads.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from cutpoint.coordinator.dr.site import CephConnection
from fastapi.testclient import TestClient
from labflow import (  # api/tests/labflow.py
    dr_plane,  # noqa: F401  the `plane` fixture
    finish,
    inventory_states,
    lab_site,
    register,
    snapshot_and_replicate,
    writer_verdict,
)
from plane import Plane

pytestmark = [pytest.mark.lab,
              pytest.mark.lab_config(hosts=2, vms_per_host=1, disks=2, backend="rbd",
                                     workload="writer")]


def stop_vms(lab: dict[str, Any], plane: Plane, site: str = "primary") -> None:
    """`vm.stop` of every VM of `site` through its agent (the coordinator's certificate)."""
    from cutpoint.agentclient import AgentClient, client_context

    st = plane.settings
    ctx = client_context(st.agent_ca, st.agent_cert, st.agent_key)

    async def one(h: dict[str, Any], vms: list[str]) -> None:
        async with AgentClient(h["address"], 7443, ssl_context=ctx) as ac:
            for vm in vms:
                await ac.call("vm.stop", {"vm": vm}, timeout=30)

    for h in lab["hosts"]:
        vms = [v["name"] for v in lab["vms"] if v["host"] == h["name"] and v["site"] == site]
        if vms:
            asyncio.run(one(h, vms))


def images_of(lab: dict[str, Any]) -> list[str]:
    return sorted(d["image"] for v in lab["vms"] if v["site"] == "primary" for d in v["disks"])


def sums(site: Any, images: list[str], snap: str | None) -> dict[str, str]:
    with CephConnection(site) as ceph:
        return {i: ceph.sha256(site.pool("rbd"), i, snap) for i in images}


def restore(c: TestClient, plane: Plane, how: str, body: dict[str, Any]) -> dict[str, Any]:
    r = c.post(f"/v1/groups/app/restore/{how}", json=body)
    assert r.status_code == 202, r.text
    job = finish(c, r.json()["id"], f"restore {how}", plane, 300, follow=True)
    assert job["state"] == "succeeded", (job["error_code"], job["error"], plane.tail())
    events = c.get(f"/v1/jobs/{job['id']}/events").json()
    assert [e["step"] for e in events].count("clone" if how == "clone" else "rollback") == \
        len(job["result"]["disks"]), events
    return dict(job["result"])


def test_restore_as_clones_and_in_place(lab: dict[str, Any], plane: Plane,
                                        client: TestClient) -> None:
    c = client
    plane.start("worker")
    register(c, lab, plane)
    point = snapshot_and_replicate(c, plane)
    snap = f"cp.app.{point['txn']}"
    images = images_of(lab)
    primary, dr = lab_site(lab, "primary"), lab_site(lab, "dr")
    at_snap = sums(primary, images, snap)

    # As clones at the primary: the clones read as the snapshot, the writer
    # checker passes on them; the originals keep running and changing.
    res = restore(c, plane, "clone", {"snapshot": str(point["snapshot_id"])})
    clones = {d["disk"]: d["clone"].split("/", 1)[1] for d in res["disks"]}
    assert len(clones) == len(images) == 4, res
    src_of = {d["clone"].split("/", 1)[1]: d["source"].split("/", 1)[1].split("@")[0]
              for d in res["disks"]}
    got = sums(primary, sorted(clones.values()), None)
    assert {src_of[k]: v for k, v in got.items()} == at_snap
    v = writer_verdict(primary, sorted(clones.values()), None)
    assert v.ok and v.p > 0, v.summary()
    print(f"\nclones at the primary: {sorted(clones.values())}; writer {v.summary()}")
    assert set(inventory_states(lab, plane).values()) == {"running"}
    r = c.post("/v1/groups/app/restore/clone", json={"snapshot": str(point["snapshot_id"])})
    assert r.status_code == 409 and r.json()["code"] == "clone_exists", r.text
    assert len(r.json()["items"]) == 4

    # As clones at DR, from the recovery point.
    res = restore(c, plane, "clone", {"snapshot": point["txn"], "site": "dr",
                                      "suffix": "drclone"})
    dr_clones = sorted(d["clone"].split("/", 1)[1] for d in res["disks"])
    assert dr_clones == sorted(f"{i}-drclone" for i in images)
    got = sums(dr, dr_clones, None)
    assert {k.removesuffix("-drclone"): v for k, v in got.items()} == at_snap
    v = writer_verdict(dr, dr_clones, None)
    assert v.ok and v.p > 0, v.summary()

    # In place while the guests run: refused, naming both, nothing touched.
    r = c.post("/v1/groups/app/restore/in-place", json={"snapshot": point["txn"]})
    assert r.status_code == 409, r.text
    body = r.json()
    assert body["code"] == "vms_running", body
    running = {x["vm"] for x in body["vms"]}
    assert running == {v["name"] for v in lab["vms"] if v["site"] == "primary"}, body
    print(f"in place while running: 409 {body['detail']}")
    assert len(c.get("/v1/jobs", params={"kind": "restore"}).json()["items"]) == 2

    # Stopped: the in-place restore rolls every image back to the snapshot.
    stop_vms(lab, plane)
    assert set(inventory_states(lab, plane).values()) == {"shutoff"}
    assert sums(primary, images, None) != at_snap  # the guests wrote after the cut
    res = restore(c, plane, "in-place", {"snapshot": point["txn"]})
    assert all(d["rolled_back"] for d in res["disks"]), res
    assert sums(primary, images, None) == at_snap
    v = writer_verdict(primary, images, None)
    assert v.ok and v.p > 0, v.summary()
    print(f"in place after stop: {res['seconds']} s, writer {v.summary()}")
