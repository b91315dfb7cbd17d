from __future__ import annotations

from cutpoint.api.deps import Admin, Cursor, IdPath, IfMatch, Limit, SessionDep, Viewer
from cutpoint.api.models import Site
from cutpoint.api.schemas.common import Page
from cutpoint.api.schemas.sites import SiteCreate, SitePublic, SiteUpdate
from cutpoint.api.services import sites
from cutpoint.api.services.common import get_or_404, paginate
from fastapi import APIRouter, Response
from sqlalchemy import select

router = APIRouter(prefix="/sites", tags=["sites"])


@router.get("", response_model=Page[SitePublic])
def list_sites(session: SessionDep, _: Viewer, limit: Limit = 50, cursor: Cursor = None) \
        -> Page[SitePublic]:
    rows, nxt = paginate(session, select(Site), Site.id, limit, cursor)
    return Page(items=[SitePublic.model_validate(r) for r in rows], next_cursor=nxt)


@router.post("", status_code=201, response_model=SitePublic)
def create_site(data: SiteCreate, session: SessionDep, _: Admin, response: Response) -> SitePublic:
    site = sites.create(session, data)
    response.headers["ETag"] = sites.site_etag(site)
    response.headers["Location"] = f"/v1/sites/{site.id}"
    return SitePublic.model_validate(site)


@router.get("/{site_id}", response_model=SitePublic)
def get_site(site_id: IdPath, session: SessionDep, _: Viewer, response: Response) -> SitePublic:
    site = get_or_404(session, Site, site_id, "site")
    response.headers["ETag"] = sites.site_etag(site)
    return SitePublic.model_validate(site)


@router.patch("/{site_id}", response_model=SitePublic)
def update_site(site_id: IdPath, data: SiteUpdate, session: SessionDep, _: Admin,
                response: Response, if_match: IfMatch = None) -> SitePublic:
    site = sites.update(session, site_id, data, if_match)
    response.headers["ETag"] = sites.site_etag(site)
    return SitePublic.model_validate(site)


@router.delete("/{site_id}", status_code=204)
def delete_site(site_id: IdPath, session: SessionDep, _: Admin, if_match: IfMatch = None) -> Response:
    sites.delete(session, site_id, if_match)
    return Response(status_code=204)
