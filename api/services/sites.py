"""Sites and their Ceph access.

A site's Ceph access (ceph.conf or mon addresses, cephx id, keyring path,
pool map, timeouts) is product configuration: set with `POST /v1/sites`,
changed with `PATCH`, and read by every control-plane path that talks to
the site's cluster through `ceph_site()`.  A site may have none (a site
whose disks cutpoint does not replicate).

Registration and every change of the access run the site check
(`cutpoint.coordinator.dr.site_check.check_site`) first and are refused,
with nothing stored, when it fails; `check: false` skips it for a site
set up before its cluster answers.  The check does the control plane's
work (snapshot, write, diff) on a scratch image of each mapped pool, as a
replication target: every site is one at some point, the primary when a
failback replicates back to it.

No transaction is held across a check (on SQLite, a write transaction is
the database's write lock, and a check of an unreachable site waits for
its connect timeout): the service ends the request's transaction first,
runs the check, then writes, refusing with 409 `site_changed` if the site
changed meanwhile.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

from cutpoint.api.errors import ApiError, Conflict
from cutpoint.api.models import Host, Site, utcnow
from cutpoint.api.schemas.sites import (
    CephAccessPublic,
    SiteCreate,
    SitePublic,
    SiteUpdate,
    check_public,
)
from cutpoint.api.services.common import (
    add_unique,
    check_if_match,
    etag,
    get_by_name_or_404,
    get_or_404,
)
from cutpoint.coordinator.dr.site import CephSite, SiteConfigError
from sqlalchemy import select
from sqlalchemy.orm import Session

# Ceph access fields: API name -> Site column.
FIELDS = {"ceph_conf": "ceph_conf", "mon_host": "ceph_mon_host", "client_id": "ceph_client_id",
          "keyring": "ceph_keyring", "pools": "ceph_pools",
          "connect_timeout_s": "ceph_connect_timeout_s", "op_timeout_s": "ceph_op_timeout_s",
          "bulk_timeout_s": "ceph_bulk_timeout_s"}


class SiteCheckFailed(ApiError):
    """The site check failed: the problem names the failing check and its Ceph code.

    A cluster that does not answer is 503 (`ceph_unreachable`) or 504
    (`ceph_timeout`); anything else (a missing pool, keyring or ceph.conf,
    caps that refuse a step, a step whose answer is wrong) is 422: the
    site's description does not work, and a retry will not change that."""

    title = "Site check failed"

    def __init__(self, site: str, result: dict[str, Any]) -> None:
        failed: dict[str, Any] = next(
            (s for s in result["steps"] if s["status"] == "fail"), {})
        code = failed.get("code")
        where = f" (pool {failed['pool']})" if failed.get("pool") else ""
        super().__init__(
            f"site {site}: check {failed.get('name')}{where} failed: {failed.get('detail')}",
            code="site_check_failed",
            status={"ceph_unreachable": 503, "ceph_timeout": 504}.get(code or "", 422),
            extra={"site": site, "failed_check": failed.get("name"),
                   "failed_pool": failed.get("pool"), "ceph_code": code,
                   "errno": failed.get("errno"), "checks": result["steps"]})


class BadCephAccess(ApiError):
    """A Ceph access that cannot work whatever the cluster says (no pool, no mon...)."""

    status, code, title = 422, "bad_site_ceph", "Unusable Ceph access"


def site_etag(site: Site) -> str:
    return etag("site", site.id, site.version)


def by_name(session: Session, name: str) -> Site:
    return get_by_name_or_404(session, Site, name, "site")


def access_of(site: Site) -> dict[str, Any] | None:
    """The site's Ceph access as the API names its fields; None: it has none."""
    if site.ceph_pools is None:
        return None
    return {k: getattr(site, col) for k, col in FIELDS.items()}


def to_ceph_site(name: str, access: dict[str, Any]) -> CephSite:
    """A CephSite from the API's fields (SiteConfigError when it cannot work)."""
    return CephSite(name=name, pools=dict(access["pools"]), ceph_conf=access.get("ceph_conf"),
                    mon_host=tuple(access.get("mon_host") or ()),
                    client_id=access.get("client_id") or "cutpoint",
                    keyring=access.get("keyring"),
                    connect_timeout_s=int(access.get("connect_timeout_s") or 10),
                    op_timeout_s=int(access.get("op_timeout_s") or 30),
                    bulk_timeout_s=int(access.get("bulk_timeout_s") or 900))


def ceph_site(session: Session, name: str, *, timeout_s: int | None = None) -> CephSite:
    """The Ceph access of site `name`, for the control plane's Ceph calls.

    `timeout_s` caps the site's connect and per-request timeouts, for a
    caller that must answer within it whatever the site's own are (a
    failover's preconditions: site.py's deadlines then end a call to a site
    that does not answer within it).

    404 `site_not_found`; 409 `site_has_no_ceph` when none is set."""
    site = by_name(session, name)
    access = access_of(site)
    if access is None:
        raise Conflict(f"site {name!r} has no Ceph access: set it with PATCH /v1/sites/"
                       f"{site.id} (or `cutpoint site update {name} --ceph-conf ... "
                       "--pool ...`)", code="site_has_no_ceph", extra={"site": name})
    try:
        ceph = to_ceph_site(name, access)
    except SiteConfigError as exc:  # stored before a rule was added: say what to fix
        raise Conflict(str(exc), code="bad_site_ceph", extra={"site": name}) from exc
    if timeout_s is not None:
        ceph = dataclasses.replace(ceph,
                                   connect_timeout_s=min(ceph.connect_timeout_s, timeout_s),
                                   op_timeout_s=min(ceph.op_timeout_s, timeout_s))
    return ceph


def public(site: Site) -> SitePublic:
    access = access_of(site)
    return SitePublic(
        id=site.id, name=site.name, description=site.description, version=site.version,
        created_at=site.created_at,
        ceph=CephAccessPublic.model_validate(access) if access else None,
        last_check=check_public(site.ceph_check, site.ceph_checked_at)
        if site.ceph_check else None)


def validated(name: str, access: dict[str, Any]) -> CephSite:
    try:
        return to_ceph_site(name, access)
    except SiteConfigError as exc:
        raise BadCephAccess(str(exc)) from exc


def run_check(name: str, access: dict[str, Any]) -> dict[str, Any]:
    """The site check of `access` (SiteCheck.as_dict), whether it passed or not."""
    from cutpoint.coordinator.dr.site_check import check_site

    return check_site(validated(name, access), replication_target=True).as_dict()


def _store(site: Site, access: dict[str, Any] | None,
           result: dict[str, Any] | None) -> None:
    for k, col in FIELDS.items():
        setattr(site, col, access.get(k) if access else None)
    site.ceph_check = result
    site.ceph_checked_at = utcnow() if result else None


def create(session: Session, data: SiteCreate) -> Site:
    access = data.ceph.model_dump() if data.ceph else None
    if session.scalar(select(Site.id).where(Site.name == data.name)) is not None:
        raise Conflict(f"site {data.name!r} already exists", code="site_exists")
    result = None
    if access is not None:
        validated(data.name, access)
        if data.check:
            session.rollback()  # no transaction across the check (module docstring)
            result = run_check(data.name, access)
            if not result["ok"]:
                raise SiteCheckFailed(data.name, result)
    site = Site(name=data.name, description=data.description)
    _store(site, access, result)
    return add_unique(session, site, "site", data.name)


def _merged(current: dict[str, Any] | None, data: SiteUpdate) -> tuple[bool, dict[str, Any] | None]:
    """(whether the Ceph access changes, the access after the update)."""
    if "ceph" not in data.model_fields_set:
        return False, current
    if data.ceph is None:
        return current is not None, None
    given = {k: getattr(data.ceph, k) for k in data.ceph.model_fields_set}
    if current is None:
        from cutpoint.api.schemas.sites import CephAccess
        from pydantic import ValidationError

        try:
            new = CephAccess.model_validate(given).model_dump()
        except ValidationError as exc:  # its messages only: never the input
            why = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'ceph'}: {e['msg']}"
                            for e in exc.errors())
            raise BadCephAccess(f"the site has no Ceph access yet: give all of it ({why})") \
                from None
        return True, new
    new = {**current, **given}
    for k in ("client_id", "pools", "connect_timeout_s", "op_timeout_s", "bulk_timeout_s"):
        if new.get(k) is None:
            raise BadCephAccess(f"ceph.{k} cannot be removed")
    if (new.get("ceph_conf") is None) == (new.get("mon_host") is None):
        raise BadCephAccess("give ceph_conf or mon_host (exactly one): set the other to null")
    return new != current, new


def update(session: Session, site_id: int, data: SiteUpdate, if_match: str | None) -> Site:
    site = get_or_404(session, Site, site_id, "site")
    check_if_match(if_match, site_etag(site))
    changed, access = _merged(access_of(site), data)
    result = None
    if changed and access is not None:
        validated(site.name, access)
        if data.check:
            version, name = site.version, site.name
            session.rollback()  # no transaction across the check (module docstring)
            result = run_check(name, access)
            if not result["ok"]:
                raise SiteCheckFailed(name, result)
            site = get_or_404(session, Site, site_id, "site")
            if site.version != version:
                raise Conflict(f"site {name!r} changed while it was checked; try again",
                               code="site_changed")
    if data.description is not None:
        site.description = data.description
    if changed:
        _store(site, access, result)
    site.version += 1
    session.commit()
    return site


def check(session: Session, site_id: int) -> tuple[dict[str, Any], dt.datetime]:
    """Check the site's Ceph access now and keep the result on the site;
    a failed check is kept too, then raised as SiteCheckFailed."""
    site = get_or_404(session, Site, site_id, "site")
    access = access_of(site)
    if access is None:
        raise Conflict(f"site {site.name!r} has no Ceph access to check",
                       code="site_has_no_ceph", extra={"site": site.name})
    version, name = site.version, site.name
    session.rollback()  # no transaction across the check (module docstring)
    result = run_check(name, access)
    now = utcnow()
    site = get_or_404(session, Site, site_id, "site")
    if site.version == version:  # else the result is of an access that is gone
        site.ceph_check, site.ceph_checked_at = result, now
        session.commit()
    if not result["ok"]:
        raise SiteCheckFailed(name, result)
    return result, now


def delete(session: Session, site_id: int, if_match: str | None) -> None:
    site = get_or_404(session, Site, site_id, "site")
    check_if_match(if_match, site_etag(site))
    if session.scalar(select(Host.id).where(Host.site_id == site_id).limit(1)) is not None:
        raise Conflict(f"site {site.name!r} still has hosts", code="site_in_use")
    session.delete(site)
    session.commit()
