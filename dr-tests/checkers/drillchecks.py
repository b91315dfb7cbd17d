"""The test bed's drill checks, plugged into cutpoint.coordinator.dr.checks.

Registered under the entry-point group `cutpoint.drill_checks` (setup.cfg):

    kvstore    cp-kvstore's recovery invariants over the clones' raw disks
    sharedlog  cp-sharedlog's recovery invariants over the clones' raw disks

Each exports every clone (`rbd export`, through the product's rbd runner) to a
file and runs the store's offline checker on them; a drill of a group whose
guests run that store (one disk per node) passes when every invariant holds.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cutpoint.coordinator.dr.rbdcli import rbd


def _exported(site: dict[str, Any], images: list[str],
              check: Callable[[list[str]], Any]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="cp-drillcheck-") as tmp:
        paths = []
        for image in images:
            path = Path(tmp) / f"{image}.raw"
            rbd(site, "export", "--no-progress", f"{site.get('pool', 'rbd')}/{image}",
                str(path), timeout=600)
            paths.append(str(path))
        verdict = check(paths)
    d = verdict.as_dict()
    failed = [name for name, c in d["checks"].items() if not c["ok"]]
    summary = ("OK: " if verdict.ok else "FAILED: " + ", ".join(failed) + "; ") \
        + " ".join(f"{k}={v}" for k, v in d["stats"].items())
    return {"ok": verdict.ok, "summary": summary, "verdict": d}


def kvstore(site: dict[str, Any], images: list[str]) -> dict[str, Any]:
    from cutpoint.checkers import kvstore as kv

    return _exported(site, images, kv.check_disks)


def sharedlog(site: dict[str, Any], images: list[str]) -> dict[str, Any]:
    from cutpoint.checkers import sharedlog as sl

    return _exported(site, images, sl.check_disks)
