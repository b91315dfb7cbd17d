"""The sweeper of drill leftovers, by tag.

A drill names everything it makes at DR with its tag, `drill-<id>` (id:
the first 8 hex digits of its job id): its clones `drill-<id>-<image>` in
the DR pools, and, through the agents, its VMs `drill-<id>-<vm>`.  A
worker killed mid-drill leaves them; the job's redelivery cleans up after
it (drills.py `_interrupted`), but only if the job comes back.  This
sweeper does not wait for that.  A pass:

1. the tags of the drills that may still be running: every drill job
   queued or running (their VMs and clones are theirs, not leftovers);
2. at each site some group replicates to (where drills run), through its
   Ceph access as set through the API: every image of its pools named
   `drill-<8 hex>-*` whose tag is not one of those is removed (EBUSY: a
   watch of a stopped QEMU lingers; retried for 10 s, then left for the
   next pass);
2b. there too, every snapshot a drill protected (the image's metadata
   `cutpoint.drill_protected.<snap>` names the drill's tag, set before the
   protect: coordinator/dr/drill.py) whose tag is not active is
   unprotected once it has no clone left, and the key removed; one with a
   clone still (another drill's) keeps its key for a later pass.  Without
   this a killed drill's protection stayed until its job was redelivered,
   and a protected snapshot is one retention cannot delete;
3. at each pinned host of those sites: every VM its agent's inventory
   lists named `drill-<8 hex>-*` whose tag is not active is stopped
   (`vm.stop`: a drill's VMs are transient, so nothing stays defined).

VMs go first, then the clones they held.  It runs at worker start and
every `drill_sweep_interval_s` (tasks_periodic.drill_sweep_tick).  What it
removed and what it could not is returned (and logged).
"""

from __future__ import annotations

import asyncio
import logging
import re
from typing import Any

from cutpoint.api.models import Host, Job, JobState, Policy, Site
from sqlalchemy import select
from sqlalchemy.orm import Session

log = logging.getLogger("cutpoint.drill_sweeper")
TAGGED = re.compile(r"^(drill-[0-9a-f]{8})-")


def active_tags(s: Session) -> set[str]:
    return {f"drill-{j.replace('-', '')[:8]}" for j in s.scalars(
        select(Job.id).where(Job.kind == "drill",
                             Job.state.in_((JobState.queued, JobState.running))))}


def _stale(name: str, active: set[str]) -> bool:
    m = TAGGED.match(name)
    return m is not None and m.group(1) not in active


def sweep(sf: Any, settings: Any) -> dict[str, Any]:
    from cutpoint.api.services.replication import ReplicationFailed, site_of
    from cutpoint.coordinator.dr.ceph_errors import CephError
    from cutpoint.coordinator.dr.site import CephConnection

    out: dict[str, Any] = {"vms_stopped": [], "images_removed": [],
                           "snapshots_unprotected": [], "errors": []}
    with sf() as s:
        active = active_tags(s)
        targets = select(Policy.replication_target_id).where(
            Policy.replication_target_id.is_not(None))
        sites = list(s.scalars(select(Site).where(Site.id.in_(targets))))
        hosts = [(h.name, h.address, h.port, h.cert_fingerprint) for h in s.scalars(
            select(Host).where(Host.cert_fingerprint.is_not(None),
                               Host.site_id.in_(targets)))]
        ceph = {}
        for site in sites:
            try:
                ceph[site.name] = (site_of(s, site.name), sorted(set((site.ceph_pools or {})
                                                                     .values())))
            except ReplicationFailed as exc:
                out["errors"].append(f"site {site.name}: {exc}")
    out["vms_stopped"], errs = _stop_vms(settings, hosts, active)
    out["errors"] += errs
    for name, (site, pools) in ceph.items():
        try:
            with CephConnection(site) as c:
                for pool in pools:
                    for image in c.list_images(pool):
                        if not _stale(image, active):
                            continue
                        err = _remove(c, pool, image)
                        if err is None:
                            out["images_removed"].append(f"{name}:{pool}/{image}")
                        elif err:
                            out["errors"].append(f"{name}:{pool}/{image}: {err}")
                    done, errs = _unprotect(c, pool, active)
                    out["snapshots_unprotected"] += [f"{name}:{x}" for x in done]
                    out["errors"] += [f"{name}:{x}" for x in errs]
        except CephError as exc:
            out["errors"].append(f"site {name}: {exc}")
    if out["vms_stopped"] or out["images_removed"] or out["snapshots_unprotected"] \
            or out["errors"]:
        log.warning("event=drill_sweep vms_stopped=%s images_removed=%s "
                    "snapshots_unprotected=%s errors=%s", out["vms_stopped"],
                    out["images_removed"], out["snapshots_unprotected"], out["errors"])
    return out


def _unprotect(c: Any, pool: str, active: set[str]) -> tuple[list[str], list[str]]:
    """Unprotects the snapshots of `pool` that a drill no longer active
    protected (step 2b); returns those done and the errors."""
    from cutpoint.coordinator.dr.ceph_errors import CephError, CephNotFound
    from cutpoint.coordinator.dr.drill import PROTECTED_PREFIX

    done: list[str] = []
    errors: list[str] = []
    for image in c.list_images(pool):
        if TAGGED.match(image):
            continue  # a drill's clone: it protects nothing
        try:
            keys = c.metadata_list(pool, image, PROTECTED_PREFIX)
        except CephNotFound:
            continue
        for key, tag in keys.items():
            if tag in active:
                continue
            snap = key[len(PROTECTED_PREFIX):]
            try:
                if c.is_protected(pool, image, snap):
                    c.unprotect(pool, image, snap)
                c.metadata_remove(pool, image, key)
                done.append(f"{pool}/{image}@{snap}")
            except CephNotFound:
                c.metadata_remove(pool, image, key)  # the snapshot is gone
            except CephError as exc:
                # EBUSY: a clone of it remains (another drill's): next pass
                errors.append(f"{pool}/{image}@{snap} ({tag}): {exc}")
    return done, errors


def _remove(c: Any, pool: str, image: str) -> str | None:
    """Removes one image: None done, "" already gone, else why not.  The
    watch of a QEMU that just stopped can linger a few seconds (EBUSY)."""
    import errno
    import time

    from cutpoint.coordinator.dr.ceph_errors import CephError, CephNotFound

    for attempt in range(10):
        try:
            c.remove_image(pool, image)
            return None
        except CephNotFound:
            return ""
        except CephError as exc:
            if exc.errno != errno.EBUSY or attempt == 9:
                return str(exc)
            time.sleep(1)
    return "busy"


def _stop_vms(settings: Any, hosts: list[tuple[str, str, int, str]],
              active: set[str]) -> tuple[list[str], list[str]]:
    if not hosts or not (settings.agent_ca and settings.agent_cert and settings.agent_key):
        return [], []
    from cutpoint.agentclient.client import AgentClient
    from cutpoint.agentclient.tls import client_context

    ctx = client_context(str(settings.agent_ca), str(settings.agent_cert),
                         str(settings.agent_key))

    async def one(name: str, addr: str, port: int, pin: str) -> tuple[list[str], list[str]]:
        stopped: list[str] = []
        try:
            async with AgentClient(addr, port, ssl_context=ctx, cert_sha256=pin,
                                   connect_timeout=5, call_timeout=15) as c:
                inv = await c.inventory()
                for vm in inv.get("vms", []):
                    if _stale(vm["name"], active):
                        await c.call("vm.stop", {"vm": vm["name"]}, timeout=30)
                        stopped.append(f"{name}:{vm['name']}")
            return stopped, []
        except Exception as exc:  # noqa: BLE001  one host: recorded, the others go on
            return stopped, [f"host {name}: {type(exc).__name__}: {exc}"]

    async def all_() -> list[tuple[list[str], list[str]]]:
        return await asyncio.gather(*(one(*h) for h in hosts))

    stopped, errors = [], []
    for st, er in asyncio.run(all_()):
        stopped += st
        errors += er
    return stopped, errors
