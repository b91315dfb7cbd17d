"""The lab's Ceph sites as the product takes them: registered through the
API, reached as the control plane's client.

    ceph_site(status, "dr")                  -> CephSite (client.cutpoint)
    ceph_site(status, "dr", role="readonly") -> CephSite (client.cutpoint-ro)
    registration(status, "dr")               -> body of POST /v1/sites
    cli_args(status, "dr")                   -> options of `cutpoint site add`

Roles are the clients the lab creates per site (`cutpoint.lab.ceph.CLIENTS`:
`cutpoint`, `readonly`) and `admin`, the lab's own tools' client.  Every
site maps the pool its disks carry (`rbd`) to itself.
"""

from __future__ import annotations

from typing import Any

from cutpoint.coordinator.dr.site import CephSite
from cutpoint.lab.errors import LabError


def access(status: dict[str, Any], name: str, role: str = "cutpoint") -> dict[str, Any]:
    """The Ceph access of lab site `name` as `role`, in the API's fields."""
    try:
        s = status["sites"][name]
    except KeyError:
        raise LabError(f"the lab has no site {name!r} "
                       f"(its sites: {sorted(status.get('sites', {}))})") from None
    if role == "admin":
        client_id, keyring = s["client_id"], s["keyring"]
    else:
        try:
            c = s["clients"][role]
        except KeyError:
            raise LabError(f"lab site {name} has no client {role!r} "
                           f"(its clients: {sorted(s.get('clients', {}))})") from None
        client_id, keyring = c["client_id"], c["keyring"]
    return {"ceph_conf": s["ceph_conf"], "client_id": client_id, "keyring": keyring,
            "pools": {s["pool"]: s["pool"]}}


def ceph_site(status: dict[str, Any], name: str, role: str = "cutpoint",
              **kw: Any) -> CephSite:
    a = access(status, name, role)
    return CephSite(name, pools=a["pools"], ceph_conf=a["ceph_conf"],
                    client_id=a["client_id"], keyring=a["keyring"], **kw)


def registration(status: dict[str, Any], name: str, role: str = "cutpoint",
                 **kw: Any) -> dict[str, Any]:
    """The body of `POST /v1/sites` for lab site `name` (extra fields: `kw`)."""
    return {"name": name, "description": f"lab site {name}",
            "ceph": access(status, name, role), **kw}


def cli_args(status: dict[str, Any], name: str, role: str = "cutpoint") -> list[str]:
    """`cutpoint site add NAME` options for lab site `name`."""
    a = access(status, name, role)
    argv = ["--ceph-conf", a["ceph_conf"], "--client-id", a["client_id"],
            "--keyring", a["keyring"]]
    for logical, real in a["pools"].items():
        argv += ["--pool", f"{logical}={real}" if logical != real else logical]
    return argv
