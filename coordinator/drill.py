"""Drills (test failover) at the DR site, without touching production.

    report = run_drill(DrillSpec(...))

Steps, each a timeline event in the report:

    clone      rbd clone <image>@<recovery point> -> drill-<id>-<image> (DR)
    isolate    a bridge of its own in the DR host's namespace (no uplink,
               no address: no route to production) and one tap per guest
    boot       QEMU per VM from the clones, inside the DR host namespace,
               guest NIC on the isolated bridge; wait for the guest init
    check      each check over the clones (built-in: `writer`)
    verdict    pass iff every guest booted and every check passed
    cleanup    (always, in `finally`) kill QEMU, delete taps and bridge,
               remove the clones, unprotect the snapshot if we protected it,
               then look again: anything left is reported as a leak

Agents start VMs only through libvirt (`vm.start` needs the libvirt driver,
docs/agent-protocol.md 4.9) and the lab runs plain QEMU, so drill guests are
started with the lab's own QEMU launcher (`cutpoint.lab.vms.qemu_argv`) in
the DR host's namespace.  Clones boot with workload `none`: the check reads
what the recovery point holds, not what a restarted workload wrote since.

Only clones are written; the replicated images and their snapshots are
never opened for writing, so replication of the group goes on meanwhile.
"""

from __future__ import annotations

import html
import json
import subprocess
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cutpoint.coordinator.replicate import ReplicationError, _rbd

EventHook = Callable[[dict[str, Any]], None]
READY = "cp-init: ready"


class DrillError(RuntimeError):
    pass


@dataclass
class DrillVM:
    name: str  # production VM name
    index: int  # its global lab index (MAC)
    disks: list[dict[str, Any]]  # [{node, image}] in node order


@dataclass
class DrillSpec:
    site: dict[str, Any]  # DR site (ceph_conf, keyring, client_id, pool)
    recovery_point: str  # snapshot name at DR, cp.<group>.<txn>
    vms: list[DrillVM]
    guest_image: dict[str, Any]  # {kernel, initrd}
    host_netns: str = "dr-h1"
    accel: str = "tcg"
    checks: list[str] = field(default_factory=lambda: ["writer"])
    report_dir: str = "/var/lib/cutpoint/drills"
    drill_id: str = ""
    boot_timeout_s: float = 240
    memory_mb: int = 160


def _sh(argv: list[str], timeout: float = 60, check: bool = True) -> str:
    cp = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if check and cp.returncode != 0:
        raise DrillError(f"{' '.join(argv)}: rc={cp.returncode}: {cp.stderr.strip()[-400:]}")
    return cp.stdout


def check_writer(spec: DrillSpec, clones: list[str]) -> dict[str, Any]:
    """The writer checker over every scratch image (a prefix of the writes, once each)."""
    from cutpoint.checkers.writer import RbdSpec, scan_specs

    s = spec.site
    v = scan_specs([RbdSpec(s.get("pool", "rbd"), c, None, s["ceph_conf"],
                            s.get("client_id", "admin"), s.get("keyring")) for c in clones])
    return {"ok": v.ok, "summary": v.summary(), "verdict": v.as_dict()}


CHECKS: dict[str, Callable[[DrillSpec, list[str]], dict[str, Any]]] = {"writer": check_writer}


class Drill:
    def __init__(self, spec: DrillSpec, on_event: EventHook | None = None) -> None:
        if not spec.vms:
            raise DrillError("a drill needs at least one VM")
        unknown = [c for c in spec.checks if c not in CHECKS]
        if unknown:
            raise DrillError(f"unknown check(s) {unknown}; known: {sorted(CHECKS)}")
        self.spec = spec
        self.id = spec.drill_id or uuid.uuid4().hex[:8]
        self.dir = Path(spec.report_dir) / f"drill-{self.id}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.on_event = on_event
        self.t0 = time.monotonic()
        self.timeline: list[dict[str, Any]] = []
        self.bridge = f"db{self.id[:6]}"
        self.clones: list[str] = []
        self.protected: list[str] = []
        self.guests: list[dict[str, Any]] = []
        self.taps: list[str] = []

    def event(self, step: str, status: str, **detail: Any) -> None:
        ev = {"t_s": round(time.monotonic() - self.t0, 3), "at": time.time(), "step": step,
              "status": status, **detail}
        self.timeline.append(ev)
        if self.on_event:
            self.on_event(ev)

    # -- steps --
    def clone(self) -> None:
        s, rp = self.spec.site, self.spec.recovery_point
        pool = s.get("pool", "rbd")
        for vm in self.spec.vms:
            for d in vm.disks:
                src = f"{pool}/{d['image']}@{rp}"
                info = json.loads(_rbd(s, "info", "--format", "json", src))
                if info.get("protected") not in (True, "true"):
                    _rbd(s, "snap", "protect", src)
                    self.protected.append(src)
                name = f"drill-{self.id}-{d['image']}"
                _rbd(s, "clone", src, f"{pool}/{name}")
                self.clones.append(name)
                d["clone"] = name
        self.event("clone", "ok", clones=list(self.clones))

    def isolate(self) -> None:
        ns = self.spec.host_netns
        cmds = [f"link add {self.bridge} type bridge", f"link set {self.bridge} up"]
        for k, _vm in enumerate(self.spec.vms):
            tap = f"{self.bridge}t{k}"
            cmds += [f"tuntap add dev {tap} mode tap", f"link set {tap} master {self.bridge} up"]
            self.taps.append(tap)
        subprocess.run(["ip", "-n", ns, "-batch", "-"], input="\n".join(cmds) + "\n",
                       text=True, capture_output=True, check=True, timeout=30)
        ports = _sh(["ip", "-n", ns, "-o", "link", "show", "master", self.bridge])
        # Link-local IPv6 (fe80::, scope link) is not a route anywhere; any
        # IPv4 or global address on the bridge would be.
        addrs = "\n".join(
            line for line in _sh(["ip", "-n", ns, "-o", "addr", "show", "dev",
                                  self.bridge]).splitlines()
            if " inet " in line or "scope global" in line)
        members = sorted(line.split(":", 2)[1].strip().split("@")[0]
                         for line in ports.splitlines() if ":" in line)
        if set(members) != set(self.taps) or addrs.strip():
            raise DrillError(f"bridge {self.bridge} is not isolated: ports {members}, "
                             f"addresses {addrs.strip()!r}")
        self.event("isolate", "ok", bridge=self.bridge, netns=ns, ports=members,
                   uplink=None, bridge_addresses=[])

    def boot(self) -> None:
        from cutpoint.lab import config as C
        from cutpoint.lab.vms import qemu_argv

        s = self.spec
        sites = {"dr": s.site}
        for k, vm in enumerate(s.vms):
            gdir = self.dir / vm.name
            gdir.mkdir(parents=True, exist_ok=True)
            g = {"name": f"drill-{self.id}-{vm.name}", "index": vm.index,
                 "address": f"10.78.0.{k + 1}", "mac": C.vm_mac(vm.index), "tap": self.taps[k],
                 "qmp": str(gdir / "qmp.sock"), "console": str(gdir / "console.log"),
                 "pidfile": str(gdir / "qemu.pid"), "workload": "none",
                 "disks": [{"node": d["node"], "backend": "rbd", "pool": s.site.get("pool", "rbd"),
                            "image": d["clone"], "site": "dr"} for d in vm.disks],
                 "vm": vm.name, "pid": 0}
            argv = qemu_argv(g, s.guest_image, s.accel, [g["address"]], sites, s.memory_mb, "")
            _sh(["ip", "netns", "exec", s.host_netns, *argv], timeout=60)
            g["pid"] = int(Path(g["pidfile"]).read_text().strip())
            self.guests.append(g)
        self.event("boot", "started", guests=[{"vm": g["vm"], "pid": g["pid"]}
                                              for g in self.guests])
        pending = {g["name"]: g for g in self.guests}
        end = time.monotonic() + s.boot_timeout_s
        while pending:
            for name, g in list(pending.items()):
                text = Path(g["console"]).read_text(errors="replace") \
                    if Path(g["console"]).exists() else ""
                if READY in text:
                    del pending[name]
                    self.event("boot", "ok", vm=g["vm"])
                elif not Path(f"/proc/{g['pid']}").exists():
                    raise DrillError(f"{g['vm']}: QEMU died during boot: "
                                     + " | ".join(text.strip().splitlines()[-3:]))
            if pending and time.monotonic() > end:
                raise DrillError(f"not booted after {s.boot_timeout_s:.0f}s: "
                                 f"{', '.join(sorted(pending))}")
            if pending:
                time.sleep(0.5)

    def run_checks(self) -> list[dict[str, Any]]:
        out = []
        for name in self.spec.checks:
            t = time.monotonic()
            try:
                r = CHECKS[name](self.spec, self.clones)
            except Exception as exc:  # noqa: BLE001  a crashed check is a failed check
                r = {"ok": False, "summary": f"check crashed: {type(exc).__name__}: {exc}"}
            r = {"name": name, "seconds": round(time.monotonic() - t, 3), **r}
            (self.dir / f"check-{name}.json").write_text(json.dumps(r, indent=2))
            self.event("check", "ok" if r["ok"] else "failed", check=name,
                       summary=r["summary"])
            out.append(r)
        return out

    def cleanup(self) -> dict[str, Any]:
        s = self.spec
        errors: list[str] = []
        stop_pids([g.get("pid") or 0 for g in self.guests])
        # Keep the console logs (evidence) next to the report.
        if self.taps or self.bridge:
            cmds = [f"link del {t}" for t in self.taps] + [f"link del {self.bridge}"]
            subprocess.run(["ip", "-n", s.host_netns, "-force", "-batch", "-"],
                           input="\n".join(cmds) + "\n", text=True, capture_output=True,
                           check=False, timeout=30)
        pool = s.site.get("pool", "rbd")
        for c in self.clones:
            last = ""
            for _ in range(40):  # a killed QEMU's watch lingers until it times out
                try:
                    _rbd(s.site, "rm", "--no-progress", f"{pool}/{c}")
                    break
                except ReplicationError as exc:
                    if "No such file" in exc.stderr:
                        break
                    last = str(exc)
                    time.sleep(1.5)
            else:
                errors.append(last)
        for src in self.protected:
            try:
                _rbd(s.site, "snap", "unprotect", src)
            except ReplicationError as exc:
                errors.append(str(exc))
        left = leftovers(s.site, s.host_netns, self.id)
        ok = not errors and not any(left.values())
        self.event("cleanup", "ok" if ok else "failed", errors=errors, leftovers=left)
        return {"ok": ok, "errors": errors, "leftovers": left}

    def run(self) -> dict[str, Any]:
        verdict, error, checks = "failed", None, []
        self.event("start", "ok", recovery_point=self.spec.recovery_point,
                   vms=[v.name for v in self.spec.vms], checks=self.spec.checks)
        cleanup: dict[str, Any] = {}
        try:
            self.clone()
            self.isolate()
            self.boot()
            checks = self.run_checks()
            verdict = "passed" if all(c["ok"] for c in checks) else "failed"
        except Exception as exc:  # noqa: BLE001  recorded in the report, then cleaned up
            error = f"{type(exc).__name__}: {exc}"
            self.event("error", "failed", error=error)
        finally:
            consoles = {g["vm"]: g["console"] for g in self.guests}
            cleanup = self.cleanup()
        if not cleanup.get("ok"):
            verdict = "failed"
        self.event("verdict", verdict)
        rto = next((e["t_s"] for e in reversed(self.timeline)
                    if e["step"] == "boot" and e["status"] == "ok"), None)
        report = {"drill_id": self.id, "recovery_point": self.spec.recovery_point,
                  "verdict": verdict, "error": error, "checks": checks,
                  "consoles": consoles, "boot_s": rto, "cleanup": cleanup,
                  "isolated_bridge": self.bridge, "host": self.spec.host_netns,
                  "timeline": self.timeline,
                  "report_json": str(self.dir / "report.json"),
                  "report_html": str(self.dir / "report.html")}
        (self.dir / "report.json").write_text(json.dumps(report, indent=2, default=str))
        (self.dir / "report.html").write_text(render_html(report))
        return report


def stop_pids(pids: list[int], grace_s: float = 10) -> None:
    """SIGTERM (QEMU then closes its RBD images: no stale watch or lock), SIGKILL after grace."""
    import os
    import signal

    live = [p for p in pids if p and Path(f"/proc/{p}").exists()]
    for p in live:
        os.kill(p, signal.SIGTERM)
    end = time.monotonic() + grace_s
    while time.monotonic() < end and any(Path(f"/proc/{p}").exists() for p in live):
        time.sleep(0.1)
    for p in live:
        if Path(f"/proc/{p}").exists():
            os.kill(p, signal.SIGKILL)
    end = time.monotonic() + 10
    while time.monotonic() < end and any(Path(f"/proc/{p}").exists() for p in live):
        time.sleep(0.1)


def run_drill(spec: DrillSpec, on_event: EventHook | None = None) -> dict[str, Any]:
    return Drill(spec, on_event).run()


def leftovers(site: dict[str, Any], netns: str, drill_id: str) -> dict[str, list[str]]:
    """Scratch images, QEMU processes and links of drill `drill_id` that still exist."""
    pool = site.get("pool", "rbd")
    images = [i for i in json.loads(_rbd(site, "ls", "--format", "json", pool))
              if i.startswith(f"drill-{drill_id}-")]
    procs = [line for line in _sh(["ps", "-eo", "pid,args"]).splitlines()
             if f"drill-{drill_id}-" in line and "qemu" in line]
    links = [ln for ln in _sh(["ip", "-n", netns, "-o", "link", "show"], check=False).splitlines()
             if f"db{drill_id[:6]}" in ln]
    return {"images": images, "processes": procs, "links": links}


def render_html(r: dict[str, Any]) -> str:
    e = html.escape
    color = "#2a7" if r["verdict"] == "passed" else "#c33"
    rows = "".join(
        f"<tr><td>{ev['t_s']:.1f}</td><td>{e(ev['step'])}</td><td>{e(ev['status'])}</td>"
        f"<td><code>{e(json.dumps({k: v for k, v in ev.items() if k not in ('t_s', 'at', 'step', 'status')}, default=str)[:400])}</code></td></tr>"
        for ev in r["timeline"])
    checks = "".join(
        f"<li><b>{e(c['name'])}</b>: {'pass' if c['ok'] else 'FAIL'} — {e(c['summary'])}</li>"
        for c in r["checks"]) or "<li>no check ran</li>"
    consoles = ""
    for vm, path in r["consoles"].items():
        try:
            text = Path(path).read_text(errors="replace")[-6000:]
        except OSError:
            text = "(no console log)"
        consoles += f"<h3>{e(vm)}</h3><pre>{e(text)}</pre>"
    return (f"<!doctype html><meta charset=utf-8><title>drill {e(r['drill_id'])}</title>"
            f"<h1>Drill {e(r['drill_id'])}: <span style='color:{color}'>"
            f"{e(r['verdict'].upper())}</span></h1>"
            f"<p>recovery point <code>{e(r['recovery_point'])}</code>, host "
            f"{e(r['host'])}, isolated bridge {e(r['isolated_bridge'])}</p>"
            + (f"<p><b>error:</b> {e(r['error'])}</p>" if r["error"] else "")
            + f"<h2>Checks</h2><ul>{checks}</ul><h2>Timeline</h2>"
            f"<table border=1 cellpadding=3><tr><th>t (s)</th><th>step</th><th>status</th>"
            f"<th>detail</th></tr>{rows}</table>"
            f"<h2>Cleanup</h2><pre>{e(json.dumps(r['cleanup'], indent=2))}</pre>"
            f"<h2>Consoles</h2>{consoles}")


def spec_from_lab(status: dict[str, Any], recovery_point: str, vms: list[str] | None = None,
                  **kw: Any) -> DrillSpec:
    """A DrillSpec for (some of) the lab's primary VMs, replicated to the lab's DR site."""
    chosen = [v for v in status["vms"] if v.get("site") == "primary"
              and (vms is None or v["name"] in vms)]
    dr_hosts = [h for h in status["hosts"] if h["site"] == "dr"]
    if not dr_hosts:
        raise DrillError("the lab has no DR host")
    return DrillSpec(
        site=status["sites"]["dr"], recovery_point=recovery_point,
        vms=[DrillVM(v["name"], v["index"], [{"node": d["node"], "image": d["image"]}
                                             for d in v["disks"]]) for v in chosen],
        guest_image=status["image"], host_netns=dr_hosts[0]["netns"],
        accel=status.get("accel", "tcg"), **kw)
