"""Failover to the DR site and failback (issue 6, items 3 and 4).

    failover(spec, fence)   ->  {timeline, rto_s, guests, epoch, ...}
    failback(spec, ...)     ->  {bytes_shipped, base, snap, ...}

Failover, after the caller has (in planned mode) taken and replicated a
final group snapshot:

    fence     `fence()` stops the primary VMs if reachable (agents'
              `vm.stop`) and records a fencing epoch; an unreachable primary
              is recorded, not waited for (unplanned mode)
    rollback  every DR image whose head differs from the recovery point
              back to it (`rbd snap rollback`); an unchanged image is left
              alone, because a rollback rewrites every object and would make
              failback ship the whole disk
    boot      `vm.start{spec: {vm}}` of every VM through the DR host's agent
              (docs/agent-protocol.md 4.9), in parallel: the agent runs the
              start command its config gives that VM (in the lab: the standby
              launcher `cutpoint.lab.standby`, QEMU on the DR images in the DR
              host namespace) and replies once QMP says running; the
              timeline gets one `vm_start` step per VM with the agent's
              `start_ms`.  A VM already running there is left as it is
              (`already_running`), never started twice
    ready     every guest's init printed its ready line: RTO = request to
              here

Failback replicates DR -> primary from the newest snapshot both sites hold
(`newest_common_snapshot`): cutpoint-sync ships the extents changed at DR
since then plus whatever the primary wrote after it (drift, repaired), never
a full copy when a common snapshot exists.  `rbd diff` counts an object born
after that snapshot from its start to its end; on a sparse guest disk that
is most of the disk, so the engine zeroes (does not ship) the 4 KiB blocks
of the diff that read as zeroes (docs/replication.md, "Holes in new
objects").
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cutpoint.coordinator.drill import READY, DrillVM
from cutpoint.coordinator.replicate import (
    GroupReplication,
    MemberCopy,
    ReplicationError,
    _rbd,
    newest_common_snapshot,
    replicate_group,
)


class FailoverError(RuntimeError):
    pass


@dataclass
class BootSpec:
    """What failover boots where.

    The DR agent is `agent` (address, port) with the client certificate
    `tls` (ca, cert, key); when None, the lab's agent of the host whose
    namespace is `host_netns`, with the lab's coordinator certificate.
    `workload` is written into the lab standby's spec before `vm.start`
    (the guest command line).  `guest_image`, `accel`, `memory_mb`,
    `state_dir` and `tap_prefix` are not used any more: how a standby
    boots is the DR agent's configuration (kept for callers).
    """

    site: dict[str, Any]  # Ceph site of the images
    vms: list[DrillVM]
    guest_image: dict[str, Any]
    host_netns: str
    accel: str = "tcg"
    workload: str = "none"
    state_dir: str = "/var/lib/cutpoint/failover"
    memory_mb: int = 160
    boot_timeout_s: float = 240
    tap_prefix: str = "fo"
    guests: list[dict[str, Any]] = field(default_factory=list)
    agent: tuple[str, int] | None = None
    tls: tuple[str, str, str] | None = None
    start_timeout_s: float = 180
    lab_state_dir: str | None = None  # the lab's (standby specs, certs); None: default


def rollback(site: dict[str, Any], images: list[str], snap: str) -> list[str]:
    """Roll every image back to `snap`; returns the images actually rolled back.

    An image whose head has not changed since `snap` (the usual case: the
    replication engine writes the head, then creates the snapshot) is left
    alone.  `rbd snap rollback` rewrites every object, so a needless rollback
    would make the next diff from `snap` (failback's base) cover the whole
    disk instead of what the DR guests wrote.
    """
    pool = site.get("pool", "rbd")

    def one(image: str) -> str | None:
        changed = json.loads(_rbd(site, "diff", "--from-snap", snap, "--format", "json",
                                  f"{pool}/{image}", timeout=600) or "[]")
        if not changed:
            return None
        _rbd(site, "snap", "rollback", "--no-progress", f"{pool}/{image}@{snap}", timeout=600)
        return image

    with ThreadPoolExecutor(max_workers=4) as ex:
        return [i for i in ex.map(one, images) if i is not None]


def _lab_agent(spec: BootSpec) -> tuple[tuple[str, int], tuple[str, str, str]]:
    """The lab's agent of `spec.host_netns` and the lab's coordinator certificate."""
    from cutpoint.lab.agents import PORT
    from cutpoint.lab.status import load_status

    status = load_status(spec.lab_state_dir)
    host = next((h for h in status["hosts"] if h["netns"] == spec.host_netns), None)
    if host is None:
        raise FailoverError(f"no lab host with namespace {spec.host_netns}")
    certs = Path(status["state_dir"]) / "certs"
    return ((host["address"], PORT),
            (str(certs / "ca.pem"), str(certs / "coordinator.pem"),
             str(certs / "coordinator.key")))


def _start_via_agent(spec: BootSpec, names: list[str]) \
        -> tuple[dict[str, dict[str, Any]], list[str]]:
    """`vm.start` of every VM on the DR agent, in parallel: ({vm: result}, [error])."""
    import asyncio

    from cutpoint.agentclient.client import AgentClient
    from cutpoint.agentclient.errors import AgentError, AgentReplyError
    from cutpoint.agentclient.tls import client_context

    if spec.agent is None or spec.tls is None:
        agent, tls = _lab_agent(spec)
        spec.agent, spec.tls = spec.agent or agent, spec.tls or tls
    assert spec.agent is not None and spec.tls is not None
    addr, port = spec.agent
    ctx = client_context(*spec.tls)

    async def all_() -> list[dict[str, Any] | BaseException]:
        async with AgentClient(addr, port, ssl_context=ctx, connect_timeout=10,
                               call_timeout=spec.start_timeout_s) as c:
            res: list[dict[str, Any] | BaseException] = await asyncio.gather(
                *(c.call("vm.start", {"spec": {"vm": n}}) for n in names),
                return_exceptions=True)
            return res

    try:
        replies = asyncio.run(all_())
    except AgentError as exc:
        raise FailoverError(f"DR agent {addr}:{port}: {type(exc).__name__}: {exc}") from exc
    out: dict[str, dict[str, Any]] = {}
    errors = []
    for name, r in zip(names, replies, strict=True):
        if isinstance(r, AgentReplyError):
            errors.append(f"{name}: vm.start {r.code}: {r.message}")
        elif isinstance(r, BaseException):
            errors.append(f"{name}: vm.start: {type(r).__name__}: {r}")
        else:
            out[name] = r
    return out, errors


def boot(spec: BootSpec, on_event: Callable[[str, dict[str, Any]], None] | None = None) \
        -> list[dict[str, Any]]:
    """Start every VM of `spec` through the DR agent and wait until each guest is ready."""
    from cutpoint.lab import standby
    from cutpoint.lab.errors import LabError
    from cutpoint.lab.proc import pid_alive
    from cutpoint.lab.status import load_status

    status = load_status(spec.lab_state_dir)
    sb = {}
    for vm in spec.vms:
        try:
            standby.set_workload(status, vm.name, spec.workload)
            sb[vm.name] = standby.load(status, vm.name)
        except (LabError, OSError, ValueError) as exc:
            raise FailoverError(f"{vm.name}: no standby at DR: {exc}") from exc
    started, errors = _start_via_agent(spec, [v.name for v in spec.vms])
    for vm in spec.vms:
        if vm.name not in started:
            continue
        s, r = sb[vm.name], started[vm.name]
        pid = 0
        try:
            pid = int(Path(s["pidfile"]).read_text().strip())
        except (OSError, ValueError):
            pass
        g = {"name": vm.name, "index": s["index"], "address": s["address"], "mac": s["mac"],
             "tap": s["tap"], "qmp": s["qmp"], "console": s["console"],
             "pidfile": s["pidfile"], "workload": spec.workload, "netns": s["netns"],
             "pid": pid, "start_ms": r.get("start_ms"),
             "already_running": bool(r.get("already_running")),
             "agent": f"{spec.agent[0]}:{spec.agent[1]}" if spec.agent else None,
             "disks": s["disks"]}
        spec.guests.append(g)
        if on_event:
            on_event("vm_start", {"vm": vm.name, "start_ms": r.get("start_ms"),
                                  "command_ms": r.get("command_ms"),
                                  "already_running": bool(r.get("already_running"))})
    if errors:  # the caller stops what did start (spec.guests)
        assert spec.agent is not None
        raise FailoverError(f"DR agent {spec.agent[0]}:{spec.agent[1]}: " + "; ".join(errors))
    end = time.monotonic() + spec.boot_timeout_s
    pending = {g["name"]: g for g in spec.guests}
    while pending:
        for name, g in list(pending.items()):
            p = Path(g["console"])
            text = p.read_text(errors="replace") if p.exists() else ""
            if READY in text:
                del pending[name]
                if on_event:
                    on_event("ready", {"vm": name})
            elif not pid_alive(g["pid"]):  # daemonized: a zombie until init reaps it
                raise FailoverError(f"{name}: QEMU died during boot: "
                                    + " | ".join(text.strip().splitlines()[-3:]))
        if pending and time.monotonic() > end:
            raise FailoverError(f"not booted after {spec.boot_timeout_s:.0f}s: {sorted(pending)}")
        if pending:
            time.sleep(0.5)
    return spec.guests


def stop_guests(guests: list[dict[str, Any]]) -> None:
    """Kill the QEMUs started by `boot` and remove their taps."""
    import subprocess

    from cutpoint.coordinator.drill import stop_pids

    stop_pids([g.get("pid") or 0 for g in guests])
    for g in guests:
        if g.get("netns") and g.get("tap"):
            subprocess.run(["ip", "-n", g["netns"], "link", "del", g["tap"]],
                           capture_output=True, check=False)


@dataclass
class FailoverResult:
    recovery_point: str
    rto_s: float
    timeline: list[dict[str, Any]]
    guests: list[dict[str, Any]]
    fence: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        return {"recovery_point": self.recovery_point, "rto_s": round(self.rto_s, 3),
                "timeline": self.timeline, "fence": self.fence,
                "guests": [{"vm": g["name"], "pid": g["pid"], "console": g.get("console"),
                            "netns": g.get("netns"), "start_ms": g.get("start_ms"),
                            "agent": g.get("agent")} for g in self.guests]}


def failover(boot_spec: BootSpec, recovery_point: str, fence: Callable[[], dict[str, Any]],
             t_request: float | None = None) -> FailoverResult:
    """Fence, roll the DR images back to `recovery_point`, boot at DR; RTO from t_request."""
    t0 = t_request if t_request is not None else time.monotonic()
    timeline: list[dict[str, Any]] = []

    def ev(step: str, detail: dict[str, Any]) -> None:
        timeline.append({"t_s": round(time.monotonic() - t0, 3), "step": step, **detail})

    fenced = fence()
    ev("fence", fenced)
    images = [d["image"] for v in boot_spec.vms for d in v.disks]
    try:
        rolled = rollback(boot_spec.site, images, recovery_point)
    except ReplicationError as exc:
        raise FailoverError(f"rollback to {recovery_point} at DR failed: {exc}") from exc
    ev("rollback", {"images": images, "to": recovery_point, "rolled_back": rolled})
    try:
        boot(boot_spec, ev)
    except Exception:
        stop_guests(boot_spec.guests)
        raise
    rto = time.monotonic() - t0
    ev("running", {"vms": [g["name"] for g in boot_spec.guests]})
    return FailoverResult(recovery_point, rto, timeline, boot_spec.guests, fenced)


def failback_replicate(dr_site: dict[str, Any], primary_site: dict[str, Any],
                       images: list[str], snap: str, *, state_dir: str,
                       prefix: str = "cp.") -> GroupReplication:
    """Ship DR -> primary the deltas since the newest common snapshot of each image.

    `snap` must exist at DR (taken after the DR VMs stopped).  Refuses when
    an image has no common snapshot (that would be a full copy: the operator
    asks for it explicitly with a full resync, not here)."""
    members = []
    for image in images:
        base = newest_common_snapshot(dr_site, primary_site, image, prefix)
        if base is None:
            raise FailoverError(f"{image}: no snapshot common to DR and primary; failback "
                                "would be a full copy")
        members.append(MemberCopy(image, snap, base))
    return replicate_group(dr_site, primary_site, members, jobs=2, state_dir=state_dir,
                           verify_full=True)


def fence_via_agents(targets: list[tuple[str, int, list[str]]], tls: tuple[str, str, str],
                     timeout_s: float = 15) -> dict[str, Any]:
    """`vm.stop` every VM through its agent; unreachable agents are recorded, not waited for.

    targets: [(address, port, [vm names])]; tls: (ca, cert, key)."""
    import asyncio

    from cutpoint.agentclient.client import AgentClient
    from cutpoint.agentclient.tls import client_context

    ctx = client_context(*tls)

    async def one(addr: str, port: int, vms: list[str]) -> tuple[list[str], dict[str, str] | None]:
        done: list[str] = []
        try:
            async with AgentClient(addr, port, ssl_context=ctx, connect_timeout=5,
                                   call_timeout=timeout_s) as c:
                for vm in vms:
                    await c.call("vm.stop", {"vm": vm})
                    done.append(vm)
            return done, None
        except Exception as exc:  # noqa: BLE001  fencing goes on without this host
            return done, {"agent": f"{addr}:{port}", "error": f"{type(exc).__name__}: {exc}"}

    async def all_() -> list[tuple[list[str], dict[str, str] | None]]:
        return await asyncio.gather(*(one(a, p, v) for a, p, v in targets))

    stopped, unreachable = [], []
    for done, err in asyncio.run(all_()):
        stopped += done
        if err:
            unreachable.append(err)
    return {"stopped": stopped, "unreachable": unreachable}
