"""Failover's signed definitions: the VMs no DR agent defines.

A DR host's agent starts the VMs its config defines (`vm.start{spec:
{vm}}`): a standby it lists.  A libvirt VM it does not define can still be
started at DR from its captured definition (vm_definitions.py): the newest
version, rewritten for the DR site (vmdef_rewrite.py: each disk to its
replicated image, by target dev; the site's monitors, cephx user, libvirt
secret and network map) and signed with the control plane's key
(vmdef_sign.py), sent to the agent of the site's `definition_targets`
host (`vm.start{spec: {vm, xml, sig}}`, agent-protocol 4.9).

`signed_starts` gives, for the VMs that no DR agent lists, the agent and
the spec of each it can start so, and why not for the others (the boot's
preflight then names them: nothing is started or stopped).  The
definition is the VM's identity at DR: a failover keeps its name, UUID and
MAC addresses.
"""

from __future__ import annotations

from typing import Any

from cutpoint.api.models import Host, Site, Vm, VmDefinition
from cutpoint.api.services import vmdef_sign
from cutpoint.api.services.vmdef_policy import site_policy
from cutpoint.api.services.vmdef_rewrite import DrTarget, RewriteError, rewrite
from sqlalchemy import select
from sqlalchemy.orm import Session


def _newest(s: Session, source: str, vm: str) -> VmDefinition | None:
    """The newest definition captured of `vm` on a host of site `source`."""
    return s.scalar(select(VmDefinition).join(Vm, Vm.id == VmDefinition.vm_id)
                    .join(Host, Host.id == Vm.host_id).join(Site, Site.id == Host.site_id)
                    .where(Vm.name == vm, Site.name == source)
                    .order_by(VmDefinition.captured_at.desc(), VmDefinition.version.desc())
                    .limit(1))


def signed_starts(s: Session, settings: Any, target: str, source: str,
                  vms: dict[str, list[tuple[str, str, str]]],
                  plan_networks: dict[str, str] | None = None) \
        -> tuple[dict[str, tuple[str, int, str]], dict[str, dict[str, Any]], dict[str, str]]:
    """For `vms` (vm -> [(node, logical pool, DR image)]) at site `target`:
    ({vm: (address, port, pin)}, {vm: vm.start spec}, {vm: why not})."""
    agents: dict[str, tuple[str, int, str]] = {}
    specs: dict[str, dict[str, Any]] = {}
    why: dict[str, str] = {}
    if not vms:
        return agents, specs, why
    conf = settings.definition_targets.get(target)
    if conf is None or settings.definition_signing_key is None:
        return agents, specs, dict.fromkeys(vms, "no definition_targets entry for the site "
                                            "or no definition_signing_key")
    host = s.scalar(select(Host).join(Site, Site.id == Host.site_id)
                    .where(Host.name == conf.host, Site.name == target))
    if host is None or not host.cert_fingerprint:
        return agents, specs, dict.fromkeys(vms, f"definition_targets host {conf.host!r} is "
                                            f"not a pinned host of site {target!r}")
    pools: dict[str, str] = dict(s.scalar(select(Site.ceph_pools).where(
        Site.name == target)) or {})
    try:
        key = vmdef_sign.load_key(settings.definition_signing_key)
    except vmdef_sign.SigningKeyError as exc:
        return agents, specs, dict.fromkeys(vms, str(exc))
    mons = tuple((a, int(p)) for a, _, p in (m.rpartition(":") for m in conf.mon_hosts))
    # the group's recovery plan maps production networks too (networks.failover)
    networks = dict(conf.networks) | dict(plan_networks or {})
    for vm, disks in vms.items():
        d = _newest(s, source, vm)
        if d is None or d.format != "libvirt-domain-xml":
            why[vm] = "no captured libvirt definition"
            continue
        t = DrTarget(pool=next(iter(pools.values()), "rbd"), mon_hosts=mons,
                     auth_user=conf.auth_user, secret_uuid=conf.secret_uuid,
                     networks=networks, policy=site_policy(conf),
                     by_target={node: f"{pools.get(pool, pool)}/{image}"
                                for node, pool, image in disks})
        try:
            xml = rewrite(d.definition, t)
        except RewriteError as exc:
            why[vm] = f"definition v{d.version}: {exc}"
            continue
        specs[vm] = vmdef_sign.spec(key, vm, xml)
        agents[vm] = (host.address, host.port, host.cert_fingerprint)
    return agents, specs, why
