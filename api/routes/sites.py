from __future__ import annotations

from cutpoint.api.deps import (
    Admin,
    Cursor,
    IdPath,
    IfMatch,
    Limit,
    Operator,
    SessionDep,
    Viewer,
)
from cutpoint.api.models import Site
from cutpoint.api.schemas.common import Page
from cutpoint.api.schemas.sites import (
    SiteCheckPublic,
    SiteCreate,
    SitePublic,
    SiteUpdate,
    check_public,
)
from cutpoint.api.services import sites
from cutpoint.api.services.common import get_or_404, paginate
from fastapi import APIRouter, Response
from sqlalchemy import select

router = APIRouter(prefix="/sites", tags=["sites"])

CHECK_FAILED = {
    "description": "The site check failed (`site_check_failed`): `failed_check`, "
                   "`failed_pool`, `ceph_code`, `errno` and every step in `checks`; 503 when "
                   "no mon answered, 504 when a request timed out, 422 otherwise",
    "content": {"application/problem+json": {}}}


@router.get("", response_model=Page[SitePublic])
def list_sites(session: SessionDep, _: Viewer, limit: Limit = 50, cursor: Cursor = None) \
        -> Page[SitePublic]:
    """Every site (failure domain) and its Ceph access, secrets by reference only."""
    rows, nxt = paginate(session, select(Site), Site.id, limit, cursor)
    return Page(items=[sites.public(r) for r in rows], next_cursor=nxt)


@router.post("", status_code=201, response_model=SitePublic,
             responses={422: CHECK_FAILED, 503: CHECK_FAILED, 504: CHECK_FAILED})
def create_site(data: SiteCreate, session: SessionDep, _: Admin, response: Response) -> SitePublic:
    """Register a site; with Ceph access, only if the site check passes (unless `check: false`)."""
    site = sites.create(session, data)
    response.headers["ETag"] = sites.site_etag(site)
    response.headers["Location"] = f"/v1/sites/{site.id}"
    return sites.public(site)


@router.get("/{site_id}", response_model=SitePublic)
def get_site(site_id: IdPath, session: SessionDep, _: Viewer, response: Response) -> SitePublic:
    """One site with its Ceph access and its last check."""
    site = get_or_404(session, Site, site_id, "site")
    response.headers["ETag"] = sites.site_etag(site)
    return sites.public(site)


@router.patch("/{site_id}", response_model=SitePublic,
              responses={422: CHECK_FAILED, 503: CHECK_FAILED, 504: CHECK_FAILED})
def update_site(site_id: IdPath, data: SiteUpdate, session: SessionDep, _: Admin,
                response: Response, if_match: IfMatch = None) -> SitePublic:
    """Change a site; a changed Ceph access is checked first (unless `check: false`)."""
    site = sites.update(session, site_id, data, if_match)
    response.headers["ETag"] = sites.site_etag(site)
    return sites.public(site)


@router.post("/{site_id}/check", response_model=SiteCheckPublic,
             responses={422: CHECK_FAILED, 503: CHECK_FAILED, 504: CHECK_FAILED})
def check_site(site_id: IdPath, session: SessionDep, _: Operator) -> SiteCheckPublic:
    """Run the site check now (connect, pools, snapshot, write, diff on a scratch image)."""
    result, checked_at = sites.check(session, site_id)
    return check_public(result, checked_at)


@router.delete("/{site_id}", status_code=204)
def delete_site(site_id: IdPath, session: SessionDep, _: Admin, if_match: IfMatch = None) -> Response:
    """Forget a site (refused while it still has hosts: `site_in_use`)."""
    sites.delete(session, site_id, if_match)
    return Response(status_code=204)
