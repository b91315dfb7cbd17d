"""The two-phase group snapshot (DESIGN.md "The group snapshot protocol",
docs/design.md §4).  Both entry points are plain async functions so that the
CLI and the control plane's Celery task share one code path:

    take_group_snapshot(spec, txlog, txn=...)   one group snapshot
    resolve_in_doubt(txlog, pool)               after a coordinator restart

Ordering rules (docs/design.md §5), each enforced below where it applies:
  R1  PREPARING is durable before any PREPARE is sent.
  R2  COMMITTING is durable before any COMMIT is sent; it is written only
      after every agent answered PREPARED (the cut is fixed).
  R3  COMMITTED is written only after every agent answered COMMITTED and
      every member snapshot is listed on its disk (snapshot.list).
  R4  ABORTING is written before ABORT is sent, except when the log itself
      failed: then ABORT is sent anyway (presumed abort; no COMMITTING
      record exists, so a restart aborts too).
  R5  ABORTED is written only once no member snapshot can remain: either
      COMMIT was never sent (agents create snapshots only on COMMIT), or
      every agent confirmed the abort and the member snapshots are gone.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import inspect
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from cutpoint.agentclient import AgentClient, AgentError, AgentPool, AgentReplyError
from cutpoint.agentclient.tls import client_context
from cutpoint.coordinator.results import GroupSnapshotResult, VMTiming, group_timings
from cutpoint.coordinator.spec import NAME_RE, AgentSpec, GroupSpec, SpecError
from cutpoint.coordinator.txlog import (
    ABORTED,
    ABORTING,
    COMMITTED,
    COMMITTING,
    FINAL,
    PREPARING,
    TxLog,
    TxLogError,
    TxnRecord,
    utcnow,
)

log = logging.getLogger(__name__)

# A COMMIT reply may take the snapshot budget plus transport time.
COMMIT_MARGIN_S = 2.0
# ABORT only resumes VMs and deletes snapshots.  Waiting longer than the
# lease for its reply gains nothing before COMMIT (the lease resumes the VMs
# anyway); after COMMIT an unanswered ABORT leaves the txn ABORTING, retried.
ABORT_TIMEOUT_MAX_S = 10.0
# A txn not updated for lease + budget + this is no longer driven by a live
# coordinator: its agents have resumed on their own (invariant 2).
STALE_MARGIN_S = 2.0

EventHook = Callable[[str, str], Awaitable[None] | None]
T = TypeVar("T")


class CoordinatorError(RuntimeError):
    pass


class GroupBusy(CoordinatorError):
    """The group already has a group snapshot in flight (DESIGN.md: never two)."""

    def __init__(self, group: str, txn: str, state: str) -> None:
        self.group, self.txn, self.state = group, txn, state
        super().__init__(f"group {group} has txn {txn} in flight ({state})")


class TxnInFlight(CoordinatorError):
    def __init__(self, txn: str, state: str) -> None:
        self.txn, self.state = txn, state
        super().__init__(f"txn {txn} is in flight ({state}) in another coordinator")


async def _db(fn: Callable[..., T], *args: Any, offload: bool = True, **kw: Any) -> T:
    """A blocking call of the log: on a thread, waited for, with `offload`
    (see `_Run.write`); else here."""
    if not offload:
        return fn(*args, **kw)
    return await asyncio.to_thread(fn, *args, **kw)


def new_txn_id() -> str:
    """Sortable, unique, and valid in RBD snapshot names."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + secrets.token_hex(3)


def pool_for(spec: GroupSpec, **kwargs: Any) -> AgentPool:
    if spec.tls is None:
        raise SpecError("tls: the group needs ca, cert and key to reach its agents")
    return AgentPool(client_context(spec.tls.ca, spec.tls.cert, spec.tls.key), **kwargs)


def _stale_at(rec: TxnRecord) -> dt.datetime:
    return rec.updated_at + dt.timedelta(
        milliseconds=rec.lease_ms + rec.budget_ms + _quiesce_allowance_ms(rec.spec),
        seconds=STALE_MARGIN_S)


def _quiesce_allowance_ms(spec: dict[str, Any] | None) -> int:
    """Extra time a live coordinator may spend in a txn with guest freezes:
    the freezes inside PREPARE (before any lease is armed) and the thaws
    inside COMMIT/ABORT (after `cont`).  Read from the stored spec, so an
    in-doubt fs-freeze txn is not taken for stale while it is still driven."""
    if not spec or spec.get("quiesce") != "fs-freeze":
        return 0
    try:
        s = GroupSpec.from_dict({k: v for k, v in spec.items() if k != "tls"})
    except SpecError:
        return 0
    return s.freeze_allowance_ms + s.thaw_allowance_ms


class _Run:
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
                 "thaw_error": t.thaw_error, "pause_path": t.pause_path}
                for t in self.vms.values()]

    async def write(self, state: str, *, light: bool = False, **kw: Any) -> bool:
        """Record a transition; a log failure is kept and reported at the end.

        light: only the state and its event row.  The COMMITTING write is
        inside every VM's pause window, so it carries nothing else; the
        per-VM facts of phase 1 are written with the final state.

        With `offload` the write runs on a thread (`_db`): the event loop
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
                await _db(self.txlog.transition, self.txn, state, **kw)
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


async def take_group_snapshot(spec: GroupSpec, txlog: TxLog, *, txn: str | None = None,
                              pool: AgentPool | None = None,
                              on_event: EventHook | None = None,
                              offload: bool = False) -> GroupSnapshotResult:
    """Take one crash-consistent group snapshot of `spec`.

    Idempotent by `txn`: repeating a finished txn returns its stored result
    without contacting any agent.  Raises TxLogError when the log cannot be
    written before PREPARE (then nothing was paused), GroupBusy when another
    snapshot of the group is in flight.  `pool` keeps agent connections open
    across calls; without it one is made from `spec.tls` and closed at the end.
    `offload`: run the log's reads and writes on threads (but the commit
    decision's), for a loop that drives many groups at once (`_Run.write`).
    `on_event(txn, phase)` is called at each phase (preparing, prepared,
    committing, committed, aborting, aborted).  "prepared" and "committing"
    are called *inside* every VM's pause window and are awaited: a hook that
    writes to a database there lengthens the pause by that write.
    """
    txn = txn or new_txn_id()
    if not NAME_RE.match(txn) or len(spec.snapshot_name(txn)) > 128:
        raise SpecError(f"txn: {txn!r} must be [A-Za-z0-9._-] and fit cp.<group>.<txn> "
                        "in 128 characters")
    own_pool = pool is None
    pool = pool or pool_for(spec)
    try:
        existing = await _db(txlog.get, txn, offload=offload)
        if existing is not None:
            if existing.state in FINAL:
                return GroupSnapshotResult.from_record(existing)
            if utcnow() < _stale_at(existing):
                raise TxnInFlight(txn, existing.state)
            return await _resolve(existing, txlog, pool, offload)
        for rec in await _db(txlog.in_doubt, group=spec.name, offload=offload):
            if utcnow() >= _stale_at(rec):
                await _resolve(rec, txlog, pool, offload)
            elif rec.state in (PREPARING, COMMITTING):
                raise GroupBusy(spec.name, rec.txn, rec.state)
        return await _run(spec, txlog, pool, txn, on_event, offload)
    finally:
        if own_pool:
            await pool.close()


async def _run(spec: GroupSpec, txlog: TxLog, pool: AgentPool, txn: str,
               on_event: EventHook | None, offload: bool) -> GroupSnapshotResult:
    run = _Run(spec, txlog, pool, txn, on_event, offload)
    # R1: durable PREPARING before anything is paused.  If this raises, no
    # agent was contacted.
    await _db(txlog.begin, txn, spec.name, spec.to_dict(), run.all_disks(),
              lease_ms=spec.lease_ms, budget_ms=spec.budget_ms, offload=offload)
    await run.emit("preparing")
    try:
        reason = await run.prepare()
        if reason is not None:
            return await run.finish_abort(reason)
        await run.emit("prepared")
        # R2: the cut is fixed; record the decision before any COMMIT.
        t = time.monotonic()
        if not await run.write(COMMITTING, light=True):
            await run.finish_abort(f"could not record the commit decision: {run.log_error}")
            assert run.log_error is not None
            raise run.log_error
        run.timings["log_commit_ms"] = (time.monotonic() - t) * 1000
        await run.emit("committing")
        reason = await run.commit() or await run.verify_commit()
        if reason is not None:
            return await run.finish_abort(reason)
        res = await run.finish_commit()
        if run.log_error is not None:
            # The snapshots exist but COMMITTED is not recorded; the txn stays
            # COMMITTING and resolve_in_doubt finishes it.
            raise run.log_error
        return res
    except BaseException:
        # A bug, a cancellation or a log failure: never leave VMs paused
        # longer than needed; abort is idempotent and safe in every state
        # before COMMITTED.
        if run.log_error is None:
            await asyncio.shield(_best_effort_abort(run))
        raise


async def _best_effort_abort(run: _Run) -> None:
    try:
        rec = await _db(run.txlog.get, run.txn, offload=run.offload)
    except TxLogError:
        rec = None
    if rec is not None and rec.state in FINAL:
        return
    try:
        await run.finish_abort("coordinator error")
    except Exception:
        log.exception("event=abort_failed txn=%s", run.txn)


async def _resolve(rec: TxnRecord, txlog: TxLog, pool: AgentPool,
                   offload: bool = False) -> GroupSnapshotResult:
    """Resolve one in-doubt txn (docs/design.md §6):

    PREPARING  → abort (prepared but undecided means abort; no COMMIT was sent)
    COMMITTING → re-send COMMIT (idempotent, agent-protocol §4.4); if every
                 agent confirms, COMMITTED; otherwise ABORT + cleanup
    ABORTING   → ABORT again + cleanup
    """
    spec = GroupSpec.from_dict({k: v for k, v in rec.spec.items() if k != "tls"})
    run = _Run(spec, txlog, pool, rec.txn, None, offload)
    run.errors = list(rec.errors)
    run.commit_sent = COMMITTING in rec.states
    log.warning("event=txn_in_doubt txn=%s state=%s", rec.txn, rec.state)
    if rec.state == PREPARING:
        return await run.finish_abort("in doubt after coordinator restart: "
                                      "prepared but undecided, aborted")
    if rec.state == COMMITTING:
        reason = await run.commit() or await run.verify_commit()
        if reason is None:
            return await run.finish_commit()
        return await run.finish_abort(f"in doubt after coordinator restart: {reason}")
    return await run.finish_abort(rec.reason or "in doubt after coordinator restart")


async def resolve_in_doubt(txlog: TxLog, pool: AgentPool, *, group: str | None = None,
                           wait: bool = True,
                           offload: bool = False) -> list[GroupSnapshotResult]:
    """Resolve every in-doubt txn (invariant 4), e.g. at coordinator start.

    A txn updated less than lease + budget + margin ago may still be driven
    by a live coordinator; with `wait` it is resolved once that time has
    passed, otherwise it is skipped.  Returns the results of resolved txns.
    """
    out = []
    for rec in sorted(await _db(txlog.in_doubt, group=group, offload=offload),
                      key=lambda r: r.created_at):
        delay = (_stale_at(rec) - utcnow()).total_seconds()
        if delay > 0:
            if not wait:
                log.info("event=txn_in_flight txn=%s skipped", rec.txn)
                continue
            await asyncio.sleep(delay)
            fresh = await _db(txlog.get, rec.txn, offload=offload)
            if fresh is None or fresh.state in FINAL:
                continue
            rec = fresh
        out.append(await _resolve(rec, txlog, pool, offload))
    return out
