"""Sites and their Ceph access, split by purpose.

The key of the site's cephx client stays in its keyring file: requests and
responses carry the keyring's path, never a key.  A path field only takes
an absolute path on one line, so a key or a pasted keyring is refused
(and the refusal does not repeat what was sent).
"""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any

from cutpoint.api.schemas.common import Description, Name, Public, Strict
from pydantic import AfterValidator, Field, StringConstraints, model_validator

FilePath = Annotated[str, StringConstraints(pattern=r"^/[^\x00-\x1f]{0,1022}$")]
MonAddr = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9.:\[\]/_-]{1,255}$")]
ClientId = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"),
                     AfterValidator(lambda v: _bare_id(v))]
PoolName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")]

def _bare_id(v: str) -> str:
    if v.startswith("client."):
        raise ValueError("the cephx id without 'client.' (e.g. cutpoint)")
    return v


CONF_DOC = "Path of the site's ceph.conf on the control plane's machines"
MON_DOC = "Mon addresses (e.g. v2:10.0.0.1:3300), instead of a ceph.conf"
ID_DOC = "The cephx client id, without `client.`"
KEYRING_DOC = ("Path of that client's keyring on the control plane's machines (never the key); "
               "empty: Ceph's default search")
POOLS_DOC = ("Pool map: the pool name cutpoint's disks carry (as the primary's agents report "
             "it) -> the pool at this site")


class CephAccess(Strict):
    """How the control plane reaches a site's Ceph cluster."""

    ceph_conf: FilePath | None = Field(default=None, description=CONF_DOC)
    mon_host: list[MonAddr] | None = Field(default=None, min_length=1, max_length=16,
                                           description=MON_DOC)
    client_id: ClientId = Field(default="cutpoint", description=ID_DOC)
    keyring: FilePath | None = Field(default=None, description=KEYRING_DOC)
    pools: dict[PoolName, PoolName] = Field(min_length=1, max_length=64,
                                            description=POOLS_DOC)
    connect_timeout_s: int = Field(default=10, ge=1, le=600)
    op_timeout_s: int = Field(default=30, ge=1, le=3600)
    bulk_timeout_s: int = Field(default=900, ge=1, le=86400)

    @model_validator(mode="after")
    def _one_way_to_the_mons(self) -> CephAccess:
        # cutpoint-sync reads one ceph.conf; a file plus addresses that
        # override it cannot be handed over as one.
        if (self.ceph_conf is None) == (self.mon_host is None):
            raise ValueError("give ceph_conf or mon_host (exactly one)")
        return self


class CephAccessUpdate(Strict):
    """The fields to change (absent: keep).  `ceph_conf`, `mon_host` and
    `keyring` may be set to null, e.g. to move from a file to addresses."""

    ceph_conf: FilePath | None = Field(default=None, description=CONF_DOC)
    mon_host: list[MonAddr] | None = Field(default=None, min_length=1, max_length=16,
                                           description=MON_DOC)
    client_id: ClientId | None = Field(default=None, description=ID_DOC)
    keyring: FilePath | None = Field(default=None, description=KEYRING_DOC)
    pools: dict[PoolName, PoolName] | None = Field(default=None, min_length=1, max_length=64,
                                                   description=POOLS_DOC)
    connect_timeout_s: int | None = Field(default=None, ge=1, le=600)
    op_timeout_s: int | None = Field(default=None, ge=1, le=3600)
    bulk_timeout_s: int | None = Field(default=None, ge=1, le=86400)


CHECK_DOC = ("Run the site check (connect, pools, snapshot, write, diff) and refuse the "
             "change when it fails; false only to set a site up before its cluster is "
             "reachable")


class SiteCreate(Strict):
    name: Name
    description: Description = ""
    ceph: CephAccess | None = Field(default=None, description="None: no Ceph cluster")
    check: bool = Field(default=True, description=CHECK_DOC)


class SiteUpdate(Strict):
    description: Description | None = None
    ceph: CephAccessUpdate | None = Field(
        default=None, description="Fields of the Ceph access to change; null removes it")
    check: bool = Field(default=True, description=CHECK_DOC)


class CheckStepPublic(Public):
    name: str
    status: str = Field(description="pass | fail | skip")
    detail: str
    pool: str | None = None
    code: str | None = Field(default=None, description="the Ceph error code of a failure")
    errno: int | None = None
    ms: float


class SnapshotLatencyPublic(Public):
    pool: str
    samples_ms: list[float] = Field(description="each timed snapshot of the scratch image")
    p50_ms: float
    p99_ms: float
    in_pause_pause_p50_ms: float = Field(
        description="a VM's pause on the agents' in_pause path at this site (its disks' "
                    "snapshots in parallel, plus the coordination); the redirect path "
                    "does not wait for snapshots (agent-protocol §5.1)")
    in_pause_pause_p99_ms: float


class SiteCheckPublic(Public):
    site: str
    ok: bool
    replication_target: bool
    failed_check: str | None
    failed_pool: str | None
    steps: list[CheckStepPublic]
    snapshot_latency: list[SnapshotLatencyPublic] = Field(
        default_factory=list, description="per pool, from the check's snapshot_latency step")
    checked_at: dt.datetime | None = None


class CephAccessPublic(Public):
    ceph_conf: str | None
    mon_host: list[str] | None
    client_id: str
    keyring: str | None = Field(description="the keyring's path (the key is never stored)")
    pools: dict[str, str]
    connect_timeout_s: int
    op_timeout_s: int
    bulk_timeout_s: int


class SitePublic(Public):
    id: int
    name: str
    description: str
    version: int
    created_at: dt.datetime
    ceph: CephAccessPublic | None = None
    last_check: SiteCheckPublic | None = None


def check_public(result: dict[str, Any], checked_at: dt.datetime | None) -> SiteCheckPublic:
    return SiteCheckPublic.model_validate({**result, "checked_at": checked_at})
