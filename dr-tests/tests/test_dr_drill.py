"""Group replication and drills against the lab's two Ceph clusters.

One lab (2 primary hosts x 1 guest x 1 RBD disk, workload `writer` in a
ring across both guests, 1 DR host).  The writer keeps writing throughout.

- three group snapshots, each replicated (the first full, then
  incremental from the previous one); every DR member snapshot has the
  same SHA-256 as its primary snapshot (`rbd export`, independent of the
  engine's own hashing), and the group is a recovery point only then;
- a drill of the newest recovery point boots the clones on the DR host on
  an isolated bridge, the writer checker passes on them, and afterwards no
  scratch image, QEMU or link is left; a fourth group snapshot is
  replicated while the drill runs;
- a drill of a recovery point with no writer records fails, with its
  evidence (check output, console log, HTML report), and cleans up too;
- a drill with the product's booter (the DR agents) is refused, with the
  reason in its report, and leaves no clone behind;
- a planned failover through the DR agent, then failback of the deltas.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest
from cutpoint.bench.replication import pattern, write_extents
from cutpoint.coordinator.dr.boot import DRILL, BootDisk, BootRequest, BootVM
from cutpoint.coordinator.dr.drill import leftovers, run_drill
from cutpoint.coordinator.dr.replicate import (
    GroupReplication,
    MemberCopy,
    list_snaps,
    replicate_group,
)
from cutpoint.lab.ceph import rbd_cmd
from cutpoint.lab.drillboot import LabBooter, drill_spec
from cutpoint.lab.proc import pid_alive
from cutpoint.lab.sites import ceph_site

pytestmark = [pytest.mark.lab,
              pytest.mark.lab_config(hosts=2, vms_per_host=1, disks=1, workload="writer")]

CLI = [str(Path(sys.executable).with_name("cutpoint"))]
GROUP = "drt"


def cutpoint(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout,
                          check=False, env=dict(os.environ, COLUMNS="250"))


def sha256_of(site: dict[str, Any], image: str, snap: str) -> str:
    p = subprocess.Popen(rbd_cmd(site, "export", "--no-progress",
                                 f"{site['pool']}/{image}@{snap}", "-"),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    h = hashlib.sha256()
    assert p.stdout is not None
    for chunk in iter(lambda: p.stdout.read(1 << 20), b""):  # type: ignore[union-attr]
        h.update(chunk)
    assert p.wait(timeout=300) == 0, p.stderr.read() if p.stderr else ""
    return h.hexdigest()


def diff_sum(site: dict[str, Any], image: str, from_snap: str, snap: str | None) -> int:
    """Bytes `rbd diff --from-snap from_snap image[@snap]` reports (data and zero)."""
    spec = f"{site['pool']}/{image}" + (f"@{snap}" if snap else "")
    out = subprocess.run(rbd_cmd(site, "diff", "--format", "json", "--from-snap", from_snap,
                                 spec), capture_output=True, text=True, check=True).stdout
    return sum(int(r["length"]) for r in json.loads(out or "[]"))


class Env:
    """Agents + group file + coordinator log for the lab; remembers the replicated chain."""

    def __init__(self, status: dict[str, Any], tmp: Path) -> None:
        from cutpoint.lab.agents import start_agents
        from cutpoint.lab.groupfile import write_group_file

        self.status = status
        self.certs = Path(status["state_dir"]) / "certs"
        self.agents = start_agents(status, self.certs)
        self.file = tmp / "group.yaml"
        write_group_file(status, self.file, certs_dir=self.certs, group=GROUP)
        self.db = f"sqlite:///{tmp / 'coordinator.db'}"
        self.state_dir = str(tmp / "sync")
        self.vms = sorted(status["vms"], key=lambda v: v["index"])
        self.images = [d["image"] for v in self.vms for d in v["disks"]]
        self.last: str | None = None  # newest replicated group snapshot name
        # The product's Ceph access, as the control plane's client (the
        # lab's rbd CLI checks below stay the independent, admin reader).
        self.primary, self.dr = ceph_site(status, "primary"), ceph_site(status, "dr")

    def snapshot(self) -> str:
        res = cutpoint("snapshot", "--group-file", str(self.file), "--db", self.db, "--json")
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
        doc, _ = json.JSONDecoder().raw_decode(res.stdout, res.stdout.index("{"))
        assert doc["state"] == "committed", doc
        return f"cp.{GROUP}.{doc['txn']}"

    def replicate(self, snap: str, base: str | None) -> GroupReplication:
        members = [MemberCopy(i, snap, base) for i in self.images]
        return replicate_group(self.primary, self.dr, members, jobs=2,
                               state_dir=self.state_dir)


_ENV: dict[str, Env] = {}


@pytest.fixture
def env(lab: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Env:
    key = str(lab.get("started_at"))
    if key not in _ENV:
        _ENV.clear()
        _ENV[key] = Env(lab, tmp_path_factory.mktemp("dr"))
    return _ENV[key]


def test_three_group_rounds_under_writer_load_identical(env: Env) -> None:
    p, d = env.status["sites"]["primary"], env.status["sites"]["dr"]
    base = None
    for rnd in range(3):
        snap = env.snapshot()
        rep = env.replicate(snap, base)
        assert rep.recovery_point, rep.as_dict()
        for m in rep.members:
            assert m.state == "verified"
            assert m.full is (base is None), m
            if base is not None:
                # Only what changed crosses: the writer wrote a little.
                assert 0 < m.bytes_shipped < 64 << 20, m
        for image in env.images:
            want, got = sha256_of(p, image, snap), sha256_of(d, image, snap)
            assert want == got, f"round {rnd} {image}@{snap}: primary {want} != dr {got}"
            assert snap in list_snaps(env.dr, image)
        base = snap
    env.last = base


def test_drill_passes_cleans_up_while_replication_continues(env: Env, tmp_path: Path) -> None:
    if env.last is None:
        snap = env.snapshot()
        assert env.replicate(snap, None).recovery_point
        env.last = snap
    rp = env.last
    # A new group snapshot is taken and replicated while the drill runs.
    during: dict[str, Any] = {}

    def replicate_meanwhile() -> None:
        try:
            snap = env.snapshot()
            during["snap"] = snap
            during["rep"] = env.replicate(snap, rp)
        except BaseException as exc:  # noqa: BLE001  reported by the main thread
            during["error"] = exc

    events: list[dict[str, Any]] = []
    spec = drill_spec(env.status, rp, report_dir=str(tmp_path))
    t = threading.Thread(target=replicate_meanwhile)
    started = threading.Event()

    def hook(ev: dict[str, Any]) -> None:
        events.append(ev)
        if ev["step"] == "boot" and ev["status"] == "started" and not started.is_set():
            started.set()
            t.start()

    booter = LabBooter()
    report = run_drill(spec, booter, on_event=hook)
    if started.is_set():
        t.join(timeout=600)
    assert "error" not in during, during.get("error")
    assert report["verdict"] == "passed", json.dumps(report, indent=1, default=str)[-3000:]
    assert report["checks"][0]["name"] == "writer" and report["checks"][0]["ok"]
    assert report["checks"][0]["verdict"]["p"] > 0
    assert report["cleanup"]["ok"] and not any(report["cleanup"]["leftovers"].values())
    tag = f"drill-{report['drill_id']}"
    assert not any(leftovers(env.dr, tag).values())
    assert not any(booter.leftovers(BootRequest(DRILL, spec.site, spec.vms, tag)).values())
    isolate = next(e for e in report["timeline"] if e["step"] == "isolate")
    assert isolate["status"] == "ok" and isolate["uplink"] is None, isolate
    steps = [(e["step"], e["status"]) for e in report["timeline"]]
    assert ("boot", "ok") in steps and steps[-1] == ("verdict", "passed")
    assert sum(1 for s in steps if s == ("boot", "ok")) == len(env.vms)
    # Replication went on during the drill and produced a new recovery point.
    assert started.is_set() and during["rep"].recovery_point, during
    env.last = during["snap"]
    for name, console in report["consoles"].items():
        assert "cp-init: ready" in Path(console).read_text(), name
    assert Path(report["report_json"]).is_file() and Path(report["report_html"]).is_file()
    assert "PASSED" in Path(report["report_html"]).read_text()


def test_drill_with_failing_check_reports_evidence(env: Env, tmp_path: Path) -> None:
    """A recovery point whose disk holds no writer records: the check must fail."""
    p, d = env.status["sites"]["primary"], env.status["sites"]["dr"]
    image = f"blank-{uuid.uuid4().hex[:6]}"
    snap = "cp.blank.t1"
    subprocess.run(rbd_cmd(p, "create", "--size", "16M", f"{p['pool']}/{image}"), check=True)
    try:
        subprocess.run(rbd_cmd(p, "snap", "create", f"{p['pool']}/{image}@{snap}"), check=True)
        rep = replicate_group(env.primary, env.dr, [MemberCopy(image, snap)],
                              state_dir=env.state_dir)
        assert rep.recovery_point
        spec = drill_spec(env.status, snap, report_dir=str(tmp_path))
        spec.vms = [BootVM("blank", (BootDisk("disk0", image),))]
        report = run_drill(spec, LabBooter())
        assert report["verdict"] == "failed"
        assert report["error"] is None  # the drill ran; the check failed
        chk = report["checks"][0]
        assert not chk["ok"] and chk["summary"].startswith("FAILED")
        assert Path(tmp_path, f"drill-{report['drill_id']}", "check-writer.json").is_file()
        console = Path(report["consoles"]["blank"]).read_text()
        assert "cp-init: ready" in console
        html = Path(report["report_html"]).read_text()
        assert "FAILED" in html and "FAIL" in html and "cp-init: ready" in html
        assert report["cleanup"]["ok"], report["cleanup"]
    finally:
        for site in (p, d):
            subprocess.run(rbd_cmd(site, "snap", "purge", "--no-progress",
                                   f"{site['pool']}/{image}"), capture_output=True, check=False)
            subprocess.run(rbd_cmd(site, "rm", "--no-progress", f"{site['pool']}/{image}"),
                           capture_output=True, check=False)


def test_agent_booter_drill_is_refused_and_leaves_nothing(env: Env, tmp_path: Path) -> None:
    """The product's booter cannot boot clones: the drill fails with that
    reason in its report, and its clones are gone again."""
    from cutpoint.coordinator.dr.boot import AgentBooter

    if env.last is None:
        snap = env.snapshot()
        assert env.replicate(snap, None).recovery_point
        env.last = snap
    report = run_drill(drill_spec(env.status, env.last, report_dir=str(tmp_path)),
                       AgentBooter())
    assert report["verdict"] == "failed" and report["checks"] == []
    assert report["error"].startswith("DrillBootUnsupported: "), report["error"]
    assert "captured definition" in report["error"]
    assert report["cleanup"]["ok"], report["cleanup"]
    assert not any(leftovers(env.dr, f"drill-{report['drill_id']}").values())


def test_planned_failover_boots_at_dr_then_failback_ships_only_deltas(env: Env,
                                                                      tmp_path: Path) -> None:
    """Last in the module: it stops the primary guests (fencing)."""
    from cutpoint.checkers.writer import RbdSpec, scan_specs
    from cutpoint.coordinator.dr.boot import FAILOVER
    from cutpoint.coordinator.dr.failover import (
        failback_replicate,
        failover,
        fence_via_agents,
    )
    from cutpoint.lab.drillboot import agent_ref, stop_guests

    p, d = env.status["sites"]["primary"], env.status["sites"]["dr"]
    if env.last is None:
        snap = env.snapshot()
        assert env.replicate(snap, None).recovery_point
        env.last = snap
    # Planned: a final group snapshot, replicated, is the recovery point.
    final = env.snapshot()
    rep = env.replicate(final, env.last)
    assert rep.recovery_point and all(m.full is False for m in rep.members), rep.as_dict()
    hosts = {h["name"]: h for h in env.status["hosts"]}
    targets = [(hosts[v["host"]]["address"], 7443, [v["name"]]) for v in env.vms]
    tls = (str(env.certs / "ca.pem"), str(env.certs / "coordinator.pem"),
           str(env.certs / "coordinator.key"))
    vms = drill_spec(env.status, final).vms
    dr = agent_ref(env.status)
    boot = BootRequest(FAILOVER, env.dr, vms, "failover-test", workload="none",
                       agents={v.name: dr for v in vms}, tls=tls)
    booter = LabBooter(env.status["state_dir"])
    dr_agent = next(a for a in env.agents
                    if a["host"] == next(h["name"] for h in env.status["hosts"]
                                         if h["site"] == "dr"))
    guests: list[dict[str, Any]] = []
    try:
        res = failover(booter, boot, final, lambda: fence_via_agents(targets, tls))
        guests = [g.as_dict() for g in res.guests]
        assert sorted(res.fence["stopped"]) == sorted(v["name"] for v in env.vms), res.fence
        assert res.fence["unreachable"] == []
        for v in env.vms:
            assert not Path(f"/proc/{v['pid']}").exists(), f"{v['name']} still runs at primary"
        assert [g["vm"] for g in guests] == [v["name"] for v in env.vms]
        for g in guests:
            assert "cp-init: ready" in Path(g["console"]).read_text()
            assert Path(f"/proc/{g['pid']}").exists()
            assert g["agent"] == str(dr), g
        assert res.rto_s > 0 and res.timeline[-1]["step"] == "running"
        # Booted by the DR host's agent (vm.start runs its standby's start
        # command), not by the coordinator: one vm_start per VM, with the
        # agent's start_ms, and the agent logged each start.
        starts = {e["vm"]: e for e in res.timeline if e["step"] == "vm_start"}
        assert sorted(starts) == sorted(v["name"] for v in env.vms), res.timeline
        for e in starts.values():
            assert e["start_ms"] > 0 and e["already_running"] is False, e
        agent_log = Path(dr_agent["log"]).read_text(errors="replace")
        for v in env.vms:
            assert f"event=vm_start vm={v['name']} result=started" in agent_log, agent_log[-2000:]
        print("failover vm.start via " + dr_agent["address"] + ": "
              + ", ".join(f"{n} {e['start_ms']:.0f} ms" for n, e in sorted(starts.items())))
        # The writer checker on the disks the DR guests run from.
        verdict = scan_specs([RbdSpec(d["pool"], i, None, d["ceph_conf"], d["client_id"],
                                      d["keyring"]) for i in env.images])
        assert verdict.ok and verdict.p > 0, verdict.summary()
        print(f"failover RTO {res.rto_s:.1f}s, writer {verdict.summary()}")

        # Failback: the DR guests stop (planned: through their agent), DR
        # wrote a little meanwhile, a snapshot at DR, and only deltas go back
        # to the primary.
        assert booter.stop(boot, res.guests) == []
        for g in guests:
            assert not pid_alive(g["pid"]), g
        # 256 distinct random 4 KiB blocks of non-zero data per disk (rbd
        # bench fills its buffer with one random byte: 0 one time in 256).
        size = 64 << 20
        for k, i in enumerate(env.images):
            blocks = random.Random(k).sample(range(size // 4096), 256)
            write_extents(d, i, size, [(b * 4096, pattern(100 + b, 4096)) for b in blocks])
        fb = f"cp.{GROUP}.failback1"
        for i in env.images:
            subprocess.run(rbd_cmd(d, "snap", "create", f"{d['pool']}/{i}@{fb}"), check=True)
        # What each side changed since the common snapshot, as rbd sees it:
        # DR's new snapshot (to ship) and the primary's head (to repair).
        # rbd diff at DR is far above the 1 MiB written: the writer's disk is
        # sparse, and every object born after `final` counts from its start
        # to its end.  The engine ships only the non-zero 4 KiB blocks.
        rbd_diff = {i: (diff_sum(d, i, final, fb), diff_sum(p, i, final, None))
                    for i in env.images}
        assert not any(e["step"] == "rollback" and e["rolled_back"] for e in res.timeline)
        back = failback_replicate(env.dr, env.primary, env.images, fb, state_dir=env.state_dir,
                                  prefix=f"cp.{GROUP}.")
        assert back.recovery_point, back.as_dict()
        for m in back.members:
            assert m.base == final, m
            assert m.full is False
            assert m.bytes_shipped > 0, m
            print(f"failback {m.image}: shipped {m.bytes_shipped} B of {size} B "
                  f"(diff at DR {m.bytes_changed} B, of which zero blocks "
                  f"{m.bytes_zero_data} B, not even written {m.bytes_zero_skipped} B; "
                  f"primary drift {rbd_diff[m.image][1]} B, "
                  f"repaired {m.bytes_repaired} B)")
            assert m.bytes_changed == rbd_diff[m.image][0]
            # 1 MiB written at DR, what the primary wrote after `final`.
            assert m.bytes_shipped <= (1 << 20) + rbd_diff[m.image][1], m
        for i in env.images:
            assert sha256_of(p, i, fb) == sha256_of(d, i, fb)
    finally:
        stop_guests(guests)
