"""One run of the two-phase protocol for one txn: its phases, each a method
of `TxnRun` (prepare, commit, verify_commit, abort, verify_cleanup, and the
log writes between them).  `twophase.py` drives a run from start to end
(`take_group_snapshot`) or resumes one in doubt (`resolve_in_doubt`); the
ordering rules R1-R5 it enforces are listed there.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from cutpoint.agentclient import AgentClient, AgentError, AgentPool, AgentReplyError
from cutpoint.coordinator.results import GroupSnapshotResult, VMTiming, group_timings
from cutpoint.coordinator.spec import AgentSpec, GroupSpec
from cutpoint.coordinator.txlog import (
    ABORTED,
    ABORTING,
    COMMITTED,
    TxLog,
    TxLogError,
)

log = logging.getLogger(__name__)

# A COMMIT reply may take the snapshot budget plus transport time.
COMMIT_MARGIN_S = 2.0
# ABORT only resumes VMs and deletes snapshots.  Waiting longer than the
# lease for its reply gains nothing before COMMIT (the lease resumes the VMs
# anyway); after COMMIT an unanswered ABORT leaves the txn ABORTING, retried.
ABORT_TIMEOUT_MAX_S = 10.0

EventHook = Callable[[str, str], Awaitable[None] | None]
T = TypeVar("T")


async def run_db(fn: Callable[..., T], *args: Any, offload: bool = True, **kw: Any) -> T:
    """A blocking call of the log: on a thread, waited for, with `offload`
    (see `TxnRun.write`); else here."""
    if not offload:
        return fn(*args, **kw)
    return await asyncio.to_thread(fn, *args, **kw)


class TxnRun:
    """One execution of the protocol for one txn (fresh or being resolved)."""

    def __init__(self, spec: GroupSpec, txlog: TxLog, pool: AgentPool, txn: str,
                 on_event: EventHook | None, offload: bool = False) -> None:
        self.spec, self.txlog, self.pool, self.txn = spec, txlog, pool, txn
        self.offload = offload
        self.on_event = on_event
        self.name = spec.snapshot_name(txn)
        self.vms: dict[str, VMTiming] = {
            v.name: VMTiming(vm=v.name, agent=a.name) for a, v in spec.vms()}
        self.errors: list[dict[str, Any]] = []
        self.timings: dict[str, float | None] = {}
        self.log_error: TxLogError | None = None
        self.commit_sent = False
        self.t0 = time.monotonic()

    # -- helpers -------------------------------------------------------------
    def client(self, a: AgentSpec) -> AgentClient:
        return self.pool.get(a.address, a.port, name=a.name, server_name=a.server_name,
                             cert_sha256=a.cert_sha256)

    def disk_names(self, a: AgentSpec) -> dict[str, str]:
        return {d: self.name for v in a.vms for d in v.disk_ids()}

    def all_disks(self) -> list[dict[str, str]]:
        return [{"disk": d, "vm": v.name, "agent": a.name, "name": self.name}
                for a, v in self.spec.vms() for d in v.disk_ids()]

    async def emit(self, phase: str) -> None:
        log.info("event=txn_%s group=%s txn=%s", phase, self.spec.name, self.txn)
        if self.on_event is not None:
            r = self.on_event(self.txn, phase)
            if inspect.isawaitable(r):
                await r

    def error(self, phase: str, a: AgentSpec, exc: BaseException) -> dict[str, Any]:
        if isinstance(exc, AgentError):
            e = {"phase": phase, "agent": a.name, "code": exc.code,
                 "message": exc.message, "sent": exc.sent,
                 "received": exc.to_dict()["received"]}
        else:
            e = {"phase": phase, "agent": a.name, "code": "INTERNAL",
                 "message": f"{type(exc).__name__}: {exc}", "sent": None,
                 "received": None}
        self.errors.append(e)
        return e

    def vm_rows(self) -> list[dict[str, Any]]:
        return [{"vm": t.vm, "agent": t.agent, "stop_ms": t.stop_ms,
                 "barrier_ms": t.barrier_ms, "snapshot_ms": t.snapshot_ms,
                 "cont_ms": t.cont_ms, "paused_ms": t.paused_ms, "method": t.method,
                 "consistency": t.consistency, "freeze_ms": t.freeze_ms,
                 "thaw_ms": t.thaw_ms, "freeze_error": t.freeze_error,
                 "thaw_error": t.thaw_error, "pause_path": t.pause_path,
                 "pause_path_why": t.pause_path_why}
                for t in self.vms.values()]

    async def write(self, state: str, *, light: bool = False, **kw: Any) -> bool:
        """Record a transition; a log failure is kept and reported at the end.

        light: only the state and its event row.  The COMMITTING write is
        inside every VM's pause window, so it carries nothing else; the
        per-VM facts of phase 1 are written with the final state.

        With `offload` the write runs on a thread (`run_db`): the event loop
        may be driving other groups' transactions meanwhile (the control
        plane's threads-pool worker runs many at once on one loop, their
        agent calls pipelined per host), and a blocking commit would hold up
        their replies.  The light write, the commit decision, is written
        inline even then: it is inside every VM's pause window, where two
        thread handovers cost more than the short commit holds up the loop
        (on a loaded machine each handover waits for the OS to run the other
        thread).  Either way it is done before the next phase is sent
        (R1-R5).
        """
        if not light:
            kw.setdefault("errors", list(self.errors))
            kw.setdefault("vms", self.vm_rows())
        try:
            if light or not self.offload:
                self.txlog.transition(self.txn, state, **kw)
            else:
                await run_db(self.txlog.transition, self.txn, state, **kw)
            return True
        except TxLogError as exc:
            log.error("event=txlog_failed txn=%s state=%s error=%s", self.txn, state, exc)
            self.log_error = self.log_error or exc
            return False

    def result(self, state: str, reason: str | None) -> GroupSnapshotResult:
        self.timings.update(group_timings(list(self.vms.values())))
        self.timings["total_ms"] = (time.monotonic() - self.t0) * 1000
        snaps = ({d["disk"]: self.name for d in self.all_disks()}
                 if state == COMMITTED else {})
        return GroupSnapshotResult(txn=self.txn, group=self.spec.name, state=state,
                                   reason=reason, snapshots=snaps,
                                   vms=list(self.vms.values()), timings=dict(self.timings),
                                   errors=list(self.errors), quiesce=self.spec.quiesce)

    # -- phase 1 ---------------------------------------------------------------
    async def prepare(self) -> str | None:
        """Send PREPARE to every agent in parallel; None if all PREPARED,
        else the reason to abort.

        With quiesce fs-freeze the wait for PREPARED grows by the agents'
        freeze deadlines (GroupSpec.prepare_wait_ms); connecting keeps the
        plain prepare timeout, since no freeze happens before PREPARE.
        """
        pt = self.spec.effective_prepare_timeout_ms / 1000
        pw = self.spec.prepare_wait_ms / 1000
        quiesce = self.spec.quiesce if self.spec.quiesce != "crash" else None

        async def one(a: AgentSpec) -> dict[str, Any]:
            # The freeze timeout we size `pw` on goes with the request; the
            # agent uses min(its own, ours), so `pw` is long enough whatever
            # the agents' configs say (only sent with fs-freeze).
            t_sent = time.monotonic()
            res = await self.client(a).prepare(
                self.txn, [v.name for v in a.vms], self.spec.lease_ms,
                quiesce=quiesce, freeze_timeout_ms=self.spec.freeze_timeout_ms,
                timeout=pw)
            got = {v.get("vm") for v in res.get("vms", []) if isinstance(v, dict)}
            want = {v.name for v in a.vms}
            if res.get("state") != "prepared" or got != want:
                raise AgentError("PROTOCOL", f"prepare reply does not cover {sorted(want)}",
                                 None, res, agent=a.name)
            # Per agent, for the pause's breakdown: when its PREPARED came
            # (from PREPARE sent), and its time before its first stop.  The
            # VMs of every other agent are paused while the last one's come.
            self.timings[f"prepared_ms:{a.name}"] = (time.monotonic() - t_sent) * 1000
            steps = res.get("steps_ms")
            if isinstance(steps, dict):
                pre = [steps.get(k) for k in ("before_journal", "journal", "before_stops")]
                if all(isinstance(x, (int, float)) for x in pre):
                    self.timings[f"prestop_ms:{a.name}"] = float(sum(pre))  # type: ignore[arg-type]
                if isinstance(steps.get("journal"), (int, float)):
                    self.timings[f"journal_ms:{a.name}"] = float(steps["journal"])
            return res

        # R7: open every connection first, so that no agent pauses its VMs
        # while another is still in its TLS handshake.  A no-op when the
        # pool's connections are already open.
        t = time.monotonic()
        conns = await asyncio.gather(
            *(asyncio.wait_for(self.client(a).connect(), pt) for a in self.spec.agents),
            return_exceptions=True)
        self.timings["connect_ms"] = (time.monotonic() - t) * 1000
        reasons = []
        for a, c in zip(self.spec.agents, conns, strict=True):
            if isinstance(c, BaseException):
                if isinstance(c, asyncio.CancelledError):
                    raise c
                if isinstance(c, TimeoutError):
                    c = AgentError("TIMEOUT", f"connect: no connection within {pt * 1000:.0f} ms",
                                   agent=a.name)
                e = self.error("connect", a, c)
                reasons.append(f"connect to {a.name}: {e['code']} {e['message']}")
        if reasons:
            return "; ".join(reasons)
        t = time.monotonic()
        outs = await asyncio.gather(*(one(a) for a in self.spec.agents),
                                    return_exceptions=True)
        self.timings["prepare_ms"] = (time.monotonic() - t) * 1000
        for a, out in zip(self.spec.agents, outs, strict=True):
            if isinstance(out, BaseException):
                if isinstance(out, asyncio.CancelledError):
                    raise out
                e = self.error("prepare", a, out)
                # An agent that did not answer says nothing of its VMs:
                # name the ones it was asked to pause (its log names the
                # one whose `stop` hung, event=stop_unanswered).
                asked = ("" if isinstance(out, AgentReplyError) else
                         f" (asked to pause {', '.join(v.name for v in a.vms)})")
                reasons.append(f"prepare on {a.name}: {e['code']} {e['message']}{asked}")
            else:
                for v in out.get("vms", []):
                    self.vms[v["vm"]].update(v)
        return "; ".join(reasons) or None

    # -- phase 2 ---------------------------------------------------------------
    async def commit(self) -> str | None:
        # The reply comes after each guest's thaw (agent-protocol §4.3).
        timeout = (self.spec.budget_ms + self.spec.thaw_allowance_ms) / 1000 + COMMIT_MARGIN_S

        async def one(a: AgentSpec) -> dict[str, Any]:
            res = await self.client(a).commit(self.txn, self.disk_names(a),
                                              self.spec.budget_ms, timeout=timeout)
            got = {v.get("vm") for v in res.get("vms", []) if isinstance(v, dict)}
            want = {v.name for v in a.vms}
            if res.get("state") != "committed" or not want <= got:
                raise AgentError("PROTOCOL", f"commit reply does not cover {sorted(want)}",
                                 None, res, agent=a.name)
            return res

        self.commit_sent = True
        t = time.monotonic()
        outs = await asyncio.gather(*(one(a) for a in self.spec.agents),
                                    return_exceptions=True)
        self.timings["commit_ms"] = (time.monotonic() - t) * 1000
        reasons = []
        for a, out in zip(self.spec.agents, outs, strict=True):
            if isinstance(out, asyncio.CancelledError):
                raise out
            if isinstance(out, BaseException):
                e = self.error("commit", a, out)
                reasons.append(f"commit on {a.name}: {e['code']} {e['message']}")
                if isinstance(out, AgentReplyError):
                    self._take_vms(out.result)
            else:
                self._take_vms(out)
        return "; ".join(reasons) or None

    async def verify_commit(self) -> str | None:
        """R3: every member snapshot is listed on its disk before COMMITTED.

        Runs after the VMs were resumed, so it costs no pause time.  It
        catches an agent that answered COMMITTED for a snapshot the backend
        does not have (seen in the lab: a snapshot refused by an RBD snap
        limit was reported as done).
        """
        timeout = self.spec.budget_ms / 1000 + COMMIT_MARGIN_S

        async def one(a: AgentSpec, disk: str) -> None:
            names = await self.client(a).call("snapshot.list", {"disk": disk},
                                              timeout=timeout, retry_closed=True)
            listed = [s.get("name") for s in names.get("snapshots", [])
                      if isinstance(s, dict)]
            if self.name not in listed:
                raise AgentError("MISSING", f"{disk}@{self.name} is not listed after "
                                 "COMMITTED", {"cmd": "snapshot.list", "args": {"disk": disk}},
                                 names, agent=a.name)

        jobs = [(a, d) for a in self.spec.agents for v in a.vms for d in v.disk_ids()]
        t = time.monotonic()
        outs = await asyncio.gather(*(one(a, d) for a, d in jobs), return_exceptions=True)
        self.timings["verify_ms"] = (time.monotonic() - t) * 1000
        reasons = []
        for (a, _d), out in zip(jobs, outs, strict=True):
            if isinstance(out, asyncio.CancelledError):
                raise out
            if isinstance(out, BaseException):
                e = self.error("verify", a, out)
                reasons.append(f"verify on {a.name}: {e['code']} {e['message']}")
        return "; ".join(reasons) or None

    def _take_vms(self, res: dict[str, Any]) -> None:
        for v in res.get("vms", []) or []:
            if isinstance(v, dict) and v.get("vm") in self.vms:
                t = self.vms[v["vm"]]
                t.update(v)
                if t.thaw_error:
                    # The snapshot is fine, but the guest may still be
                    # frozen (writes blocked): say so loudly, per VM.
                    log.warning("event=thaw_failed group=%s txn=%s vm=%s agent=%s "
                                "error=%r", self.spec.name, self.txn, t.vm, t.agent,
                                t.thaw_error)

    # -- abort -----------------------------------------------------------------
    async def abort(self) -> bool:
        """ABORT everywhere (resume + delete member snapshots).  True when no
        member snapshot can remain (rule R5)."""
        timeout = (min(ABORT_TIMEOUT_MAX_S, self.spec.lease_ms / 1000 + 1.0)
                   + self.spec.thaw_allowance_ms / 1000)

        async def one(a: AgentSpec) -> dict[str, Any]:
            return await self.client(a).abort(self.txn, self.disk_names(a),
                                              timeout=timeout)

        outs = await asyncio.gather(*(one(a) for a in self.spec.agents),
                                    return_exceptions=True)
        clean = True
        for a, out in zip(self.spec.agents, outs, strict=True):
            if isinstance(out, asyncio.CancelledError):
                raise out
            if isinstance(out, BaseException):
                self.error("abort", a, out)
                clean = False
            elif isinstance(out, dict):
                # Only the thaw facts (agent-protocol §4.5): a thaw that
                # failed after an abort's cont leaves a frozen guest too.
                self._take_vms({"vms": [
                    {"vm": x.get("vm"), "thaw_ms": x.get("thaw_ms"),
                     "thaw_error": x.get("thaw_error")}
                    for x in out.get("timings") or [] if isinstance(x, dict)
                    and "thaw_error" in x]})
        if not self.commit_sent:
            # No COMMIT was ever sent, so no agent made a snapshot of this
            # txn; an unreachable agent resumes its VMs at lease expiry.
            return True
        if not clean:
            return False
        return await self.verify_cleanup()

    async def verify_cleanup(self) -> bool:
        """After a phase-2 abort: every member snapshot is gone (invariant 3)."""
        async def one(a: AgentSpec, disk: str) -> None:
            c = self.client(a)
            if self.name in await c.snapshot_list(disk):
                await c.snapshot_delete(disk, self.name)
                if self.name in await c.snapshot_list(disk):
                    raise AgentError("CLEANUP", f"{disk}@{self.name} is still there",
                                     agent=a.name)

        jobs = [(a, d) for a in self.spec.agents for v in a.vms for d in v.disk_ids()]
        outs = await asyncio.gather(*(one(a, d) for a, d in jobs), return_exceptions=True)
        ok = True
        for (a, _d), out in zip(jobs, outs, strict=True):
            if isinstance(out, BaseException):
                self.error("cleanup", a, out)
                ok = False
        return ok

    async def finish_abort(self, reason: str) -> GroupSnapshotResult:
        await self.write(ABORTING, reason=reason)  # R4 (sent even if this fails)
        try:
            await self.emit("aborting")
        except Exception as exc:  # noqa: BLE001  a progress hook must not keep VMs paused
            log.warning("event=hook_failed phase=aborting txn=%s error=%r", self.txn, exc)
        clean = await self.abort()
        if clean:
            await self.write(ABORTED, timings=dict(self.result(ABORTED, reason).timings),
                       snapshots={d["disk"]: {"state": "deleted"} for d in self.all_disks()}
                       if self.commit_sent else None)
            await self.emit("aborted")
            return self.result(ABORTED, reason)
        reason += "; cleanup incomplete, retried by resolve_in_doubt"
        await self.write(ABORTING, reason=reason)
        return self.result(ABORTING, reason)

    async def finish_commit(self) -> GroupSnapshotResult:
        snaps = {}
        for t in self.vms.values():
            for d in t.disks:
                if isinstance(d.get("disk"), str):
                    snaps[d["disk"]] = {"state": "created",
                                        "snapshot_ms": d.get("snapshot_ms")}
        for d in self.all_disks():
            snaps.setdefault(d["disk"], {"state": "created"})
        res = self.result(COMMITTED, None)
        if await self.write(COMMITTED, timings=dict(res.timings), snapshots=snaps):  # R3
            await self.emit("committed")
        return res
