"""A replication longer than the broker's visibility timeout runs once
(api/jobclaim.py), on the lab, with real Celery workers on the test's own
Redis.

The timeout is 30 s, set explicitly (the product's default is 120 s; the
mechanism under test is the same at any value, and 30 s keeps the cell
under a minute where 120 s took three).  The
group snapshot's replicate job (queued by its commit, as labflow's
`snapshot_and_replicate` does) goes to the DR site's queue
(`dr_site_queues`), which no worker takes until the test has measured what
the copy must ship (the lab's guests leave their disks empty, so the test
first writes FILL_MB of random data to each member disk at the primary): the non-zero 4 KiB blocks of each member snapshot at
the primary (what cutpoint-sync sends as data, `ZERO_BLOCK`).  The worker
of that queue then starts with the product's own rate limit
(`CUTPOINT_REPLICATION_RATE_MBPS`) chosen so that the copy lasts COPY_S.
Kombu looks for unacknowledged messages every quarter of the timeout, so
Redis hands the message out again between 30 s and 37.5 s after the first
delivery: the copy must outlast that.

Redis must redeliver the message while the copy runs, the redelivery must
be held back (`event=running_elsewhere`) without touching the job's row,
and the job must succeed once: attempts 1, one member-replication attempt,
at most JOBS cutpoint-sync --serve sessions (seen in /proc while it ran), a
recovery point whose snapshots are at DR.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Self

import pytest
from fastapi.testclient import TestClient
from faultkit import (  # api/tests/faultkit.py
    MARKS,
    fault_plane,
    redis_box_fixture,  # noqa: F401  (the fixture `redis_box`)
    snaps_of,
)
from labflow import finish, register
from plane import Plane, wait_for  # api/tests/plane.py

pytestmark = [*MARKS]

VISIBILITY_S = 30
# Longer than the latest redelivery (1.25 x the timeout) with a margin for
# the worker's start and the copy's own end.
COPY_S = 55.0
ZERO_BLOCK = 4096
FILL_MB = 16
JOBS = 2  # cutpoint-sync runs at once: the replicate job the commit queues asks for 2


@pytest.fixture
def plane(lab: dict[str, Any], agents: list[dict[str, Any]], tmp_path: Path,
          redis_box: dict[str, Any]) -> Iterator[Plane]:
    with fault_plane(lab, tmp_path, redis_box["port"],
                     CUTPOINT_BROKER_VISIBILITY_TIMEOUT_S=str(VISIBILITY_S),
                     CUTPOINT_DR_SITE_QUEUES="1") as p:
        yield p


def _fill(lab: dict[str, Any]) -> None:
    """FILL_MB of random data at the start of every primary member disk (the
    lab's guests leave their disks empty, and an empty disk ships nothing)."""
    import rados  # type: ignore[import-not-found]
    import rbd  # type: ignore[import-not-found]

    site = lab["sites"]["primary"]
    with rados.Rados(conffile=site["ceph_conf"], rados_id=site.get("client_id", "admin"),
                     conf={"keyring": site["keyring"]}) as cluster:
        for vm in lab["vms"]:
            if vm["site"] != "primary":
                continue
            for d in vm["disks"]:
                with cluster.open_ioctx(d["pool"]) as io, rbd.Image(io, d["image"]) as img:
                    for off in range(0, FILL_MB << 20, 1 << 20):
                        img.write(os.urandom(1 << 20), off)


def _data_bytes(lab: dict[str, Any], spec: str) -> int:
    """Bytes of non-zero ZERO_BLOCK blocks of `pool/image@snap` at the primary:
    what a full copy of it ships as data."""
    from cutpoint.lab.ceph import rbd_cmd

    p = subprocess.Popen(rbd_cmd(lab["sites"]["primary"], "export", "--no-progress", spec, "-"),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.stdout is not None
    zero, n = bytes(ZERO_BLOCK), 0
    while block := p.stdout.read(ZERO_BLOCK):
        if block != zero[:len(block)]:
            n += len(block)
    err = p.stderr.read().decode(errors="replace") if p.stderr else ""
    assert p.wait(120) == 0, err
    return n


class SyncRuns:
    """Every `cutpoint-sync --serve` session writing into this lab's DR site
    seen in /proc while it runs (the replicate job copies its members
    through at most JOBS of them: coordinator/dr/replicate.py): pids."""

    def __init__(self, dr_conf_dir: str) -> None:
        self.conf_dir = dr_conf_dir.encode()
        self.seen: set[int] = set()
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> Self:
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join(10)

    def _watch(self) -> None:
        while not self._stop.wait(0.2):
            for d in Path("/proc").iterdir():
                if not d.name.isdigit():
                    continue
                try:
                    argv = (d / "cmdline").read_bytes().split(b"\0")
                except OSError:
                    continue
                if (not argv[0].endswith(b"cutpoint-sync") or b"--serve" not in argv
                        or b"--dst-conf" not in argv
                        or not argv[argv.index(b"--dst-conf") + 1].startswith(self.conf_dir)):
                    continue
                self.seen.add(int(d.name))


def test_a_replication_longer_than_the_visibility_timeout_runs_once(
        lab: dict[str, Any], plane: Plane, client: TestClient) -> None:
    from cutpoint.lab.ceph import rbd_cmd

    c = client
    plane.start("worker")  # every queue but the DR site's
    register(c, lab, plane)
    _fill(lab)
    snap = c.post("/v1/groups/app/snapshots").json()
    done = finish(c, snap["id"], "group snapshot", plane, 90)
    assert done["state"] == "succeeded", done
    sid = done["snapshot_id"]
    txn = c.get(f"/v1/snapshots/{sid}").json()["txn"]
    rep_job = wait_for(lambda: next(iter(c.get("/v1/jobs", params={"kind": "replicate"})
                                         .json()["items"]), None),
                       30, "the replicate job the commit queues", plane)
    assert rep_job["snapshot_id"] == sid and rep_job["state"] == "queued", rep_job
    job_id = rep_job["id"]

    # What the copy must ship, and the rate that makes it last COPY_S.
    specs = snaps_of(lab, txn)
    sizes = {s: _data_bytes(lab, s) for s in specs}
    total = sum(sizes.values())
    rate = max(max(sizes.values()), total / JOBS) / 1e6 / COPY_S
    print(f"\ncopy of {txn}: {len(sizes)} images, {total} data bytes ({sizes}); "
          f"rate {rate:.4f} MB/s for {COPY_S:.0f} s against a {VISIBILITY_S} s "
          "visibility timeout", flush=True)
    assert total > 0, sizes

    plane.env["CUTPOINT_REPLICATION_RATE_MBPS"] = f"{rate:.6f}"
    states: list[str] = []
    t0 = time.monotonic()
    dr_conf_dir = str(Path(lab["sites"]["dr"]["ceph_conf"]).parent)
    with SyncRuns(dr_conf_dir) as runs:
        plane.start("worker-dr", queues="cutpoint.site.dr")

        def ended() -> bool:
            j = c.get(f"/v1/jobs/{job_id}").json()
            if not states or states[-1] != j["state"]:
                states.append(j["state"])
            return j["state"] in ("succeeded", "failed")
        wait_for(ended, COPY_S + 240, "the rate-limited replication", plane, every=0.5)
    wall = time.monotonic() - t0
    job = c.get(f"/v1/jobs/{job_id}").json()
    rep = c.get(f"/v1/snapshots/{sid}/replication").json()
    log = plane.tail(2_000_000)
    held = len(re.findall(rf"job={job_id} event=running_elsewhere", log))
    deliveries = re.findall(rf"task=replicate job={job_id} outcome=(\S+) seconds=\S+ "
                            r"delivery=(\S+)", log)
    ran_s = (_ts(job["finished_at"]) - _ts(job["started_at"])) if job["started_at"] else 0.0
    pids = sorted(runs.seen)
    print(f"job {job['state']} after {wall:.1f} s (running {ran_s:.1f} s): attempts "
          f"{job['attempts']}, states seen {states}; shipped {rep['bytes_shipped']} bytes "
          f"in {rep['seconds']} s ({rep['throughput_mbps']} MB/s), member attempts "
          f"{rep['attempts']}; deliveries held back {held}; task ends {deliveries}; "
          f"cutpoint-sync --serve sessions {pids}", flush=True)

    # Redis handed the message out again while the copy ran (else this
    # shows nothing), and that delivery was held back.
    assert held >= 1, log[-6000:]
    assert any(d == "redelivered" for _, d in deliveries), deliveries
    # The job ran once, and nothing said it was queued again meanwhile.
    assert job["state"] == "succeeded", (job, log[-6000:])
    assert job["attempts"] == 1, job
    assert states[states.index("running"):] == ["running", "succeeded"], states
    assert ran_s > VISIBILITY_S, (ran_s, job)
    # Each image was copied once: one attempt per member, through one set of
    # at most JOBS engine sessions (a second delivery would have started more).
    assert rep["recovery_point"] and rep["state"] == "verified", rep
    assert rep["attempts"] == 1, rep
    assert [m["state"] for m in rep["members"]] == ["verified"] * len(specs), rep["members"]
    assert 1 <= len(pids) <= min(JOBS, len(specs)), pids
    # The recovery point is at DR: each member's snapshot is there.
    for spec in specs:
        image, name = spec.split("@")
        out = subprocess.run(rbd_cmd(lab["sites"]["dr"], "snap", "ls", "--format", "json",
                                     image), capture_output=True, text=True, check=True,
                             timeout=60).stdout
        assert name in [s["name"] for s in json.loads(out or "[]")], (spec, out)


def _ts(iso: str) -> float:
    import datetime as dt

    return dt.datetime.fromisoformat(iso).timestamp()
