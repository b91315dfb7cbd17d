"""What the console's host and VM pages show, read through the services the
REST routes use (`services/vms.py`, `services/hosts.py`): plain dicts for
the templates.

A host's certificate is flagged when it expires within CERT_WARN_DAYS, the
window of the shipped alert rule (CutpointAgentCertExpiring), so the page
and the alert agree on what "soon" is.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from cutpoint.api.models import Host, Site, Vm, as_utc, utcnow
from cutpoint.api.services import hosts, vms
from sqlalchemy import func, select
from sqlalchemy.orm import Session

CERT_WARN_DAYS = 14
VMS_SHOWN = 500



def cert_standing(not_after: dt.datetime | None, now: dt.datetime) -> tuple[str, float | None]:
    """(standing, days left): unknown, expired, expiring (< CERT_WARN_DAYS) or ok."""
    if not_after is None:
        return "unknown", None
    days = (as_utc(not_after) - now).total_seconds() / 86400  # type: ignore[operator]
    if days <= 0:
        return "expired", days
    return ("expiring" if days < CERT_WARN_DAYS else "ok"), days


def host_rows(s: Session) -> list[dict[str, Any]]:
    """Every host by site and name, with its agent's standing and its VM count."""
    now = utcnow()
    counts = dict(s.execute(select(Vm.host_id, func.count()).where(Vm.present.is_(True))
                            .group_by(Vm.host_id)).all())
    out = []
    for h in s.scalars(select(Host).join(Site, Site.id == Host.site_id)
                       .order_by(Site.name, Host.name)):
        p = hosts.public(h)
        cert, days = cert_standing(p.cert_not_after, now)
        out.append({**p.model_dump(), "vms": counts.get(h.id, 0), "stale": h.inventory_stale,
                    "agent": "unknown" if p.reachable is None
                    else "reachable" if p.reachable else "unreachable",
                    "cert": cert, "cert_days": days})
    return out


def vm_rows(s: Session, site: str | None, host: str | None) -> list[dict[str, Any]]:
    """The VMs the agents reported, present ones first, by site, host and name."""
    stmt = vms.query(site=site, host=host)
    if host is None and site is None:
        stmt = stmt.join(Host, Host.id == Vm.host_id)
    if site is None:
        # vms.query joins Site only for a site filter.
        stmt = stmt.join(Site, Site.id == Host.site_id)
    stmt = stmt.order_by(Vm.present.desc(), Site.name, Host.name, Vm.name).limit(VMS_SHOWN)
    return [vms.vm_public(s, vm).model_dump() for vm in s.scalars(stmt).unique()]
