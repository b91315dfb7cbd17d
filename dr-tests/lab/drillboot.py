"""The lab's booter (`booter = lab`), plugged into cutpoint.coordinator.dr.boot.

Registered as entry point `lab` of `cutpoint.booters` (setup.cfg); the
lab's tests, demo and drills run the control plane with CUTPOINT_BOOTER=lab.

failover  through the DR host's agent like the product's AgentBooter
          (`vm.start` of the standby the agent defines, cutpoint.lab.standby),
          after writing the request's workload into each standby's spec
          (the guest command line; the writer with `--resume`, so it
          continues its run: `failover_args`); ready = the guest's init printed its
          ready line on the console (QEMU still alive), which is later than
          the agent's `running` and means the workload started
drill     the agents cannot boot clones (they start only the VMs they
          define), so the lab boots them itself: a bridge of its own in the
          DR host's namespace (no uplink, no address: no route to
          production) with one tap per guest (event `isolate`), and QEMU
          per VM from the clones (`cutpoint.lab.vms.qemu_argv`, workload
          `none`) with its console and pid file under the drill's evidence
          directory; ready = the console's ready line

Which lab: the status of `CUTPOINT_LAB_DIR` (or the default state dir).
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

from cutpoint.coordinator.dr.boot import (
    DRILL,
    FAILOVER,
    AgentBooter,
    AgentRef,
    BootDisk,
    BootError,
    BootRequest,
    BootVM,
    EventHook,
    Guest,
    Unbootable,
)
from cutpoint.coordinator.dr.drill import DrillSpec
from cutpoint.lab import config as C
from cutpoint.lab.errors import LabError
from cutpoint.lab.proc import kill_pids, pid_alive, read_pidfile
from cutpoint.lab.status import load_status
from cutpoint.lab.vms import READY

DEFAULT_MEMORY_MB = 160


def _sh(argv: list[str], timeout: float = 60, check: bool = True) -> str:
    try:
        cp = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                            check=False)
    except subprocess.TimeoutExpired as exc:
        # A QEMU that cannot reach its disks' Ceph never finishes starting
        # (its daemonized child waits in the RBD open): say which command.
        guest = next((a.split(",")[0].removeprefix("guest=") for a in argv
                      if a.startswith("guest=")), None)
        what = f"QEMU of {guest}" if guest else " ".join(argv[:6])
        raise BootError(f"{what}: not started within {timeout:.0f} s") from exc
    if check and cp.returncode != 0:
        raise BootError(f"{' '.join(argv)}: rc={cp.returncode}: {cp.stderr.strip()[-400:]}")
    return cp.stdout


def _dr_netns(status: dict[str, Any]) -> str:
    host = next((h for h in status.get("hosts", []) if h["site"] == "dr"), None)
    if host is None:
        raise BootError("the lab has no DR host")
    return str(host["netns"])


def _tag_qemus(tag: str) -> list[tuple[int, str]]:
    """(pid, `ps` line) of every QEMU of a drill's guests (named `<tag>-<vm>`)."""
    return [(int(line.split(None, 1)[0]), line)
            for line in _sh(["ps", "-eo", "pid,args"]).splitlines()
            if f"{tag}-" in line and "qemu" in line]


def bridge_of(tag: str) -> str:
    """The isolated bridge of a drill (interface names are at most 15 bytes)."""
    return f"db{tag.removeprefix('drill-')[:6]}"


class LabBooter:
    purposes = frozenset({FAILOVER, DRILL})

    def __init__(self, state_dir: str | None = None) -> None:
        self.state_dir = state_dir

    def status(self) -> dict[str, Any]:
        try:
            return load_status(self.state_dir)
        except LabError as exc:
            raise BootError(f"the lab booter needs a running lab: {exc}") from exc

    def preflight(self, req: BootRequest) -> list[Unbootable]:
        """Failover: the DR agent's check (AgentBooter), and a standby spec
        per VM.  A drill boots its clones itself: nothing to ask."""
        if req.purpose == DRILL:
            return []
        from cutpoint.lab import standby

        out = AgentBooter().preflight(req)
        try:
            status = self.status()
        except BootError as exc:
            return out + [Unbootable(v.name, "cannot_start", str(exc)) for v in req.vms]
        for vm in req.vms:
            try:
                standby.load(status, vm.name)
            except (LabError, OSError, ValueError) as exc:
                out.append(Unbootable(vm.name, "cannot_start", f"no standby at DR: {exc}"))
        return out

    def start(self, req: BootRequest, on_event: EventHook | None = None) -> list[Guest]:
        if req.purpose == DRILL:
            return self._start_clones(req, on_event)
        return self._start_standbys(req, on_event)

    def wait_ready(self, req: BootRequest, guests: list[Guest], timeout_s: float,
                   on_event: EventHook | None = None) -> None:
        """Until every guest's console has the init's ready line (its QEMU alive)."""
        end = time.monotonic() + timeout_s
        pending = {g.vm: g for g in guests}
        while pending:
            for name, g in list(pending.items()):
                p = Path(g.detail["console"])
                text = p.read_text(errors="replace") if p.exists() else ""
                if READY in text:
                    del pending[name]
                    if on_event:
                        on_event("ready", {"vm": name})
                elif not pid_alive(int(g.detail.get("pid") or 0)):
                    raise BootError(f"{name}: QEMU died during boot: "
                                    + " | ".join(text.strip().splitlines()[-3:]), guests)
            if pending and time.monotonic() > end:
                raise BootError(f"not booted after {timeout_s:.0f}s: "
                                f"{', '.join(sorted(pending))}", guests)
            if pending:
                time.sleep(0.5)

    def stop(self, req: BootRequest, guests: list[Guest]) -> list[str]:
        if req.purpose == FAILOVER:
            # QEMU of a standby is the agent's child: quit through its QMP.
            errors = AgentBooter().stop(req, guests)
            stop_guests([g.as_dict() for g in guests])
            return errors
        stop_guests([g.as_dict() for g in guests])
        # A QEMU whose start timed out was never recorded as a guest, but
        # its daemonized child may still run: every QEMU of the drill's tag goes.
        kill_pids([pid for pid, _ in _tag_qemus(req.tag)], grace=10)
        status = self.status()
        ns = _dr_netns(status)
        bridge = bridge_of(req.tag)
        taps = [f"{bridge}t{k}" for k in range(len(req.vms))]
        cmds = [f"link del {t}" for t in taps] + [f"link del {bridge}"]
        subprocess.run(["ip", "-n", ns, "-force", "-batch", "-"],
                       input="\n".join(cmds) + "\n", text=True, capture_output=True,
                       check=False, timeout=30)
        return []

    def leftovers(self, req: BootRequest) -> dict[str, list[str]]:
        if req.purpose == FAILOVER:
            return AgentBooter().leftovers(req)
        ns = _dr_netns(self.status())
        procs = [line for _, line in _tag_qemus(req.tag)]
        links = [ln for ln in _sh(["ip", "-n", ns, "-o", "link", "show"],
                                  check=False).splitlines()
                 if bridge_of(req.tag) in ln]
        return {"processes": procs, "links": links}

    # -- failover: the DR agent's standbys --

    def _start_standbys(self, req: BootRequest, on_event: EventHook | None) -> list[Guest]:
        from cutpoint.lab import standby

        status = self.status()
        # Failover boots DR's standbys; a failback, the primary's own VMs.
        site = "dr" if req.site is None or req.site.name == "dr" else req.site.name
        specs = {}
        args = failover_args(status, req.workload)
        for vm in req.vms:
            try:
                standby.set_workload(status, vm.name, req.workload, args, site=site)
                specs[vm.name] = standby.load(status, vm.name, site)
            except (LabError, OSError, ValueError) as exc:
                raise BootError(f"{vm.name}: no standby at DR: {exc}") from exc
        try:
            guests = AgentBooter().start(req, on_event)
        except BootError as exc:
            for g in exc.guests:
                self._describe(g, specs[g.vm], req.workload)
            raise
        for g in guests:
            self._describe(g, specs[g.vm], req.workload)
        return guests

    @staticmethod
    def _describe(g: Guest, s: dict[str, Any], workload: str) -> None:
        g.detail.update(
            pid=read_pidfile(Path(s["pidfile"])), console=s["console"], qmp=s["qmp"],
            pidfile=s["pidfile"], netns=s["netns"], tap=s["tap"], index=s["index"],
            address=s["address"], mac=s["mac"], workload=workload,
            disks=[d["image"] for d in s["disks"]])

    # -- drill: clones on an isolated bridge --

    def _start_clones(self, req: BootRequest, on_event: EventHook | None) -> list[Guest]:
        from cutpoint.lab.vms import qemu_argv

        if req.site is None:
            raise BootError("a drill's boot request names the Ceph site of its clones")
        status = self.status()
        ns = _dr_netns(status)
        bridge = bridge_of(req.tag)
        taps = [f"{bridge}t{k}" for k in range(len(req.vms))]
        self._isolate(ns, bridge, taps, on_event)
        evidence = Path(req.evidence_dir or Path(status["state_dir"]) / "drills" / req.tag)
        index = {v["name"]: int(v["index"]) for v in status.get("vms", [])}
        memory = int(status.get("config", {}).get("memory_mb") or DEFAULT_MEMORY_MB)
        guests: list[Guest] = []
        try:
            for k, vm in enumerate(req.vms):
                gdir = evidence / vm.name
                gdir.mkdir(parents=True, exist_ok=True)
                idx = index.get(vm.name, 200 + k)  # a VM the lab does not know: a free MAC
                g: dict[str, Any] = {"name": f"{req.tag}-{vm.name}", "index": idx,
                     "address": f"10.78.0.{k + 1}", "mac": C.vm_mac(idx), "tap": taps[k],
                     "qmp": str(gdir / "qmp.sock"), "console": str(gdir / "console.log"),
                     "pidfile": str(gdir / "qemu.pid"), "workload": "none",
                     "disks": [{"node": d.node, "backend": "rbd",
                                "pool": req.site.pool(d.pool), "image": d.image,
                                "site": "dr"} for d in vm.disks]}
                # QEMU reaches Ceph as the DR hypervisor does (the lab's own
                # access to the DR cluster), not with the control plane's client.
                argv = qemu_argv(g, status["image"], status.get("accel", "tcg"),
                                 [g["address"]], {"dr": status["sites"]["dr"]}, memory, "")
                _sh(["ip", "netns", "exec", ns, *argv], timeout=60)
                guests.append(Guest(vm.name, detail={
                    "pid": read_pidfile(Path(g["pidfile"])), "console": g["console"],
                    "qmp": g["qmp"], "pidfile": g["pidfile"], "netns": ns, "tap": g["tap"],
                    "name": g["name"]}))
        except BootError as exc:
            raise BootError(str(exc), guests) from exc
        return guests

    @staticmethod
    def _isolate(ns: str, bridge: str, taps: list[str], on_event: EventHook | None) -> None:
        cmds = [f"link add {bridge} type bridge", f"link set {bridge} up"]
        for tap in taps:
            cmds += [f"tuntap add dev {tap} mode tap", f"link set {tap} master {bridge} up"]
        cp = subprocess.run(["ip", "-n", ns, "-batch", "-"], input="\n".join(cmds) + "\n",
                            text=True, capture_output=True, check=False, timeout=30)
        if cp.returncode != 0:
            raise BootError(f"isolated bridge {bridge} in {ns}: {cp.stderr.strip()[-400:]}")
        ports = _sh(["ip", "-n", ns, "-o", "link", "show", "master", bridge])
        # Link-local IPv6 (fe80::, scope link) is not a route anywhere; any
        # IPv4 or global address on the bridge would be.
        addrs = "\n".join(
            line for line in _sh(["ip", "-n", ns, "-o", "addr", "show", "dev",
                                  bridge]).splitlines()
            if " inet " in line or "scope global" in line)
        members = sorted(line.split(":", 2)[1].strip().split("@")[0]
                         for line in ports.splitlines() if ":" in line)
        if set(members) != set(taps) or addrs.strip():
            raise BootError(f"bridge {bridge} is not isolated: ports {members}, "
                            f"addresses {addrs.strip()!r}")
        if on_event:
            on_event("isolate", {"status": "ok", "bridge": bridge, "netns": ns,
                                 "ports": members, "uplink": None, "bridge_addresses": []})


def failover_args(status: dict[str, Any], workload: str) -> str:
    """The workload arguments of a VM that a failover (or failback) boots:
    the lab's own (`--workload-args`), and for the writer `--resume`, since
    the VM goes on where its disks' recovery point left off: the writer
    continues the run they hold, so its checker sees one run throughout."""
    args = [a for a in (status.get("config", {}).get("workload_args") or "").split(",") if a]
    if workload == "writer" and "--resume" not in args:
        args.append("--resume")
    return ",".join(args)


def stop_guests(guests: list[dict[str, Any]], grace_s: float = 10) -> None:
    """Stop the lab QEMUs of booted guests by their `pid`: SIGTERM first, so
    QEMU closes its RBD images and leaves no watch or lock; SIGKILL after
    `grace_s`.  Returns once each is gone from /proc (its parent reaped it),
    or after 10 s more.  (A standby's tap stays for its next boot; lab down
    removes it.)"""
    pids = [int(g.get("pid") or 0) for g in guests]
    kill_pids(pids, grace=grace_s)
    end = time.monotonic() + 10
    while time.monotonic() < end and any(p and Path(f"/proc/{p}").exists() for p in pids):
        time.sleep(0.1)


def stop_standbys(status: dict[str, Any]) -> list[int]:
    """Stop every standby QEMU of the lab's DR host (by its pid file); the pids stopped."""
    from cutpoint.lab import standby

    pids = [read_pidfile(Path(s["pidfile"])) for s in standby.plan(status)]
    return kill_pids([p for p in pids if p])


def agent_ref(status: dict[str, Any]) -> AgentRef:
    """The agent of the lab's DR host (the one that defines the standbys)."""
    from cutpoint.lab.agents import PORT

    host = next((h for h in status.get("hosts", []) if h["site"] == "dr"), None)
    if host is None:
        raise LabError("the lab has no DR host")
    return AgentRef(host["address"], PORT)


def drill_spec(status: dict[str, Any], recovery_point: str, vms: list[str] | None = None,
               **kw: Any) -> DrillSpec:
    """A DrillSpec for (some of) the lab's primary VMs, replicated to the lab's DR site
    (reached as the control plane's client, `client.cutpoint`)."""
    from cutpoint.lab.sites import ceph_site

    chosen = [v for v in status["vms"] if v.get("site") == "primary"
              and (vms is None or v["name"] in vms)]
    return DrillSpec(
        site=ceph_site(status, "dr"), recovery_point=recovery_point,
        vms=[BootVM(v["name"], tuple(BootDisk(d["node"], d["image"], d["pool"])
                                     for d in v["disks"]))
             for v in chosen], **kw)
