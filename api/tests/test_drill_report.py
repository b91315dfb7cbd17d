"""GET /v1/drills/{id}/report: a drill's evidence as JSON and as one HTML
page, from a report a lab drill wrote (data/drill-report-lab-2vm.json, two
VMs booted by the lab's booter, the writer check), rendered in headless
Chromium (Debian's chromium) with a screenshot under out/drill-report/."""

from __future__ import annotations

import copy
import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest
from consolebrowser import OUT, start_chromium  # api/tests/consolebrowser.py
from cutpoint.api.models import Group, GroupSnapshot, Job, JobState, SnapState
from cutpoint.api.services import history
from sqlalchemy import select

DATA = Path(__file__).parent / "data" / "drill-report-lab-2vm.json"
JOB = "00000000-0000-4000-8000-0000000000d1"


def _seed(sf: Any, report: dict[str, Any], job_id: str = JOB,
          state: JobState = JobState.succeeded, later_s: float = 0) -> dict[str, Any]:
    """Group app, its point cut 40 s before the drill was asked for, and the
    drill job, asked for 0.5 s before the drill's first event."""
    start_at = float(report["timeline"][0]["at"]) if report else 1795718455.0
    requested = dt.datetime.fromtimestamp(start_at - 0.5 + later_s, dt.UTC)
    with sf() as s:
        g = s.scalar(select(Group).where(Group.name == "app"))
        if g is None:
            g = Group(name="app")
            s.add(g)
            s.flush()
        snap = GroupSnapshot(group_id=g.id, txn=f"t{job_id[-2:]}", state=SnapState.committed,
                             cut_at=requested - dt.timedelta(seconds=40))
        s.add(snap)
        s.flush()
        s.add(Job(id=job_id, kind="drill", group_id=g.id, snapshot_id=snap.id, state=state,
                  created_at=requested, finished_at=requested + dt.timedelta(seconds=20)
                  if state != JobState.running else None, result=report))
        s.commit()
    return {"requested": requested, "start_at": start_at}


def test_report_json_has_rpo_rto_and_one_row_per_vm(api: Any, session_factory: Any) -> None:
    report = json.loads(DATA.read_text())
    _seed(session_factory, report)
    r = api.as_("viewer").get(f"/v1/drills/{JOB}/report")
    assert r.status_code == 200, r.text
    ev = r.json()
    assert ev["group"] == "app" and ev["verdict"] == "passed"
    assert ev["point_age_s"] == 40.0
    # Asked for 0.5 s before the drill's start; the last VM was ready 12.964 s in.
    assert ev["rto_s"] == pytest.approx(0.5 + 12.964, abs=0.002)
    assert [v["vm"] for v in ev["vms"]] == ["primary-h1-vm1", "primary-h2-vm1"]
    steps = [s["step"] for s in ev["vms"][0]["segments"]]
    assert steps == ["clone", "boot", "writer", "teardown"]
    (check,) = ev["checks"]
    assert check["ok"] and check["output"]["verdict"]["records"] == 3702


def test_a_vm_that_never_was_ready_has_no_rto(api: Any, session_factory: Any) -> None:
    """The negative control of the RTO: drop one VM's `boot ok`, as a drill whose
    VM never came up records it; its boot segment is failed and there is no RTO."""
    report = json.loads(DATA.read_text())
    broken = copy.deepcopy(report)
    broken["timeline"] = [e for e in broken["timeline"]
                          if not (e["step"] == "boot" and e.get("vm") == "primary-h2-vm1")]
    _seed(session_factory, broken)
    ev = api.as_("viewer").get(f"/v1/drills/{JOB}/report").json()
    assert ev["rto_s"] is None
    boot = {v["vm"]: v["segments"][1] for v in ev["vms"]}
    assert boot["primary-h2-vm1"]["status"] == "failed"
    assert boot["primary-h1-vm1"]["status"] == "ok"


def test_report_refusals(api: Any, session_factory: Any) -> None:
    report = json.loads(DATA.read_text())
    _seed(session_factory, {}, job_id="00000000-0000-4000-8000-0000000000d2",
          state=JobState.running)
    _seed(session_factory, report)
    assert api.as_(None).get(f"/v1/drills/{JOB}/report").status_code == 401
    r = api.get("/v1/drills/00000000-0000-4000-8000-0000000000d2/report")
    assert r.status_code == 409 and r.json()["code"] == "drill_not_finished", r.text
    r = api.get("/v1/drills/00000000-0000-4000-8000-00000000ffff/report")
    assert r.status_code == 404 and r.json()["code"] == "job_not_found", r.text
    with session_factory() as s:
        s.add(Job(id="00000000-0000-4000-8000-0000000000d3", kind="retention",
                  state=JobState.succeeded))
        s.commit()
    r = api.get("/v1/drills/00000000-0000-4000-8000-0000000000d3/report")
    assert r.status_code == 404 and r.json()["code"] == "not_a_drill", r.text


def test_report_html_in_chromium_shows_one_timeline_row_per_vm(api: Any,
                                                               session_factory: Any) -> None:
    report = json.loads(DATA.read_text())
    _seed(session_factory, report)
    r = api.as_("viewer").get(f"/v1/drills/{JOB}/report", headers={"Accept": "text/html"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html"), r.text
    assert api.get(f"/v1/drills/{JOB}/report?format=html").text == r.text
    out = OUT.parent / "drill-report"
    out.mkdir(parents=True, exist_ok=True)
    page = out / "report.html"
    page.write_text(r.text)
    from selenium.webdriver.common.by import By

    d = start_chromium()
    try:
        d.get(page.as_uri())
        rows = d.find_elements(By.CSS_SELECTOR, "#timeline svg g.vm-row")
        assert [row.get_attribute("data-vm") for row in rows] == [
            "primary-h1-vm1", "primary-h2-vm1"]
        for row in rows:  # each drawn: its segments have a width on the page
            segs = row.find_elements(By.CSS_SELECTOR, "rect.seg")
            assert [s.get_attribute("data-step") for s in segs] == [
                "clone", "boot", "writer", "teardown"]
            assert all(s.rect["width"] > 0 for s in segs)
        assert d.find_element(By.ID, "verdict").text == "PASSED"
        assert d.find_element(By.ID, "rto").text == "13.5 s"
        assert d.find_element(By.ID, "rpo").text == "40.0 s"
        checks = d.find_elements(By.CSS_SELECTOR, "#checks tr.check")
        assert len(checks) == 1 and "3702 records" in checks[0].text
        shot = out / "report.png"
        assert d.save_screenshot(str(shot)) and shot.stat().st_size > 5000
    finally:
        d.quit()


def test_the_newest_drill_reports_of_a_group_outlive_history_pruning(
        session_factory: Any) -> None:
    report = json.loads(DATA.read_text())
    ids = [f"00000000-0000-4000-8000-0000000001{n:02d}" for n in range(4)]
    for n, i in enumerate(ids):
        _seed(session_factory, report, job_id=i, later_s=60 * n)
    with session_factory() as s:
        res = history.prune(s, keep_days=1, now=dt.datetime.now(dt.UTC)
                            + dt.timedelta(days=3650), keep_drills=2)
        left = set(s.scalars(select(Job.id).where(Job.kind == "drill")))
    assert res.jobs == 2
    assert left == set(ids[2:])  # the newest two (created last)


def test_a_planned_drill_through_the_agents_shows_the_order_kept() -> None:
    """The evidence of a real drill of two libvirt VMs through the DR agents
    with a plan of two boot groups (api/tests/test_drill_agents_lab.py wrote
    it on this machine): vm2's group first, vm1's after it was ready.  The
    timeline row of vm1 waits until its group starts, its boot begins after
    vm2 was ready, and the page's boot-order table lists the groups so."""
    import json

    from cutpoint.coordinator.dr import drill_report, drill_timeline

    ev = json.loads((Path(__file__).parent / "data" / "drill-report-agents-plan.json")
                    .read_text())
    rows = {r["vm"]: r for r in drill_timeline.vm_rows(ev)}
    seg = {vm: {s["step"]: s for s in r["segments"]} for vm, r in rows.items()}
    assert "wait" not in seg["drl-vm2"] and "wait" in seg["drl-vm1"]
    assert seg["drl-vm1"]["boot"]["start_s"] >= rows["drl-vm2"]["ready_s"]
    assert [(b["group"], b["vms"]) for b in ev["boot_order"]] == \
        [("first", ["drl-vm2"]), ("second", ["drl-vm1"])]
    page = drill_report.render_evidence(ev)
    assert page.index("<td>first</td>") < page.index("<td>second</td>")
    assert drill_timeline.svg(list(rows.values())).count('data-step="wait"') == 1
