"""A site's Ceph access as `cutpoint.coordinator.dr.site.CephSite`, for the
control plane's own librados/librbd calls (failover preconditions, fencing).

    site = ceph_site("dr", timeout_s=10)    # NoCephSite when not configured

The description comes from where the control plane keeps sites' Ceph access
(today `replication.ceph_sites()`); `timeout_s` caps the connect and the
per-request timeouts, so a call to a site that does not answer ends within
it (site.py's deadlines).
"""

from __future__ import annotations

import dataclasses

from cutpoint.coordinator.dr.site import CephSite, SiteConfigError


class NoCephSite(LookupError):
    """The site has no usable Ceph access configured (the message says why)."""


def ceph_site(name: str, *, timeout_s: int | None = None) -> CephSite:
    from cutpoint.api.services.replication import ReplicationFailed, ceph_sites

    try:
        sites = ceph_sites()
    except ReplicationFailed as exc:
        raise NoCephSite(str(exc)) from exc
    if name not in sites:
        raise NoCephSite(f"no Ceph configuration for site {name!r} (have {sorted(sites)})")
    try:
        site = CephSite.from_mapping(name, sites[name])
    except (SiteConfigError, TypeError, ValueError) as exc:
        raise NoCephSite(f"the Ceph configuration of site {name!r} is unusable: {exc}") \
            from exc
    if timeout_s is not None:
        site = dataclasses.replace(site, connect_timeout_s=min(site.connect_timeout_s, timeout_s),
                                   op_timeout_s=min(site.op_timeout_s, timeout_s))
    return site
