"""Restore a group snapshot at one site, from its member snapshots.

    plan = RestorePlan(site, [RestoreDisk("web1", "vda", "rbd", "web1-vda", "cp.web.0007")])
    clones(plan, {"web1/vda": "web1-vda-restored"})   # new images, originals untouched
    in_place(plan)                                       # every image back to the snapshot

Two ways, both on the images of one site (the primary's images, or the DR
copies that replication made under the same names):

    clones    a copy-on-write clone of each member's snapshot under a new
              name, in the member's pool.  Nothing existing is touched.
              Every name is checked first: if any target exists, or any
              snapshot is missing, nothing is created.  A clone that fails
              midway removes the clones this restore made, so a failed
              restore leaves no half group behind.
    in_place  each image's head rolled back to the snapshot.  It destroys
              what was written since, so it runs only on images nobody has
              open: an image with a lock holder (a running VM holds its
              exclusive lock) refuses the whole restore before anything is
              rolled back, naming the image and the holder.  Which VMs run
              is the caller's check (the agents); the lock is the check
              that also catches a client cutpoint does not know.  An image
              whose head has not changed since the snapshot is left alone:
              a rollback rewrites every object.

Clones of a snapshot: Ceph's clone format 2 needs no protected snapshot; a
cluster that still makes format-1 clones refuses an unprotected parent, so
that parent is protected and the clone retried (the result says which).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cutpoint.coordinator.dr.ceph_errors import CephError, CephExists, CephNotFound
from cutpoint.coordinator.dr.site import CephConnection, CephSite

Progress = Callable[[str, dict[str, Any]], None]


class RestoreRefused(RuntimeError):
    """The restore cannot start; nothing was changed.  `code` names the rule."""

    def __init__(self, code: str, message: str, *, items: list[dict[str, Any]]) -> None:
        super().__init__(message)
        self.code, self.items = code, items


class RestoreFailed(RuntimeError):
    """The restore started and failed; `undone` says what it took back."""

    def __init__(self, message: str, *, done: list[dict[str, Any]],
                 undone: list[str]) -> None:
        super().__init__(message)
        self.done, self.undone = done, undone


@dataclass(frozen=True)
class RestoreDisk:
    vm: str
    node: str
    pool: str            # the logical pool; the site maps it
    image: str
    snap: str            # the member snapshot's name at this site

    @property
    def key(self) -> str:
        return f"{self.vm}/{self.node}"


@dataclass
class RestorePlan:
    site: CephSite
    disks: list[RestoreDisk] = field(default_factory=list)


def clone_name(d: RestoreDisk, suffix: str) -> str:
    """The derived clone name of a member: `<image>-<suffix>`."""
    return f"{d.image}-{suffix}"


def _missing_snapshots(ceph: CephConnection, plan: RestorePlan) -> list[dict[str, Any]]:
    out = []
    for d in plan.disks:
        pool = plan.site.pool(d.pool)
        try:
            names = {s.name for s in ceph.snapshots(pool, d.image)}
        except CephNotFound:
            out.append({"disk": d.key, "image": f"{pool}/{d.image}", "why": "no such image"})
            continue
        if d.snap not in names:
            out.append({"disk": d.key, "image": f"{pool}/{d.image}",
                        "why": f"no snapshot {d.snap}"})
    return out


def _refuse_missing(ceph: CephConnection, plan: RestorePlan) -> None:
    missing = _missing_snapshots(ceph, plan)
    if missing:
        raise RestoreRefused(
            "snapshot_missing_at_site",
            f"site {plan.site.name} does not hold this group snapshot on every member: "
            + "; ".join(f"{m['image']}: {m['why']}" for m in missing), items=missing)


def _refuse_taken(ceph: CephConnection, plan: RestorePlan, names: dict[str, str]) -> None:
    taken = [{"disk": d.key, "image": f"{plan.site.pool(d.pool)}/{names[d.key]}"}
             for d in plan.disks if ceph.image_exists(plan.site.pool(d.pool), names[d.key])]
    if taken:
        raise RestoreRefused("clone_exists", "an image of that name exists already: "
                             + ", ".join(t["image"] for t in taken), items=taken)


def _refuse_held(ceph: CephConnection, plan: RestorePlan) -> None:
    held = []
    for d in plan.disks:
        pool = plan.site.pool(d.pool)
        for lk in ceph.lockers(pool, d.image):
            held.append({"disk": d.key, "vm": d.vm, "image": f"{pool}/{d.image}",
                         "holder": lk.client, "address": lk.address})
    if held:
        raise RestoreRefused(
            "image_in_use", "an image to roll back is open (a running VM holds its "
            "lock): " + ", ".join(f"{h['image']} by {h['holder']} at {h['address']}"
                                  for h in held), items=held)


def check(plan: RestorePlan, mode: str, names: dict[str, str]) -> None:
    """Every refusal of `clones` (mode "clone") or `in_place` (mode "in_place"),
    without changing anything: RestoreRefused names the first rule broken."""
    with CephConnection(plan.site) as ceph:
        _refuse_missing(ceph, plan)
        if mode == "clone":
            _refuse_taken(ceph, plan, names)
        else:
            _refuse_held(ceph, plan)


def clones(plan: RestorePlan, names: dict[str, str], *,
           on_progress: Progress | None = None) -> list[dict[str, Any]]:
    """Clone every member's snapshot as `names[disk key]`; returns one record per clone."""
    note = on_progress or (lambda step, detail: None)
    if set(names) != {d.key for d in plan.disks}:
        raise RestoreRefused("bad_names", "a clone name is needed for every member disk, "
                             f"and only for them: {sorted(d.key for d in plan.disks)}",
                             items=[])
    if len(set(names.values())) != len(names):
        raise RestoreRefused("bad_names", "two members would get the same clone name",
                             items=[])
    with CephConnection(plan.site) as ceph:
        _refuse_missing(ceph, plan)
        _refuse_taken(ceph, plan, names)
        done: list[dict[str, Any]] = []
        try:
            for i, d in enumerate(plan.disks, 1):
                pool = plan.site.pool(d.pool)
                protected = _clone(ceph, pool, d, names[d.key])
                rec = {"disk": d.key, "vm": d.vm, "source": f"{pool}/{d.image}@{d.snap}",
                       "clone": f"{pool}/{names[d.key]}", "protected_parent": protected}
                done.append(rec)
                note("clone", {**rec, "done": i, "of": len(plan.disks)})
        except CephError as exc:
            undone = _remove_clones(ceph, done)
            raise RestoreFailed(f"clone of a member failed: {exc}; the {len(undone)} clone(s) "
                                "this restore made were removed", done=done,
                                undone=undone) from exc
        return done


def _clone(ceph: CephConnection, pool: str, d: RestoreDisk, name: str) -> bool:
    """Clone d's snapshot as `name`; True when the parent had to be protected first."""
    try:
        ceph.clone(pool, d.image, d.snap, name)
        return False
    except (CephExists, CephNotFound):
        raise
    except CephError:
        if ceph.is_protected(pool, d.image, d.snap):
            raise
    ceph.protect(pool, d.image, d.snap)  # a format-1 clone needs a protected parent
    ceph.clone(pool, d.image, d.snap, name)
    return True


def _remove_clones(ceph: CephConnection, done: list[dict[str, Any]]) -> list[str]:
    undone = []
    for rec in reversed(done):
        pool, image = rec["clone"].split("/", 1)
        try:
            ceph.remove_image(pool, image)
            undone.append(rec["clone"])
        except CephError:  # reported by omission: `undone` lists what went
            pass
    return undone


def in_place(plan: RestorePlan, *, on_progress: Progress | None = None) -> list[dict[str, Any]]:
    """Roll every member image back to its snapshot; refuses while any is open."""
    note = on_progress or (lambda step, detail: None)
    with CephConnection(plan.site) as ceph:
        _refuse_missing(ceph, plan)
        _refuse_held(ceph, plan)
        done: list[dict[str, Any]] = []
        try:
            for i, d in enumerate(plan.disks, 1):
                pool = plan.site.pool(d.pool)
                changed = ceph.changed_since(pool, d.image, d.snap)
                if changed:
                    ceph.rollback(pool, d.image, d.snap)
                rec = {"disk": d.key, "vm": d.vm, "image": f"{pool}/{d.image}",
                       "to": d.snap, "rolled_back": changed}
                done.append(rec)
                note("rollback", {**rec, "done": i, "of": len(plan.disks)})
        except CephError as exc:
            raise RestoreFailed(f"rollback of a member failed: {exc}; {len(done)} of "
                                f"{len(plan.disks)} images were rolled back (run the restore "
                                "again: it is safe to repeat)", done=done, undone=[]) from exc
        return done
