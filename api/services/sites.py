from __future__ import annotations

from cutpoint.api.errors import Conflict, NotFound
from cutpoint.api.models import Host, Site
from cutpoint.api.schemas.sites import SiteCreate, SiteUpdate
from cutpoint.api.services.common import check_if_match, etag, get_or_404
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session


def site_etag(site: Site) -> str:
    return etag("site", site.id, site.version)


def by_name(session: Session, name: str) -> Site:
    site = session.scalar(select(Site).where(Site.name == name))
    if site is None:
        raise NotFound(f"site {name!r} does not exist", code="site_not_found")
    return site


def create(session: Session, data: SiteCreate) -> Site:
    site = Site(name=data.name, description=data.description)
    session.add(site)
    try:
        session.commit()
    except IntegrityError:
        session.rollback()
        raise Conflict(f"site {data.name!r} already exists", code="site_exists") from None
    return site


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
