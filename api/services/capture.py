"""Group snapshots through the coordinator, recorded in the API's tables.

`run(ctx, snapshot_id)` builds a GroupSpec from the database, calls
`cutpoint.coordinator.take_group_snapshot` with the snapshot's txn (so a
redelivered job resumes or resolves the same transaction instead of taking
a second one), and writes the outcome: state, member snapshots, timings.

A txn whose abort could not confirm its cleanup stays ABORTING in the log,
and its snapshot `aborting` here (never `aborted` while a member snapshot
may remain, invariant 3).  `settle` records what a later resolution of a
txn decided (services/indoubt.py: at worker start, periodically, and before
each snapshot of the same group).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cutpoint.api.config import Settings
from cutpoint.api.grouplock import guard_of
from cutpoint.api.models import (
    Disk,
    Group,
    GroupDisk,
    GroupSnapshot,
    Host,
    Job,
    MemberSnapshot,
    SnapState,
    Vm,
    utcnow,
)
from cutpoint.api.services import rpo
from sqlalchemy import select, update
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session, sessionmaker

log = logging.getLogger("cutpoint.capture")

PHASE_STATE = {"preparing": SnapState.preparing, "prepared": SnapState.preparing,
               "committing": SnapState.committing, "aborting": SnapState.aborting}
PHASE_PROGRESS = {"preparing": 0.2, "prepared": 0.4, "committing": 0.6, "committed": 0.9,
                  "aborting": 0.8, "aborted": 0.9}
UNREACHABLE = {"CONNECT", "TIMEOUT", "CLOSED"}


class CaptureError(RuntimeError):
    def __init__(self, code: str, message: str) -> None:
        self.code = code
        super().__init__(message)


@dataclass
class Plan:
    spec: Any  # cutpoint.coordinator.spec.GroupSpec
    members: list[dict[str, Any]]  # host, vm, disk, disk_id


def build_spec(session: Session, g: Group, settings: Settings) -> Plan:
    from cutpoint.coordinator.spec import (
        AgentSpec,
        GroupSpec,
        SpecError,
        TlsSpec,
        VMSpec,
    )

    rows = session.execute(
        select(Host, Vm, Disk).join(Vm, Vm.host_id == Host.id).join(Disk, Disk.vm_id == Vm.id)
        .join(GroupDisk, GroupDisk.disk_id == Disk.id).where(GroupDisk.group_id == g.id)
        .order_by(Host.name, Vm.name, Disk.node)).all()
    if not rows:
        raise CaptureError("group_empty", f"group {g.name} has no disks")
    by_host: dict[int, tuple[Host, dict[str, list[str]]]] = {}
    members = []
    for host, vm, disk in rows:
        if not disk.present:
            raise CaptureError("disk_missing", f"disk {disk.key} is no longer reported by "
                                                f"the agent on {host.name}")
        h = by_host.setdefault(host.id, (host, defaultdict(list)))
        h[1][vm.name].append(disk.node)
        members.append({"host": host.name, "vm": vm.name, "disk": disk.key,
                        "disk_id": disk.id})
    tls = None
    if settings.agent_ca and settings.agent_cert and settings.agent_key:
        tls = TlsSpec(str(settings.agent_ca), str(settings.agent_cert), str(settings.agent_key))
    p = g.policy
    try:
        spec = GroupSpec(
            name=g.name, lease_ms=p.lease_ms, budget_ms=p.pause_budget_ms, tls=tls,
            # freeze_timeout_ms: the spec's default (5000) is sent in
            # PREPARE and each agent uses min(it, its own), so the wait for
            # PREPARED sized on it is always long enough.
            quiesce=p.quiesce.value,
            agents=tuple(AgentSpec(name=h.name, address=h.address, port=h.port,
                                   cert_sha256=h.cert_fingerprint,
                                   vms=tuple(VMSpec(n, tuple(d)) for n, d in vms.items()))
                         for h, vms in by_host.values()))
    except SpecError as exc:
        raise CaptureError("bad_spec", str(exc)) from exc
    if tls is None:
        raise CaptureError("agent_tls_unset", "CUTPOINT_AGENT_CA/CERT/KEY are not configured")
    return Plan(spec, members)


def weakest(levels: list[str | None]) -> str | None:
    from cutpoint.coordinator.results import weakest as _weakest

    return _weakest(levels)


_txlogs: dict[str, Any] = {}
# One event loop and one agent connection pool per worker process: agent
# connections stay open across snapshots (agent-protocol §1.3), so a
# snapshot pays no TCP/TLS handshake.  A dropped connection is re-opened
# by the client on its next call.
#
# Two ways to run it, chosen by the calling thread:
# - "inline": from the process's main thread (a prefork worker's child runs
#   its tasks there, one at a time; the CLI), the loop runs in the caller,
#   as `run_until_complete`, and the coordinator writes its log inline:
#   no thread handover anywhere in the protocol;
# - "shared": from any other thread (the tasks of a threads-pool worker),
#   the loop runs on a thread of its own and every caller hands its
#   coroutines to it: many group snapshots are in flight at once in one
#   process, and those to one host share its connection, their requests
#   pipelined (agent-protocol §1.3: replies may come in any order).  The
#   log's writes then run on threads (twophase `offload`), except the one
#   inside the pause window.
# Each way has its own pools: a connection belongs to the loop it was
# opened on.
INLINE, SHARED = "inline", "shared"
_inline_loop: asyncio.AbstractEventLoop | None = None
_inline_pid: int | None = None
_loop: asyncio.AbstractEventLoop | None = None
SWITCH_INTERVAL_S = 0.0005
_loop_thread: threading.Thread | None = None
_loop_pid: int | None = None
_lock = threading.RLock()
_pools: dict[tuple[str, str, str, str], Any] = {}
# Per pool: the pin (and TLS server name) each agent's connection was
# opened under.  The pool reuses a connection by address alone, so a
# host whose pin changed must not find its old connection there.
_pins: dict[tuple[str, str, str, str],
            dict[tuple[str, int], tuple[str | None, str | None]]] = {}


def _mode() -> str:
    return INLINE if threading.current_thread() is threading.main_thread() else SHARED


def _forget_parent() -> None:
    """In a forked child: the parent's loops and connections are not ours."""
    if os.getpid() not in (_inline_pid, _loop_pid, None):
        _pools.clear()
        _pins.clear()


def _agent_loop() -> asyncio.AbstractEventLoop:
    """This process's shared agent loop, started on first use (and again in
    a forked child)."""
    global _loop, _loop_thread, _loop_pid
    with _lock:
        if (_loop is None or _loop.is_closed() or _loop_pid != os.getpid()
                or _loop_thread is None or not _loop_thread.is_alive()):
            _forget_parent()
            _loop = asyncio.new_event_loop()
            # The loop's thread is inside every VM's pause window whenever a
            # reply comes in; other threads of a threads-pool worker (the
            # tasks' database work) hold the GIL meanwhile.  CPython hands it
            # over only every switch interval (5 ms by default), and a
            # protocol step may wait for several handovers: 0.5 ms bounds
            # each wait tighter, for a little more switching overhead.
            sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL_S))
            _loop_thread = threading.Thread(target=_loop.run_forever, daemon=True,
                                            name="cutpoint-agent-loop")
            _loop_thread.start()
            _loop_pid = os.getpid()
        return _loop


def _run_async(coro: Any) -> Any:
    """Run `coro` on this thread's agent loop (see INLINE, SHARED) and
    return its result."""
    global _inline_loop, _inline_pid
    if _mode() == INLINE:
        with _lock:
            if _inline_loop is None or _inline_loop.is_closed() or _inline_pid != os.getpid():
                _forget_parent()
                _inline_loop = asyncio.new_event_loop()
                _inline_pid = os.getpid()
        return _inline_loop.run_until_complete(coro)
    loop = _agent_loop()
    if threading.current_thread() is _loop_thread:
        coro.close()
        raise RuntimeError("_run_async called on the agent loop's own thread")
    return asyncio.run_coroutine_threadsafe(coro, loop).result()


def close_pools() -> None:
    """Close every agent pool of this process, each on its own loop (tests)."""
    with _lock:
        pools = dict(_pools)
        _pools.clear()
        _pins.clear()
    for (mode, *_k), p in pools.items():
        if mode == INLINE and _inline_loop is not None and not _inline_loop.is_closed():
            _inline_loop.run_until_complete(p.close())
        elif mode == SHARED and _loop is not None and not _loop.is_closed():
            asyncio.run_coroutine_threadsafe(p.close(), _loop).result(30)


def _pool_for(spec: Any) -> Any:
    """This process's agent pool for the spec's certificate, holding a
    connection to each of its agents opened under the agent's current pin.

    When an agent's pin (or server name) differs from the one its pooled
    connection was checked against, the pool is closed and a new one made:
    every connection of the new pool checks the pins it is given (a pin
    changes rarely; the others reconnect once)."""
    with _lock:
        return _pool_for_locked(spec)


def _pool_for_locked(spec: Any) -> Any:
    from cutpoint.agentclient.client import normalize_fingerprint
    from cutpoint.coordinator.twophase import pool_for

    key = (_mode(), spec.tls.ca, spec.tls.cert, spec.tls.key)
    want = {(a.address, a.port): (normalize_fingerprint(a.cert_sha256), a.server_name)
            for a in spec.agents}
    seen = _pins.setdefault(key, {})
    changed = sorted(f"{addr}:{port}" for (addr, port), v in want.items()
                     if seen.get((addr, port), v) != v)
    if changed and key in _pools:
        log.warning("event=agent_pin_changed agents=%s action=reconnect", ",".join(changed))
        _run_async(_pools.pop(key).close())
        seen.clear()
    if key not in _pools:
        _pools[key] = pool_for(spec)
    pool_ = _pools[key]
    for a in spec.agents:  # open under the current pins (before any stored spec's)
        pool_.get(a.address, a.port, name=a.name, server_name=a.server_name,
                  cert_sha256=a.cert_sha256)
    seen.update(want)
    return pool_


def pool(settings: Settings) -> Any:
    """This process's agent pool for the control plane's certificate."""
    from cutpoint.agentclient import AgentPool, client_context

    if not (settings.agent_ca and settings.agent_cert and settings.agent_key):
        raise CaptureError("agent_tls_unset", "CUTPOINT_AGENT_CA/CERT/KEY are not configured")
    key = (_mode(), str(settings.agent_ca), str(settings.agent_cert),
           str(settings.agent_key))
    with _lock:
        if key not in _pools:
            _pools[key] = AgentPool(client_context(*key[1:]))
        return _pools[key]


def txlog(sf: sessionmaker[Session], settings: Settings) -> Any:
    """The coordinator's log, guarded by the group locks `sf` is fenced with."""
    log_ = txlog_for(settings.database_url)
    guard = guard_of(sf)
    return log_.guarded(guard) if guard is not None else log_


def txlog_for(url: str) -> Any:
    from cutpoint.api.db import get_engine
    from cutpoint.coordinator.txlog import TxLog

    if url not in _txlogs:
        # Tables come from Alembic (migration 0002), not create_all.  On
        # SQLite, reads of the log go through the engine whose BEGIN does
        # not take the write lock.
        reads = get_engine(url, immediate=False) if url.startswith("sqlite") else None
        _txlogs[url] = TxLog(get_engine(url), create=False, read_engine=reads)
    return _txlogs[url]


def _phase_hook(snapshot_id: int, job_id: str | None, txn: str,
                quiesce: str) -> Callable[[Connection, str, str], None]:
    """What each state write of `txn` also records about the API's rows,
    inside the log's own transaction (TxLog.hooked): the snapshot's state,
    start and cut times, the job's progress.  One commit per protocol phase,
    not two, and none inside the pause window but the COMMITTING decision's
    own (the "prepared" progress mark is not written at all)."""
    snaps, jobs = GroupSnapshot.__table__, Job.__table__

    def hook(c: Connection, t: str, state: str) -> None:
        if t != txn:  # an earlier txn of the group, resolved by this run
            return
        now = utcnow()
        row = snaps.c.id == snapshot_id
        st = PHASE_STATE.get(state)
        if st is not None:
            c.execute(update(snaps).where(row, snaps.c.state.not_in(
                [SnapState.committed, SnapState.aborted])).values(state=st))
        if state == "preparing":
            c.execute(update(snaps).where(row).values(quiesce=quiesce))
            c.execute(update(snaps).where(row, snaps.c.started_at.is_(None))
                      .values(started_at=now))
        if state == "committing":
            c.execute(update(snaps).where(row, snaps.c.cut_at.is_(None)).values(cut_at=now))
        if job_id and state in PHASE_PROGRESS:
            c.execute(update(jobs).where(jobs.c.id == job_id).values(
                progress=PHASE_PROGRESS[state], message=state))
    return hook


def run(sf: sessionmaker[Session], settings: Settings, snapshot_id: int) -> dict[str, Any]:
    """Drive one group snapshot to a final state; returns a summary for the job."""
    from cutpoint.api.db import get_sessionmaker
    from cutpoint.coordinator.twophase import resolve_in_doubt, take_group_snapshot

    # Read only: the snapshot's start is written with PREPARING, in the
    # log's transaction (_phase_hook).
    with get_sessionmaker(settings.database_url, readonly=True)() as s:
        snap = s.get(GroupSnapshot, snapshot_id)
        assert snap is not None
        g = s.get(Group, snap.group_id)
        assert g is not None
        plan = build_spec(s, g, settings)
        job_id, txn = snap.job_id, snap.txn

    # The worker's group lock guards the log too; the hook writes the
    # snapshot's and job's rows with each state.
    log_ = txlog(sf, settings).hooked(_phase_hook(snapshot_id, job_id, txn,
                                                  plan.spec.quiesce))
    # Earlier txns of this group left in doubt (a dead worker's, an
    # unconfirmed abort) are resolved first, and their snapshots settled.
    offload = _mode() == SHARED
    for res in _run_async(resolve_in_doubt(log_, _pool_for(plan.spec), group=plan.spec.name,
                                           wait=False, offload=offload)):
        settle(sf, settings, res)
    t0 = time.monotonic()
    result = _run_async(take_group_snapshot(plan.spec, log_, txn=txn,
                                            pool=_pool_for(plan.spec), offload=offload))
    elapsed_ms = (time.monotonic() - t0) * 1000
    return record(sf, snapshot_id, plan, result, elapsed_ms)


def record(sf: sessionmaker[Session], snapshot_id: int, plan: Plan, result: Any,
           elapsed_ms: float | None) -> dict[str, Any]:
    """Write a txn's outcome.  elapsed_ms None: a later resolution of the txn
    (its timings are the first run's and stay as they were)."""
    from cutpoint.coordinator.txlog import ABORTING

    now = utcnow()
    aborting = result.state == ABORTING
    # A member of an unconfirmed abort may still exist: `deleting` until the
    # cleanup is confirmed.
    member_state = "present" if result.committed else "deleting" if aborting else "deleted"
    with sf() as s:
        snap = s.get(GroupSnapshot, snapshot_id)
        assert snap is not None
        timing = {v.vm: v for v in result.vms}
        existing = {m.disk: m for m in snap.members}
        for m in plan.members:
            if m["disk"] in existing:
                existing[m["disk"]].state = member_state
                continue
            t = timing.get(m["vm"])
            disk_t = {}
            if t is not None:
                for d in t.disks:
                    if d.get("disk") == m["disk"]:
                        disk_t = d
            # The level the agent says the member reached; a pause alone is
            # crash-consistent, so a committed member without one is "crash".
            reached = (t.consistency if t is not None and t.consistency else "crash")
            snap.members.append(MemberSnapshot(
                disk_id=m["disk_id"], host=m["host"], vm=m["vm"], disk=m["disk"],
                name=plan.spec.snapshot_name(snap.txn),
                state=member_state,
                consistency=reached if result.committed else None,
                freeze_ms=t.freeze_ms if t else None, thaw_ms=t.thaw_ms if t else None,
                freeze_error=t.freeze_error if t else None,
                thaw_error=t.thaw_error if t else None,
                method=t.method if t else None,
                pause_path=t.pause_path if t else None,
                pause_path_why=t.pause_path_why if t else None,
                stop_ms=t.stop_ms if t else None, barrier_ms=t.barrier_ms if t else None,
                snapshot_ms=disk_t.get("snapshot_ms", t.snapshot_ms if t else None),
                cont_ms=t.cont_ms if t else None, paused_ms=t.paused_ms if t else None))
        if elapsed_ms is not None:
            pauses = [v.paused_ms for v in result.vms if v.paused_ms is not None]
            snap.max_pause_ms = max(pauses) if pauses else None
            total = result.timings.get("total_ms") if result.timings else None
            snap.duration_ms = float(total) if isinstance(total, (int, float)) else elapsed_ms
        # Not in flight any more: the group's next snapshot may start (the
        # coordinator does not wait for an unconfirmed abort either).
        snap.inflight_group_id = None
        snap.finished_at = None if aborting else now
        hosts = {h.name: h for h in s.scalars(select(Host).where(
            Host.name.in_({m["host"] for m in plan.members})))}
        if result.committed:
            snap.state = SnapState.committed
            snap.consistency = weakest([m.consistency for m in snap.members]) or "crash"
            if snap.cut_at is None:
                snap.cut_at = now - dt.timedelta(milliseconds=snap.duration_ms or 0)
            for h in hosts.values():
                h.reachable, h.last_seen_at, h.last_error = True, now, None
            group = s.get(Group, snap.group_id)
            if group is not None:
                rpo.note_recovery(s, group, snap)
        else:
            snap.state = SnapState.aborting if aborting else SnapState.aborted
            codes = [e.get("code") for e in result.errors if e.get("code")]
            snap.error_code = (codes[0] if codes else "aborted")[:64]
            snap.error = (result.reason or "aborted")[:4000]
            for e in result.errors:
                h = hosts.get(str(e.get("agent")))
                if h is not None and e.get("code") in UNREACHABLE:
                    h.reachable = False
                    h.last_error = f"{e.get('code')}: {e.get('message')}"[:2000]
        s.commit()
        return {"snapshot_id": snap.id, "txn": snap.txn, "state": snap.state.value,
                "quiesce": snap.quiesce, "consistency": snap.consistency,
                "max_pause_ms": snap.max_pause_ms, "duration_ms": snap.duration_ms,
                "error_code": snap.error_code, "reason": result.reason}


def settle(sf: sessionmaker[Session], settings: Settings, result: Any) -> int | None:
    """Record a resolution of `result.txn` (aborted, committed, or still
    aborting) on its snapshot; the snapshot id, or None when the txn is not
    one of the control plane's."""
    from cutpoint.coordinator.spec import GroupSpec

    with sf() as s:
        snap = s.scalar(select(GroupSnapshot).where(GroupSnapshot.txn == result.txn))
        if snap is None:
            return None
        snap_id = snap.id
    rec = txlog_for(settings.database_url).get(result.txn)
    assert rec is not None
    spec = GroupSpec.from_dict({k: v for k, v in rec.spec.items() if k != "tls"})
    with sf() as s:
        members = []
        for d in rec.snapshots:
            disk_id = s.scalar(select(Disk.id).join(Vm, Vm.id == Disk.vm_id)
                               .join(Host, Host.id == Vm.host_id)
                               .where(Host.name == d["agent"], Disk.key == d["disk"]))
            members.append({"host": d["agent"], "vm": d["vm"], "disk": d["disk"],
                            "disk_id": disk_id})
    log.info("event=txn_settled txn=%s snapshot=%s state=%s", result.txn, snap_id,
             result.state)
    record(sf, snap_id, Plan(spec, members), result, None)
    return snap_id


def txn_in_doubt(sf: sessionmaker[Session], settings: Settings, snapshot_id: int) -> bool:
    """True if the coordinator's log has this snapshot's txn in a non-final state."""
    from cutpoint.coordinator.txlog import FINAL

    try:
        with sf() as s:
            snap = s.get(GroupSnapshot, snapshot_id)
            if snap is None:
                return False
            txn = snap.txn
        rec = txlog_for(settings.database_url).get(txn)
    except Exception:  # noqa: BLE001  log unreadable: treat as in doubt, retry later
        return True
    return rec is not None and rec.state not in FINAL


def fail(sf: sessionmaker[Session], snapshot_id: int, code: str, message: str) -> None:
    """The snapshot never reached an agent (or its outcome is final): close it."""
    with sf() as s:
        snap = s.get(GroupSnapshot, snapshot_id)
        if snap is None or snap.state in (SnapState.committed, SnapState.aborted,
                                          SnapState.failed):
            return
        snap.state = SnapState.failed
        snap.inflight_group_id = None
        snap.error_code = code[:64]
        snap.error = message[:4000]
        snap.finished_at = utcnow()
        s.commit()
