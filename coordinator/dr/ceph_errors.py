"""Typed errors of Ceph access (`cutpoint.coordinator.dr.site`).

Every failure of a librados/librbd call reaches the caller as one of these,
never as a binding exception or a CLI's stderr:

    CephError                   code ceph_error: any other errno
      CephNotFound              ceph_not_found: pool, image, snapshot, keyring or ceph.conf
      CephExists                ceph_exists: image or snapshot already there
      CephPermissionDenied      ceph_permission_denied: the client's caps or key
      CephTimeout               ceph_timeout: connected, but a mon or OSD did not answer
      CephUnreachable           ceph_unreachable: no mon answered the connect

Each carries the operation (`op`, e.g. "create snapshot"), the object it
was applied to (`obj`, e.g. "rbd/vm1-disk0@cp.web.0001"), the site name,
the positive errno (None when no call returned one) and the binding's own
message (`detail`).  `code` is stable: API problem responses use it as is.
Nothing here reads a keyring; a message names the keyring path at most.
"""

from __future__ import annotations

import errno as E
import os
from typing import Any


class CephError(Exception):
    """A Ceph call failed; the subclasses name the failures callers act on."""

    code = "ceph_error"

    def __init__(self, op: str, obj: str, errno: int | None, *, site: str = "",
                 detail: str = "") -> None:
        self.op = op
        self.obj = obj
        self.errno = errno
        self.site = site
        self.detail = detail
        why = os.strerror(errno) if errno else (detail or "failed")
        where = f"site {site}: " if site else ""
        super().__init__(f"{where}{op} {obj}: {why}"
                         + (f" (errno {errno})" if errno else ""))

    def as_dict(self) -> dict[str, Any]:
        return {"code": self.code, "site": self.site, "op": self.op, "object": self.obj,
                "errno": self.errno, "message": str(self), "detail": self.detail}


class CephNotFound(CephError):
    code = "ceph_not_found"


class CephExists(CephError):
    code = "ceph_exists"


class CephPermissionDenied(CephError):
    code = "ceph_permission_denied"


class CephTimeout(CephError):
    code = "ceph_timeout"


class CephUnreachable(CephError):
    code = "ceph_unreachable"


# errno of a call on a connected cluster -> error class.  librados turns an
# expired rados_mon_op_timeout / rados_osd_op_timeout into ETIMEDOUT.
_BY_ERRNO: dict[int, type[CephError]] = {
    E.ENOENT: CephNotFound,
    E.EEXIST: CephExists,
    E.EACCES: CephPermissionDenied,
    E.EPERM: CephPermissionDenied,
    E.ETIMEDOUT: CephTimeout,
}

# errno of a failed connect.  A mon that never answers ends the connect
# with ETIMEDOUT after client_mount_timeout: an unreachable cluster, not a
# slow call.  A rejected key is EACCES/EPERM and a missing keyring or
# ceph.conf ENOENT: those keep their own class.  Anything else (EIO: a
# keyring librados cannot parse) is a plain CephError.
_CONNECT_BY_ERRNO: dict[int, type[CephError]] = {
    E.ENOENT: CephNotFound,
    E.EACCES: CephPermissionDenied,
    E.EPERM: CephPermissionDenied,
    **dict.fromkeys((E.ETIMEDOUT, E.ECONNREFUSED, E.ECONNRESET, E.EHOSTUNREACH,
                     E.ENETUNREACH, E.ENOTCONN, E.ESHUTDOWN), CephUnreachable),
}


def errno_of(exc: BaseException) -> int | None:
    """The positive errno a binding exception carries (librados gives it either sign)."""
    n = getattr(exc, "errno", None)
    return abs(n) if isinstance(n, int) and n else None


def from_binding(exc: BaseException, op: str, obj: str, *, site: str = "",
                 connecting: bool = False) -> CephError:
    """The typed error for an exception raised by the rados/rbd bindings."""
    n = errno_of(exc)
    table = _CONNECT_BY_ERRNO if connecting else _BY_ERRNO
    cls = table.get(n, CephError) if n else CephError
    return cls(op, obj, n, site=site, detail=str(exc))
