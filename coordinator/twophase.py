"""The two-phase group snapshot (DESIGN.md "The group snapshot protocol",
docs/design.md §4).  Both entry points are plain async functions so that the
CLI and the control plane's Celery task share one code path:

    take_group_snapshot(spec, txlog, txn=...)   one group snapshot
    resolve_in_doubt(txlog, pool)               after a coordinator restart

Ordering rules (docs/design.md §5), each enforced where it applies, here or
in a phase of `TxnRun` (txnrun.py):
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
import logging
import secrets
import time
from typing import Any

from cutpoint.agentclient import AgentPool
from cutpoint.agentclient.tls import client_context
from cutpoint.coordinator.results import GroupSnapshotResult
from cutpoint.coordinator.spec import NAME_RE, GroupSpec, SpecError
from cutpoint.coordinator.txlog import (
    COMMITTING,
    FINAL,
    PREPARING,
    TxLog,
    TxLogError,
    TxnRecord,
    utcnow,
)
from cutpoint.coordinator.txnrun import EventHook, TxnRun, run_db

log = logging.getLogger(__name__)

# A txn not updated for lease + budget + this is no longer driven by a live
# coordinator: its agents have resumed on their own (invariant 2).
STALE_MARGIN_S = 2.0


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
    decision's), for a loop that drives many groups at once (`TxnRun.write`).
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
        existing = await run_db(txlog.get, txn, offload=offload)
        if existing is not None:
            if existing.state in FINAL:
                return GroupSnapshotResult.from_record(existing)
            if utcnow() < _stale_at(existing):
                raise TxnInFlight(txn, existing.state)
            return await _resolve(existing, txlog, pool, offload)
        for rec in await run_db(txlog.in_doubt, group=spec.name, offload=offload):
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
    run = TxnRun(spec, txlog, pool, txn, on_event, offload)
    # R1: durable PREPARING before anything is paused.  If this raises, no
    # agent was contacted.
    await run_db(txlog.begin, txn, spec.name, spec.to_dict(), run.all_disks(),
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


async def _best_effort_abort(run: TxnRun) -> None:
    try:
        rec = await run_db(run.txlog.get, run.txn, offload=run.offload)
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
    run = TxnRun(spec, txlog, pool, rec.txn, None, offload)
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
    for rec in sorted(await run_db(txlog.in_doubt, group=group, offload=offload),
                      key=lambda r: r.created_at):
        delay = (_stale_at(rec) - utcnow()).total_seconds()
        if delay > 0:
            if not wait:
                log.info("event=txn_in_flight txn=%s skipped", rec.txn)
                continue
            await asyncio.sleep(delay)
            fresh = await run_db(txlog.get, rec.txn, offload=offload)
            if fresh is None or fresh.state in FINAL:
                continue
            rec = fresh
        out.append(await _resolve(rec, txlog, pool, offload))
    return out
