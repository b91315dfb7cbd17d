"""A drill's VMs through the DR agents: their definitions, built by the
control plane.

The drill (coordinator/dr/drill.py) clones each member image at DR, then
asks `definitions(tag, clone_vms)` (DrillSpec.definitions) how to start its
VMs.  For each of the group's VMs:

- its newest captured definition (vm_definitions.py: libvirt's inactive
  domain XML, taken on a host that is not at the DR site);
- rewritten for the drill (vmdef_rewrite.py): each disk onto its clone
  (by target dev), the DR site's monitors, cephx user and libvirt secret,
  the name `drill-<id>-<vm>`, a new UUID, no MAC addresses, its taps
  named `d<id><vm index><n>`, and every interface on the site's isolated
  drill bridge (`definition_targets.<site>
  .drill_network`: a bridge of the DR hosts with no route to production);
- signed with the control plane's key (vmdef_sign.py) and sent
  `transient` (agent-protocol 4.9: nothing stays defined after vm.stop);
- started on the agent failover would use for it: the DR host whose
  inventory lists the VM (its standby), else the site's
  `definition_targets` host.

`check(settings, site)` says, before any job exists, why drills cannot
boot through the agents at a site (the request's 409
`drill_boot_unsupported`).
"""

from __future__ import annotations

import uuid
from typing import Any

from cutpoint.api.models import Host, Site, Vm, VmDefinition
from sqlalchemy import select
from sqlalchemy.orm import Session


class DrillBootError(RuntimeError):
    pass


def check(settings: Any, site: str, plan_network: str | None = None) -> str | None:
    """Why drills cannot boot through the agents at `site`; None when they
    can.  `plan_network`: the drill bridge the group's plan names (it
    overrides the site's)."""
    conf = settings.definition_targets.get(site)
    if settings.definition_signing_key is None:
        return "no definition_signing_key: captured definitions cannot be signed"
    if conf is None:
        return f"no definition_targets entry for site {site!r}"
    if not (plan_network or conf.drill_network):
        return (f"definition_targets.{site} has no drill_network: a drill's copies are "
                "never attached to a production network")
    if not (settings.agent_ca and settings.agent_cert and settings.agent_key):
        return "no agent certificate configured (agent_ca, agent_cert, agent_key)"
    return None


def _newest(s: Session, target: str, vm: str) -> VmDefinition | None:
    """The newest libvirt definition of `vm` captured on a host that is not
    at the DR site (its production definition)."""
    return s.scalar(select(VmDefinition).join(Vm, Vm.id == VmDefinition.vm_id)
                    .join(Host, Host.id == Vm.host_id).join(Site, Site.id == Host.site_id)
                    .where(Vm.name == vm, Site.name != target,
                           VmDefinition.format == "libvirt-domain-xml")
                    .order_by(VmDefinition.captured_at.desc(), VmDefinition.version.desc())
                    .limit(1))


def definitions(sf: Any, settings: Any, target: str, plan_network: str | None = None) -> Any:
    """The DrillSpec.definitions of a drill at site `target` (on the plan's
    drill bridge when it names one, else the site's drill_network)."""
    from cutpoint.api.services import vmdef_sign
    from cutpoint.api.services.failover import dr_agent_for
    from cutpoint.api.services.vmdef_policy import site_policy
    from cutpoint.api.services.vmdef_rewrite import DrTarget, RewriteError, rewrite
    from cutpoint.coordinator.dr.boot import AgentRef, BootVM
    from cutpoint.coordinator.dr.drill import DrillBoot

    def build(tag: str, clone_vms: list[BootVM]) -> DrillBoot:
        why = check(settings, target, plan_network)
        if why:
            raise DrillBootError(why)
        conf = settings.definition_targets[target]
        key = vmdef_sign.load_key(settings.definition_signing_key)
        mons = tuple((a, int(p)) for a, _, p in (m.rpartition(":") for m in conf.mon_hosts))
        vms: list[BootVM] = []
        agents: dict[str, AgentRef] = {}
        specs: dict[str, dict[str, Any]] = {}
        original: dict[str, str] = {}
        errors: list[str] = []
        with sf() as s:
            pools: dict[str, str] = dict(s.scalar(select(Site.ceph_pools).where(
                Site.name == target)) or {})
            listed = dr_agent_for(s, settings, target, [v.name for v in clone_vms])
            host = s.scalar(select(Host).join(Site, Site.id == Host.site_id)
                            .where(Host.name == conf.host, Site.name == target))
            for k, v in enumerate(clone_vms):
                d = _newest(s, target, v.name)
                if d is None:
                    errors.append(f"{v.name}: no captured libvirt definition")
                    continue
                name = f"{tag}-{v.name}"
                t = DrTarget(pool=next(iter(pools.values()), "rbd"), mon_hosts=mons,
                             auth_user=conf.auth_user, secret_uuid=conf.secret_uuid,
                             by_target={dk.node: f"{pools.get(dk.pool, dk.pool)}/{dk.image}"
                                        for dk in v.disks},
                             name=name, uuid=str(uuid.uuid4()), policy=site_policy(conf),
                             isolate=plan_network or conf.drill_network,
                             # d<drill id><VM index>: 12 characters with the
                             # interface's index, inside IFNAMSIZ
                             taps=f"d{tag.removeprefix('drill-')[:8]}{k:02x}")
                try:
                    xml = rewrite(d.definition, t)
                except RewriteError as exc:
                    errors.append(f"{v.name}: definition v{d.version}: {exc}")
                    continue
                ref = listed.get("agents", {}).get(v.name)
                if ref is None and host is not None and host.cert_fingerprint:
                    ref = (host.address, host.port, host.cert_fingerprint)
                if ref is None:
                    errors.append(f"{v.name}: no pinned DR host lists it, and definition_"
                                  f"targets host {conf.host!r} is not a pinned host of "
                                  f"site {target!r}")
                    continue
                vms.append(BootVM(name, v.disks))
                agents[name] = AgentRef(*ref)
                specs[name] = {**vmdef_sign.spec(key, name, xml), "transient": True}
                original[name] = v.name
        if errors:
            raise DrillBootError("; ".join(errors))
        tls = (str(settings.agent_ca), str(settings.agent_cert), str(settings.agent_key))
        return DrillBoot(vms, agents, specs, tls, original)

    return build
