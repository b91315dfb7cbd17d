"""Failover through the control plane: `POST /v1/groups/{id}/failover`.

    {recovery_point: <id|txn|"latest">, mode: planned|unplanned, workload?: str}

planned:   take a final group snapshot with the guests running (the normal
           capture path) and replicate it (the bulk of the lag); fence;
           then, with every member VM stopped and its images closed, take
           `rbd snap create` of each disk (a consistent cut: nothing runs)
           and replicate that small increment.  The stopped-disk snapshot
           is the recovery point, so nothing written before the fence is
           lost.  If a host could not be fenced, the online snapshot is the
           recovery point and the result says what was not captured
           (`not_captured`).
both:      fence the primary (agents' `vm.stop` for every member VM; an
           unreachable host is recorded, not waited for), record fencing
           epoch n+1 (`fencing_epochs`: DR is the only writer from then on),
           disable the group's schedule at the fenced site, roll the DR
           images back to the recovery point and boot the VMs at DR
           (`cutpoint.coordinator.dr.failover`).  Unplanned mode fences inside
           `failover()`; planned mode has fenced already and hands it the
           record.  A failure after the fence leaves the primary stopped
           and the group disabled: the job's error says where it stopped.

RTO is measured from the HTTP request, not from the worker: the route
stamps the request's wall-clock time into the job's params (`requested_at`,
epoch seconds; `Job.created_at` when absent) and the worker turns it into
the monotonic origin it passes to `failover(t_request=...)`, so every `t_s`
of the timeline and `rto_s` count from the request (one clock on one
machine; across machines it needs synchronised clocks).  The result's
`breakdown` splits the RTO between consecutive milestones: `queue_wait_s`
(request -> worker start), planned only `final_snapshot_s`,
`replication_s`, then `fence_s`, `stopped_snapshot_s`,
`stopped_replication_s`; both `setup_s` (the boot spec), unplanned
`fence_s`, `rollback_s`, `boot_s` (rollback done -> every guest ready).
They add up to `rto_s`.

The job runs under the group's Redis lock (the one group snapshots take):
no scheduled snapshot runs during it, and a redelivered copy of the task
(broker visibility timeout shorter than a failover) waits instead of
fencing and booting a second time.

The DR guests are booted by the configured booter (setting `booter`,
cutpoint.coordinator.dr.boot).  The product's, `agent`, asks the DR agent
that defines each VM (`vm.start{spec: {vm}}`, docs/agent-protocol.md 4.9):
the registered host of the DR site whose inventory lists the VM
(`dr_agent_for`), reached with the control plane's agent certificate.  The
agent runs the start command its configuration gives that VM and replies
once QMP says running; each VM's `start_ms` is in the timeline (`vm_start`
steps), and a VM is ready when its agent lists it running.  `workload`
(default `none`) is what the DR guests run after boot, for a booter that
can set it.
"""

from __future__ import annotations

import time
from typing import Any

from cutpoint.api.models import (
    Disk,
    FencingEpoch,
    Group,
    GroupSnapshot,
    Host,
    Job,
    JobState,
    MemberSnapshot,
    SnapState,
    utcnow,
)
from sqlalchemy import func, select
from sqlalchemy.orm import Session


class FailoverFailed(Exception):
    def __init__(self, code: str, message: str) -> None:
        self.code = code
        super().__init__(message)


def request(s: Session, g: Group, ref: str | None, mode: str, workload: str,
            actor: str | None, requested_at: float | None = None) -> Job:
    """Create the failover job; `requested_at` is the request's wall clock (epoch s)."""
    from cutpoint.api.errors import ApiError
    from cutpoint.api.services import drills, jobs

    if mode not in ("planned", "unplanned"):
        raise ApiError(f"mode must be planned or unplanned, not {mode!r}", code="bad_mode")
    snap = None
    if mode == "unplanned" or ref not in (None, "", "latest"):
        snap = drills.recovery_point(s, g, ref)
    return jobs.create(s, "failover", actor=actor, group_id=g.id,
                       snapshot_id=snap.id if snap else None,
                       params={"group_id": g.id, "mode": mode, "workload": workload,
                               "recovery_point": snap.txn if snap else None,
                               "requested_at": requested_at if requested_at is not None
                               else time.time()})


def _final_snapshot(sf: Any, settings: Any, g_id: int, actor: str | None,
                    mark: Any) -> int:
    """Take and replicate the final group snapshot; `mark(step, detail)` times each part."""
    from cutpoint.api.errors import Conflict
    from cutpoint.api.services import capture, replication, snapshots

    with sf() as s:
        g = s.get(Group, g_id)
        assert g is not None
        try:
            sub = snapshots.request(s, g, trigger="failover", actor=actor)
        except Conflict as exc:
            raise FailoverFailed(exc.code, f"the final group snapshot: {exc}") from exc
        sub_id, snap_id = sub.id, sub.snapshot_id
    assert snap_id is not None
    try:
        summary = capture.run(sf, settings, snap_id)
    except capture.CaptureError as exc:
        capture.fail(sf, snap_id, exc.code, str(exc))
        summary = {"state": "failed", "error_code": exc.code, "reason": str(exc)}
    with sf() as s:
        sub = s.get(Job, sub_id)
        if sub is not None:
            sub.state = JobState.succeeded if summary["state"] == "committed" \
                else JobState.failed
            sub.result, sub.progress, sub.finished_at = summary, 1.0, utcnow()
            s.commit()
    if summary["state"] != "committed":
        raise FailoverFailed("final_snapshot_failed",
                             f"the final group snapshot did not commit: {summary}")
    mark("final_snapshot", {"snapshot_id": snap_id, "txn": summary.get("txn")})
    try:
        rep = replication.run(sf, settings, snap_id)
    except replication.ReplicationFailed as exc:
        raise FailoverFailed("final_replication_failed",
                             f"the final group snapshot was not replicated: {exc}") from exc
    mark("replicated", {"snapshot_id": snap_id,
                        "bytes_shipped": rep.get("bytes_shipped") if isinstance(rep, dict)
                        else None})
    return int(snap_id)


def _wait_closed(site: dict[str, Any], specs: list[str], timeout_s: float = 60) -> None:
    """Until no client holds the exclusive lock of any image: every QEMU has closed its disks.

    `vm.stop` returns when QEMU acknowledged `quit`, which may be before the
    process has flushed and closed its RBD images; a snapshot taken then
    could miss the last writes.  The writer holds the image's exclusive
    lock (`rbd lock ls` lists it as an `auto` locker) until it closes the
    image.  Watchers are no sign: the agent keeps every disk open."""
    import json

    from cutpoint.coordinator.dr.rbdcli import RbdError, rbd

    deadline = time.monotonic() + timeout_s
    pending = list(specs)
    while pending:
        still = []
        for spec in pending:
            try:
                out = rbd(site, "lock", "ls", "--format", "json", spec, timeout=60)
            except RbdError as exc:
                raise FailoverFailed("rbd_lock_ls_failed", f"rbd lock ls {spec}: "
                                     f"rc={exc.returncode} {exc.stderr.strip()[-300:]}") \
                    from exc
            if json.loads(out or "[]"):
                still.append(spec)
        pending = still
        if pending and time.monotonic() > deadline:
            raise FailoverFailed("primary_still_open", f"after {timeout_s:.0f}s the fenced "
                                 f"VMs still hold {pending} locked")
        if pending:
            time.sleep(0.2)


def _stopped_snapshot(sf: Any, settings: Any, g_id: int, online_id: int, job_id: str,
                      mark: Any) -> int:
    """Planned mode, after the fence: snapshot the stopped VMs' disks and replicate it.

    The online final snapshot was replicated while the guests still ran;
    what they wrote between its cut and the fence is on the primary disks
    only.  With every member VM stopped (and its images closed) a plain
    `rbd snap create` of each disk is a consistent group cut, and its
    increment from the online snapshot is small.  It becomes the recovery
    point, so nothing written before the fence is lost."""
    from cutpoint.api.services import replication, snapshots
    from cutpoint.coordinator.dr.rbdcli import RbdError, rbd

    with sf() as s:
        online = s.get(GroupSnapshot, online_id)
        g = s.get(Group, g_id)
        assert online is not None and g is not None
        members, specs, site_name = [], [], None
        for m in online.members:
            disk = s.get(Disk, m.disk_id) if m.disk_id else None
            if disk is None or not disk.image:
                raise FailoverFailed("not_replicable", f"member {m.disk} has no RBD image")
            site_name = disk.vm.host.site.name
            specs.append(f"{disk.pool or 'rbd'}/{disk.image}")
            members.append((m.disk_id, m.host, m.vm, m.disk))
        quiesce, gname = online.quiesce, g.name
    try:
        sites = replication.ceph_sites()
    except replication.ReplicationFailed as exc:
        raise FailoverFailed(exc.code, str(exc)) from exc
    if site_name not in sites:
        raise FailoverFailed("unknown_site", f"no Ceph configuration for {site_name!r}")
    site = sites[site_name]
    _wait_closed(site, specs)
    txn = snapshots.new_txn()
    name = f"cp.{gname}.{txn}"
    started = utcnow()
    t0 = time.monotonic()
    for spec in specs:
        try:
            rbd(site, "snap", "create", "--no-progress", f"{spec}@{name}", timeout=120)
        except RbdError as exc:
            raise FailoverFailed("stopped_snapshot_failed", f"rbd snap create {spec}@{name}: "
                                 f"rc={exc.returncode} {exc.stderr.strip()[-300:]}") from exc
    ms = (time.monotonic() - t0) * 1000
    with sf() as s:
        snap = GroupSnapshot(group_id=g_id, txn=txn, state=SnapState.committed,
                             trigger="failover", job_id=job_id, requested_at=started,
                             started_at=started, cut_at=started, finished_at=utcnow(),
                             duration_ms=round(ms, 3), consistency="crash", quiesce=quiesce)
        s.add(snap)
        s.flush()
        for disk_id, host, vm, disk in members:
            s.add(MemberSnapshot(group_snapshot_id=snap.id, disk_id=disk_id, host=host, vm=vm,
                                 disk=disk, name=name, state="present", consistency="crash",
                                 method="stopped"))
        s.commit()
        snap_id = int(snap.id)
    mark("stopped_snapshot", {"snapshot_id": snap_id, "txn": txn, "ms": round(ms, 1)})
    try:
        rep = replication.run(sf, settings, snap_id)
    except replication.ReplicationFailed as exc:
        raise FailoverFailed("stopped_replication_failed",
                             f"the stopped-disk snapshot {txn} was not replicated: {exc}") from exc
    mark("stopped_replicated", {"snapshot_id": snap_id, "bytes_shipped": rep.get("bytes_shipped")})
    return snap_id


def fence(sf: Any, settings: Any, g_id: int, snap_id: int, job_id: str,
          target: str) -> dict[str, Any]:
    from cutpoint.api.services import agents

    stopped, unreachable = [], []
    with sf() as s:
        snap = s.get(GroupSnapshot, snap_id)
        assert snap is not None
        vms_by_host: dict[str, set[str]] = {}
        for m in snap.members:
            vms_by_host.setdefault(m.host, set()).add(m.vm)
        source = None
        for host_name, vms in sorted(vms_by_host.items()):
            host = s.scalar(select(Host).where(Host.name == host_name))
            if host is None:
                unreachable.append({"host": host_name, "error": "unknown host"})
                continue
            source = host.site.name
            try:
                agents.call(host, settings, *[("vm.stop", {"vm": v}) for v in sorted(vms)])
                stopped += sorted(vms)
            except agents.AgentCallError as exc:
                unreachable.append({"host": host_name, "error": str(exc)[:400]})
        epoch = (s.scalar(select(func.max(FencingEpoch.epoch)).where(
            FencingEpoch.group_id == g_id)) or 0) + 1
        s.add(FencingEpoch(group_id=g_id, epoch=epoch, active_site=target,
                           fenced_site=source or "primary", job_id=job_id))
        g = s.get(Group, g_id)
        assert g is not None
        g.enabled = False  # no more snapshots of the fenced primary
        s.commit()
    return {"epoch": epoch, "stopped": stopped, "unreachable": unreachable,
            "fenced_site": source}


def _progress(sf: Any, job_id: str, progress: float, message: str,
              snap_id: int | None = None) -> None:
    with sf() as s:
        j = s.get(Job, job_id)
        if j is not None:
            j.progress, j.message = max(j.progress, progress), message[:255]
            if snap_id is not None:
                j.snapshot_id = snap_id
            s.commit()


# Timeline milestones and the breakdown key of the span that ends at each.
MILESTONES = {"worker_start": "queue_wait_s", "final_snapshot": "final_snapshot_s",
              "replicated": "replication_s", "failover_start": "setup_s", "fence": "fence_s",
              "stopped_snapshot": "stopped_snapshot_s",
              "stopped_replicated": "stopped_replication_s", "rollback": "rollback_s",
              "running": "boot_s"}


def breakdown(timeline: list[dict[str, Any]]) -> dict[str, float | None]:
    """Where the RTO went: each milestone minus the one before it (`t_s` from the request).

    A step absent from this run (unplanned: no final snapshot) is None."""
    out: dict[str, float | None] = dict.fromkeys(MILESTONES.values())
    prev = 0.0
    seen: set[str] = set()
    for e in sorted(timeline, key=lambda e: e["t_s"]):
        step = str(e["step"])
        if step in MILESTONES and step not in seen:
            seen.add(step)
            out[MILESTONES[step]] = round(float(e["t_s"]) - prev, 3)
            prev = float(e["t_s"])
    return out


def run_job(sf: Any, settings: Any, job_id: str) -> dict[str, Any]:
    from cutpoint.api.services import drills
    from cutpoint.coordinator.dr.boot import (
        FAILOVER,
        AgentRef,
        BootRequest,
        UnknownBooter,
        load_booter,
    )
    from cutpoint.coordinator.dr.failover import FailoverError, failover

    with sf() as s:
        job = s.get(Job, job_id)
        if job is None or job.group_id is None:
            raise FailoverFailed("bad_job", f"job {job_id} names no group")
        g_id, mode = job.group_id, job.params.get("mode", "unplanned")
        workload = job.params.get("workload") or "none"
        snap_id, actor = job.snapshot_id, job.created_by
        requested_at = job.params.get("requested_at")
        if requested_at is None:
            requested_at = job.created_at.timestamp()
    # The request's wall-clock time as a point on this process's monotonic
    # clock: the coordinator times everything monotonically from it.
    t_request = time.monotonic() - max(0.0, time.time() - float(requested_at))
    ours: list[dict[str, Any]] = [{"t_s": 0.0, "step": "request"}]

    def mark(step: str, detail: dict[str, Any] | None = None) -> None:
        ours.append({"t_s": round(time.monotonic() - t_request, 3), "step": step,
                     **(detail or {})})

    mark("worker_start", {"mode": mode})
    fenced: dict[str, Any] | None = None
    final: dict[str, Any] = {}
    if mode == "planned" and snap_id is None:
        _progress(sf, job_id, 0.05, "final group snapshot (guests running)")
        online_id = _final_snapshot(sf, settings, g_id, actor, mark)
        final["online_snapshot_id"] = online_id
        _progress(sf, job_id, 0.25, "fencing the primary", online_id)
        fenced = fence(sf, settings, g_id, online_id, job_id, _target(sf, g_id))
        mark("fence", fenced)
        if fenced["unreachable"]:
            # A VM we could not stop may still write: no stopped-disk cut is
            # possible, and its writes after the online cut are not at DR.
            snap_id = online_id
            final["stopped_snapshot_id"] = None
            final["not_captured"] = ("writes after the online final snapshot on "
                                     f"{[u['host'] for u in fenced['unreachable']]}")
        else:
            _progress(sf, job_id, 0.3, "snapshot of the stopped disks")
            snap_id = _stopped_snapshot(sf, settings, g_id, online_id, job_id, mark)
            final["stopped_snapshot_id"] = snap_id
    assert snap_id is not None
    with sf() as s:
        snap = s.get(GroupSnapshot, snap_id)
        if snap is None or snap.dr_verified_at is None:
            raise FailoverFailed("not_a_recovery_point", "the recovery point is not verified at DR")
        try:
            spec = drills.build_spec(s, snap, [], "fo")
        except drills.DrillFailed as exc:
            raise FailoverFailed(exc.code, str(exc)) from exc
        txn, rp = snap.txn, snap.members[0].name
    target = _target(sf, g_id)
    with sf() as s:
        dr_agent = dr_agent_for(s, settings, target, [v.name for v in spec.vms])
    try:
        booter = load_booter(settings.booter)
    except UnknownBooter as exc:
        raise FailoverFailed("unknown_booter", str(exc)) from exc
    _progress(sf, job_id, 0.4, f"failing over to {target}; recovery point {txn}", snap_id)
    agents = {v.name: AgentRef(*dr_agent["agent"]) for v in spec.vms} if dr_agent else {}
    tls = (str(settings.agent_ca), str(settings.agent_cert), str(settings.agent_key)) \
        if settings.agent_ca and settings.agent_cert and settings.agent_key else None
    boot = BootRequest(FAILOVER, spec.site, spec.vms, f"failover-{job_id[:8]}",
                       workload=workload, agents=agents, tls=tls)
    mark("failover_start", {"recovery_point": txn})

    def do_fence() -> dict[str, Any]:
        if fenced is not None:  # planned: fenced before the stopped-disk snapshot
            return fenced
        return fence(sf, settings, g_id, snap_id, job_id, target)

    try:
        res = failover(booter, boot, rp, do_fence, t_request=t_request)
    except FailoverError as exc:
        raise FailoverFailed("failover_failed", str(exc)) from exc
    out = res.as_dict()
    theirs = [e for e in out.pop("timeline", [])
              if not (fenced is not None and e["step"] == "fence")]  # ours, earlier
    timeline = sorted(ours + theirs, key=lambda e: e["t_s"])
    guests = out.pop("guests", [])
    # recovery_point: the group snapshot's txn, as the request names it (the
    # coordinator's is the member snapshot name: snapshot_name).
    return {"mode": mode, "snapshot_id": snap_id, "requested_at": float(requested_at),
            **final, **out, "recovery_point": txn, "snapshot_name": rp, "guests": guests,
            "timeline": timeline, "breakdown": breakdown(timeline)}


def dr_agent_for(s: Session, settings: Any, site: str, vms: list[str]) -> dict[str, Any]:
    """The DR agent that starts `vms`, from the API's hosts: {agent, tls}.

    The registered host of `site` whose inventory lists every one of `vms`
    (the standby copies its agent starts with `vm.start`), reached with the
    control plane's agent certificate.  No such host, or no agent
    certificate: {} (the boot then fails, naming the VMs no agent starts)."""
    from cutpoint.api.models import Site, Vm

    if not (settings.agent_ca and settings.agent_cert and settings.agent_key):
        return {}
    for host in s.scalars(select(Host).join(Site, Host.site_id == Site.id)
                          .where(Site.name == site).order_by(Host.name)):
        names = set(s.scalars(select(Vm.name).where(Vm.host_id == host.id,
                                                    Vm.present.is_(True))))
        if set(vms) <= names:
            return {"agent": (host.address, host.port),
                    "tls": (settings.agent_ca, settings.agent_cert, settings.agent_key)}
    return {}


def _target(sf: Any, g_id: int) -> str:
    with sf() as s:
        g = s.get(Group, g_id)
        if g is None or g.policy is None or g.policy.replication_target is None:
            raise FailoverFailed("no_target", f"group {g_id} has no replication target")
        return str(g.policy.replication_target.name)
