"""A drill of libvirt VMs through the DR agents, from captured definitions
(api/tests/drill_agents.py sets the scene: the lab's Ceph sites, two DR
libvirtds with an agent each, the captured definitions in a database).

The product's path, with nothing of the lab's booter: `run_drill` with
`AgentBooter`, its definitions from `drill_boot.definitions` (the control
plane's rewrite, signature and agent choice).  Seen while the VMs run
(the drill's `boot started` event): each domain is `drill-<id>-<vm>` on
the agent failover would use (vm1 on dr-h1, the definition_targets host;
vm2 on dr-h2, whose inventory lists its standby), transient, with a new
UUID, its disk the drill's clone at DR and its one interface on the
isolated drill bridge.  Each is ready by guest-ping through its agent.
After: no domain on either libvirtd (defined or running), no clone, no
tap on the drill bridge.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from drill_agents import BRIDGE, RP, DrillBed, tiny_image

pytestmark = [pytest.mark.lab, pytest.mark.lab_config(hosts=1, vms_per_host=1, disks=1)]


@pytest.fixture
def bed(lab: dict[str, Any], tmp_path: Path) -> Any:
    b = DrillBed(lab, tmp_path)
    try:
        b.make_images()
        b.start()
        yield b
    finally:
        b.stop()


def test_drill_boots_captured_definitions_isolated_on_two_agents(bed: DrillBed,
                                                                  tmp_path: Path) -> None:
    from cutpoint.api.services import drill_boot
    from cutpoint.coordinator.dr.boot import AgentBooter, BootDisk, BootVM
    from cutpoint.coordinator.dr.drill import DrillSpec, leftovers, run_drill
    from cutpoint.lab.sites import ceph_site

    sf = bed.database(tiny_image())
    settings = bed.settings()
    site = ceph_site(bed.status, "dr")
    seen: dict[str, Any] = {}

    def on_event(ev: dict[str, Any]) -> None:
        print(f"  {ev['t_s']:7.2f} {ev['step']} {ev['status']} "
              f"{ {k: v for k, v in ev.items() if k not in ('t_s', 'at', 'step', 'status')} }")
        if ev["step"] == "boot" and ev["status"] == "started":
            seen["domains"] = bed.domains()
            seen["xml"] = {n: h.virsh("dumpxml", n) for h in bed.hosts
                           for n in (h.virsh("list", "--name") or "").split()}
            seen["persistent"] = {n: h.virsh("dominfo", n) for h in bed.hosts
                                  for n in (h.virsh("list", "--name") or "").split()}
            seen["taps"] = bed.taps()

    spec = DrillSpec(site=site, recovery_point=RP,
                     vms=[BootVM(vm, (BootDisk("vda", img, "rbd"),))
                          for vm, img in bed.images.items()],
                     checks=[], report_dir=str(tmp_path / "drills"),
                     definitions=drill_boot.definitions(sf, settings, "dr"),
                     agent_tls=(str(settings.agent_ca), str(settings.agent_cert),
                                str(settings.agent_key)),
                     boot_timeout_s=180)
    print()
    report = run_drill(spec, AgentBooter(), on_event)
    tag = f"drill-{report['drill_id']}"
    assert report["verdict"] == "passed", (report["error"], report["cleanup"])
    # where each VM ran: vm1 on dr-h1 (definition_targets), vm2 on dr-h2 (its standby)
    assert seen["domains"] == {"dr-h1": [f"{tag}-drl-vm1"], "dr-h2": [f"{tag}-drl-vm2"]}
    for vm, img in bed.images.items():
        root = ET.fromstring(seen["xml"][f"{tag}-{vm}"])
        src = root.find("devices/disk/source")
        assert src is not None and src.get("name") == f"{bed.dr['pool']}/{tag}-{img}"
        itfs = root.findall("devices/interface")
        assert [(i.get("type"), i.find("source").get("bridge")) for i in itfs] == \
            [("bridge", BRIDGE)]
        assert "52:54:00:aa:00:01" not in seen["xml"][f"{tag}-{vm}"]  # a MAC of its own
        assert "Persistent:     no" in seen["persistent"][f"{tag}-{vm}"]
    assert sorted(seen["taps"]) == [f"d{report['drill_id']}000", f"d{report['drill_id']}010"]
    ready = [e for e in report["timeline"] if e["step"] == "boot" and e["status"] == "ok"]
    assert sorted(e["vm"] for e in ready) == ["drl-vm1", "drl-vm2"]
    assert sorted(e["boot_name"] for e in ready) == [f"{tag}-drl-vm1", f"{tag}-drl-vm2"]
    assert all(e["rule"] == {"kind": "guest-ping"} for e in ready)
    print(f"ready (guest-ping) at {[e['ready_s'] for e in ready]} s; boot_s {report['boot_s']}")
    # nothing of the drill remains
    assert report["cleanup"]["ok"], report["cleanup"]
    assert bed.domains() == {"dr-h1": [], "dr-h2": []}
    assert bed.taps() == []
    assert not any(leftovers(site, tag, [bed.dr["pool"]]).values())
    assert "transient=yes" in bed.agent_log(0) and "transient=yes" in bed.agent_log(1)


def _t(report: dict[str, Any], step: str, status: str, **match: Any) -> float:
    return next(e["t_s"] for e in report["timeline"] if e["step"] == step
                and e["status"] == status and all(e.get(k) == v for k, v in match.items()))


def test_plan_order_hooks_and_guest_checks(bed: DrillBed, tmp_path: Path) -> None:
    """A plan of two boot groups (db: vm1, ready by guest-ping then 1 s more,
    with a post hook run in it; app: vm2), and checks run in the guests:
    each clone's disk holds its VM's marker (`head -c` of /dev/vda through
    guest-exec).  A third check, vm1's disk against vm2's marker, must fail
    (the negative control): the drill fails on it alone, and still cleans
    up.  The report keeps the order: vm2 starts after vm1 is ready."""
    from cutpoint.coordinator.dr.boot import AgentBooter
    from cutpoint.coordinator.dr.drill import run_drill
    from cutpoint.coordinator.dr.plan import RecoveryPlan

    sf = bed.database(tiny_image())
    settings = bed.settings()
    plan = RecoveryPlan.parse({"boot_groups": [
        {"name": "db", "vms": [{"vm": "drl-vm1", "delay_s": 1}],
         "post": [{"kind": "guest-exec", "vm": "drl-vm1", "path": "/bin/sh",
                   "args": ["-c", "test -b /dev/vda"]}]},
        {"name": "app", "vms": ["drl-vm2"]}]})
    head = ["-c", "head -c 80 /dev/vda | tr -d '\\000'"]
    checks = [{"name": "guest-exec", "params": {"vm": vm, "path": "/bin/sh", "args": head,
                                                "regex": bed.markers[vm]}}
              for vm in bed.vms]
    checks.append({"name": "guest-exec", "timeout_s": 60,
                   "params": {"vm": "drl-vm1", "path": "/bin/sh", "args": head,
                              "regex": bed.markers["drl-vm2"]}})
    report = run_drill(bed.spec(sf, settings, checks=checks, plan=plan), AgentBooter(),
                       lambda ev: print(f"  {ev['t_s']:7.2f} {ev['step']} {ev['status']} "
                                        f"{ev.get('vm') or ev.get('group') or ''}"))
    print(f"checks: {[(c['name'], c['ok'], c['summary']) for c in report['checks']]}")
    print(f"boot order: {report['boot_order']}")
    assert [c["ok"] for c in report["checks"]] == [True, True, False], report["checks"]
    assert "does not match" in report["checks"][2]["summary"]
    assert bed.markers["drl-vm1"] in report["checks"][0]["output"]
    assert report["verdict"] == "failed" and report["error"] is None
    assert [(b["group"], b["order"], b["vms"]) for b in report["boot_order"]] == \
        [("db", 1, ["drl-vm1"]), ("app", 2, ["drl-vm2"])]
    tag = f"drill-{report['drill_id']}"
    vm1_ready = _t(report, "boot", "ok", vm="drl-vm1")
    vm2_start = _t(report, "vm_start", "ok", vm=f"{tag}-drl-vm2")
    assert vm1_ready + 1 <= vm2_start, (vm1_ready, vm2_start)  # ready, the delay, then app
    assert report["cleanup"]["ok"], report["cleanup"]
    assert bed.domains() == {"dr-h1": [], "dr-h2": []} and bed.taps() == []


@pytest.fixture
def bed4(lab: dict[str, Any], tmp_path: Path) -> Any:
    b = DrillBed(lab, tmp_path, ("drl-a1", "drl-a2", "drl-b1", "drl-b2"))
    try:
        b.make_images()
        b.start()
        yield b
    finally:
        b.stop()


def test_two_groups_drill_at_once(bed4: DrillBed) -> None:
    """Two drills (groups a and b, two VMs each) at the same time: four drill
    VMs up together on the two hosts, both pass, nothing of either left."""
    import threading

    from cutpoint.coordinator.dr.boot import AgentBooter
    from cutpoint.coordinator.dr.drill import run_drill

    sf = bed4.database(tiny_image())
    settings = bed4.settings()
    up: list[dict[str, list[str]]] = []
    reports: dict[str, Any] = {}

    def on_event(ev: dict[str, Any]) -> None:
        if ev["step"] == "check":
            up.append(bed4.domains())

    def go(name: str, vms: tuple[str, ...]) -> None:
        reports[name] = run_drill(bed4.spec(sf, settings, vms, checks=[
            {"name": "guest-exec", "params": {"path": "/bin/true"}}]), AgentBooter(), on_event)

    ts = [threading.Thread(target=go, args=("a", ("drl-a1", "drl-a2"))),
          threading.Thread(target=go, args=("b", ("drl-b1", "drl-b2")))]
    for t in ts:
        t.start()
    for t in ts:
        t.join(600)
    for name, r in sorted(reports.items()):
        print(f"drill {name} {r['drill_id']}: {r['verdict']} boot_s {r['boot_s']}")
        assert r["verdict"] == "passed", (r["error"], r["checks"], r["cleanup"])
    most = max(sum(len(v) for v in d.values()) for d in up)
    print(f"drill VMs up at once: {most}")
    assert most == 4
    assert bed4.domains() == {"dr-h1": [], "dr-h2": []} and bed4.taps() == []


def test_sweeper_removes_what_a_killed_drill_left(bed: DrillBed, tmp_path: Path) -> None:
    """A drill's process killed (SIGKILL) once its VMs run: its domains and
    clones stay at DR, and the recovery point's snapshots it protected stay
    protected.  The sweeper leaves them while the drill's job is still
    running (its tag is active), and once the job is not, removes them by
    their tag and unprotects what the drill protected (the image's metadata
    names it): no domain, clone, tap or protection remains."""
    import json
    import multiprocessing
    import os
    import signal
    import subprocess
    import time

    from cutpoint.api.models import Group, Job, JobState
    from cutpoint.api.services import drill_sweeper
    from cutpoint.coordinator.dr.boot import AgentBooter
    from cutpoint.coordinator.dr.drill import leftovers, run_drill

    sf = bed.database(tiny_image())
    settings = bed.settings()
    job_id = "5eed0001-0000-4000-8000-000000000001"
    from cutpoint.api.models import Policy, Site
    from sqlalchemy import select

    with sf() as s:  # a group that replicates to dr: the sweeper looks there
        g = Group(name="drl")
        s.add(g)
        s.flush()
        s.add(Policy(group_id=g.id, replication_target_id=s.scalar(
            select(Site.id).where(Site.name == "dr"))))
        s.add(Job(id=job_id, kind="drill", group_id=g.id, state=JobState.running))
        s.commit()
    from cutpoint.coordinator.dr.plan import RecoveryPlan

    # a post hook that holds the drill once its VMs are ready, until the kill
    hold = RecoveryPlan.parse({"boot_groups": [{"name": "all", "vms": list(bed.vms), "post": [
        {"kind": "script", "path": "/bin/sleep", "args": ["600"], "timeout_s": 900}]}]})
    spec = bed.spec(sf, settings, checks=[], drill_id="5eed0001", plan=hold)
    ctx = multiprocessing.get_context("fork")
    p = ctx.Process(target=run_drill, args=(spec, AgentBooter()))
    p.start()
    t0 = time.monotonic()
    state = Path(spec.report_dir) / "drill-5eed0001" / "state.json"
    while sum(len(v) for v in bed.domains().values()) < 2 or not state.exists() \
            or len(json.loads(state.read_text())["guests"]) < 2:
        assert p.is_alive() and time.monotonic() - t0 < 180, \
            f"the drill's VMs never ran: {sorted(Path(spec.report_dir).rglob('*'))}"
        time.sleep(0.5)
    hook = [int(x) for x in subprocess.run(["pgrep", "-P", str(p.pid)], capture_output=True,
                                           text=True, check=False).stdout.split()]
    os.kill(p.pid, signal.SIGKILL)
    p.join()
    for pid in hook:  # the hook's sleep: ours, orphaned by the kill
        os.kill(pid, signal.SIGKILL)
    left = bed.domains()
    site = spec.site
    clones = leftovers(site, "drill-5eed0001", [bed.dr["pool"]])["images"]
    def protected() -> list[str]:
        pool = bed.dr["pool"]
        return sorted(img for img in bed.images.values() if "protected: True" in bed.rbd(
            "info", f"{pool}/{img}@{RP}").stdout)

    print(f"\nafter kill -9: domains {left}, clones {clones}, protected {protected()}")
    assert sum(len(v) for v in left.values()) == 2 and len(clones) == 2
    assert protected() == sorted(bed.images.values())  # the killed drill protected them
    out = drill_sweeper.sweep(sf, settings)  # the job still runs: nothing of it goes
    assert out["vms_stopped"] == [] and out["images_removed"] == [], out
    assert out["snapshots_unprotected"] == [] and protected() == sorted(bed.images.values())
    assert bed.domains() == left
    with sf() as s:
        s.get(Job, job_id).state = JobState.failed
        s.commit()
    t0 = time.monotonic()
    out = drill_sweeper.sweep(sf, settings)
    print(f"sweep in {time.monotonic() - t0:.2f} s: {out}")
    assert sorted(v.split(":")[1] for v in out["vms_stopped"]) == \
        ["drill-5eed0001-drl-vm1", "drill-5eed0001-drl-vm2"], out
    assert sorted(out["images_removed"]) == sorted(f"dr:{bed.dr['pool']}/{c}" for c in clones)
    assert out["errors"] == [], out
    # the recovery point's snapshots the killed drill protected are not any more
    assert sorted(out["snapshots_unprotected"]) == sorted(
        f"dr:{bed.dr['pool']}/{img}@{RP}" for img in bed.images.values()), out
    assert protected() == []
    assert bed.domains() == {"dr-h1": [], "dr-h2": []} and bed.taps() == []
    assert leftovers(site, "drill-5eed0001", [bed.dr["pool"]])["images"] == []


def test_drill_job_with_the_groups_plan_and_its_report(bed: DrillBed, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The control plane's path of a drill job: the request (drills.request:
    the group's stored plan, whose drill_checks are used as the request names
    none), the job as the worker runs it (drills.run_job: DrillSpec from the
    job's params, definitions, plan), then the evidence the API serves
    (drill_reports.evidence: RTO, one row per VM, the boot order) and its HTML."""
    import json

    from cutpoint.api.models import Group, Job, JobState, utcnow
    from cutpoint.api.services import drill_reports, drills, plans

    monkeypatch.setenv("CP_DRILL_DIR", str(tmp_path / "drills"))
    sf = bed.database(tiny_image())
    settings = bed.settings()
    gid = bed.group(sf)
    head = ["-c", "head -c 80 /dev/vda | tr -d '\\000'"]
    with sf() as s:
        g = s.get(Group, gid)
        plans.put(s, g, {"boot_groups": [{"name": "first", "vms": ["drl-vm2"]},
                                         {"name": "second", "vms": ["drl-vm1"]}],
                         "drill_checks": [{"name": "guest-exec", "params": {
                             "vm": vm, "path": "/bin/sh", "args": head,
                             "regex": bed.markers[vm]}} for vm in bed.vms]}, "op")
        job = drills.request(s, g, "latest", None, "op", "agent", settings)
        job_id = job.id
        assert job.params["plan_version"] == 1
    report = drills.run_job(sf, settings, job_id)  # raises DrillFailed unless passed
    with sf() as s:  # what the task's wrapper records
        j = s.get(Job, job_id)
        j.state, j.result, j.finished_at = JobState.succeeded, report, utcnow()
        s.commit()
        ev = drill_reports.evidence(s, j)
    doc = ev.model_dump(mode="json")
    out = Path("out/drill-agents")
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(doc, indent=1))
    (out / "report.html").write_text(drill_reports.as_html(ev))
    print(f"\nverdict {doc['verdict']}, RTO {doc['rto_s']} s, point age {doc['point_age_s']} s,"
          f" boot order {[(b['group'], b['vms']) for b in report['boot_order']]}")
    for e in doc["timeline"]:
        print(f"  {e['t_s']:7.2f} {e['step']} {e['status']} "
              f"{e.get('vm') or e.get('group') or e.get('check') or ''}")
    assert doc["verdict"] == "passed" and [c["ok"] for c in doc["checks"]] == [True, True]
    assert [r["vm"] for r in doc["vms"]] == ["drl-vm1", "drl-vm2"]
    assert all(r["ready_s"] is not None for r in doc["vms"]) and doc["rto_s"] is not None
    assert [b["group"] for b in report["boot_order"]] == ["first", "second"]
    assert bed.domains() == {"dr-h1": [], "dr-h2": []} and bed.taps() == []


def test_tcp_readiness_and_http_checks_on_the_drill_network(bed: DrillBed,
                                                            tmp_path: Path) -> None:
    """The drill network probed from the control side: the copies' kernel
    command lines give each an address on the drill bridge and an HTTP port
    (the tiny guest's `cp.listen`); this process has a leg on the bridge
    (10.99.0.254/24, as docs/drills.md says a worker needs).  Each VM is
    ready by its tcp rule, the `tcp` check connects to both ports and each
    `http` check reads its own guest's page.  Negative controls: an `http`
    check of vm2's page wanting vm1's name, and a `tcp` check of a port
    nothing listens on, both fail (so the verdict is failed); cleanup leaves
    nothing."""
    import subprocess

    from cutpoint.coordinator.dr.boot import AgentBooter
    from cutpoint.coordinator.dr.drill import run_drill
    from cutpoint.coordinator.dr.plan import RecoveryPlan

    ips = {vm: f"10.99.0.{11 + i}" for i, vm in enumerate(bed.vms)}
    sf = bed.database(tiny_image(), {vm: f"cp.ip={ip}/24 cp.listen=8080"
                                     for vm, ip in ips.items()})
    settings = bed.settings()
    subprocess.run(["ip", "addr", "add", "10.99.0.254/24", "dev", BRIDGE], check=True)
    plan = RecoveryPlan.parse({"boot_groups": [{"name": "web", "vms": [
        {"vm": vm, "readiness": {"kind": "tcp", "address": ip, "port": 8080,
                                 "timeout_s": 180}} for vm, ip in ips.items()]}]})
    checks = [{"name": "tcp", "params": {"targets": [{"address": ip, "port": 8080}
                                                     for ip in ips.values()]}}]
    checks += [{"name": "http", "params": {"url": f"http://{ip}:8080/",
                                           "regex": f"cutpoint guest {vm}"}}
               for vm, ip in ips.items()]
    checks += [{"name": "http", "timeout_s": 30, "params": {
                    "url": f"http://{ips['drl-vm2']}:8080/", "regex": "cutpoint guest drl-vm1$"}},
               {"name": "tcp", "timeout_s": 10, "params": {"address": ips["drl-vm1"],
                                                           "port": 9}}]
    report = run_drill(bed.spec(sf, settings, checks=checks, plan=plan), AgentBooter(),
                       lambda ev: print(f"  {ev['t_s']:7.2f} {ev['step']} {ev['status']} "
                                        f"{ev.get('vm') or ev.get('check') or ''}"))
    print(f"checks: {[(c['name'], c['ok'], c['summary']) for c in report['checks']]}")
    ready = [e for e in report["timeline"] if e["step"] == "boot" and e["status"] == "ok"]
    print(f"ready: {[(e['vm'], e['ready_s'], e['rule']) for e in ready]}")
    assert sorted(e["vm"] for e in ready) == sorted(bed.vms)
    assert all(e["rule"]["kind"] == "tcp" for e in ready), ready
    assert [c["ok"] for c in report["checks"]] == [True, True, True, False, False], \
        report["checks"]
    assert "cutpoint guest drl-vm2" in report["checks"][2]["output"]
    assert report["verdict"] == "failed" and report["error"] is None
    assert report["cleanup"]["ok"], report["cleanup"]
    assert bed.domains() == {"dr-h1": [], "dr-h2": []} and bed.taps() == []


def test_drill_through_http_survives_its_worker_killed(bed: DrillBed, tmp_path: Path,
                                                       local_services: Any) -> None:
    """A drill asked for through HTTP (`POST /v1/groups/drl/drills`) and run
    by a real Celery worker; the worker (its whole process group) is killed
    with SIGKILL while the drill's VMs run (a post hook holds the drill
    there), and a new worker is started.  The broker hands the job out
    again (visibility timeout 10 s) and the new delivery cleans up what the
    first left (drills.py `_interrupted`: the drill's state file), the
    sweeper at the new worker's start having left the still-running job's
    tag alone; the job ends failed, `drill_interrupted`.  Asserted by the
    drill's tag: no domain, clone or tap remains, and the recovery point's
    snapshots are no longer protected."""
    import json
    import time

    from cutpoint.api.config import DefinitionTarget
    from cutpoint.coordinator.dr.drill import leftovers
    from cutpoint.lab.sites import ceph_site
    from plane import Plane, admin_client, wait_for

    # The bed's DR target (its boot_paths: the site's allow-list for the
    # guests' kernel and initrd), as the worker's environment.
    targets = {k: v.model_dump(mode="json")
               for k, v in bed.settings().definition_targets.items()}
    plane = Plane(tmp_path, int(local_services.redis_port or 0), {
        "CUTPOINT_AGENT_CA": str(bed.certs / "ca.pem"),
        "CUTPOINT_AGENT_CERT": str(bed.certs / "coordinator.pem"),
        "CUTPOINT_AGENT_KEY": str(bed.certs / "coordinator.key")},
        CUTPOINT_BOOTER="agent", CUTPOINT_DEFINITION_SIGNING_KEY=str(tmp_path / "sign.pem"),
        CUTPOINT_DEFINITION_TARGETS=json.dumps(targets), CUTPOINT_AGENT_TIMEOUT_S="15",
        CUTPOINT_BROKER_VISIBILITY_TIMEOUT_S="10", CP_DRILL_DIR=str(tmp_path / "drills"))
    plane.settings = plane.settings.model_copy(update={
        "definition_signing_key": tmp_path / "sign.pem",
        "definition_targets": {k: DefinitionTarget(**v) for k, v in targets.items()}})
    site = ceph_site(bed.status, "dr")

    def protected() -> list[str]:
        return sorted(img for img in bed.images.values() if "protected: True" in bed.rbd(
            "info", f"{bed.dr['pool']}/{img}@{RP}").stdout)

    with plane:
        bed.database(tiny_image())
        bed.group(plane.sf)
        plane.start("worker")
        hold = {"boot_groups": [{"name": "all", "vms": list(bed.vms), "post": [
            {"kind": "script", "path": "/bin/sleep", "args": ["600"], "timeout_s": 900}]}]}
        with admin_client(plane) as c:
            r = c.post("/v1/groups/drl/drills", json={"checks": [
                {"name": "guest-exec", "params": {"path": "/bin/true"}}], "plan": hold})
            assert r.status_code == 202, r.text
            job_id = r.json()["id"]
            tag = f"drill-{job_id.replace('-', '')[:8]}"
            t0 = time.monotonic()
            def booted() -> bool:
                # A job that ended before its VMs ran fails here, with its error.
                job = c.get(f"/v1/jobs/{job_id}").json()
                assert job["state"] in ("queued", "running"), \
                    (job["state"], job["error_code"], job["error"])
                return sum(len(v) for v in bed.domains().values()) == 2
            wait_for(booted, 240, "the drill's two VMs running", plane)
            assert c.get(f"/v1/jobs/{job_id}").json()["state"] == "running"
            plane.kill9("worker")
            left = bed.domains()
            clones = leftovers(site, tag, [bed.dr["pool"]])["images"]
            print(f"\nworker killed at {time.monotonic() - t0:.1f} s: domains {left}, "
                  f"clones {clones}, protected {protected()}")
            assert sorted(n for v in left.values() for n in v) == \
                [f"{tag}-drl-vm1", f"{tag}-drl-vm2"]
            assert len(clones) == 2 and protected() == sorted(bed.images.values())
            t1 = time.monotonic()
            plane.start("worker2")
            wait_for(lambda: c.get(f"/v1/jobs/{job_id}").json()["state"] in
                     ("succeeded", "failed"), 300, "the redelivered drill job", plane)
            job = c.get(f"/v1/jobs/{job_id}").json()
            print(f"job after the restart ({time.monotonic() - t1:.1f} s): {job['state']} "
                  f"{job['error_code']}: {job['error']}")
            assert job["state"] == "failed" and job["error_code"] == "drill_interrupted", job
    assert bed.domains() == {"dr-h1": [], "dr-h2": []} and bed.taps() == []
    assert not any(leftovers(site, tag, [bed.dr["pool"]]).values())
    assert protected() == []
