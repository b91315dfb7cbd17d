from __future__ import annotations

from cutpoint.api.errors import Conflict
from cutpoint.api.models import GroupDisk, Host
from cutpoint.api.schemas.hosts import HostCreate, HostPublic, HostUpdate
from cutpoint.api.services import sites
from cutpoint.api.services.common import (
    add_unique,
    check_if_match,
    etag,
    get_by_name_or_404,
    get_or_404,
)
from sqlalchemy import select
from sqlalchemy.orm import Session


def host_etag(host: Host) -> str:
    return etag("host", host.id, host.version)


def public(host: Host) -> HostPublic:
    return HostPublic.model_validate({**{c: getattr(host, c) for c in (
        "id", "name", "address", "port", "cert_fingerprint", "reachable", "last_seen_at",
        "last_error", "agent_version", "cert_not_after", "version", "created_at")},
        "site": host.site.name})


def by_name(session: Session, name: str) -> Host:
    return get_by_name_or_404(session, Host, name, "host")


def _norm_fp(fp: str | None) -> str | None:
    return fp.replace(":", "").lower() if fp else None


def create(session: Session, data: HostCreate) -> Host:
    site = sites.by_name(session, data.site)
    host = Host(name=data.name, site_id=site.id, address=data.address, port=data.port,
                cert_fingerprint=_norm_fp(data.cert_fingerprint))
    return add_unique(session, host, "host", data.name)


def update(session: Session, host_id: int, data: HostUpdate, if_match: str | None) -> Host:
    host = get_or_404(session, Host, host_id, "host")
    check_if_match(if_match, host_etag(host))
    if data.address is not None:
        host.address = data.address
    if data.port is not None:
        host.port = data.port
    if data.cert_fingerprint is not None:
        host.cert_fingerprint = _norm_fp(data.cert_fingerprint)
    host.version += 1
    session.commit()
    return host


def delete(session: Session, host_id: int, if_match: str | None) -> None:
    from cutpoint.api.models import Disk, Vm

    host = get_or_404(session, Host, host_id, "host")
    check_if_match(if_match, host_etag(host))
    used = session.scalar(select(GroupDisk.group_id).join(Disk, Disk.id == GroupDisk.disk_id)
                          .join(Vm, Vm.id == Disk.vm_id).where(Vm.host_id == host_id).limit(1))
    if used is not None:
        raise Conflict(f"host {host.name!r} has disks in a group", code="host_in_use")
    session.delete(host)
    session.commit()
