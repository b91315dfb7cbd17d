"""The test bed's drill checks, plugged into cutpoint.coordinator.dr.checks.

Registered under the entry-point group `cutpoint.drill_checks` (setup.cfg):

    kvstore    cp-kvstore's recovery invariants over the clones' raw disks
    sharedlog  cp-sharedlog's recovery invariants over the clones' raw disks

Each exports every clone to a file (read through the product's Ceph access,
cutpoint.coordinator.dr.site, as the drill's client) and runs the store's
offline checker on them; a drill of a group whose
guests run that store (one disk per node) passes when every invariant holds.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cutpoint.coordinator.dr.site import CephConnection, CephSite, ImageRef


def _exported(site: CephSite, images: list[ImageRef],
              check: Callable[[list[str]], Any]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="cp-drillcheck-") as tmp:
        paths = []
        with CephConnection(site) as ceph:
            for ref in images:
                path = Path(tmp) / f"{ref.image}.raw"
                with open(path, "wb") as f:
                    for data in ceph.iter_read(ref.pool, ref.image, ref.snap):
                        if data == bytes(len(data)):
                            f.seek(len(data), 1)  # a hole stays a hole (sparse file)
                        else:
                            f.write(data)
                    f.truncate()
                paths.append(str(path))
        verdict = check(paths)
    d = verdict.as_dict()
    failed = [name for name, c in d["checks"].items() if not c["ok"]]
    summary = ("OK: " if verdict.ok else "FAILED: " + ", ".join(failed) + "; ") \
        + " ".join(f"{k}={v}" for k, v in d["stats"].items())
    return {"ok": verdict.ok, "summary": summary, "verdict": d}


def kvstore(site: CephSite, images: list[ImageRef]) -> dict[str, Any]:
    from cutpoint.checkers import kvstore as kv

    return _exported(site, images, kv.check_disks)


def sharedlog(site: CephSite, images: list[ImageRef]) -> dict[str, Any]:
    from cutpoint.checkers import sharedlog as sl

    return _exported(site, images, sl.check_disks)
