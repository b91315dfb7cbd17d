"""Drills (test failover) at the DR site, without touching production.

    report = run_drill(DrillSpec(...), booter)

Steps, each a timeline event in the report:

    clone      protect <image>@<recovery point> (unless it is already; the
               image's metadata `cutpoint.drill_protected.<snap>` then names
               the drill, for the sweeper) and clone it ->
               drill-<id>-<image>, in the same pool at DR (site.py)
    boot       the booter starts one VM per member VM from the clones, on a
               network with no route to production (the booter's own
               events, e.g. `isolate`, go into the timeline too), then waits
               until each is ready by its readiness rule (`boot ok` per VM).
               A booter that starts VMs only from definitions
               (`needs_definitions`: the agent booter) gets them from
               `DrillSpec.definitions`: each VM's captured definition
               rewritten for its clones as `drill-<id>-<vm>` on the
               isolated drill network, signed, transient (the control
               plane builds them: api/services/drill_boot.py)
    check      each check over the clones and the booted VMs (checks.py; the
               built-in `writer` reads the recovery point's DR snapshots)
    verdict    pass iff every guest booted and every check passed
    cleanup    (always, in `finally`) the booter stops what it started,
               the clones are removed, the snapshot unprotected if we
               protected it; then look again: anything left (a clone, or
               what the booter reports for the drill's tag) is a leak

What the drill made (clones, protected snapshots, guests) is written to
`state.json` in its report directory as it goes.  A drill whose worker died
is not run again: `sweep_interrupted` (same spec, same drill id) stops the
guests and removes the clones that file names, unprotects what it
protected, and reports what is left, as `cleanup` would have.

Only clones are written; the replicated images and their snapshots are
never opened for writing, so replication of the group goes on meanwhile.
Clones boot with workload `none`: a check reads what the recovery point
holds, not what a restarted workload wrote since.
"""

from __future__ import annotations

import errno
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cutpoint.coordinator.dr import checks as drill_checks
from cutpoint.coordinator.dr.boot import (
    DRILL,
    BootDisk,
    Booter,
    BootRequest,
    BootVM,
    Guest,
)
from cutpoint.coordinator.dr.ceph_errors import CephError, CephNotFound
from cutpoint.coordinator.dr.drill_report import render_html
from cutpoint.coordinator.dr.site import CephConnection, CephSite, ImageRef

EventHook = Callable[[dict[str, Any]], None]


# Image metadata key that names the drill that protected a snapshot of the
# image (value: its tag `drill-<id>`), set before the protect and removed
# after the unprotect (api/services/drill_sweeper.py reads it).
PROTECTED_PREFIX = "cutpoint.drill_protected."


def protected_key(snap: str) -> str:
    return f"{PROTECTED_PREFIX}{snap}"


@dataclass
class DrillBoot:
    """How the drill's VMs are started by a booter that needs definitions:
    the VMs under their drill names (`drill-<id>-<vm>`, clone disks), the
    agent and the signed vm.start spec of each, the TLS files to reach
    them, and each drill name's original VM."""
    vms: list[BootVM]
    agents: dict[str, Any]
    specs: dict[str, dict[str, Any]]
    tls: tuple[str, str, str] | None
    original: dict[str, str]


# (tag, the clone VMs under their original names) -> DrillBoot
Definitions = Callable[[str, list[BootVM]], DrillBoot]


class DrillError(RuntimeError):
    pass


@dataclass
class DrillSpec:
    site: CephSite  # the DR site
    recovery_point: str  # snapshot name at DR, cp.<group>.<txn>
    vms: list[BootVM]  # the member VMs, with their replicated images at DR
    # names or {name, params, timeout_s} (checks.CheckSpec)
    checks: list[Any] = field(default_factory=lambda: ["writer"])
    report_dir: str = "/var/lib/cutpoint/drills"
    drill_id: str = ""
    boot_timeout_s: float = 240
    # for a booter that needs definitions (see the module's `boot` step)
    definitions: Definitions | None = None
    # the TLS files (ca, cert, key) that reach the DR agents (a sweep of an
    # interrupted drill stops its VMs through them)
    agent_tls: tuple[str, str, str] | None = None
    # original VM name -> its readiness rule (readiness.Readiness.parse)
    readiness: dict[str, dict[str, Any]] = field(default_factory=dict)
    # the boot order, hooks and readiness per VM (plan.RecoveryPlan);
    # None: every VM at once
    plan: Any = None


class Drill:
    def __init__(self, spec: DrillSpec, booter: Booter,
                 on_event: EventHook | None = None) -> None:
        if not spec.vms:
            raise DrillError("a drill needs at least one VM")
        try:
            self.checks = [drill_checks.CheckSpec.parse(c) for c in spec.checks]
        except drill_checks.CheckError as exc:
            raise DrillError(str(exc)) from exc
        unknown = [c.name for c in self.checks if c.name not in drill_checks.known()]
        if unknown:
            raise DrillError(f"unknown check(s) {unknown}; known: {drill_checks.known()}")
        self.spec = spec
        self.booter = booter
        self.id = spec.drill_id or uuid.uuid4().hex[:8]
        self.tag = f"drill-{self.id}"
        self.dir = Path(spec.report_dir) / self.tag
        self.dir.mkdir(parents=True, exist_ok=True)
        self.on_event = on_event
        self.t0 = time.monotonic()
        self.timeline: list[dict[str, Any]] = []
        self.clones: list[ImageRef] = []
        self.clone_vms: list[BootVM] = []
        self.protected: list[ImageRef] = []
        self.guests: list[Guest] = []
        self.original: dict[str, str] = {}  # drill VM name -> the group's VM
        self.request = BootRequest(DRILL, spec.site, [], self.tag, evidence_dir=str(self.dir))

    def event(self, step: str, status: str, **detail: Any) -> None:
        ev = {"t_s": round(time.monotonic() - self.t0, 3), "at": time.time(), "step": step,
              "status": status, **detail}
        self.timeline.append(ev)
        if self.on_event:
            self.on_event(ev)

    def _booter_event(self, step: str, detail: dict[str, Any]) -> None:
        d = dict(detail)
        self.event(step, str(d.pop("status", "ok")), **d)

    # -- steps --
    def clone(self) -> None:
        rp = self.spec.recovery_point
        with CephConnection(self.spec.site) as ceph:
            for vm in self.spec.vms:
                disks = []
                for d in vm.disks:
                    if not ceph.is_protected(d.pool, d.image, rp):
                        # Whose protection this is, on the image, before it
                        # exists: the drill sweeper finds it there when the
                        # process died and its state file is out of reach.
                        ceph.metadata_set(d.pool, d.image, protected_key(rp), self.tag)
                        ceph.protect(d.pool, d.image, rp)
                        self.protected.append(ImageRef(d.pool, d.image, rp))
                    name = f"{self.tag}-{d.image}"
                    ceph.clone(d.pool, d.image, rp, name)
                    self.clones.append(ImageRef(d.pool, name))
                    disks.append(BootDisk(d.node, name, d.pool))
                self.clone_vms.append(BootVM(vm.name, tuple(disks)))
        self.request.vms = self.clone_vms
        self._save_state()
        self.event("clone", "ok", clones=[c.image for c in self.clones])

    def _definitions(self) -> None:
        """The booter's VMs, agents and signed specs (a booter that needs
        definitions), and each VM's readiness rule under its boot name."""
        if getattr(self.booter, "needs_definitions", False) and self.spec.definitions:
            db = self.spec.definitions(self.tag, self.clone_vms)
            self.original = dict(db.original)
            self.request.vms, self.request.agents = db.vms, dict(db.agents)
            self.request.specs, self.request.tls = dict(db.specs), db.tls
            self._save_state()
            self.event("define", "ok", vms={v.name: self.original.get(v.name, v.name)
                                            for v in db.vms},
                       agents={v: str(a) for v, a in db.agents.items()})
        name_of = {orig: boot for boot, orig in self.original.items()}
        self.request.readiness = {name_of.get(vm, vm): rule
                                  for vm, rule in self.spec.readiness.items()}

    def boot(self) -> None:
        from cutpoint.coordinator.dr.plan import RecoveryPlan, boot_in_order

        self._definitions()
        names = {orig: boot for boot, orig in self.original.items()}
        try:
            self.guests = boot_in_order(self.booter, self.request,
                                        self.spec.plan or RecoveryPlan(),
                                        self.spec.boot_timeout_s, self._ready_event, names)
        except Exception as exc:
            self.guests = list(getattr(exc, "guests", []))
            self._save_state()
            raise
        finally:
            if self.guests:
                self._save_state()

    def _save_state(self) -> None:
        """What exists because of this drill, for `sweep_interrupted` if the
        process running it dies (written before the next step begins)."""
        st = {"clones": [[c.pool, c.image] for c in self.clones],
              "protected": [[p.pool, p.image, p.snap] for p in self.protected],
              "vms": [[v.name, [[d.node, d.image, d.pool] for d in v.disks]]
                      for v in self.clone_vms],
              "guests": [{"vm": g.vm, "agent": g.agent, "detail": g.detail}
                         for g in self.guests],
              # a booter that needs definitions: what it was asked to start
              "boot_vms": [v.name for v in self.request.vms] if self.original else [],
              "agents": {vm: [a.address, a.port, a.cert_sha256]
                         for vm, a in self.request.agents.items()},
              "original": self.original}
        tmp = self.dir / "state.json.tmp"
        tmp.write_text(json.dumps(st, default=str))
        tmp.replace(self.dir / "state.json")

    def _load_state(self) -> bool:
        """The clones, protections and guests an earlier run of this drill id
        recorded; False when it recorded none."""
        p = self.dir / "state.json"
        if not p.exists():
            return False
        st = json.loads(p.read_text())
        self.clones = [ImageRef(pool, image) for pool, image in st["clones"]]
        self.protected = [ImageRef(pool, image, snap) for pool, image, snap in st["protected"]]
        self.clone_vms = [BootVM(name, tuple(BootDisk(n, i, pl) for n, i, pl in disks))
                          for name, disks in st["vms"]]
        self.request.vms = self.clone_vms
        self.guests = [Guest(g["vm"], g.get("agent"), detail=dict(g.get("detail") or {}))
                       for g in st["guests"]]
        self.original = dict(st.get("original") or {})
        if st.get("boot_vms"):
            self.request.vms = [BootVM(n, ()) for n in st["boot_vms"]]
        from cutpoint.coordinator.dr.boot import AgentRef

        self.request.agents = {vm: AgentRef(a, int(p), pin)
                               for vm, (a, p, pin) in (st.get("agents") or {}).items()}
        self.request.tls = self.spec.agent_tls
        return True

    def _ready_event(self, step: str, detail: dict[str, Any]) -> None:
        if step == "boot":  # a boot group's VMs started: saved before waiting
            self.guests = list(self.guests) + [g for g in detail.get("started", [])
                                               if g not in self.guests]
            self._save_state()
            self.event("boot", "started", group=detail.get("group"),
                       guests=[g.as_dict() for g in detail.get("started", [])])
            return
        if step == "ready":  # the drill's timeline says `boot ok` per VM
            d = dict(detail)
            if d.get("vm") in self.original:  # the group's VM; its drill name beside
                d["boot_name"], d["vm"] = d["vm"], self.original[d["vm"]]
            self.event("boot", "ok", **d)
        else:
            self._booter_event(step, detail)

    def check_context(self) -> drill_checks.CheckContext:
        vms = [drill_checks.DrillVM(v.name, self.original.get(v.name, v.name),
                                    self.request.agents.get(v.name))
               for v in self.request.vms]
        rp = self.spec.recovery_point
        points = [ImageRef(d.pool, d.image, rp) for vm in self.spec.vms for d in vm.disks]
        return drill_checks.CheckContext(self.spec.site, list(self.clones), vms,
                                         tls=self.request.tls, drill_id=self.id,
                                         points=points)

    def run_checks(self) -> list[dict[str, Any]]:
        out = []
        base = self.check_context()
        for c in self.checks:
            ctx = drill_checks.CheckContext(base.site, base.images, base.vms, dict(c.params),
                                            c.timeout_s, base.tls, base.drill_id,
                                            base._addresses, base.points)
            self.event("check", "started", check=c.name)
            r = drill_checks.run(c, ctx)
            n = sum(1 for x in out if x["name"] == c.name)
            fname = f"check-{c.name}{f'-{n + 1}' if n else ''}.json"
            (self.dir / fname).write_text(json.dumps(r, indent=2, default=str))
            self.event("check", "ok" if r["ok"] else "failed", check=c.name,
                       summary=r["summary"])
            out.append(r)
        return out

    def cleanup(self) -> dict[str, Any]:
        s = self.spec
        errors: list[str] = []
        try:
            errors += self.booter.stop(self.request, self.guests)
        except Exception as exc:  # noqa: BLE001  recorded; the clones still go
            errors.append(f"booter stop: {type(exc).__name__}: {exc}")
        try:
            errors += self._remove_clones()
        except CephError as exc:  # no session to the site at all: recorded
            errors.append(str(exc))
        try:
            left = leftovers(s.site, self.tag, sorted({d.pool for v in s.vms for d in v.disks}))
        except CephError as exc:  # cannot tell: reported, not hidden
            errors.append(f"leftovers: {exc}")
            left = {"images": [f"unknown: {exc.code}"]}
        try:
            left.update(self.booter.leftovers(self.request))
        except Exception as exc:  # noqa: BLE001  cannot tell: reported, not hidden
            errors.append(f"booter leftovers: {type(exc).__name__}: {exc}")
        ok = not errors and not any(left.values())
        self.event("cleanup", "ok" if ok else "failed", errors=errors, leftovers=left)
        return {"ok": ok, "errors": errors, "leftovers": left}

    def _remove_clones(self) -> list[str]:
        """Remove the clones, then unprotect what the drill protected; the errors."""
        errors: list[str] = []
        with CephConnection(self.spec.site) as ceph:
            for c in self.clones:
                for attempt in range(40):
                    try:
                        ceph.remove_image(c.pool, c.image)
                        break
                    except CephNotFound:
                        break
                    except CephError as exc:
                        # A killed VM's watch on the clone lingers until it
                        # times out: EBUSY passes with time, nothing else does.
                        if exc.errno != errno.EBUSY or attempt == 39:
                            errors.append(str(exc))
                            break
                        time.sleep(1.5)
            for p in self.protected:
                try:
                    ceph.unprotect(p.pool, p.image, str(p.snap))
                    ceph.metadata_remove(p.pool, p.image, protected_key(str(p.snap)))
                except CephError as exc:
                    errors.append(str(exc))
        return errors

    def run(self) -> dict[str, Any]:
        verdict, error, checks = "failed", None, []
        self.event("start", "ok", recovery_point=self.spec.recovery_point,
                   vms=[v.name for v in self.spec.vms], checks=[c.name for c in self.checks],
                   booter=type(self.booter).__name__)
        cleanup: dict[str, Any] = {}
        consoles: dict[str, str] = {}
        try:
            self.clone()
            self.boot()
            checks = self.run_checks()
            verdict = "passed" if all(c["ok"] for c in checks) else "failed"
        except Exception as exc:  # noqa: BLE001  recorded in the report, then cleaned up
            error = f"{type(exc).__name__}: {exc}"
            self.event("error", "failed", error=error)
        finally:
            consoles = {g.vm: str(g.detail["console"]) for g in self.guests
                        if g.detail.get("console")}
            cleanup = self.cleanup()
        if not cleanup.get("ok"):
            verdict = "failed"
        self.event("verdict", verdict)
        boot_s = next((e["t_s"] for e in reversed(self.timeline)
                       if e["step"] == "boot" and e["status"] == "ok"), None)
        boot_order = [{"group": e.get("group"), "order": e.get("order"), "vms": e.get("vms"),
                       "ready_t_s": e["t_s"]} for e in self.timeline
                      if e["step"] == "boot_group" and e["status"] == "ok"]
        report = {"drill_id": self.id, "recovery_point": self.spec.recovery_point,
                  "verdict": verdict, "error": error, "checks": checks,
                  "booter": type(self.booter).__name__,
                  "guests": [{**g.as_dict(), "original": self.original.get(g.vm, g.vm)}
                             for g in self.guests],
                  "consoles": consoles, "boot_s": boot_s, "boot_order": boot_order,
                  "cleanup": cleanup,
                  "timeline": self.timeline,
                  "report_json": str(self.dir / "report.json"),
                  "report_html": str(self.dir / "report.html")}
        (self.dir / "report.json").write_text(json.dumps(report, indent=2, default=str))
        (self.dir / "report.html").write_text(render_html(report))
        return report


def run_drill(spec: DrillSpec, booter: Booter,
              on_event: EventHook | None = None) -> dict[str, Any]:
    return Drill(spec, booter, on_event).run()


def _unrecorded_guests(d: Drill) -> None:
    """Adds to `d.guests` the VMs the run asked its booter to start that are
    there though its state file does not list them: the process died
    between the starts and the state written after them (CI rehearsal of
    7b6d99e, under load: both domains running, `guests: []`, so the sweep
    stopped nothing and the clones stayed busy).  Only a booter that can
    say what runs (`states`) is asked."""
    states = getattr(d.booter, "states", None)
    recorded = {g.vm for g in d.guests}
    unrecorded = [v.name for v in d.request.vms if v.name not in recorded]
    if states is None or not unrecorded:
        return
    try:
        found = states(d.request, unrecorded)
    except Exception as exc:  # noqa: BLE001  recorded; cleanup's leftovers say the rest
        d.event("sweep", "failed", error=f"booter states: {type(exc).__name__}: {exc}")
        return
    d.guests = list(d.guests) + [Guest(vm) for vm, st in found.items() if st != "absent"]


def sweep_interrupted(spec: DrillSpec, booter: Booter,
                      on_event: EventHook | None = None) -> dict[str, Any]:
    """Clean up after a run of drill `spec.drill_id` that died mid-way (its
    process killed): stop the guests and remove the clones its state file
    names, unprotect what it protected, then look for anything left under
    the drill's tag.  {"found", "cleanup": {ok, errors, leftovers}, "timeline"}."""
    d = Drill(spec, booter, on_event)
    found = d._load_state()
    if not d.clone_vms:  # died before its clones were recorded: the booter's per-VM names
        d.request.vms = [BootVM(v.name, ()) for v in spec.vms]
    _unrecorded_guests(d)
    d.event("sweep", "started", found=found, clones=[c.image for c in d.clones],
            guests=[g.vm for g in d.guests])
    # Clones made before the state file was written (the process died inside
    # clone()) are found by their tag.
    try:
        pools = sorted({dk.pool for v in spec.vms for dk in v.disks})
        named = {(c.pool, c.image) for c in d.clones}
        for pool in pools:
            with CephConnection(spec.site) as ceph:
                d.clones += [ImageRef(pool, i) for i in ceph.list_images(pool)
                             if i.startswith(f"{d.tag}-") and (pool, i) not in named]
    except CephError as exc:
        d.event("sweep", "failed", error=str(exc))
    cleanup = d.cleanup()
    return {"drill_id": d.id, "found": found, "cleanup": cleanup, "timeline": d.timeline}


def leftovers(site: CephSite, tag: str, pools: list[str] | None = None) -> dict[str, list[str]]:
    """The drill's clones (`<tag>-*` images at the DR site) that still exist."""
    images: list[str] = []
    with CephConnection(site) as ceph:
        for pool in pools or ["rbd"]:
            images += [i for i in ceph.list_images(pool) if i.startswith(f"{tag}-")]
    return {"images": images}
