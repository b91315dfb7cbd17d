from __future__ import annotations

from cutpoint.api.deps import (
    Admin,
    Cursor,
    IdPath,
    IfMatch,
    Limit,
    Operator,
    SessionDep,
    SettingsDep,
    Viewer,
)
from cutpoint.api.models import Host
from cutpoint.api.schemas.common import Page
from cutpoint.api.schemas.hosts import HostCreate, HostPublic, HostUpdate
from cutpoint.api.schemas.jobs import JobPublic
from cutpoint.api.services import hosts, jobs, queue
from cutpoint.api.services.common import get_or_404, paginate
from fastapi import APIRouter, Response
from sqlalchemy import select

router = APIRouter(prefix="/hosts", tags=["hosts"])


@router.get("", response_model=Page[HostPublic])
def list_hosts(session: SessionDep, _: Viewer, limit: Limit = 50, cursor: Cursor = None) \
        -> Page[HostPublic]:
    """Every registered host with `reachable`, `last_seen_at`, `last_error` and `agent_version`."""
    rows, nxt = paginate(session, select(Host), Host.id, limit, cursor)
    return Page(items=[hosts.public(h) for h in rows], next_cursor=nxt)


@router.post("", status_code=201, response_model=HostPublic)
def create_host(data: HostCreate, session: SessionDep, _: Admin, response: Response) -> HostPublic:
    """Register a host `{name, site, address, port=7443, cert_fingerprint}`.

    `cert_fingerprint` (SHA-256 of the agent's DER certificate, hex) is required and checked on
    every connection to that agent: any other certificate, even one the CA signed, is refused
    (`fingerprint_mismatch`) before a request is sent.  `cutpoint host add --cert AGENT.pem`
    computes it."""
    host = hosts.create(session, data)
    response.headers["ETag"] = hosts.host_etag(host)
    response.headers["Location"] = f"/v1/hosts/{host.id}"
    return hosts.public(host)


@router.get("/{host_id}", response_model=HostPublic)
def get_host(host_id: IdPath, session: SessionDep, _: Viewer, response: Response) -> HostPublic:
    """One host with `reachable`, `last_seen_at`, `last_error` and `agent_version`."""
    host = get_or_404(session, Host, host_id, "host")
    response.headers["ETag"] = hosts.host_etag(host)
    return hosts.public(host)


@router.patch("/{host_id}", response_model=HostPublic)
def update_host(host_id: IdPath, data: HostUpdate, session: SessionDep, _: Admin,
                response: Response, if_match: IfMatch = None) -> HostPublic:
    """Change a host; the pin can be replaced, not removed."""
    host = hosts.update(session, host_id, data, if_match)
    response.headers["ETag"] = hosts.host_etag(host)
    return hosts.public(host)


@router.delete("/{host_id}", status_code=204)
def delete_host(host_id: IdPath, session: SessionDep, _: Admin, if_match: IfMatch = None) -> Response:
    """Forget a host (refused while one of its disks is in a group: `host_in_use`)."""
    hosts.delete(session, host_id, if_match)
    return Response(status_code=204)


@router.post("/{host_id}/sync", status_code=202, response_model=JobPublic)
def sync_host(host_id: IdPath, session: SessionDep, token: Operator, settings: SettingsDep,
              response: Response) -> JobPublic:
    """Pull the agent's inventory (VMs and disks) in a background job."""
    host = get_or_404(session, Host, host_id, "host")
    job = jobs.create(session, "inventory_sync", actor=token.name, host_id=host.id,
                      params={"host_id": host.id})
    queue.enqueue(session, settings, job)
    response.headers["Location"] = f"/v1/jobs/{job.id}"
    return jobs.public(job)
