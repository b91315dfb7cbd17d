"""The web console in headless Chromium against the lab: real agents, QEMU
guests running the writer on RBD disks, two Ceph sites, a Celery worker.

An operator signs in, opens group `app`, presses "Snapshot now" and
watches the job finish on its page (htmx polls the status; the page is
never reloaded); the snapshot becomes a DR recovery point (the worker
replicates it), the group page shows it at both sites with its lag; the
operator starts a drill of it from the group page, watches that job, and
opens the drill report: verdict, the writer check, the timeline.  The
page's figures are compared with what the REST API says of the same job
and snapshot.  Screenshots go under out/console/.
"""

from __future__ import annotations

from typing import Any

import pytest
from consolebrowser import Browser, browser  # api/tests/consolebrowser.py
from cutpoint.api.models import Role
from cutpoint.api.services import tokens
from fastapi.testclient import TestClient
from labflow import dr_plane, register  # noqa: F401  (api/tests/labflow.py; dr_plane: `plane`)
from liveapi import serve  # api/tests/liveapi.py
from plane import SECRET, Plane

pytestmark = [pytest.mark.lab,
              pytest.mark.lab_config(hosts=2, vms_per_host=1, disks=1, workload="writer")]


def _follow(b: Browser, timeout: float) -> list[str]:
    """Watch the job page until the job ends; the states it showed, in order.
    The page must stay the same document (live updates, no reload)."""
    b.d.execute_script("window.__job_page = true")
    seen: list[str] = []

    def done() -> bool:
        st = str(b.find("#job-status").get_attribute("data-state"))
        if not seen or seen[-1] != st:
            seen.append(st)
            print(f"  job page: {st} {b.text('#job-progress')}% {b.text('#job-message')}",
                  flush=True)
        return st in ("succeeded", "failed")

    b.wait(done, timeout, "the job's end on its page", every=0.5)
    assert b.d.execute_script("return window.__job_page === true"), "the page reloaded"
    return seen


def test_snapshot_and_drill_through_the_console(lab: dict[str, Any],
                                                agents: list[dict[str, Any]], plane: Plane,
                                                client: TestClient) -> None:
    plane.start("worker")
    register(client, lab, plane)
    with plane.sf() as s:
        _, operator = tokens.create(s, "console-operator", Role.operator, SECRET)
    print()
    with serve(plane.settings) as base, browser(base, "lab_snapshot_and_drill") as b:
        b.sign_in(operator)
        b.wait(lambda: b.has("#groups"), 30, "the groups page")
        b.find("a.group-link").click()
        b.wait(lambda: b.has("#snapshot-now"), 30, "the group page")
        b.shot("group-before")

        b.submit("#snapshot-now")
        job_id = b.path.rsplit("/", 1)[-1]
        states = _follow(b, 120)
        b.shot("snapshot-job-done")
        job = client.get(f"/v1/jobs/{job_id}").json()
        assert job["kind"] == "group_snapshot" and job["created_by"] == "console-operator"
        assert states[-1] == job["state"] == "succeeded", (states, job)
        assert b.text("#job-progress") == f"{100 * job['progress']:.0f}"
        snap = client.get("/v1/groups/app/snapshots").json()["items"][0]
        assert snap["id"] == job["snapshot_id"] and snap["state"] == "committed", snap

        # The worker replicates it; the group page shows it at DR once verified.
        b.find("#group-link").click()
        b.wait(lambda: b.has("#points"), 30, "the group page")

        def at_dr() -> bool:
            b.open("/console/groups/app")
            row = b.find(f"#points tr[data-txn='{snap['txn']}']")
            return "recovery point" in row.find_element("css selector", ".dr-point").text

        b.wait(at_dr, 300, f"snapshot {snap['txn']} verified at DR", every=3)
        rep = client.get("/v1/groups/app/replication").json()
        assert rep["newest_recovery_point"] == snap["txn"], rep
        rows = {r.get_attribute("data-site-role"): r for r in b.all("#site-rpo tbody tr")}
        lag = rows["dr"].find_element("css selector", ".lag").text
        print(f"  DR lag on the page: {lag}; REST: {rep['replication_lag_s']:.3f} s")
        assert lag.endswith(" s") and lag != "-", lag
        b.shot("group-recovery-point")

        # A drill of that recovery point, started from the group page.
        b.find(f"#drill-point option[value='{snap['txn']}']").click()
        b.submit("#drill-start")
        drill_id = b.path.rsplit("/", 1)[-1]
        states = _follow(b, 600)
        b.shot("drill-job-done")
        drill = client.get(f"/v1/jobs/{drill_id}").json()
        assert drill["kind"] == "drill" and states[-1] == drill["state"], (states, drill)
        b.submit("#drill-report-link")
        verdict = b.find("#verdict").get_attribute("data-verdict")
        b.shot("drill-report")
        report = drill["result"]
        assert verdict == report["verdict"] == "passed", report
        checks = {r.get_attribute("data-check"): r.get_attribute("data-ok")
                  for r in b.all("#checks tbody tr")}
        assert checks == {c["name"]: "true" if c["ok"] else "false"
                          for c in report["checks"]} == {"writer": "true"}, checks
        steps = [r.get_attribute("data-step") for r in b.all("#timeline tbody tr")]
        assert steps == [e["step"] for e in report["timeline"]], steps
        assert "boot" in steps and steps[-1] == "verdict"
        assert b.find("#cleanup").get_attribute("data-ok") == "true"
        print(f"  drill {report['drill_id']}: {verdict}, boot {report['boot_s']} s, "
              f"{len(steps)} timeline steps, screenshots in {b.dir}")
