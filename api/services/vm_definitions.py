"""VM definitions captured for DR, versioned.

A protected VM (a group member, or a VM with a disk in a group) has its
persistent definition stored: its agent's `vm.definition`
(agent-protocol 4.11: a libvirt domain's inactive XML, or a qmp VM's start
command).  One row per version (`vm_definitions`): a capture whose sha256
equals the newest version's stores nothing.  Captured by the inventory
watch (`refresh_host`): every protected VM of a host whose inventory
moved (a `virsh define` moves it: libvirt reports the domain defined) or
that was not asked for FULL_S (a `--config` change raises no event), and
a protected VM with no version yet (one that just joined a group), at
most once a minute.

Failover rewrites the newest version for the DR site (vmdef_rewrite.py)
and sends it signed (vmdef_sign.py, failover_signed.py).  Only a
definition of the allow-list shape of vmdef_policy.py is signed: each
version's `dr_status` says whether it is (`signable`) or why not
(`refused`, with `dr_refusals` naming each element: for every DR site of
`definition_targets`, and what no site allows), judged when it is
captured (a warning in the log) and again when it is read (the settings
may have changed), so that the operator sees it before a disaster.
"""

from __future__ import annotations

import hashlib
import logging
import time
from typing import Any

from cutpoint.api.config import Settings
from cutpoint.api.models import Disk, GroupDisk, GroupMember, Host, Vm, VmDefinition
from cutpoint.api.schemas.vm_definitions import VmDefinitionFull, VmDefinitionPublic
from cutpoint.api.services import agents
from cutpoint.api.services.vmdef_policy import refusals_of, site_policy
from sqlalchemy import select
from sqlalchemy.orm import Session

log = logging.getLogger("cutpoint.api.vm_definitions")

FORMATS = ("libvirt-domain-xml", "qmp-start-command")
# A protected VM without a definition is asked again after this long; one
# whose agent keeps none (BAD_REQUEST: a qmp VM without `start =`) after
# NONE_S.
RETRY_S = 60.0
NONE_S = 3600.0
# Every protected VM of a host is asked again at least this often: a change
# made without a define (`virsh setmaxmem --config`, `virsh
# attach-device --config`) raises no lifecycle event, so the inventory
# does not move for it.
FULL_S = 300.0
_next_try: dict[int, float] = {}
_last_full: dict[int, float] = {}


class DefinitionError(ValueError):
    """An agent's vm.definition reply that cannot be stored."""


def latest(s: Session, vm_id: int) -> VmDefinition | None:
    return s.scalar(select(VmDefinition).where(VmDefinition.vm_id == vm_id)
                    .order_by(VmDefinition.version.desc()).limit(1))


def store(s: Session, vm: Vm, reply: dict[str, Any]) -> tuple[VmDefinition, bool]:
    """Stores `reply` (a vm.definition result) for `vm` as a new version,
    unless the newest version has its sha256: (that row, whether it is new).
    The caller commits."""
    text, fmt = reply.get("definition"), reply.get("format")
    if not isinstance(text, str) or not text or fmt not in FORMATS:
        raise DefinitionError(f"vm {vm.name}: vm.definition gave no definition of a known "
                              f"format ({fmt!r})")
    digest = hashlib.sha256(text.encode()).hexdigest()
    if reply.get("sha256") not in (None, digest):
        raise DefinitionError(f"vm {vm.name}: the agent's sha256 {reply.get('sha256')} is not "
                              f"that of the definition it sent ({digest})")
    last = latest(s, vm.id)
    if last is not None and last.sha256 == digest:
        return last, False
    row = VmDefinition(vm_id=vm.id, uid=vm.uid, host=vm.host.name,
                       version=(last.version + 1) if last else 1, format=fmt,
                       sha256=digest, definition=text)
    s.add(row)
    s.flush()
    return row, True


def protected(s: Session, host_id: int) -> list[Vm]:
    """The VMs of a host that a group protects (a member, or a disk in one)."""
    by_member = select(GroupMember.vm_id).where(GroupMember.vm_id.is_not(None))
    by_disk = select(Disk.vm_id).join(GroupDisk, GroupDisk.disk_id == Disk.id)
    return list(s.scalars(select(Vm).where(Vm.host_id == host_id, Vm.present.is_(True),
                                           Vm.id.in_(by_member.union(by_disk)))
                          .order_by(Vm.id)).unique())


def _capture(s: Session, settings: Settings, host: Host, vms: list[Vm]) -> dict[str, int]:
    out = {"new": 0, "same": 0, "failed": 0}
    if not vms:
        return out
    try:
        replies = agents.call_each(host, settings,
                                   [("vm.definition", {"vm": v.name}) for v in vms])
    except agents.AgentCallError as exc:
        log.warning("event=vm_definition_failed host=%s msg=%r", host.name, str(exc))
        out["failed"] = len(vms)
        return out
    for vm, r in zip(vms, replies, strict=True):
        if isinstance(r, agents.AgentCallError) and r.code == "BAD_REQUEST":
            log.info("event=vm_definition_none vm=%s host=%s msg=%r", vm.name, host.name,
                     str(r))
            _next_try[vm.id] = time.monotonic() + NONE_S
            out["failed"] += 1
            continue
        try:
            if isinstance(r, Exception):
                raise DefinitionError(str(r))
            row, new = store(s, vm, r)
        except DefinitionError as exc:
            log.warning("event=vm_definition_failed vm=%s host=%s msg=%r", vm.name,
                        host.name, str(exc))
            _next_try[vm.id] = time.monotonic() + RETRY_S
            out["failed"] += 1
            continue
        _next_try.pop(vm.id, None)
        out["new" if new else "same"] += 1
        if new:
            log.info("event=vm_definition_stored vm=%s host=%s version=%d sha256=%s",
                     vm.name, host.name, row.version, row.sha256)
            why = dr_refusals(row, settings)
            if why:
                log.warning("event=vm_definition_refused vm=%s host=%s version=%d "
                            "refusals=%d msg=%r", vm.name, host.name, row.version,
                            len(why), "; ".join(why))
    s.commit()
    return out


def refresh_host(s: Session, settings: Settings, host: Host, *, changed: bool) -> dict[str, int]:
    """The watch's part: every protected VM of `host` when its inventory
    `changed`; else only those with no version yet, once per RETRY_S."""
    vms = protected(s, host.id)
    now = time.monotonic()
    if changed or now - _last_full.get(host.id, now) >= FULL_S:
        changed = True
    if changed or host.id not in _last_full:
        _last_full[host.id] = now
    if not changed:
        have = set(s.scalars(select(VmDefinition.vm_id).where(
            VmDefinition.vm_id.in_([v.id for v in vms]))))
        vms = [v for v in vms if v.id not in have and _next_try.get(v.id, 0) <= now]
    return _capture(s, settings, host, vms)


def dr_refusals(row: VmDefinition, settings: Settings | None) -> list[str]:
    """Why the DR rewrite would refuse `row` (vmdef_policy.py): what no
    site allows, then per DR site of `definition_targets` ("site NAME: ..."
    for its host files); [] when it is signable everywhere."""
    if row.format != "libvirt-domain-xml":
        return []
    base = refusals_of(row.definition)
    out = list(base)
    targets = settings.definition_targets if settings is not None else {}
    for site, conf in sorted(targets.items()):
        out += [f"site {site}: {r}" for r in refusals_of(row.definition, site_policy(conf))
                if r not in base]
    return out


def _public(row: VmDefinition, settings: Settings | None) -> dict[str, Any]:
    why = dr_refusals(row, settings)
    return {"vm_id": row.vm_id, "version": row.version, "format": row.format,
            "sha256": row.sha256, "size_bytes": len(row.definition.encode()),
            "host": row.host, "uid": row.uid, "captured_at": row.captured_at,
            "dr_status": ("not-libvirt" if row.format != "libvirt-domain-xml" else
                          "refused" if why else "signable"),
            "dr_refusals": why}


def versions(s: Session, vm_id: int, settings: Settings | None = None) \
        -> list[VmDefinitionPublic]:
    rows = s.scalars(select(VmDefinition).where(VmDefinition.vm_id == vm_id)
                     .order_by(VmDefinition.version))
    return [VmDefinitionPublic(**_public(r, settings)) for r in rows]


def one(s: Session, vm_id: int, version: int | None,
        settings: Settings | None = None) -> VmDefinitionFull | None:
    """Version `version` (None: the newest) with its text."""
    row = latest(s, vm_id) if version is None else s.scalar(
        select(VmDefinition).where(VmDefinition.vm_id == vm_id,
                                   VmDefinition.version == version))
    return None if row is None else VmDefinitionFull(**_public(row, settings),
                                                     definition=row.definition)

