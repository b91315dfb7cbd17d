"""Failover through the control plane: `POST /v1/groups/{id}/failover`.

    {recovery_point: <id|txn|"latest">, mode: planned|unplanned, workload?: str}

A failover never hurts production before it can succeed.  The route first
checks every precondition (failover_checks.py: the DR Ceph site answers,
the recovery point is verified and present on every DR image, the DR
agents know how to start every VM, the fencing epoch can be taken), and
refuses with a 409/503 problem naming the one that failed: no job, nothing
touched.  The job checks them again before it touches anything.  Its
stages (failover_recovery.py), each step a job event (failover_timeline.py):

    checking  preconditions; planned mode without a chosen recovery point:
              a final group snapshot with the guests running (the normal
              capture path) and its replication, then the recovery point
              check on it.  A failure leaves every primary VM running.
    stopped   `vm.stop` of every member VM through the primary agents, all
              at once, each host bounded by a short connect deadline (an
              unreachable host is recorded, not waited for); the group's
              schedule is disabled.  Planned mode then snapshots the stopped
              disks (once no client holds an image's exclusive lock: a
              consistent cut, nothing runs), replicates it
              and checks it at DR: it is the recovery point, so nothing
              written before the stop is lost.  If a host could not be
              stopped, the online final snapshot is the recovery point and
              the result says what was not captured (`not_captured`).
    fenced    fencing epoch n (`fencing_epochs`: DR is the only writer; a
              retry of a failover that failed after this point reuses it),
              `cutpoint.fencing_epoch = n` on every member image at DR (the
              copy engine refuses to write an image marked so by an older
              primary), then the DR images are rolled back to the recovery
              point and the VMs booted at DR
              (`cutpoint.coordinator.dr.failover`).

A failure after `checking` fails the job with its stage, whether production
was touched and the next step the operator runs (retry, or roll back to
the primary) in its error and result.

Unplanned mode asks nothing of the primary's Ceph cluster; the only calls
to the primary site are the bounded `vm.stop`s, so it works with the
primary gone.

RTO is measured from the HTTP request, not from the worker: the route
stamps the request's wall-clock time into the job's params (`requested_at`,
epoch seconds; `Job.created_at` when absent) and the worker turns it into
the monotonic origin it passes to `failover(t_request=...)`, so every `t_s`
of the timeline and `rto_s` count from the request to the last VM running
(one clock on one machine; across machines it needs synchronised clocks).
The result's `breakdown` splits the RTO between consecutive milestones
(failover_timeline.MILESTONES); they add up to `rto_s`.

The job runs under the group's Redis lock (the one group snapshots take):
no scheduled snapshot runs during it, and a redelivered copy of the task
(broker visibility timeout shorter than a failover) waits instead of
fencing and booting a second time.

The DR guests are booted by the configured booter (setting `booter`,
cutpoint.coordinator.dr.boot).  The product's, `agent`, asks the DR agent
that defines each VM (`vm.start{spec: {vm}}`, docs/agent-protocol.md 4.9):
the registered host of the DR site whose inventory lists the VM
(`dr_agent_for`), reached with the control plane's agent certificate.  A
libvirt VM that no DR agent defines is started from its captured
definition, rewritten for the DR site and signed
(`vm.start{spec: {vm, xml, sig}}`, failover_signed.py), on the host the
site's `definition_targets` entry names.  The
agent runs the start command its configuration gives that VM and replies
once QMP says running; each VM's `start_ms` is in the timeline (`vm_start`
steps), and a VM is ready when its agent lists it running.  `workload`
(default `none`) is what the DR guests run after boot, for a booter that
can set it.
"""

from __future__ import annotations

import time
from typing import Any

from cutpoint.api.grouplock import LockLost
from cutpoint.api.models import (
    Disk,
    Group,
    GroupSnapshot,
    Host,
    Job,
    JobState,
    MemberSnapshot,
    SnapState,
    utcnow,
)
from cutpoint.api.services.failover_recovery import CHECKING, FENCED, STOPPED
from cutpoint.api.services.failover_timeline import Steps, breakdown
from sqlalchemy import select
from sqlalchemy.orm import Session

__all__ = ["FailoverFailed", "breakdown", "dr_agent_for", "request", "run_job"]


class FailoverFailed(Exception):
    """A failover step failed; `stage` says how far it got (failover_recovery)."""

    def __init__(self, code: str, message: str, *, stage: str = CHECKING,
                 result: dict[str, Any] | None = None) -> None:
        self.code = code
        self.stage = stage
        self.result = result
        super().__init__(message)


def request(s: Session, settings: Any, g: Group, ref: str | None, mode: str, workload: str,
            actor: str | None, requested_at: float | None = None) -> Job:
    """Check every precondition, then create the failover job (a refusal is a
    PreconditionNotMet problem and no job).  `requested_at` is the request's
    wall clock (epoch s): the RTO's origin."""
    from cutpoint.api.errors import ApiError
    from cutpoint.api.services import drills, failover_checks, jobs

    if requested_at is None:
        requested_at = time.time()
    t0 = time.monotonic() - max(0.0, time.time() - requested_at)
    if mode not in ("planned", "unplanned"):
        raise ApiError(f"mode must be planned or unplanned, not {mode!r}", code="bad_mode")
    snap = None
    if mode == "unplanned" or ref not in (None, "", "latest"):
        snap = drills.recovery_point(s, g, ref)
    plan = failover_checks.members(s, g, snap)
    checks = failover_checks.run(s, settings, g, plan, snap)
    failover_checks.raise_if_failed(checks)
    t_checked = round(time.monotonic() - t0, 3)
    job = jobs.create(s, "failover", actor=actor, group_id=g.id,
                      snapshot_id=snap.id if snap else None,
                      params={"group_id": g.id, "mode": mode, "workload": workload,
                              "recovery_point": snap.txn if snap else None,
                              "requested_at": requested_at})
    jobs.add_event(s, job.id, "request", t_s=0.0, detail={
        "mode": mode, "recovery_point": snap.txn if snap else ref or "latest",
        "target": plan.target, "vms": list(plan.vms)})
    for c in checks:
        jobs.add_event(s, job.id, "precondition", status=_STATUS[c.status], t_s=t_checked,
                       detail={"check": c.name, "code": c.code, "message": c.message,
                               "ms": c.ms, "at": "request"})
    return job


_STATUS = {"pass": "ok", "fail": "failed", "skip": "skipped"}

def final_snapshot(sf: Any, settings: Any, g_id: int, actor: str | None,
                   mark: Any, trigger: str = "failover") -> int:
    """Take and replicate the final group snapshot; `mark(step, detail)` times each part."""
    from cutpoint.api.errors import Conflict
    from cutpoint.api.services import capture, replication, snapshots

    with sf() as s:
        g = s.get(Group, g_id)
        assert g is not None
        try:
            sub = snapshots.request(s, g, trigger=trigger, actor=actor)
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


def _wait_closed(ceph: Any, refs: list[tuple[str, str]], timeout_s: float = 60) -> None:
    """Until no client holds the exclusive lock of any image: every QEMU has closed its disks.

    `vm.stop` returns when QEMU acknowledged `quit`, which may be before the
    process has flushed and closed its RBD images; a snapshot taken then
    could miss the last writes.  The writer holds the image's exclusive
    lock (listed as an `auto` locker) until it closes the image.  Watchers
    are no sign: the agent keeps every disk open.  `refs`: (pool, image)."""
    deadline = time.monotonic() + timeout_s
    pending = list(refs)
    while pending:
        pending = [r for r in pending if ceph.lockers(*r)]
        if pending and time.monotonic() > deadline:
            raise FailoverFailed("primary_still_open", f"after {timeout_s:.0f}s the fenced "
                                 f"VMs still hold {[f'{p}/{i}' for p, i in pending]} locked")
        if pending:
            time.sleep(0.2)


def _stopped_snapshot(sf: Any, settings: Any, g_id: int, online_id: int, job_id: str,
                      mark: Any) -> int:
    """Planned mode, after the fence: snapshot the stopped VMs' disks and replicate it.

    The online final snapshot was replicated while the guests still ran;
    what they wrote between its cut and the fence is on the primary disks
    only.  With every member VM stopped (and its images closed) a plain
    snapshot of each disk is a consistent group cut, and its increment
    from the online snapshot is small.  It becomes the recovery point, so
    nothing written before the fence is lost."""
    from cutpoint.api.services import replication, snapshots
    from cutpoint.coordinator.dr.ceph_errors import CephError
    from cutpoint.coordinator.dr.site import CephConnection

    with sf() as s:
        online = s.get(GroupSnapshot, online_id)
        g = s.get(Group, g_id)
        assert online is not None and g is not None
        members, refs, site_name = [], [], None
        for m in online.members:
            disk = s.get(Disk, m.disk_id) if m.disk_id else None
            if disk is None or not disk.image:
                raise FailoverFailed("not_replicable", f"member {m.disk} has no RBD image")
            site_name = disk.vm.host.site.name
            refs.append((disk.pool or "rbd", disk.image))
            members.append((m.disk_id, m.host, m.vm, m.disk))
        quiesce, gname = online.quiesce, g.name
        try:
            site = replication.site_of(s, str(site_name))
        except replication.ReplicationFailed as exc:
            raise FailoverFailed(exc.code, str(exc)) from exc
    txn = snapshots.new_txn()
    name = f"cp.{gname}.{txn}"
    try:
        with CephConnection(site) as ceph:
            _wait_closed(ceph, refs)
            started = utcnow()
            t0 = time.monotonic()
            for pool, image in refs:
                ceph.create_snapshot(pool, image, name)
    except CephError as exc:
        raise FailoverFailed("stopped_snapshot_failed", f"the stopped-disk snapshot {name}: "
                             f"{exc} ({exc.code})") from exc
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


def _progress(sf: Any, job_id: str, progress: float, message: str,
              snap_id: int | None = None) -> None:
    with sf() as s:
        j = s.get(Job, job_id)
        if j is not None:
            j.progress, j.message = max(j.progress, progress), message[:255]
            if snap_id is not None:
                j.snapshot_id = snap_id
            s.commit()



def _check(steps: Steps, checks: list[Any], where: str) -> None:
    """Each check as a job event; the first failure fails the job (production untouched)."""
    from cutpoint.coordinator.dr.preconditions import first_failure

    for c in checks:
        steps.mark("precondition", {"check": c.name, "code": c.code, "message": c.message,
                                    "ms": c.ms, "at": where}, status=_STATUS[c.status])
    failed = first_failure(checks)
    if failed is not None:
        raise FailoverFailed(failed.code or "precondition_not_met",
                             f"precondition {failed.name} failed: {failed.message}",
                             stage=CHECKING)


def _stop_primaries(sf: Any, settings: Any, g_id: int, hosts: dict[str, list[str]],
                    steps: Steps) -> dict[str, Any]:
    """`vm.stop` of every member VM, all hosts at once; the schedule is disabled
    first (no snapshot of a group whose VMs are going down)."""
    from cutpoint.api.services import fencing

    with sf() as s:
        g = s.get(Group, g_id)
        assert g is not None
        g.enabled = False
        s.commit()
    out = fencing.stop_primaries(sf, settings, hosts)
    steps.mark("fence", {"stopped": out["stopped"], "unreachable": out["unreachable"]},
               status="ok" if not out["unreachable"] else "info")
    return out


def _take_epoch(sf: Any, settings: Any, g_id: int, plan: Any, job_id: str,
                steps: Steps) -> int:
    """Record the fencing epoch (or adopt a failed failover's) and mark every
    member image at DR with it."""
    from cutpoint.api.services import fencing, replication
    from cutpoint.coordinator.dr.site import CephConnection

    with sf() as s:
        try:  # before the epoch: a site gone since the checks takes none
            site = replication.site_of(s, plan.target,
                                       timeout_s=int(settings.failover_check_timeout_s))
        except replication.ReplicationFailed as exc:
            raise FailoverFailed(exc.code, f"the DR site {plan.target!r}: {exc}",
                                 stage=FENCED) from exc
        st = fencing.state(s, g_id)
        n = st.epoch if st.active_site == plan.target else st.epoch + 1
        rec = fencing.take(s, g_id, n, plan.target, plan.source, job_id)
    with CephConnection(site) as ceph:
        marked = fencing.mark_images(ceph, plan.images, n)
    steps.mark("epoch", {**rec, "dr_images_marked": marked})
    return n


def run_job(sf: Any, settings: Any, job_id: str) -> dict[str, Any]:
    """The failover job, as a table of contents: check, (final snapshot), stop,
    (stopped-disk snapshot), fence, roll back and boot at DR."""
    from cutpoint.api.services import failover_recovery

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
        g = s.get(Group, g_id)
        gname = g.name if g is not None else str(g_id)
    # The request's wall-clock time as a point on this process's monotonic
    # clock: the coordinator times everything monotonically from it.
    t_request = time.monotonic() - max(0.0, time.time() - float(requested_at))
    steps = Steps(sf, job_id, t_request)
    steps.mark("worker_start", {"mode": mode})
    run = _Run(sf, settings, job_id, g_id, gname, mode, workload, snap_id, actor, steps)
    try:
        out = run.go()
    except Exception as exc:
        code = "lock_lost" if isinstance(exc, LockLost) else getattr(exc, "code",
                                                                      "failover_failed")
        failed = exc if isinstance(exc, FailoverFailed) else FailoverFailed(
            code, f"{type(exc).__name__}: {exc}")
        stage = run.stage
        nxt = failover_recovery.next_step(stage, gname, retry_txn=run.retry_txn,
                                          vms=run.vms, epoch=run.epoch,
                                          unreplicated_id=run.unreplicated_id)
        try:
            steps.mark("failed", {"code": failed.code, "stage": stage,
                                  "error": str(failed)[:1000], "next_step": nxt},
                       status="failed")
        except LockLost:
            # `sf` is fenced by the group lock (grouplock.py): with the lock
            # lost (Redis gone), it writes nothing more.  The job's own
            # row is written by the task (tasks.py `_finish`), not through
            # it: where the failover stopped and what to do next must
            # still reach it (seen: Redis killed after vm.start at DR).
            steps.timeline.append({"t_s": steps.now(), "step": "failed", "status": "failed",
                                   "code": failed.code, "stage": stage, "next_step": nxt})
        result = {"mode": mode, "stage": stage,
                  "production_touched": failover_recovery.production_touched(stage),
                  "next_step": nxt, "requested_at": float(requested_at),
                  **run.partial(), "timeline": steps.timeline}
        raise FailoverFailed(failed.code, f"{failed} [{stage}] Next: {nxt}", stage=stage,
                             result=result) from exc
    out["requested_at"] = float(requested_at)
    return out


class _Run:
    """One failover job's state as it goes; `go` is the sequence of steps."""

    def __init__(self, sf: Any, settings: Any, job_id: str, g_id: int, gname: str, mode: str,
                 workload: str, snap_id: int | None, actor: str | None, steps: Steps) -> None:
        self.sf, self.settings, self.job_id, self.g_id = sf, settings, job_id, g_id
        self.gname, self.mode, self.workload, self.snap_id = gname, mode, workload, snap_id
        self.actor, self.steps = actor, steps
        self.stage = CHECKING
        self.retry_txn: str | None = None
        self.vms: list[str] = []
        self.epoch: int | None = None
        self.unreplicated_id: int | None = None
        self.final: dict[str, Any] = {}
        self.stopped: dict[str, Any] | None = None

    def partial(self) -> dict[str, Any]:
        return {"snapshot_id": self.snap_id, **self.final,
                "fence": {**(self.stopped or {}), "epoch": self.epoch}}

    def _plan(self, snap_id: int | None, *, check: bool = False) -> tuple[Any, list[Any]]:
        """The VMs and DR images of the recovery point (of the group's disks
        when none is chosen yet); with `check`, every precondition too."""
        from cutpoint.api.errors import ApiError
        from cutpoint.api.services import failover_checks

        with self.sf() as s:
            g = s.get(Group, self.g_id)
            if g is None:
                raise FailoverFailed("group_gone", f"group {self.gname} no longer exists")
            snap = s.get(GroupSnapshot, snap_id) if snap_id is not None else None
            try:
                plan = failover_checks.members(s, g, snap)
            except ApiError as exc:  # the group's definition, e.g. a disk that is not RBD
                raise FailoverFailed(exc.code, str(exc)) from exc
            if snap is not None:
                self.retry_txn = snap.txn
            return plan, (failover_checks.run(s, self.settings, g, plan, snap, self.job_id)
                          if check else [])

    def _recovery_point_check(self, snap_id: int) -> None:
        """Planned mode: the final snapshot just replicated is verified and at DR.
        It becomes the retry's recovery point whether or not the failover goes on."""
        from cutpoint.api.services import failover_checks

        plan, _ = self._plan(snap_id)
        with self.sf() as s:
            g = s.get(Group, self.g_id)
            snap = s.get(GroupSnapshot, snap_id)
            assert g is not None and snap is not None
            inp = failover_checks.gather(s, self.settings, g, plan, snap)
        _check(self.steps, [failover_checks.recovery_point(self.settings, inp)], "job")

    def go(self) -> dict[str, Any]:
        plan, checks = self._plan(self.snap_id, check=True)
        _check(self.steps, checks, "job")
        self.steps.mark("preconditions", {"checks": len(checks)})
        self.vms = list(plan.vms)
        if self.mode == "planned" and self.snap_id is None:
            _progress(self.sf, self.job_id, 0.05, "final group snapshot (guests running)")
            online_id = final_snapshot(self.sf, self.settings, self.g_id, self.actor,
                                        self.steps.mark)
            self.final["online_snapshot_id"] = online_id
            self._recovery_point_check(online_id)
            _progress(self.sf, self.job_id, 0.25, "stopping the primary VMs", online_id)
            self.stage = STOPPED
            self.stopped = _stop_primaries(self.sf, self.settings, self.g_id, plan.hosts,
                                           self.steps)
            if self.stopped["unreachable"]:
                # A VM we could not stop may still write: no stopped-disk cut
                # is possible, and its writes after the online cut are not at DR.
                self.snap_id = online_id
                self.final["stopped_snapshot_id"] = None
                self.final["not_captured"] = (
                    "writes after the online final snapshot on "
                    f"{[u['host'] for u in self.stopped['unreachable']]}")
            else:
                _progress(self.sf, self.job_id, 0.3, "snapshot of the stopped disks")
                self.snap_id = _stopped_snapshot(self.sf, self.settings, self.g_id, online_id,
                                                 self.job_id, self.steps.mark)
                self.final["stopped_snapshot_id"] = self.snap_id
                self._recovery_point_check(self.snap_id)
        else:
            self.stage = STOPPED
            _progress(self.sf, self.job_id, 0.1, "stopping the primary VMs")
            self.stopped = _stop_primaries(self.sf, self.settings, self.g_id, plan.hosts,
                                           self.steps)
        assert self.snap_id is not None
        plan, _ = self._plan(self.snap_id)
        self.stage = FENCED
        self.epoch = _take_epoch(self.sf, self.settings, self.g_id, plan, self.job_id,
                                 self.steps)
        return self._boot(plan)

    def _boot(self, plan: Any) -> dict[str, Any]:
        from cutpoint.api.services import failover_checks, replication
        from cutpoint.coordinator.dr.boot import UnknownBooter, load_booter
        from cutpoint.coordinator.dr.failover import FailoverError, failover

        assert self.snap_id is not None and self.stopped is not None
        with self.sf() as s:
            snap = s.get(GroupSnapshot, self.snap_id)
            assert snap is not None
            txn, rp = snap.txn, snap.members[0].name
            try:
                site = replication.site_of(s, plan.target)
            except replication.ReplicationFailed as exc:
                raise FailoverFailed(exc.code, f"the DR site {plan.target!r}: {exc}",
                                     stage=FENCED) from exc
            boot = failover_checks.boot_request(s, self.settings, plan,
                                                f"failover-{self.job_id[:8]}",
                                                self.workload, site)
            from cutpoint.api.services import plans

            g = s.get(Group, self.g_id)
            rplan, rplan_version = plans.current(s, g) if g is not None else (None, None)
        try:
            booter = load_booter(self.settings.booter)
        except UnknownBooter as exc:
            raise FailoverFailed("unknown_booter", str(exc), stage=FENCED) from exc
        _progress(self.sf, self.job_id, 0.4, f"failing over to {plan.target}; recovery point "
                  f"{txn}", self.snap_id)
        self.steps.mark("failover_start", {"recovery_point": txn})
        fenced = {"epoch": self.epoch, "stopped": self.stopped["stopped"],
                  "unreachable": self.stopped["unreachable"],
                  "fenced_site": self.stopped.get("site") or plan.source}

        def theirs(step: str, detail: dict[str, Any]) -> None:
            if step != "fence":  # ours, earlier
                self.steps.record(step, detail.get("t_s"),
                                  {k: v for k, v in detail.items() if k not in ("t_s", "step")})

        try:
            res = failover(booter, boot, rp, lambda: fenced, t_request=self.steps.t_request,
                           on_event=theirs, plan=rplan)
        except FailoverError as exc:
            raise FailoverFailed("failover_failed", str(exc), stage=FENCED) from exc
        out = res.as_dict()
        events = [e for e in out.pop("timeline", []) if e["step"] != "fence"]
        timeline = sorted(self.steps.timeline + events, key=lambda e: e["t_s"])
        guests = out.pop("guests", [])
        # recovery_point: the group snapshot's txn, as the request names it (the
        # coordinator's is the member snapshot name: snapshot_name).
        return {"mode": self.mode, "snapshot_id": self.snap_id, **self.final, **out,
                "plan_version": rplan_version,
                "recovery_point": txn, "snapshot_name": rp, "guests": guests,
                "timeline": timeline, "breakdown": breakdown(timeline)}


def dr_agent_for(s: Session, settings: Any, site: str, vms: list[str]) -> dict[str, Any]:
    """The agents that start `vms` at `site`, from the API's hosts:
    {agents: {vm: (address, port, pin)}, tls}.

    For each VM, the registered host of `site` whose inventory lists it (a
    DR host lists the standby copies its agent starts with `vm.start`; after
    a failover, the original primary's hosts list the VMs the failback
    starts again), reached with the control plane's agent certificate and
    pinned to the host's registered certificate, as every call to an agent
    is.  A VM no pinned host lists is left out (the boot's preflight names
    it); no agent certificate: {}."""
    from cutpoint.api.models import Site, Vm

    if not (settings.agent_ca and settings.agent_cert and settings.agent_key):
        return {}
    agents: dict[str, tuple[str, int, str]] = {}
    for host in s.scalars(select(Host).join(Site, Host.site_id == Site.id)
                          .where(Site.name == site).order_by(Host.name)):
        if not host.cert_fingerprint:
            continue
        for name in s.scalars(select(Vm.name).where(Vm.host_id == host.id,
                                                    Vm.present.is_(True),
                                                    Vm.name.in_(vms))):
            agents.setdefault(name, (host.address, host.port, host.cert_fingerprint))
    return {"agents": agents,
            "tls": (settings.agent_ca, settings.agent_cert, settings.agent_key)}