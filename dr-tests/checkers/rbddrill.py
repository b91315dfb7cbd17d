"""The RBD images of one database drill on the lab's two Ceph clusters.

    imgs = DrillImages(status, "cp-pgdrill-1a2b", {"cpwal": 256, ...},
                       "cp-pg", {"cpwal": "disk1", ...}, workdir / "sync")
    imgs.create()                        # primary: <prefix>-<serial> images
    imgs.snap_create("cpwal", "u0")      # a direct rbd snapshot (no coordinator)
    rep = imgs.replicate("cp.pg.<txn>")  # every member to DR; invariant 5 checked
    clones = imgs.clone_at_dr(snap, "d0")  # scratch clones of the DR snapshots
    imgs.remove_clones()
    imgs.close()                         # clones, DR replicas, primary images
    imgs.leftovers()                     # {"primary": [...], "dr": [...]}

Every image this module makes starts with the drill's ``prefix``, so what a
drill left behind on either cluster is found by name.  Replication is the
project's own (`cutpoint.coordinator.dr.replicate.replicate_group`, one
``cutpoint-sync`` per member, the first copy full and later ones
incremental from the previous replicated snapshot); the DR snapshots are
cloned (never the primary ones) so a drill VM reads only the DR cluster.
"""

from __future__ import annotations

import json
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from cutpoint.lab.ceph import rbd_cmd, run_rbd

# A guest that was killed keeps its RBD watch ~30 s at the OSD, and `rbd rm`
# of its image is refused until then.
RM_RETRY_S = 45.0


class RbdDrillError(RuntimeError):
    """An rbd command or a replication check failed; keeps argv and output."""

    def __init__(self, message: str, argv: list[str] | None = None,
                 stderr: str = "", detail: Any = None) -> None:
        self.argv, self.stderr, self.detail = argv or [], stderr, detail
        super().__init__(message + (f"\nargv: {' '.join(self.argv)}" if argv else "")
                         + (f"\nstderr: {stderr.strip()[-1500:]}" if stderr else ""))


class DrillImages:
    """The images of one drill: ``disks`` maps a disk's serial to its size
    in MB; ``vm`` names the guest for the replication report."""

    def __init__(self, status: dict[str, Any], prefix: str,
                 disks: dict[str, int], vm: str, nodes: dict[str, str],
                 sync_dir: Path) -> None:
        self.status = status
        self.sites = {"primary": status["sites"]["primary"],
                      "dr": status["sites"]["dr"]}
        self.prefix = prefix
        self.disks = dict(disks)
        self.vm = vm
        self.nodes = nodes                  # serial -> QEMU node (disk1..) or vm/node
        self.sync_dir = sync_dir
        self.created: list[str] = []        # primary images
        self.replicated: list[str] = []     # snapshots at DR, oldest first
        self.clones: list[str] = []         # DR scratch clones (image names)

    # -- names --
    def image(self, serial: str) -> str:
        return f"{self.prefix}-{serial}"

    def disk_id(self, serial: str) -> str:
        """The member's disk id in reports: ``<vm>/<node>``, or the node
        entry itself when it already names its VM (``"cass-node1/disk1"``:
        a drill whose group spans several VMs)."""
        node = self.nodes[serial]
        return node if "/" in node else f"{self.vm}/{node}"

    def pool(self, site: str) -> str:
        return str(self.sites[site].get("pool", "rbd"))

    def spec(self, site: str, image: str) -> str:
        return f"{self.pool(site)}/{image}"

    # -- rbd --
    def rbd(self, site: str, *args: str, timeout: float = 120,
            check: bool = True) -> subprocess.CompletedProcess[str]:
        p = run_rbd(self.sites[site], *args, timeout=timeout)
        if check and p.returncode != 0:
            raise RbdDrillError(f"rbd at {site} failed (rc={p.returncode})",
                                rbd_cmd(self.sites[site], *args), p.stderr)
        return p

    def create(self) -> None:
        for serial, mb in self.disks.items():
            self.rbd("primary", "create", "--size", f"{mb}M",
                     self.spec("primary", self.image(serial)))
            self.created.append(self.image(serial))

    def snap_create(self, serial: str, name: str) -> None:
        self.rbd("primary", "snap", "create",
                 f"{self.spec('primary', self.image(serial))}@{name}")

    def snaps(self, site: str, serial: str) -> list[str]:
        out = self.rbd(site, "snap", "ls", "--format", "json",
                       self.spec(site, self.image(serial))).stdout
        return [s["name"] for s in json.loads(out)]

    # -- replication --
    def replicate(self, snap: str, verify_full: bool = True) -> dict[str, Any]:
        """Every member's ``snap`` to DR, incrementally from the previous
        replicated snapshot.  Raises unless invariant 5 holds: every member
        verified (and fully, with ``verify_full``) and its DR snapshot there."""
        from cutpoint.coordinator.dr.replicate import (
            MemberCopy,
            list_snaps,
            replicate_group,
        )
        from cutpoint.lab.sites import ceph_site

        # The product's replication reaches both clusters as the control
        # plane does (client.cutpoint); the lab's rbd CLI calls stay admin.
        primary, dr = ceph_site(self.status, "primary"), ceph_site(self.status, "dr")
        base = self.replicated[-1] if self.replicated else None
        members = [MemberCopy(self.image(s), snap, base, disk=self.disk_id(s))
                   for s in self.disks]
        rep = replicate_group(primary, dr, members,
                              jobs=2, verify_full=verify_full,
                              state_dir=str(self.sync_dir))
        doc = rep.as_dict()
        bad = [m.as_dict() for m in rep.members
               if m.state != "verified" or m.error is not None
               or (verify_full and not m.verified_full)
               or snap not in list_snaps(dr, m.image)]
        if bad or len(rep.members) != len(self.disks) or not rep.recovery_point:
            raise RbdDrillError(f"{snap}: not a DR recovery point "
                                f"(invariant 5): {bad or doc}", detail=doc)
        self.replicated.append(snap)
        return {"snapshot": snap, "base": base, "state": rep.state,
                "recovery_point": rep.recovery_point,
                "bytes_shipped": rep.bytes_shipped,
                "seconds": round(rep.seconds, 2),
                "members": [{"disk": m.disk, "image": m.image,
                             "full": m.full, "state": m.state,
                             "verified_full": m.verified_full,
                             "bytes_shipped": m.bytes_shipped,
                             "bytes_changed": m.bytes_changed,
                             "seconds": round(m.seconds, 2)}
                            for m in rep.members]}

    # -- scratch clones at DR --
    def clone_at_dr(self, snap: str, tag: str) -> dict[str, str]:
        """A clone of each member's DR ``snap``; returns serial -> image."""
        if snap not in self.replicated:
            raise RbdDrillError(f"{snap} was not replicated to DR")
        out = {}
        for serial in self.disks:
            src = f"{self.spec('dr', self.image(serial))}@{snap}"
            p = self.rbd("dr", "snap", "protect", src, check=False)
            if p.returncode != 0 and "already protected" not in p.stderr:
                raise RbdDrillError("rbd snap protect at dr failed", p.args,
                                    p.stderr)
            clone = f"{self.image(serial)}-{tag}"
            self.rbd("dr", "clone", src, self.spec("dr", clone))
            self.clones.append(clone)
            out[serial] = clone
        return out

    def _rm(self, site: str, image: str) -> str | None:
        """rbd rm, retried while a dead guest's watch lingers; None when
        gone, else the last error."""
        end = time.monotonic() + RM_RETRY_S
        while True:
            p = self.rbd(site, "rm", "--no-progress", self.spec(site, image),
                         check=False)
            if p.returncode == 0 or "No such file" in p.stderr:
                return None
            if time.monotonic() > end:
                return p.stderr.strip()[-300:]
            time.sleep(2)

    def remove_clones(self) -> list[str]:
        errors = []
        for c in self.clones:
            err = self._rm("dr", c)
            if err:
                errors.append(f"dr:{c}: {err}")
        self.clones = []
        return errors

    def _purge(self, site: str, image: str) -> str | None:
        for snap in self.replicated if site == "dr" else []:
            self.rbd(site, "snap", "unprotect",
                     f"{self.spec(site, image)}@{snap}", check=False)
        self.rbd(site, "snap", "purge", "--no-progress",
                 self.spec(site, image), check=False)
        err = self._rm(site, image)
        return f"{site}:{image}: {err}" if err else None

    def close(self) -> list[str]:
        """Remove the clones, then the DR replicas and the primary images
        with all their snapshots; returns the errors (best effort)."""
        errors = self.remove_clones()
        jobs = [("dr", self.image(s)) for s in self.disks] + \
            [("primary", i) for i in self.created]
        with ThreadPoolExecutor(max_workers=3) as ex:
            errors += [e for e in ex.map(lambda j: self._purge(*j), jobs) if e]
        self.replicated, self.created = [], []
        return errors

    def cleanup(self) -> dict[str, Any]:
        """close() then leftovers(), for a drill's ``finally``: never raises,
        so the drill's own error is the one reported.  Returns
        ``{"errors": [...], "left": {site: [image, ...]}, "seconds": s}``;
        a drill passes its cleanup only when every ``left`` list is empty."""
        t0 = time.monotonic()
        out: dict[str, Any] = {}
        try:
            out["errors"] = self.close()
            out["left"] = self.leftovers()
        except Exception as exc:  # noqa: BLE001  keep the drill's own error
            out.setdefault("errors", []).append(f"{type(exc).__name__}: {exc}")
            out.setdefault("left", {"unknown": [str(exc)]})
        out["seconds"] = round(time.monotonic() - t0, 1)
        return out

    def leftovers(self) -> dict[str, list[str]]:
        """Images with this drill's prefix still on either cluster."""
        out = {}
        for site in ("primary", "dr"):
            names = self.rbd(site, "ls", self.pool(site)).stdout.split()
            out[site] = [n for n in names if n.startswith(self.prefix)]
        return out
