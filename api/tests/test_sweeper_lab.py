"""The orphan sweeper on the lab: real agents, QEMU guests on RBD, Ceph, a
Celery worker, the `cutpoint` CLI over HTTP.

The orphan is made by the product itself, the way one happens: a group
snapshot whose commit exceeds its pause budget (1 ms) while the mon takes
a second to hand out snap ids (`paxos_propose_interval` 1 s, injected at
run time).  The commit answers BUDGET_EXCEEDED with the creates still
running, the coordinator aborts, the abort finds no snapshot yet (nothing
to delete), the txn ends `aborted`; then each create completes and tags
itself with the txn (agent-protocol §6): member snapshots of an aborted
txn, which nothing else will ever delete.

Around it: a committed group snapshot, a snapshot made by hand with `rbd
snap create`, one named like cutpoint's but without an owner key, and a
second orphan made later (younger than the grace).  The dry run deletes
nothing and says why; `--yes` deletes the old orphan only, and audits it.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cutpoint.api import services_local
from cutpoint.api.models import AuditEntry, Role
from cutpoint.api.services import tokens
from fastapi.testclient import TestClient
from liveapi import cli, serve  # api/tests/liveapi.py
from plane import SECRET, Plane, lab_plane, wait_for  # api/tests/plane.py
from sqlalchemy import select
from test_api_lab import register  # api/tests/test_api_lab.py

pytestmark = [pytest.mark.lab,
              pytest.mark.lab_config(hosts=2, vms_per_host=1, disks=2, backend="rbd")]


@pytest.fixture
def plane(lab: dict[str, Any], agents: list[dict[str, Any]], tmp_path: Path,
          local_services: services_local.Endpoints) -> Iterator[Plane]:
    # The worker's own sweeps (at its start, and beat's, not started here)
    # use the default grace of an hour: they must not touch this test's
    # snapshots, which are all younger.
    with lab_plane(lab, tmp_path, int(local_services.redis_port or 0),
                   CUTPOINT_RETENTION_INTERVAL_S="3600",
                   CUTPOINT_INVENTORY_INTERVAL_S="3600") as p:
        yield p


def _rbd(lab: dict[str, Any], *args: str) -> str:
    from cutpoint.lab.ceph import rbd_cmd

    return subprocess.run(rbd_cmd(lab["sites"]["primary"], *args), check=True,
                          capture_output=True, text=True).stdout


def _snaps(lab: dict[str, Any]) -> dict[str, dict[str, dict[str, Any]]]:
    """image spec -> snapshot name -> `rbd snap ls` entry, on the primary."""
    out = {}
    for vm in lab["vms"]:
        if vm["site"] != "primary":
            continue
        for d in vm["disks"]:
            spec = f"{d['pool']}/{d['image']}"
            out[spec] = {s["name"]: s for s in json.loads(
                _rbd(lab, "snap", "ls", "--format", "json", spec) or "[]")}
    return out


def _owner(lab: dict[str, Any], spec: str, snap_id: int) -> str | None:
    keys = json.loads(_rbd(lab, "image-meta", "list", "--format", "json", spec) or "{}")
    return keys.get(f"cutpoint.snap.{snap_id}")


def _paxos(lab: dict[str, Any], interval: str) -> None:
    from cutpoint.lab.ceph import ceph_cmd

    subprocess.run(ceph_cmd(Path(lab["state_dir"]) / "ceph" / "primary", "tell", "mon.*",
                            "config", "set", "paxos_propose_interval", interval),
                   check=True, capture_output=True, text=True, timeout=60)


def _snapshot(c: TestClient, plane: Plane) -> dict[str, Any]:
    job = c.post("/v1/groups/app/snapshots").json()
    wait_for(lambda: c.get(f"/v1/jobs/{job['id']}").json()["state"]
             in ("succeeded", "failed"), 120, "group snapshot job", plane)
    return dict(c.get(f"/v1/snapshots/{job['snapshot_id']}").json())


def _orphan(c: TestClient, lab: dict[str, Any], plane: Plane) -> str:
    """An aborted txn whose member snapshots appear, tagged, after its abort."""
    assert c.patch("/v1/groups/app/policy", json={"pause_budget_ms": 1}).status_code == 200
    _paxos(lab, "1")
    try:
        for _attempt in range(3):
            snap = _snapshot(c, plane)
            assert snap["state"] == "aborted", snap
            name = f"cp.app.{snap['txn']}"

            def tagged(n: str = name, txn: str = snap["txn"]) -> bool:
                have = [(spec, s[n]) for spec, s in _snaps(lab).items() if n in s]
                return bool(have) and all(_owner(lab, spec, e["id"]) == txn
                                          for spec, e in have)
            try:
                wait_for(tagged, 15, f"the late members of {name}, tagged", plane, every=0.5)
            except AssertionError:
                continue  # the abort caught every create: no orphan this time
            print(f"\norphan: {name} ({snap['error_code']}: {snap['error']})")
            return str(snap["txn"])
    finally:
        _paxos(lab, "0.01")
        c.patch("/v1/groups/app/policy", json={"pause_budget_ms": 2000})
    raise AssertionError("three aborted snapshots and no orphan")


def test_sweeper_deletes_old_orphans_only(lab: dict[str, Any], plane: Plane,
                                          client: TestClient) -> None:
    c = client
    plane.start("worker")
    register(c, lab, plane, rpo=None)
    committed = _snapshot(c, plane)
    assert committed["state"] == "committed", committed
    vm0 = next(v for v in lab["vms"] if v["site"] == "primary")
    d0 = f"{vm0['disks'][0]['pool']}/{vm0['disks'][0]['image']}"
    _rbd(lab, "snap", "create", f"{d0}@by-hand")
    lookalike = f"cp.app.t{os.urandom(4).hex()}"  # cutpoint's form, no owner key
    _rbd(lab, "snap", "create", f"{d0}@{lookalike}")
    old = _orphan(c, lab, plane)
    t_old = time.time()
    time.sleep(25)
    young = _orphan(c, lab, plane)
    # Old enough: the first orphan (>= 25 s older than the second); not the second.
    grace = int(time.time() - t_old) - 10
    before = _snaps(lab)
    with plane.sf() as s:
        _, tok = tokens.create(s, "sweep-admin", Role.admin, SECRET)
    with serve(plane.settings) as url:
        rc, out = cli("orphans", "sweep", "--dry-run", "--json", "--grace", f"{grace}s",
                      "--url", url, "--token", tok)
        assert rc == 0, out
        plan = json.loads(out)
        by = {(v["disk"], v["name"]): v for v in plan["verdicts"]}
        print("dry run:", json.dumps({k: plan[k] for k in ("snapshots", "orphans", "kept")}))
        assert _snaps(lab) == before, "a dry run deleted something"
        for (disk, name), v in by.items():
            if name == f"cp.app.{old}":
                assert (v["action"], v["reason"]) == ("delete", "orphan"), v
            elif name == f"cp.app.{young}":
                assert (v["action"], v["reason"]) == ("keep", "too_young"), v
            elif name == f"cp.app.{committed['txn']}":
                assert (v["action"], v["reason"]) == ("keep", "committed"), v
            elif name in ("by-hand", lookalike):
                assert (v["action"], v["reason"]) == ("keep", "not_cutpoints"), v
        n_old = sum(1 for s in before.values() if f"cp.app.{old}" in s)
        assert plan["orphans"] == n_old > 0, plan

        rc, out = cli("orphans", "sweep", "--yes", "--grace", f"{grace}s",
                      "--url", url, "--token", tok)
        print(out)
        assert rc == 0, out
    after = _snaps(lab)
    assert not any(f"cp.app.{old}" in s for s in after.values()), after
    for name in (f"cp.app.{young}", f"cp.app.{committed['txn']}"):
        assert sum(name in s for s in after.values()) == sum(
            name in s for s in before.values()) > 0, name
    assert {"by-hand", lookalike} <= set(after[d0]), after[d0]
    with plane.sf() as s:
        rows = list(s.scalars(select(AuditEntry).where(AuditEntry.path.like("agent:%"))))
    assert len(rows) == n_old and all(
        r.status == 200 and r.detail and r.detail["outcome"] == "deleted"
        and r.detail["owner"] == old and r.actor == "sweep-admin" for r in rows), \
        [(r.path, r.status, r.detail) for r in rows]
    _rbd(lab, "snap", "rm", f"{d0}@by-hand")
    _rbd(lab, "snap", "rm", f"{d0}@{lookalike}")


def test_sweeper_refuses_a_snapshot_changed_since_the_listing(
        lab: dict[str, Any], plane: Plane, client: TestClient) -> None:
    """An orphan listed by the sweeper, then removed and made again under the
    same name (another snap id, no owner key) before the sweeper's delete
    (injected through the run's own progress hook, called before each
    host's deletes): each agent refuses (`NOT_OWNED`), nothing is deleted,
    each refusal is audited 409."""
    from cutpoint.api.services import sweeper

    c = client
    plane.start("worker")
    register(c, lab, plane, rpo=None)
    txn = _orphan(c, lab, plane)
    name = f"cp.app.{txn}"
    changed: list[str] = []

    def progress(_frac: float, msg: str) -> None:
        if msg.startswith("deleting") and not changed:
            for spec, snaps in _snaps(lab).items():
                if name in snaps:
                    _rbd(lab, "snap", "rm", f"{spec}@{name}")
                    _rbd(lab, "snap", "create", f"{spec}@{name}")
                    changed.append(spec)

    res = sweeper.sweep(plane.sf, plane.settings, grace_s=0, progress=progress)
    print(f"\nchanged {changed}; refused {[r['error'] for r in res.refused]}; deleted "
          f"{res.deleted}; failed {res.failed}")
    assert changed, "no member of the orphan to change"
    assert len(res.refused) == len(changed) and res.deleted == [] and res.failed == [], \
        res.to_dict()
    assert all("NOT_OWNED" in r["error"] for r in res.refused), res.refused
    after = _snaps(lab)
    assert all(name in after[spec] for spec in changed), after
    with plane.sf() as s:
        rows = list(s.scalars(select(AuditEntry).where(AuditEntry.path.like("agent:%"))))
    assert len(rows) == len(changed) and all(
        r.status == 409 and r.detail and r.detail["outcome"] == "refused" for r in rows), \
        [(r.path, r.status, r.detail) for r in rows]
    for spec in changed:
        _rbd(lab, "snap", "rm", f"{spec}@{name}")
