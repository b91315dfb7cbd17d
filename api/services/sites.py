from __future__ import annotations

from cutpoint.api.errors import Conflict
from cutpoint.api.models import Host, Site
from cutpoint.api.schemas.sites import SiteCreate, SiteUpdate
from cutpoint.api.services.common import (
    add_unique,
    check_if_match,
    etag,
    get_by_name_or_404,
    get_or_404,
)
from sqlalchemy import select
from sqlalchemy.orm import Session


def site_etag(site: Site) -> str:
    return etag("site", site.id, site.version)


def by_name(session: Session, name: str) -> Site:
    return get_by_name_or_404(session, Site, name, "site")


def create(session: Session, data: SiteCreate) -> Site:
    return add_unique(session, Site(name=data.name, description=data.description), "site",
                      data.name)


def update(session: Session, site_id: int, data: SiteUpdate, if_match: str | None) -> Site:
    site = get_or_404(session, Site, site_id, "site")
    check_if_match(if_match, site_etag(site))
    if data.description is not None:
        site.description = data.description
    site.version += 1
    session.commit()
    return site


def delete(session: Session, site_id: int, if_match: str | None) -> None:
    site = get_or_404(session, Site, site_id, "site")
    check_if_match(if_match, site_etag(site))
    if session.scalar(select(Host.id).where(Host.site_id == site_id).limit(1)) is not None:
        raise Conflict(f"site {site.name!r} still has hosts", code="site_in_use")
    session.delete(site)
    session.commit()
