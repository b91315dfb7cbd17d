"""The fault matrix (docs/reliability.md, "Fault matrix"): one fault at one
protocol step per test, on the real lab.

Lab: 2 primary hosts x 1 VM x 2 RBD disks (and the DR host), shared by every
test of the suite; real cutpointd agents, the coordinator's two-phase
commit (`take_group_snapshot`) or the whole control plane (a Celery worker
on a Redis of the test's own).  Each test starts from running VMs, injects
exactly one fault with `faultkit`, and asserts, where they apply:

- no VM paused beyond lease + 100 ms (the agents' own `paused_ms`);
- every VM running again after the fault is gone (the agents' inventory);
- no partial recovery point: the txn is never `committed` unless every
  member snapshot exists, and an aborted txn leaves none (`rbd snap ls`);
- a clear error recorded: the txn's reason names the host, the step and
  the failure.
"""
from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import pytest
from cutpoint.agentclient import AgentPool
from cutpoint.coordinator import (
    GroupSpec,
    TxLog,
    pool_for,
    resolve_in_doubt,
    take_group_snapshot,
)
from faultkit import (  # api/tests/faultkit.py
    LEASE_MS,
    MARKS,
    assert_pause_bound,
    blackhole,
    hung,
    pauses,
    pool_fixture,  # noqa: F401  (the fixture `pool`)
    snaps_of,
    spec_fixture,  # noqa: F401  (the fixture `spec`)
    vm_states,
    wait_pauses,
    wait_running,
)

pytestmark = MARKS

def _txn(what: str) -> str:
    return f"{what}-{os.urandom(4).hex()}"


def _second(spec: GroupSpec, lab: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The group's second host and its VM: where the fault goes."""
    a = spec.agents[1]
    return a.name, next(v for v in lab["vms"] if v["name"] == a.vms[0].name)


# -- a hung QEMU -----------------------------------------------------------------
async def test_hung_qemu_during_prepare(lab: dict[str, Any], agents: list[dict[str, Any]],
                                        spec: GroupSpec, pool: AgentPool,
                                        tmp_path: Path) -> None:
    """SIGSTOP of one VM's QEMU while the group prepares: the txn aborts
    naming that host's prepare, and the other VM is not paused beyond its
    lease.  The QEMU stays stopped past its agent's own `stop` deadline (the
    lease); once it wakes, every VM runs and keeps running."""
    host, vm = _second(spec, lab)
    others = {v.name for a in spec.agents for v in a.vms} - {vm["name"]}
    txn = _txn("hungqemu")
    log = TxLog(f"sqlite:///{tmp_path}/c.db")
    with hung(vm["pid"]):
        t0 = time.monotonic()
        res = await take_group_snapshot(spec, log, txn=txn, pool=pool)
        got = wait_pauses(agents, txn, others, 10)
        await asyncio.sleep(max(0.0, LEASE_MS / 1000 + 1 - (time.monotonic() - t0)))
    t_cont = time.monotonic()
    await wait_running(pool, spec, 30)
    ran = time.monotonic() - t_cont
    # and it stays running: a `stop` that QEMU ran late is undone
    await asyncio.sleep(3)
    await wait_running(pool, spec, 30)
    late = [p for p in pauses(agents, txn) if p["vm"] == vm["name"]]
    print(f"\nhung QEMU: {res.state}: {res.reason}; pauses {got}; all running "
          f"{ran:.1f} s after SIGCONT; resumes of the hung VM: {late}")
    assert res.state == "aborted", res
    assert f"prepare on {host}" in (res.reason or "") and "TIMEOUT" in (res.reason or "")
    assert_pause_bound([p for p in got if p["vm"] in others], LEASE_MS)
    rec = log.get(txn)
    assert rec is not None and rec.state == "aborted" and "committed" not in rec.states
    assert snaps_of(lab, txn) == []


# -- a network blackhole between the coordinator and one agent ----------------------
async def test_blackhole_during_prepare(lab: dict[str, Any], agents: list[dict[str, Any]],
                                        spec: GroupSpec, pool: AgentPool,
                                        tmp_path: Path) -> None:
    """Packets to one agent dropped from the start of the prepare: the txn
    aborts naming that host, the reachable VM resumes within its lease;
    once the network is back, the late PREPARE (TCP delivers it after the
    ABORT queued behind it, or the lease ends it) pauses nothing for longer
    than the lease, and every VM runs."""
    host, vm = _second(spec, lab)
    txn = _txn("bhprep")
    log = TxLog(f"sqlite:///{tmp_path}/c.db")
    with blackhole(lab, host, now=False) as bh:
        def at(_txn: str, phase: str) -> None:
            if phase == "preparing":   # recorded, nothing paused yet
                bh.drop()
        res = await take_group_snapshot(spec, log, txn=txn, pool=pool, on_event=at)
        assert bh.on
    print(f"\nblackhole in prepare: {res.state}: {res.reason}")
    assert res.state == "aborted", res
    assert f"prepare on {host}: TIMEOUT" in (res.reason or ""), res.reason
    reachable = {v.name for a in spec.agents if a.name != host for v in a.vms}
    got = wait_pauses(agents, txn, reachable, 10)
    await wait_running(pool, spec, 30)
    # Whatever the late PREPARE did on the far side ended within its lease.
    await asyncio.sleep(LEASE_MS / 1000 + 1)
    got = pauses(agents, txn)
    print(f"pauses {got}")
    assert_pause_bound(got, LEASE_MS)
    assert set((await vm_states(pool, spec)).values()) == {"running"}
    rec = log.get(txn)
    assert rec is not None and rec.state == "aborted" and "committed" not in rec.states
    assert snaps_of(lab, txn) == []
    del vm


async def test_blackhole_during_commit(lab: dict[str, Any], agents: list[dict[str, Any]],
                                       spec: GroupSpec, pool: AgentPool,
                                       tmp_path: Path) -> None:
    """Packets to one agent dropped once the commit is decided: the reachable
    host commits, the far one never hears COMMIT and resumes at its lease;
    the txn is never committed (it stays `aborting` while the far host
    cannot confirm its cleanup), and once the network is back a new
    coordinator's in-doubt resolution aborts it and leaves no member
    snapshot anywhere."""
    host, vm = _second(spec, lab)
    txn = _txn("bhcommit")
    db = f"sqlite:///{tmp_path}/c.db"
    log = TxLog(db)
    with blackhole(lab, host, now=False) as bh:
        def at(_txn: str, phase: str) -> None:
            if phase == "committing":  # the cut is fixed, no COMMIT sent yet
                bh.drop()
        res = await take_group_snapshot(spec, log, txn=txn, pool=pool, on_event=at)
        print(f"\nblackhole in commit: {res.state}: {res.reason}")
        assert res.state == "aborting", res
        assert f"commit on {host}: TIMEOUT" in (res.reason or ""), res.reason
        assert "cleanup incomplete" in (res.reason or "")
        got = wait_pauses(agents, txn, {v.name for a in spec.agents for v in a.vms}, 10)
        far = [p for p in got if p["host"] == host]
        assert far and all(p["why"] == "lease_expired" for p in far), got
        assert_pause_bound(got, LEASE_MS)
    # A new coordinator (a fresh pool, as after a restart) resolves it.
    fresh = pool_for(spec)
    try:
        out = await resolve_in_doubt(TxLog(db), fresh, group=spec.name)
        await wait_running(fresh, spec, 30)
    finally:
        await fresh.close()
    print(f"resolved: {[(r.txn, r.state, r.reason) for r in out]}; pauses {pauses(agents, txn)}")
    assert [(r.txn, r.state) for r in out] == [(txn, "aborted")]
    rec = log.get(txn)
    assert rec is not None and rec.state == "aborted" and "committed" not in rec.states
    assert snaps_of(lab, txn) == []
    assert_pause_bound(pauses(agents, txn), LEASE_MS)
    del vm


# -- a certificate that is wrong but valid ----------------------------------------
def _agent_rec(agents: list[dict[str, Any]], host: str) -> dict[str, Any]:
    return next(a for a in agents if a["host"] == host)


async def test_another_hosts_certificate_cannot_prepare(
        lab: dict[str, Any], agents: list[dict[str, Any]], spec: GroupSpec,
        pool: AgentPool) -> None:
    """The second host's agent certificate (signed by the same CA, pinned
    nowhere it matters) calls PREPARE on the first host's agent: FORBIDDEN,
    naming the role it needs; nothing is paused."""
    from cutpoint.agentclient import AgentClient, AgentReplyError, client_context

    certs = Path(lab["state_dir"]) / "certs"
    first, second = spec.agents[0], spec.agents[1]
    ctx = client_context(certs / "ca.pem", certs / f"{second.name}.pem",
                         certs / f"{second.name}.key")
    rec = _agent_rec(agents, first.name)
    before = await pool.get(first.address, first.port, name=first.name).stats()
    async with AgentClient(first.address, first.port, ssl_context=ctx) as c:
        with pytest.raises(AgentReplyError) as ei:
            await c.prepare(_txn("othercert"), [v.name for v in first.vms], LEASE_MS)
    print(f"\n{second.name}'s certificate on {first.name}: {ei.value.code}: {ei.value.message}")
    assert ei.value.code == "FORBIDDEN"
    assert "needs the role coordinator" in ei.value.message and "role is agent" in ei.value.message
    after = await pool.get(first.address, first.port, name=first.name).stats()
    assert after["txns"] == before["txns"]
    assert set((await vm_states(pool, spec)).values()) == {"running"}
    assert f"cn={second.name} role=agent cmd=prepare why=role" in \
        Path(rec["log"]).read_text(errors="replace")


async def test_expired_certificate_is_refused(lab: dict[str, Any], agents: list[dict[str, Any]],
                                              spec: GroupSpec, pool: AgentPool,
                                              tmp_path: Path) -> None:
    """A coordinator certificate from the right CA, with the right role, but
    expired: the handshake is refused (the agent logs why) and no request
    runs; the same call with the valid coordinator certificate works."""
    from cutpoint.agentclient import AgentClient, AgentError, client_context
    from faultkit import expired_cert

    certs = Path(lab["state_dir"]) / "certs"
    first = spec.agents[0]
    rec = _agent_rec(agents, first.name)
    pem, key = expired_cert(certs, tmp_path, "coordinator", "coordinator")
    ctx = client_context(certs / "ca.pem", pem, key)
    log_from = Path(rec["log"]).stat().st_size
    before = await pool.get(first.address, first.port, name=first.name).stats()
    with pytest.raises(AgentError) as ei:
        async with AgentClient(first.address, first.port, ssl_context=ctx,
                               call_timeout=10) as c:
            await c.prepare(_txn("expired"), [v.name for v in first.vms], LEASE_MS)
    text = Path(rec["log"]).read_text(errors="replace")[log_from:]
    refused = [ln for ln in text.splitlines() if "event=tls_refused" in ln]
    print(f"\nexpired coordinator certificate: {ei.value.code}: {ei.value.message}; "
          f"agent: {refused}")
    assert ei.value.code != "FORBIDDEN"   # refused at the handshake, not per command
    assert any('verify="certificate has expired"' in ln for ln in refused), text[-2000:]
    after = await pool.get(first.address, first.port, name=first.name).stats()
    # Only our own second `stats` ran in between: the PREPARE never did.
    assert after["txns"] == before["txns"] and after["requests"] == before["requests"] + 1
    assert set((await vm_states(pool, spec)).values()) == {"running"}
