"""The fault matrix, Ceph cells at the prepare step (docs/reliability.md,
"Fault matrix", Ceph): the primary site's OSD or mon stopped (SIGSTOP)
while a group snapshot prepares, with the guests writing.

Lab: 2 primary hosts x 1 VM x 2 RBD disks, the lab's writer workload in
every guest (O_DIRECT records, one write in flight at a time, a token ring
across the VMs), so that a write is in flight whenever Ceph stops
answering.  QEMU's `stop` stops the vCPUs, then waits in its main loop for
the VM's I/O in flight (`bdrv_drain_all`): a VM with a write at a hung OSD
cannot be resumed by anyone until Ceph answers or QEMU's own Ceph op
timeout (30 s in the lab) ends the write.

- OSD stopped, the agents as deployed: each agent reads every RBD disk of
  the prepare before it pauses anything (agent/prepare.c
  `prepare_probe`); the read is not answered, the prepare is refused, no
  VM is paused by the txn.
- OSD stopped, the probe switched off (`storage_probe_ms = 0`): what a
  hang that begins after the probe does.  The agent gives up on `stop`
  within the lease and fails the prepare; the VM with a write in flight
  stays stopped inside QEMU until the OSD is back; the agent's retry
  resumes it then and logs how long (`paused_ms` from its `stop`).
- mon stopped: the OSDs go on serving I/O, so `stop` and the probe
  answer; the commit's snapshot-id allocation waits on the mon: the VMs
  are resumed at the commit's budget, the txn aborts, and the member
  snapshots that complete once the mon is back are swept.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cutpoint.agentclient import AgentPool
from cutpoint.coordinator import GroupSpec, TxLog, pool_for, take_group_snapshot
from fastapi.testclient import TestClient
from faultkit import (  # api/tests/faultkit.py
    LEASE_MS,
    PAUSE_SLACK_MS,
    WRITER_MARKS,
    assert_pause_bound,
    ceph_pid,
    fault_plane,
    hung,
    pauses,
    pool_fixture,  # noqa: F401  (the fixture `pool`)
    redis_box_fixture,  # noqa: F401  (the fixture `redis_box`)
    snaps_of,
    spec_fixture,  # noqa: F401  (the fixture `spec`)
    vm_states,
    wait_running,
    wait_site_serves,
)
from plane import Plane, wait_for  # api/tests/plane.py

pytestmark = WRITER_MARKS

HANG_S = 8.0          # how long the OSD stays stopped in the stop cell
QMP_TIMEOUT_MS = 2000  # the lab agents' qmp_timeout_ms: one retry's `cont`
RETRY_MS = 500         # the reaper's retry period (agent/reaper.c)
NO_PROBE = "\n[agent]\nstorage_probe_ms = 0\n"


def _txn(what: str) -> str:
    return f"{what}-{os.urandom(4).hex()}"


def _log_lines(agents: list[dict[str, Any]], pattern: str) -> list[str]:
    return [ln for a in agents for ln in Path(a["log"]).read_text(errors="replace").splitlines()
            if re.search(pattern, ln)]


async def _writing(pool: AgentPool, spec: GroupSpec) -> None:
    """Every VM runs (its writer with it) before the fault."""
    await wait_running(pool, spec, 30)
    await asyncio.sleep(1.0)


async def test_osd_hung_during_prepare_refused_before_any_pause(
        lab: dict[str, Any], agents: list[dict[str, Any]], spec: GroupSpec,
        pool: AgentPool, tmp_path: Path) -> None:
    """The primary's OSD stopped while the guests write, then a group
    snapshot: the agents' read of the disks is not answered, the prepare
    is refused with the VM and disk named, no VM is paused by the txn (no
    `stop` that would wait on the OSD); every VM runs once the OSD is
    back; no member snapshot."""
    await _writing(pool, spec)
    txn = _txn("osdprep")
    log = TxLog(f"sqlite:///{tmp_path}/c.db")
    with hung(ceph_pid(lab, "primary", "osd.0")):
        await asyncio.sleep(0.5)   # the writer's next write is at the OSD
        t0 = time.monotonic()
        res = await take_group_snapshot(spec, log, txn=txn, pool=pool)
        took = time.monotonic() - t0
        await asyncio.sleep(LEASE_MS / 1000 + 1)
        during = pauses(agents, txn)
        states = await vm_states(pool, spec)
    t_cont = time.monotonic()
    await wait_running(pool, spec, 60)
    ran = time.monotonic() - t_cont
    print(f"\nthe site serves a new client {wait_site_serves(lab, 'primary', 180):.1f} s "
          "after SIGCONT")
    probes = _log_lines(agents, f"event=storage_probe txn={txn} ")
    stuck = _log_lines(agents, f"event=stop_unanswered txn={txn} ")
    print(f"\nOSD hung in prepare: {res.state} after {took:.2f} s: {res.reason}\n"
          f"probes {probes}\npauses {during}; states during the hang {states}; "
          f"all running {ran:.1f} s after SIGCONT")
    assert res.state == "aborted", res
    reason = res.reason or ""
    assert "prepare on " in reason and "did not answer a read" in reason, reason
    assert re.search(r"vm \S+: no VM paused: disk \S+ \(rbd \S+\)", reason), reason
    assert probes, "no agent logged its probe"
    assert stuck == [], stuck       # no `stop` waited on the OSD
    assert_pause_bound(pauses(agents, txn), LEASE_MS)
    rec = log.get(txn)
    assert rec is not None and rec.state == "aborted" and "committed" not in rec.states
    assert snaps_of(lab, txn) == []


@pytest.fixture
def agents_no_probe(lab: dict[str, Any]) -> Iterator[list[dict[str, Any]]]:
    """The lab's agents with the prepare's probe switched off."""
    from cutpoint.lab.agents import start_agents, stop_agents

    recs = start_agents(lab, Path(lab["state_dir"]) / "certs", extra=NO_PROBE)
    try:
        yield recs
    finally:
        stop_agents(lab)


async def test_osd_hung_during_stop_resumed_once_back(
        lab: dict[str, Any], agents_no_probe: list[dict[str, Any]],
        tmp_path: Path) -> None:
    """The primary's OSD stopped while the guests write, and no probe (what
    an OSD that hangs after the probe does): the VM with a write in flight
    does not answer `stop`; its agent gives up within the lease and the txn
    aborts naming the host's prepare; every other VM is paused at most
    lease + 100 ms; the stuck VM stays stopped inside QEMU while the OSD is
    (its QEMU cannot serve `cont`), and once the OSD is back the agent's
    retry resumes it and logs the time from its `stop`; no member
    snapshot."""
    from cutpoint.coordinator import load_group_file
    from cutpoint.lab.groupfile import write_group_file

    agents = agents_no_probe
    p = tmp_path / "group.yaml"
    write_group_file(lab, p, group="lab", certs_dir=Path(lab["state_dir"]) / "certs",
                     lease_ms=LEASE_MS, budget_ms=1000)
    spec = load_group_file(p)
    pool = pool_for(spec)
    try:
        await _writing(pool, spec)
        txn = _txn("osdstop")
        log = TxLog(f"sqlite:///{tmp_path}/c.db")
        with hung(ceph_pid(lab, "primary", "osd.0")):
            await asyncio.sleep(0.5)
            t0 = time.monotonic()
            res = await take_group_snapshot(spec, log, txn=txn, pool=pool)
            took = time.monotonic() - t0
            wait_for(lambda: _log_lines(agents, f"event=stop_unanswered txn={txn} "),
                     LEASE_MS / 1000 + 5, "an agent giving up on stop")
            await asyncio.sleep(max(0.0, HANG_S - (time.monotonic() - t0)))
        t_cont = time.monotonic()
        stuck = _log_lines(agents, f"event=stop_unanswered txn={txn} ")
        names = {re.search(r" vm=(\S+)", ln).group(1) for ln in stuck}  # type: ignore[union-attr]

        def resumed() -> list[dict[str, Any]] | None:
            got = [q for q in pauses(agents, txn) if q["vm"] in names and q["why"] == "retry"]
            return got if {q["vm"] for q in got} == names else None
        late = wait_for(resumed, 60, "the retry's resume of the stuck VM")
        back = time.monotonic() - t_cont
        print(f"\nthe site serves a new client {wait_site_serves(lab, 'primary', 180):.1f} s "
              "after SIGCONT")
        await wait_running(pool, spec, 60)
        got = pauses(agents, txn)
        print(f"\nOSD hung in stop: {res.state} after {took:.2f} s: {res.reason}\n"
              f"gave up: {stuck}\npauses {got}\nthe stuck VM resumed {back:.1f} s after "
              f"SIGCONT (the OSD stopped {HANG_S:.0f} s)")
        assert res.state == "aborted", res
        # The host, the step, the VM: the agent's own error (QMP_TIMEOUT,
        # `stop`) comes after the coordinator's wait (lease / 2) ended, so
        # the reason names the VMs that agent was asked to pause.
        reason = res.reason or ""
        assert all(re.search(rf"prepare on \S+: .*{n}", reason) for n in names), reason
        # The agent gives up on `stop` within the lease.
        waited = [float(re.search(r"waited_ms=([0-9.]+)", ln).group(1))  # type: ignore[union-attr]
                  for ln in stuck]
        assert waited and max(waited) <= LEASE_MS + PAUSE_SLACK_MS, waited
        # Every other VM: the bound.
        assert_pause_bound([q for q in got if q["vm"] not in names], LEASE_MS)
        # The stuck VM: stopped while the OSD was, measured by its agent from
        # its `stop`; resumed by the retry once QEMU answers again.
        for q in late:
            assert HANG_S * 1000 - 1500 <= q["paused_ms"] <= \
                HANG_S * 1000 + QMP_TIMEOUT_MS + RETRY_MS + 2000, q
        assert set((await vm_states(pool, spec)).values()) == {"running"}
        rec = log.get(txn)
        assert rec is not None and rec.state == "aborted" and "committed" not in rec.states
        assert snaps_of(lab, txn) == []
    finally:
        await pool.close()


@pytest.fixture
def plane(lab: dict[str, Any], agents: list[dict[str, Any]], tmp_path: Path,
          redis_box: dict[str, Any]) -> Iterator[Plane]:
    with fault_plane(lab, tmp_path, redis_box["port"]) as p:
        yield p


def test_mon_hung_during_prepare(lab: dict[str, Any], agents: list[dict[str, Any]],
                                 plane: Plane, client: TestClient) -> None:
    """The primary's mon stopped while the guests write, then a group
    snapshot through the control plane (lease 3000 ms, budget 2000 ms): the
    OSD still serves I/O, so the prepare pauses every VM; the commit's
    snapshot ids wait on the mon: each VM is resumed at the budget, within
    lease + budget + 100 ms; the snapshot is `aborted`, naming the host,
    VM and disk; once the mon is back, the sweeper removes the members
    that completed late; every VM running."""
    from cutpoint.api.services import sweeper
    from labflow import finish, register
    from plane import agent_vm_states

    c = client
    plane.start("worker")
    register(c, lab, plane)
    policy = c.get("/v1/groups/app").json()["policy"]
    lease, budget = int(policy["lease_ms"]), int(policy["pause_budget_ms"])
    with hung(ceph_pid(lab, "primary", "mon.a")):
        t0 = time.monotonic()
        job = c.post("/v1/groups/app/snapshots").json()
        done = finish(c, job["id"], "the group snapshot with the mon stopped", plane, 120)
        took = time.monotonic() - t0
        snap = c.get(f"/v1/snapshots/{done['snapshot_id']}").json()
        txn = snap["txn"]
        got = pauses(agents, txn)
    print(f"\nmon hung: job {done['state']} after {took:.1f} s; snapshot {snap['state']}: "
          f"{snap.get('error_code')}: {snap.get('error')}\npauses {got}")
    assert snap["state"] == "aborted", snap
    assert "BUDGET_EXCEEDED" in (snap.get("error") or "") + (snap.get("error_code") or ""), snap
    assert re.search(r"primary-h\d", snap.get("error") or ""), snap
    vms = {v["name"] for v in lab["vms"] if v["site"] == "primary"}
    assert {q["vm"] for q in got} == vms, got
    over = [q for q in got if q["paused_ms"] > lease + budget + PAUSE_SLACK_MS]
    assert not over, over
    wait_for(lambda: set(agent_vm_states(lab, plane).values()) == {"running"}, 30,
             "every VM running", plane)

    # The mon back: the late creates complete (tagged with the txn); swept.
    def late() -> list[str] | None:
        have = snaps_of(lab, txn)
        return have if len(have) == 2 * len(vms) else None
    t1 = time.monotonic()
    try:
        left = wait_for(late, 60, "the late member snapshots", plane, every=0.5)
    except AssertionError:
        left = snaps_of(lab, txn)   # an abort that caught some creates
    print(f"after the mon came back ({time.monotonic() - t1:.1f} s): member snapshots {left}")
    res = sweeper.sweep(plane.sf, plane.settings, grace_s=0)
    print(f"sweep: deleted {len(res.deleted)}, refused {res.refused}, failed {res.failed}, "
          f"kept {res.to_dict()['kept']}")
    assert not res.failed and not res.refused, res.to_dict()
    assert snaps_of(lab, txn) == []
    assert set(agent_vm_states(lab, plane).values()) == {"running"}
