"""Primary -> DR -> primary through the API, on the lab, with the writer
checker at every step and the writer running at every step.

A 2-VM writer group (2 primary hosts x 1 guest x 2 RBD disks, the writer
ring across both guests) is protected to DR, then:

1. planned failover to DR (workload `writer`): the writer checker passes on
   the recovery point at DR; the DR guests boot with `cp-writer --resume`
   (the lab booter's `failover_args`) and continue the run their disks
   hold: same run id, the next sequence numbers;
2. re-protect: the group now names the VMs at DR and replicates to the
   primary; its snapshot of the writing DR guests reaches the primary as
   deltas from the failover's recovery point (no full copy) and the writer
   checker passes on it there, with more records than the failover's;
3. failback: a planned failover back (its own failover job, workload
   `writer` again) and re-protect in the original direction: the primary
   guests run again from the primary's images and resume the run; the
   writer checker passes on the failback's recovery point at the primary
   and on the new re-protect snapshot at DR.  The failback's bytes shipped
   DR -> primary / bytes changed at DR are printed (the figure in
   docs/benchmarks.md) and checked: something was shipped, and never more
   than changed.

Every check reads a snapshot: the live images change under the writer.

The primary agents are restarted with start commands for their VMs
(`primary_start`): the lab starts primary guests itself, a failback starts
them through the agents, as on real hosts.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
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
from plane import Plane, wait_for

pytestmark = [pytest.mark.lab,
              pytest.mark.lab_config(hosts=2, vms_per_host=1, disks=2, backend="rbd",
                                     workload="writer",
                                     driver="qemu")]  # failback starts the primary's raw QEMU launchers

PROGRESS = re.compile(r"cp-writer: progress vm=\d+ seq=(\d+)")


def restart_primary_agents(lab: dict[str, Any], agents: list[dict[str, Any]]) -> None:
    from cutpoint.lab.agents import start_agent, stop_agent_pid

    certs = Path(lab["state_dir"]) / "certs"
    for h in lab["hosts"]:
        if h["site"] != "primary":
            continue
        stop_agent_pid(next(a["pid"] for a in agents if a["host"] == h["name"]))
        start_agent(lab, h, certs, primary_start=True)


def job(c: TestClient, plane: Plane, path: str, body: dict[str, Any] | None,
        what: str) -> dict[str, Any]:
    r = c.post(path, json=body) if body is not None else c.post(path)
    assert r.status_code == 202, r.text
    done = finish(c, r.json()["id"], what, plane, 600, follow=True)
    assert done["state"] == "succeeded", (done["error_code"], done["error"], plane.tail())
    return dict(done["result"])


def writing_past(guests: list[dict[str, Any]], p: int, plane: Plane) -> int:
    """Wait until every guest's writer resumed and reported a seq past `p`
    on its console (the ring's writers report the seq they last wrote or
    passed on); the smallest such seq."""
    def seqs() -> int | None:
        got = []
        for g in guests:
            text = Path(g["console"]).read_text(errors="replace")
            assert "cp-writer: error" not in text, text[-2000:]
            found = [int(x) for x in PROGRESS.findall(text)]
            got.append(max(found, default=0))
        return min(got) if min(got) > p else None
    return int(wait_for(seqs, 240, f"the writers past seq {p}", plane, every=1))


def test_primary_to_dr_and_back(lab: dict[str, Any], agents: list[dict[str, Any]],
                                plane: Plane, client: TestClient) -> None:
    from cutpoint.lab.drillboot import stop_guests, stop_standbys

    c = client
    restart_primary_agents(lab, agents)
    plane.start("worker")
    register(c, lab, plane)
    snapshot_and_replicate(c, plane)
    primaries = sorted(v["name"] for v in lab["vms"] if v["site"] == "primary")
    images = sorted(d["image"] for v in lab["vms"] if v["site"] == "primary"
                    for d in v["disks"])
    primary, dr = lab_site(lab, "primary"), lab_site(lab, "dr")
    guests: list[dict[str, Any]] = []
    try:
        # 1. Planned failover to DR; the DR guests resume the writer's run.
        fo = job(c, plane, "/v1/groups/app/failover",
                 {"mode": "planned", "workload": "writer"}, "failover to DR")
        guests = list(fo.get("guests") or [])
        at_dr = writer_verdict(dr, images, fo["snapshot_name"])
        assert at_dr.ok and at_dr.p > 0, at_dr.summary()
        seen = writing_past(guests, at_dr.p, plane)
        consoles = [Path(g["console"]).read_text(errors="replace") for g in guests]
        run_id = next(iter(at_dr.runs))
        assert all(f"run={run_id}" in t and "cp-writer: resume" in t for t in consoles), \
            consoles
        print(f"\n1. failover: RTO {fo['rto_s']} s; writer at DR on {fo['snapshot_name']} "
              f"{at_dr.summary()}; the DR writers resumed run {run_id} and passed seq {seen}")

        # 2. Re-protect DR -> primary, the DR guests writing.
        rp = job(c, plane, "/v1/groups/app/re-protect", None, "re-protect")
        assert (rp["active"], rp["protected_to"]) == ("dr", "primary"), rp
        assert rp["full_copy"] is False and rp["full_copy_why"] is None, rp
        group = c.get("/v1/groups/app").json()
        assert group["enabled"] is True and group["policy"]["replication_target"] == "primary"
        assert {m["host"] for m in group["members"]} <= \
            {h["name"] for h in lab["hosts"] if h["site"] == "dr"}, group
        back = writer_verdict(primary, images, f"cp.app.{rp['txn']}")
        assert back.ok and back.p > at_dr.p and back.runs.keys() == at_dr.runs.keys(), \
            (back.summary(), at_dr.summary())
        assert 0 < rp["bytes_shipped"] <= rp["bytes_changed"], rp
        print(f"2. re-protect: {rp['bytes_shipped']} B shipped of {rp['bytes_changed']} B "
              f"changed; writer at the primary on {rp['txn']}: {back.summary()}")
        r = c.post("/v1/groups/app/re-protect")
        assert r.status_code == 409 and r.json()["code"] == "already_protected", r.text

        # 3. Failback: planned failover back, then re-protect to DR again.
        fb = job(c, plane, "/v1/groups/app/failback", {"workload": "writer"}, "failback")
        stop_guests(guests)  # the DR guests the failover started (stopped by the fence)
        guests = list(fb["failover"].get("guests") or [])
        assert sorted(g["vm"] for g in guests) == primaries, fb
        assert inventory_states(lab, plane) == dict.fromkeys(primaries, "running")
        assert "running" not in inventory_states(lab, plane, "dr").values()
        fo2 = fb["failover"]
        home = writer_verdict(primary, images, fo2["snapshot_name"])
        assert home.ok and home.p > back.p and home.runs.keys() == at_dr.runs.keys(), \
            (home.summary(), back.summary())
        again = fb["reprotect"]
        assert (again["active"], again["protected_to"]) == ("primary", "dr"), again
        assert again["full_copy"] is False, again
        at_dr2 = writer_verdict(dr, images, f"cp.app.{again['txn']}")
        assert at_dr2.ok and at_dr2.p >= home.p, (at_dr2.summary(), home.summary())
        seen2 = writing_past(guests, home.p, plane)
        shipped = changed = 0
        for sid in (fo2["online_snapshot_id"], fo2["snapshot_id"]):
            rep = c.get(f"/v1/snapshots/{sid}/replication").json()
            assert not any(m["full"] for m in rep["members"]), rep
            shipped += sum(m["bytes_shipped"] for m in rep["members"])
            changed += sum(m["bytes_changed"] for m in rep["members"])
        # The engine ships a changed block's data or zeroes it at the target
        # (docs/dr.md, "The copy back"), so shipped <= changed; the DR
        # writers wrote, so something must have been shipped.
        assert 0 < shipped <= changed, (shipped, changed)
        print(f"3. failback: RTO {fb['rto_s']} s; DR -> primary {shipped} B shipped of "
              f"{changed} B changed (ratio {shipped / changed:.3f}); re-protect to "
              f"DR {again['bytes_shipped']} B of {again['bytes_changed']} B; writer at the "
              f"primary on {fo2['snapshot_name']} {home.summary()}, at DR on {again['txn']} "
              f"{at_dr2.summary()}; the primary writers resumed and passed seq {seen2}")
    finally:
        stop_guests(guests)
        stop_standbys(lab)
