"""The web console in headless Chromium (Selenium, Debian's chromium and
chromedriver) against a real API over HTTP, on SQLite and on PostgreSQL,
with Redis as the job broker and no worker: what needs agents and Ceph
(a snapshot that finishes, a real drill) is test_console_lab.py.

Each test signs in through the form, asserts on the DOM, and saves
screenshots under out/console/.  Refusals are checked on the server: a
wrong token, a viewer's snapshot, an operator's failover, a wrong CSRF
token and a wrong typed confirmation are each refused with the REST API's
status and code, and leave no job behind.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import redis
from consolebrowser import Browser, browser  # api/tests/consolebrowser.py
from cutpoint.api import services_local
from cutpoint.api.config import Settings
from cutpoint.api.db import get_sessionmaker
from cutpoint.api.migrate import upgrade
from cutpoint.api.models import (
    AuditEntry,
    Disk,
    Group,
    GroupSnapshot,
    Host,
    Job,
    JobState,
    MemberSnapshot,
    Role,
    Site,
    SnapState,
    utcnow,
)
from cutpoint.api.services import inventory as inv
from cutpoint.api.services import tokens
from liveapi import serve  # api/tests/liveapi.py
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

SECRET = "console-test-secret-0123456789"
# A Redis database of its own: the jobs these tests queue are never run,
# and no other test's worker must pick them up.
REDIS_DB = 15
# The HTTP client's timeout, in seconds.  httpx's default (5 s) is no bound
# this test asserts: in `make test` this suite runs under nice beside the lab
# suites, and one POST of `_seed` outlived it once (ReadTimeout, rehearsal CI
# of 7a2d318, 2026-11-27) on a machine whose two cores ran TCG guests.
HTTP_TIMEOUT_S = 60.0


@dataclass
class Console:
    base: str
    sf: sessionmaker[Session]
    toks: dict[str, str]
    drills: dict[str, str]

    def jobs(self, kind: str | None = None) -> list[Job]:
        with self.sf() as s:
            q = select(Job)
            if kind:
                q = q.where(Job.kind == kind)
            return list(s.scalars(q))

    def rest(self, role: str) -> httpx.Client:
        return httpx.Client(base_url=self.base, timeout=HTTP_TIMEOUT_S,
                            headers={"Authorization": f"Bearer {self.toks[role]}"})


def _seed(sf: sessionmaker[Session], base: str, admin: str) -> dict[str, str]:
    """A primary site with one host and VM (two disks), a DR site, group
    `app` (RPO 60 s, replicating to dr) with two snapshots: t1 cut 90 s ago
    and verified at DR 12 s after its cut, t2 cut 30 s ago and not
    replicated; and two drills of t1, one passed and one failed, with their
    reports as the drill writes them.  Returns the drill job ids."""
    with sf() as s:
        site = Site(name="primary")
        s.add(site)
        s.flush()
        host = Host(name="primary-h1", site_id=site.id, address="10.77.1.1")
        s.add(host)
        s.flush()
        inv.apply(s, host, {"vms": [
            {"name": "primary-h1-vm1", "driver": "qemu", "state": "running",
             "disks": [{"id": f"primary-h1-vm1/disk{d}", "node": f"disk{d}", "backend": "rbd",
                        "pool": "rbd", "image": f"primary-h1-vm1-disk{d}"} for d in (0, 1)]}]})
        s.commit()
    with httpx.Client(base_url=base, timeout=HTTP_TIMEOUT_S,
                      headers={"Authorization": f"Bearer {admin}"}) as c:
        assert c.post("/v1/sites", json={"name": "dr"}).status_code == 201
        r = c.post("/v1/groups", json={"name": "app", "policy": {
            "replication_target": "dr", "rpo_seconds": 60}})
        assert r.status_code == 201, r.text
        r = c.post("/v1/groups/app/members", json={"vm": "primary-h1-vm1"})
        assert r.status_code == 201, r.text
    now = utcnow()
    out = {}
    with sf() as s:
        g = s.scalar(select(Group).where(Group.name == "app"))
        assert g is not None
        for txn, age, verified_after in (("t1", 90, 12.0), ("t2", 30, None)):
            cut = now - dt.timedelta(seconds=age)
            snap = GroupSnapshot(
                group_id=g.id, txn=txn, state=SnapState.committed, cut_at=cut,
                requested_at=cut - dt.timedelta(seconds=1), finished_at=cut,
                dr_verified_at=cut + dt.timedelta(seconds=verified_after)
                if verified_after is not None else None)
            s.add(snap)
            s.flush()
            for d in (0, 1):
                key = f"primary-h1-vm1/disk{d}"
                s.add(MemberSnapshot(group_snapshot_id=snap.id, host="primary-h1",
                                     vm="primary-h1-vm1", disk=key, name=f"cp.app.{txn}",
                                     state="present",
                                     disk_id=s.scalar(select(Disk.id).where(Disk.key == key))))
        t1 = s.scalar(select(GroupSnapshot.id).where(GroupSnapshot.txn == "t1"))
        for verdict, ok in (("passed", True), ("failed", False)):
            jid = f"00000000-0000-4000-8000-00000000000{1 if ok else 2}"
            started = now - dt.timedelta(seconds=600 if ok else 300)
            s.add(Job(id=jid, kind="drill", group_id=g.id, snapshot_id=t1,
                      state=JobState.succeeded if ok else JobState.failed, progress=1.0,
                      message=f"verdict {verdict}", created_by="test-operator",
                      created_at=started, started_at=started,
                      finished_at=started + dt.timedelta(seconds=41),
                      error_code=None if ok else "drill_failed",
                      error=None if ok else "drill d2 failed: writer: 3 gaps",
                      params={"group_id": g.id, "recovery_point": "t1",
                              "checks": ["writer"]},
                      result={"drill_id": f"d{1 if ok else 2}", "recovery_point": "cp.app.t1",
                              "verdict": verdict, "error": None, "booter": "LabBooter",
                              "checks": [{"name": "writer", "ok": ok,
                                          "summary": "records 1..5120, no gap" if ok
                                          else "3 gaps after record 4096"}],
                              "guests": [{"vm": "primary-h1-vm1", "state": "running"}],
                              "boot_s": 7.25, "cleanup": {"ok": True, "errors": [],
                                                          "leftovers": {"images": []}},
                              "timeline": [
                                  {"t_s": 0.0, "at": started.timestamp(), "step": "start",
                                   "status": "ok"},
                                  {"t_s": 7.25, "at": started.timestamp() + 7.25,
                                   "step": "boot", "status": "ok", "vm": "primary-h1-vm1"},
                                  {"t_s": 30.5, "at": started.timestamp() + 30.5,
                                   "step": "check", "status": "ok" if ok else "failed",
                                   "check": "writer"},
                                  {"t_s": 41.0, "at": started.timestamp() + 41.0,
                                   "step": "verdict", "status": verdict}]}))
            out[verdict] = jid
        s.commit()
    return out


@pytest.fixture(params=["sqlite", "postgresql"])
def console(request: pytest.FixtureRequest, empty_db: Any,
            local_services: services_local.Endpoints) -> Iterator[Console]:
    """The API (console included) over HTTP on a fresh database of that kind,
    one token per role, and `_seed`'s group."""
    url = empty_db(request.param)
    upgrade(url)
    redis_url = f"redis://127.0.0.1:{local_services.redis_port}/{REDIS_DB}"
    settings = Settings(database_url=url, redis_url=redis_url,
                        token_secret=SECRET)  # type: ignore[arg-type]
    sf = get_sessionmaker(url)
    toks = {}
    with sf() as s:
        for role in Role:
            toks[role.value] = tokens.create(s, f"test-{role.value}", role, SECRET)[1]
    try:
        with serve(settings) as base:
            yield Console(base, sf, toks, _seed(sf, base, toks["admin"]))
    finally:
        redis.Redis.from_url(redis_url).flushdb()


@pytest.fixture
def chrome(console: Console, request: pytest.FixtureRequest) -> Iterator[Browser]:
    with browser(console.base, request.node.name) as b:
        yield b


def _rows(b: Browser, css: str) -> dict[str, Any]:
    return {str(r.get_attribute("data-site-role")): r for r in b.all(css)}


def test_sign_in_shows_rpo_at_each_site_and_signs_out(console: Console, chrome: Browser) -> None:
    b = chrome
    b.open("/console/groups")
    assert b.path.startswith("/console/login"), b.path  # no session: the sign-in page
    b.shot("sign-in")

    b.sign_in("cp_not-a-token")
    assert b.refusal() == (401, "token_invalid")
    b.shot("wrong-token")
    assert not any(c["name"] == "cp_console" for c in b.d.get_cookies())
    assert b.has("#login-form")  # the form again, to try another token

    b.sign_in(console.toks["viewer"])
    b.wait(lambda: b.has("#groups"), 15, "the groups page")
    assert b.path == "/console/groups"
    assert b.find("#who").get_attribute("data-role") == "viewer"
    b.shot("groups")
    # The session: the token, HttpOnly (no script sees it), SameSite=Strict.
    cookie = next(c for c in b.d.get_cookies() if c["name"] == "cp_console")
    assert cookie["httpOnly"] is True and cookie["sameSite"] == "Strict", cookie
    assert cookie["path"] == "/console", cookie
    assert "cp_console" not in b.d.execute_script("return document.cookie")

    # RPO 60 s: the primary's newest point (t2) is ~30 s old, DR's (t1) ~90 s.
    rows = _rows(b, "#groups tr[data-group=app]")
    assert set(rows) == {"primary", "dr"}, rows
    assert "primary: primary" in rows["primary"].text and "dr: dr" in rows["dr"].text
    std = {k: r.find_element("css selector", "[data-standing]").get_attribute("data-standing")
           for k, r in rows.items()}
    assert std == {"primary": "ok", "dr": "breached"}, std
    assert "12.0 s" in rows["dr"].text  # the DR point's lag: verified 12 s after its cut
    assert "min" in rows["dr"].find_element("css selector", ".achieved").text  # 1 min 30 s
    drill = b.find("#groups a[href^='/console/drills/']")
    assert drill.text == "failed", drill.text  # the newest drill

    b.submit("#logout")
    b.wait(lambda: b.has("#login-form"), 15, "the sign-in page")
    assert not any(c["name"] == "cp_console" for c in b.d.get_cookies())
    b.open("/console/groups/app")
    assert b.path == "/console/login?next=/console/groups/app", b.path
    b.shot("signed-out")

    # Revoking the token ends its session at the next request.
    b.sign_in(console.toks["viewer"])
    assert b.path == "/console/groups/app", b.path  # back where it was going
    with console.sf() as s:
        tok = tokens.lookup(s, console.toks["viewer"], SECRET)
        assert tok is not None
        tokens.revoke(s, tok.id)
    b.open("/console/jobs")
    assert b.path == "/console/login?expired=1", b.path
    assert "unknown or revoked" in b.text("#login-error")
    b.shot("revoked")


def test_group_page_recovery_points_and_viewer_refusals(console: Console,
                                                        chrome: Browser) -> None:
    b = chrome
    b.sign_in(console.toks["viewer"])
    b.wait(lambda: b.has("#groups"), 15, "the groups page")
    b.find("a.group-link").click()
    b.wait(lambda: b.has("#points"), 15, "the group page")
    assert b.text("#group-name") == "app"
    b.shot("group-as-viewer")

    pts = {r.get_attribute("data-txn"): r for r in b.all("#points tbody tr")}
    assert list(pts) == ["t2", "t1"]  # newest first
    assert "recovery point" in pts["t1"].find_element("css selector", ".dr-point").text
    assert pts["t2"].find_element("css selector", ".dr-point").text == "not_replicated"
    assert "2/2 members" in pts["t2"].find_element("css selector", ".primary-point").text
    assert "12.0 s" in _rows(b, "#site-rpo tbody tr")["dr"].find_element(
        "css selector", ".lag").text
    drills = b.all("#drills tbody tr")
    assert [d.get_attribute("data-job") for d in drills] == [
        console.drills["failed"], console.drills["passed"]]

    # A viewer is shown no action, and the server refuses the one it crafts.
    assert not b.has("#snapshot-now") and not b.has("#drill-start")
    assert b.has("#read-only") and not b.has("#failover-link")
    b.forge_post("/console/groups/app/snapshot", {"csrf": b.csrf()})
    assert b.refusal() == (403, "role_insufficient")
    b.shot("viewer-snapshot-refused")
    assert "operator needed" in b.text("#error")
    assert console.jobs("group_snapshot") == []
    # The REST API says the same to the same token.
    with console.rest("viewer") as c:
        assert c.post("/v1/groups/app/snapshots").status_code == 403
    # Every console POST is audited, the refused one too, with its actor.
    with console.sf() as s:
        row = s.scalar(select(AuditEntry).where(
            AuditEntry.path == "/console/groups/app/snapshot"))
        assert row is not None and (row.actor, row.status) == ("test-viewer", 403), row


def test_operator_snapshot_job_progress_is_live(console: Console, chrome: Browser) -> None:
    b = chrome
    b.sign_in(console.toks["operator"])
    b.wait(lambda: b.has("#groups"), 15, "the groups page")
    b.open("/console/groups/app")
    assert not b.has("#failover-link")  # failover is admin's
    # A wrong CSRF token is refused, nothing queued.
    b.forge_post("/console/groups/app/snapshot", {"csrf": "0" * 64})
    assert b.refusal() == (403, "csrf_mismatch")
    assert console.jobs("group_snapshot") == []

    b.open("/console/groups/app")
    b.shot("group-as-operator")
    b.submit("#snapshot-now")
    b.wait(lambda: b.has("#job-status"), 15, "the job page")
    (job,) = console.jobs("group_snapshot")
    assert b.path == f"/console/jobs/{job.id}"
    assert job.created_by == "test-operator" and job.state == JobState.queued
    assert b.find("#job-status").get_attribute("data-state") == "queued"
    assert b.find("#job-status").get_attribute("hx-get") == f"/console/jobs/{job.id}/status"
    b.shot("job-queued")

    # No worker runs here: the test moves the job on in the database and the
    # page, never reloaded, follows it (htmx polls the status fragment).
    marker = b.d.execute_script("window.__same_page = 1; return window.__same_page")
    with console.sf() as s:
        j = s.get(Job, job.id)
        assert j is not None
        j.state, j.progress, j.message, j.started_at = (JobState.running, 0.5,
                                                        "committing 2 disks", utcnow())
        s.commit()
    b.wait(lambda: b.text("#job-message") == "committing 2 disks", 15, "live progress")
    assert b.text("#job-progress") == "50"
    b.shot("job-running")
    with console.sf() as s:
        j = s.get(Job, job.id)
        assert j is not None
        j.state, j.progress, j.message, j.finished_at = (JobState.succeeded, 1.0, "committed",
                                                         utcnow())
        s.commit()
    b.wait(lambda: b.find("#job-status").get_attribute("data-state") == "succeeded", 15,
           "the job's end")
    assert b.d.execute_script("return window.__same_page") == marker  # no reload
    assert b.find("#job-status").get_attribute("hx-get") is None  # polling stopped
    b.shot("job-succeeded")

    b.open("/console/jobs")
    row = b.find(f"#jobs tr[data-job='{job.id}']")
    assert row.get_attribute("data-state") == "succeeded" and "test-operator" in row.text
    # A job queued meanwhile appears in the list without a reload.
    b.d.execute_script("window.__same_page = 2")
    with console.sf() as s:
        s.add(Job(id="00000000-0000-4000-8000-000000000003", kind="retention",
                  message="queued", created_by="test-admin"))
        s.commit()
    b.wait(lambda: b.has("#jobs tr[data-job='00000000-0000-4000-8000-000000000003']"), 15,
           "the new job in the list")
    assert b.d.execute_script("return window.__same_page") == 2
    assert b.find("#jobs tbody tr").get_attribute("data-job").endswith("0003")  # newest first
    b.shot("jobs")


def test_drill_reports(console: Console, chrome: Browser) -> None:
    b = chrome
    b.sign_in(console.toks["viewer"])
    b.wait(lambda: b.has("#groups"), 15, "the groups page")
    b.open("/console/groups/app")
    b.find(f"#drills tr[data-job='{console.drills['passed']}'] a.drill-link").click()
    b.wait(lambda: b.has("#verdict"), 15, "the drill report")
    assert b.find("#verdict").get_attribute("data-verdict") == "passed"
    check = b.find("#checks tr[data-check=writer]")
    assert check.get_attribute("data-ok") == "true" and "no gap" in check.text
    assert [r.get_attribute("data-step") for r in b.all("#timeline tbody tr")] == [
        "start", "boot", "check", "verdict"]
    assert b.text("#boot-s") == "7.2 s" and b.text("#drill-point") == "cp.app.t1"
    assert b.find("#cleanup").get_attribute("data-ok") == "true"
    assert [g.get_attribute("data-vm") for g in b.all("#timeline-svg g.vm-row")] == [
        "primary-h1-vm1"]
    b.shot("drill-passed")
    b.find("#report-page").click()  # the auditor's page, under the console's session
    b.wait(lambda: b.has("#facts"), 15, "the one-page report")
    assert b.text("#verdict") == "PASSED" and b.has("#timeline svg g.vm-row")
    b.shot("drill-report-page")

    b.open(f"/console/drills/{console.drills['failed']}")
    assert b.find("#verdict").get_attribute("data-verdict") == "failed"
    assert b.find("#checks tr[data-check=writer]").get_attribute("data-ok") == "false"
    b.shot("drill-failed")
    b.open("/console/drills/00000000-0000-4000-8000-000000000099")
    assert b.refusal() == (404, "job_not_found")


def test_failover_needs_admin_and_the_typed_name(console: Console, chrome: Browser) -> None:
    b = chrome
    b.sign_in(console.toks["operator"])
    b.wait(lambda: b.has("#groups"), 15, "the groups page")
    b.open("/console/groups/app/failover")
    assert b.has("#read-only") and not b.has("#failover-form")
    b.forge_post("/console/groups/app/failover",
                 {"csrf": b.csrf(), "confirm": "app", "mode": "planned"})
    assert b.refusal() == (403, "role_insufficient")
    b.submit("#logout")
    b.wait(lambda: b.has("#login-form"), 15, "the sign-in page")

    b.sign_in(console.toks["admin"])
    b.wait(lambda: b.has("#groups"), 15, "the groups page")
    b.open("/console/groups/app")
    b.find("#failover-link").click()
    b.wait(lambda: b.has("#failover-form"), 15, "the failover form")
    b.shot("failover-form")
    for typed in ("ap", "APP", " app", ""):
        b.find("#confirm").clear()
        b.find("#confirm").send_keys(typed)
        b.submit("#failover-submit")
        err = b.wait(lambda: b.find("#failover-error"), 15, "the refusal")
        assert err.get_attribute("data-code") == "confirmation_mismatch", typed
        assert "Nothing was done" in err.text
    b.shot("failover-wrong-name")
    assert console.jobs("failover") == []

    # The right name passes the confirmation; the failover's own
    # preconditions then refuse it (this DR site has no Ceph access), as
    # POST /v1/groups/app/failover does, and nothing is created.
    b.find("#confirm").clear()
    b.find("#confirm").send_keys("app")
    b.submit("#failover-submit")
    status, code = b.refusal()
    b.shot("failover-precondition")
    with console.rest("admin") as c:
        r = c.post("/v1/groups/app/failover", json={"mode": "planned"})
    assert (status, code) == (r.status_code, r.json()["code"]) and status == 409, r.text
    assert console.jobs("failover") == []


def test_fragments_and_schema(console: Console) -> None:
    """Without a session an htmx poll gets 401 and where to sign in; a
    sign-in without the form's nonce is refused; the console is no part of
    the OpenAPI document; pages carry their CSP."""
    with httpx.Client(base_url=console.base, timeout=HTTP_TIMEOUT_S) as c:
        r = c.get(f"/console/jobs/{console.drills['passed']}/status",
                  headers={"HX-Request": "true"})
        assert r.status_code == 401 and r.headers["HX-Redirect"] == "/console/login"
        r = c.get(f"/console/jobs/{console.drills['passed']}/status",
                  headers={"HX-Request": "true",
                           "HX-Current-URL": f"{console.base}/console/jobs/x"})
        assert r.headers["HX-Redirect"] == "/console/login?next=/console/jobs/x", r.headers
        r = c.get("/console/login")
        assert "script-src 'self'" in r.headers["content-security-policy"]
        assert r.headers["x-frame-options"] == "DENY"
        paths = c.get("/v1/openapi.json").json()["paths"]
        assert paths and not [p for p in paths if p.startswith("/console")]
        # A sign-in posted from elsewhere (no nonce cookie of this browser) is refused.
        r = c.post("/console/login", data={"token": console.toks["admin"], "nonce": "x" * 32})
        assert r.status_code == 403 and 'data-code="csrf_mismatch"' in r.text
        assert "cp_console=" not in r.headers.get("set-cookie", "")
        js = c.get("/console/static/htmx.min.js")
        assert js.status_code == 200 and b"htmx" in js.content[:2000]
    with console.sf() as s:
        assert s.scalar(select(func.count()).select_from(Job)) == 2  # the seeded drills



def test_group_page_polls_its_rpo_and_points(console: Console, chrome: Browser) -> None:
    """A snapshot committed while the group page is open appears on it, and the
    DR standing changes, without a reload (htmx polls /live)."""
    b = chrome
    b.sign_in(console.toks["viewer"])
    b.wait(lambda: b.has("#groups"), 15, "the groups page")
    b.open("/console/groups/app")
    assert b.find("#group-live").get_attribute("hx-get") == "/console/groups/app/live"
    assert [r.get_attribute("data-txn") for r in b.all("#points tbody tr")] == ["t2", "t1"]
    marker = b.d.execute_script("window.__same_page = 3; return window.__same_page")
    with console.sf() as s:
        g = s.scalar(select(Group).where(Group.name == "app"))
        assert g is not None
        now = utcnow()
        s.add(GroupSnapshot(group_id=g.id, txn="t3", state=SnapState.committed, cut_at=now,
                            requested_at=now, finished_at=now, dr_verified_at=now))
        s.commit()
    b.wait(lambda: b.has("#points tbody tr[data-txn='t3']"), 20, "the new point, polled")
    assert b.d.execute_script("return window.__same_page") == marker  # no reload
    assert b.find("#points tbody tr").get_attribute("data-txn") == "t3"  # newest first
    # t3 is verified at DR now: DR's achieved RPO is seconds, within the 60 s target.
    dr = _rows(b, "#site-rpo tbody tr")["dr"]
    assert dr.find_element("css selector", "[data-standing]").get_attribute(
        "data-standing") == "ok", dr.text
    b.shot("group-polled")


def test_hosts_and_vms_pages(console: Console, chrome: Browser) -> None:
    """Hosts with their agent's standing and certificate expiry; a host's VMs;
    a VM with its identity, disks, group and newest snapshot."""
    with console.sf() as s:
        h = s.scalar(select(Host).where(Host.name == "primary-h1"))
        assert h is not None
        h.reachable, h.last_error = False, "connect: connection refused"
        h.cert_not_after = utcnow() + dt.timedelta(days=5)
        for d in s.scalars(select(Disk)):
            d.size_bytes = 64 << 20
        s.commit()
    b = chrome
    b.sign_in(console.toks["viewer"])
    b.wait(lambda: b.has("#groups"), 15, "the groups page")
    b.find("#nav-hosts").click()
    b.wait(lambda: b.has("#hosts"), 15, "the hosts page")
    row = b.find("#hosts tr[data-host='primary-h1']")
    assert row.get_attribute("data-agent") == "unreachable"
    assert row.get_attribute("data-cert") == "expiring"
    assert "in 5 d" in row.find_element("css selector", ".cert").text
    assert "connection refused" in row.text and "not pinned" in row.text
    b.shot("hosts")

    row.find_element("css selector", "a.host-vms").click()
    b.wait(lambda: b.has("#vms"), 15, "the host's VMs")
    assert b.path == "/console/vms?host=primary-h1"
    (vm,) = b.all("#vms tbody tr")
    assert vm.get_attribute("data-vm") == "primary-h1-vm1" and "app" in vm.text
    assert "t2" in vm.text  # its newest committed snapshot
    b.shot("vms")
    vm.find_element("css selector", "a.vm-link").click()
    b.wait(lambda: b.has("#vm-disks"), 15, "the VM page")
    assert b.text("#vm-name") == "primary-h1-vm1"
    disks = {r.get_attribute("data-disk"): r for r in b.all("#vm-disks tbody tr")}
    assert sorted(disks) == ["disk0", "disk1"]
    assert disks["disk0"].find_element("css selector", ".source").text == (
        "rbd/primary-h1-vm1-disk0")
    assert "64 MiB" in disks["disk0"].text and "app" in disks["disk0"].text
    assert "t2" in b.text("#vm-last-snapshot")
    b.shot("vm")

    # The group page links its member to this page; an unknown VM is a 404.
    b.open("/console/groups/app")
    assert b.find("a.member-link").get_attribute("href").startswith(
        f"{console.base}/console/vms/")
    b.open("/console/vms/999999")
    assert b.refusal() == (404, "vm_not_found")
    b.open("/console/vms?site=nowhere")
    assert b.has("#no-vms")
