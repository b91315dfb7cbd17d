"""Drills (test failover) at the DR site, without touching production.

    report = run_drill(DrillSpec(...), booter)

Steps, each a timeline event in the report:

    clone      protect <image>@<recovery point> (unless it is already) and clone
               it -> drill-<id>-<image>, in the same pool at DR (site.py)
    boot       the booter starts one VM per member VM from the clones, on a
               network with no route to production (the booter's own
               events, e.g. `isolate`, go into the timeline too), then waits
               until each is ready (`boot ok` per VM)
    check      each check over the clones (checks.py; built in: `writer`)
    verdict    pass iff every guest booted and every check passed
    cleanup    (always, in `finally`) the booter stops what it started,
               the clones are removed, the snapshot unprotected if we
               protected it; then look again: anything left (a clone, or
               what the booter reports for the drill's tag) is a leak

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


class DrillError(RuntimeError):
    pass


@dataclass
class DrillSpec:
    site: CephSite  # the DR site
    recovery_point: str  # snapshot name at DR, cp.<group>.<txn>
    vms: list[BootVM]  # the member VMs, with their replicated images at DR
    checks: list[str] = field(default_factory=lambda: ["writer"])
    report_dir: str = "/var/lib/cutpoint/drills"
    drill_id: str = ""
    boot_timeout_s: float = 240


class Drill:
    def __init__(self, spec: DrillSpec, booter: Booter,
                 on_event: EventHook | None = None) -> None:
        if not spec.vms:
            raise DrillError("a drill needs at least one VM")
        unknown = [c for c in spec.checks if c not in drill_checks.known()]
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
                        ceph.protect(d.pool, d.image, rp)
                        self.protected.append(ImageRef(d.pool, d.image, rp))
                    name = f"{self.tag}-{d.image}"
                    ceph.clone(d.pool, d.image, rp, name)
                    self.clones.append(ImageRef(d.pool, name))
                    disks.append(BootDisk(d.node, name, d.pool))
                self.clone_vms.append(BootVM(vm.name, tuple(disks)))
        self.request.vms = self.clone_vms
        self.event("clone", "ok", clones=[c.image for c in self.clones])

    def boot(self) -> None:
        try:
            self.guests = self.booter.start(self.request, self._booter_event)
        except Exception as exc:
            self.guests = list(getattr(exc, "guests", []))
            raise
        self.event("boot", "started", guests=[g.as_dict() for g in self.guests])
        self.booter.wait_ready(self.request, self.guests, self.spec.boot_timeout_s,
                               self._ready_event)

    def _ready_event(self, step: str, detail: dict[str, Any]) -> None:
        if step == "ready":  # the drill's timeline says `boot ok` per VM
            self.event("boot", "ok", **detail)
        else:
            self._booter_event(step, detail)

    def run_checks(self) -> list[dict[str, Any]]:
        out = []
        for name in self.spec.checks:
            t = time.monotonic()
            try:
                r = drill_checks.get(name)(self.spec.site, list(self.clones))
            except Exception as exc:  # noqa: BLE001  a crashed check is a failed check
                r = {"ok": False, "summary": f"check crashed: {type(exc).__name__}: {exc}"}
            r = {"name": name, "seconds": round(time.monotonic() - t, 3), **r}
            (self.dir / f"check-{name}.json").write_text(json.dumps(r, indent=2, default=str))
            self.event("check", "ok" if r["ok"] else "failed", check=name,
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
                except CephError as exc:
                    errors.append(str(exc))
        return errors

    def run(self) -> dict[str, Any]:
        verdict, error, checks = "failed", None, []
        self.event("start", "ok", recovery_point=self.spec.recovery_point,
                   vms=[v.name for v in self.spec.vms], checks=self.spec.checks,
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
        report = {"drill_id": self.id, "recovery_point": self.spec.recovery_point,
                  "verdict": verdict, "error": error, "checks": checks,
                  "booter": type(self.booter).__name__,
                  "guests": [g.as_dict() for g in self.guests],
                  "consoles": consoles, "boot_s": boot_s, "cleanup": cleanup,
                  "timeline": self.timeline,
                  "report_json": str(self.dir / "report.json"),
                  "report_html": str(self.dir / "report.html")}
        (self.dir / "report.json").write_text(json.dumps(report, indent=2, default=str))
        (self.dir / "report.html").write_text(render_html(report))
        return report


def run_drill(spec: DrillSpec, booter: Booter,
              on_event: EventHook | None = None) -> dict[str, Any]:
    return Drill(spec, booter, on_event).run()


def leftovers(site: CephSite, tag: str, pools: list[str] | None = None) -> dict[str, list[str]]:
    """The drill's clones (`<tag>-*` images at the DR site) that still exist."""
    images: list[str] = []
    with CephConnection(site) as ceph:
        for pool in pools or ["rbd"]:
            images += [i for i in ceph.list_images(pool) if i.startswith(f"{tag}-")]
    return {"images": images}
