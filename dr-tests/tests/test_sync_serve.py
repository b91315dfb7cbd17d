"""`cutpoint-sync --serve` against the lab's two real Ceph clusters: one
session (both clusters connected once) copies several images one after the
other, each exactly as a one-shot run would (byte for byte at DR, by
SHA-256 of `rbd export` at both sites), and a request that fails (bad
request, missing base at DR) fails alone: the session answers it with the
one-shot exit code and goes on with the next one."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cutpoint.bench.replication import (
    MiB,
    create_image,
    pattern,
    remove_image,
    snap_create,
    snap_sha256,
    snaps,
    write_extents,
)
from cutpoint.bench.replication_serve import SyncSession

pytestmark = [pytest.mark.lab, pytest.mark.lab_config(hosts=1, vms_per_host=0)]

EXIT_USAGE, EXIT_NOBASE = 2, 3


@pytest.fixture
def images(lab: dict[str, Any]) -> Iterator[list[str]]:
    names = [f"serve-{uuid.uuid4().hex[:8]}" for _ in range(3)]
    yield names
    for site in ("primary", "dr"):
        for n in names:
            remove_image(lab["sites"][site], n)


def test_one_session_copies_many_images_and_a_failure_stays_its_own(
        lab: dict[str, Any], images: list[str], tmp_path: Path) -> None:
    p, d = lab["sites"]["primary"], lab["sites"]["dr"]
    size = 32 * MiB
    for i, img in enumerate(images):
        create_image(p, img, size)
        write_extents(p, img, size, [(i * MiB + 5000, pattern(10 + i, 3 * MiB + 17)),
                                     (30 * MiB, pattern(20 + i, 4096))])
        snap_create(p, img, "a")
    with SyncSession(lab, ["--verify-full"], str(tmp_path)) as s:
        assert s.ready["event"] == "ready" and s.ready["connect_ms"] > 0
        # Full copies of the first two images, one after the other.
        for img in images[:2]:
            run = s.copy(img, "a")
            done = run.events[-1]
            assert done["event"] == "done" and done["image"] == img, run.events
            assert done["full"] is True and done["verified_full"] is True
            # every event of the copy names it
            assert all(ev["id"] == f"r{s.n}" and ev["image"] == img for ev in run.events)
        # A request that is not valid is answered with exit 2 ...
        bad = s.copy(images[2], "a", base="a", check=False)
        assert bad.returncode == EXIT_USAGE and bad.events[-1]["event"] == "error"
        assert "same snapshot" in bad.events[-1]["message"]
        # ... an incremental copy whose base is not at DR with exit 3,
        # nothing written at DR ...
        write_extents(p, images[2], size, [(MiB, pattern(31, 8192))])
        snap_create(p, images[2], "b")
        nobase = s.copy(images[2], "b", base="a", check=False)
        assert nobase.returncode == EXIT_NOBASE, nobase.events
        assert "missing at DR" in nobase.events[-1]["message"]
        assert snaps(d, images[2]) == []
        # ... and the session goes on: an incremental round of image 0 and
        # the full copy image 2 had not had.
        write_extents(p, images[0], size, [(7 * MiB, pattern(40, 65536 + 3))])
        snap_create(p, images[0], "b")
        inc = s.copy(images[0], "b", base="a").events[-1]
        assert inc["full"] is False and inc["bytes_shipped"] == 65536 + 3
        s.copy(images[2], "b")
        assert s.close() == 0
    for img, snap in ((images[0], "b"), (images[1], "a"), (images[2], "b")):
        assert snap_sha256(p, img, snap) == snap_sha256(d, img, snap), (img, snap)
