"""The database: SQLAlchemy 2 typed models.

Ownership of rows:
- sites/hosts are operator-defined; vms/disks mirror agent inventories
  (`inventory_sync`) and are never edited through the API.
- a group's disks are materialised in `group_disks`, whose primary key is
  the disk id: the database itself refuses a disk in two groups.
- `group_snapshots.inflight_group_id` equals `group_id` while a snapshot is
  not terminal and NULL afterwards; its UNIQUE constraint is the durable half
  of "a group never has two snapshots in flight" (the Redis lock is the fast
  half, and it expires if a worker dies).

Group snapshot states (DESIGN.md, two-phase commit):

    pending --> preparing --> committing --> committed --> deleting --> deleted
        \\           \\              \\
         \\           +--> aborting --+--> aborted
          +--> failed (never started: refused by lock, agent unreachable)
"""

from __future__ import annotations

import datetime as dt
import enum
from typing import Any, ClassVar, overload

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Enum,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
    text,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


@overload
def as_utc(t: None) -> None: ...
@overload
def as_utc(t: dt.datetime) -> dt.datetime: ...
def as_utc(t: dt.datetime | None) -> dt.datetime | None:
    """`t` in UTC: a time read back without its zone (the columns are UTC)."""
    return t if t is None or t.tzinfo is not None else t.replace(tzinfo=dt.UTC)


class UTCDateTime(TypeDecorator[dt.datetime]):
    """Timezone-aware UTC on the way out, on SQLite as on PostgreSQL."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: dt.datetime | None, dialect: Dialect) -> Any:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to the database")
        return value.astimezone(dt.UTC)

    def process_result_value(self, value: Any, dialect: Dialect) -> dt.datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=dt.UTC)
        return value.astimezone(dt.UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)
    type_annotation_map: ClassVar[dict[Any, Any]] = {dt.datetime: UTCDateTime}


def _enum(e: type[enum.Enum], name: str) -> Enum:
    return Enum(e, name=name, native_enum=False, create_constraint=True, length=16,
                values_callable=lambda x: [m.value for m in x], validate_strings=True)


class Role(str, enum.Enum):
    viewer = "viewer"
    operator = "operator"
    admin = "admin"


class Quiesce(str, enum.Enum):
    crash = "crash"
    fs_freeze = "fs-freeze"


class SnapState(str, enum.Enum):
    pending = "pending"
    preparing = "preparing"
    committing = "committing"
    committed = "committed"
    aborting = "aborting"
    aborted = "aborted"
    failed = "failed"
    deleting = "deleting"
    deleted = "deleted"


IN_FLIGHT = (SnapState.pending, SnapState.preparing, SnapState.committing, SnapState.aborting)
TERMINAL = (SnapState.committed, SnapState.aborted, SnapState.failed, SnapState.deleted)


class JobState(str, enum.Enum):
    queued = "queued"
    running = "running"
    succeeded = "succeeded"
    failed = "failed"


class Site(Base):
    __tablename__ = "sites"
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    description: Mapped[str] = mapped_column(String(255), default="")
    version: Mapped[int] = mapped_column(Integer, default=1)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    # Ceph access (cutpoint.coordinator.dr.site.CephSite); no pool map: the
    # site has no Ceph cluster cutpoint reaches.  The key stays in the
    # keyring file: only its path is stored.
    ceph_conf: Mapped[str | None] = mapped_column(String(1024), default=None)
    ceph_mon_host: Mapped[list[str] | None] = mapped_column(JSON, default=None)
    ceph_client_id: Mapped[str | None] = mapped_column(String(64), default=None)
    ceph_keyring: Mapped[str | None] = mapped_column(String(1024), default=None)
    ceph_pools: Mapped[dict[str, str] | None] = mapped_column(JSON, default=None)
    ceph_connect_timeout_s: Mapped[int | None] = mapped_column(Integer, default=None)
    ceph_op_timeout_s: Mapped[int | None] = mapped_column(Integer, default=None)
    ceph_bulk_timeout_s: Mapped[int | None] = mapped_column(Integer, default=None)
    # The newest site check of the current access (site_check.SiteCheck.as_dict).
    ceph_check: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    ceph_checked_at: Mapped[dt.datetime | None] = mapped_column(default=None)


class Host(Base):
    __tablename__ = "hosts"
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    site_id: Mapped[int] = mapped_column(ForeignKey("sites.id", ondelete="RESTRICT"), index=True)
    address: Mapped[str] = mapped_column(String(255))
    port: Mapped[int] = mapped_column(Integer, default=7443)
    # SHA-256 of the agent's DER certificate, hex; pinned on top of the CA.
    cert_fingerprint: Mapped[str | None] = mapped_column(String(95), default=None)
    reachable: Mapped[bool | None] = mapped_column(Boolean, default=None)
    last_seen_at: Mapped[dt.datetime | None] = mapped_column(default=None)
    last_error: Mapped[str | None] = mapped_column(Text, default=None)
    agent_version: Mapped[str | None] = mapped_column(String(64), default=None)
    # When the agent's certificate expires, as it presented it at the last
    # inventory pull (metric cutpoint_agent_cert_expiry_timestamp_seconds).
    cert_not_after: Mapped[dt.datetime | None] = mapped_column(default=None)
    # The agent inventory last applied (agent-protocol §4.2 `instance` and
    # `generation`): the inventory watch applies a reply only when they
    # differ, so an unchanged host costs one small call and no write.
    inventory_instance: Mapped[str | None] = mapped_column(String(32), default=None)
    inventory_generation: Mapped[int | None] = mapped_column(BigInteger, default=None)
    # Some hypervisor connection of the agent is down: its VMs' state is the
    # last one seen.
    inventory_stale: Mapped[bool] = mapped_column(Boolean, default=False)
    version: Mapped[int] = mapped_column(Integer, default=1)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    site: Mapped[Site] = relationship(lazy="joined")
    __table_args__ = (CheckConstraint("port > 0 AND port < 65536", name="port_range"),)


class Vm(Base):
    __tablename__ = "vms"
    id: Mapped[int] = mapped_column(primary_key=True)
    host_id: Mapped[int] = mapped_column(ForeignKey("hosts.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(128))
    # The VM's identity across hosts (inventory `uid`): a libvirt domain's
    # UUID, or a raw-QEMU VM's configured id; None when the agent gives none
    # (then host + name is all there is).  A VM reported under a known uid
    # by another host is this row, moved (services/vm_identity.py).
    uid: Mapped[str | None] = mapped_column(String(64), default=None, unique=True)
    driver: Mapped[str] = mapped_column(String(32), default="qemu")
    state: Mapped[str] = mapped_column(String(16), default="unknown")
    present: Mapped[bool] = mapped_column(Boolean, default=True)
    stale: Mapped[bool] = mapped_column(Boolean, default=False)
    synced_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    host: Mapped[Host] = relationship(lazy="joined")
    disks: Mapped[list[Disk]] = relationship(back_populates="vm", order_by="Disk.node")
    __table_args__ = (UniqueConstraint("host_id", "name", name="uq_vms_host_name"),)


class Disk(Base):
    __tablename__ = "disks"
    id: Mapped[int] = mapped_column(primary_key=True)
    vm_id: Mapped[int] = mapped_column(ForeignKey("vms.id", ondelete="CASCADE"), index=True)
    node: Mapped[str] = mapped_column(String(64))
    key: Mapped[str] = mapped_column(String(200))  # "<vm>/<node>", the agent's disk id
    backend: Mapped[str] = mapped_column(String(16))
    pool: Mapped[str | None] = mapped_column(String(128), default=None)
    image: Mapped[str | None] = mapped_column(String(255), default=None)
    file: Mapped[str | None] = mapped_column(String(1024), default=None)
    # Bytes, as the agent saw the image when it opened it; None: not known.
    size_bytes: Mapped[int | None] = mapped_column(BigInteger, default=None)
    present: Mapped[bool] = mapped_column(Boolean, default=True)
    vm: Mapped[Vm] = relationship(back_populates="disks")
    __table_args__ = (UniqueConstraint("vm_id", "node", name="uq_disks_vm_node"),)


class Group(Base):
    __tablename__ = "groups"
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    description: Mapped[str] = mapped_column(String(255), default="")
    enabled: Mapped[bool] = mapped_column(Boolean, default=True)
    version: Mapped[int] = mapped_column(Integer, default=1)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    members: Mapped[list[GroupMember]] = relationship(
        back_populates="group", cascade="all, delete-orphan", order_by="GroupMember.id")
    policy: Mapped[Policy] = relationship(
        back_populates="group", cascade="all, delete-orphan", uselist=False)


class GroupMember(Base):
    """What the operator added: a whole VM (all its disks, now and later) or one disk."""

    __tablename__ = "group_members"
    id: Mapped[int] = mapped_column(primary_key=True)
    group_id: Mapped[int] = mapped_column(ForeignKey("groups.id", ondelete="CASCADE"), index=True)
    vm_id: Mapped[int | None] = mapped_column(
        ForeignKey("vms.id", ondelete="CASCADE"), default=None, unique=True)
    disk_id: Mapped[int | None] = mapped_column(
        ForeignKey("disks.id", ondelete="CASCADE"), default=None, unique=True)
    group: Mapped[Group] = relationship(back_populates="members")
    vm: Mapped[Vm | None] = relationship(lazy="joined")
    disk: Mapped[Disk | None] = relationship(lazy="joined")
    __table_args__ = (
        CheckConstraint("(vm_id IS NULL) <> (disk_id IS NULL)", name="vm_xor_disk"),
    )


class GroupDisk(Base):
    """The disks a group snapshots; the primary key makes membership exclusive."""

    __tablename__ = "group_disks"
    disk_id: Mapped[int] = mapped_column(
        ForeignKey("disks.id", ondelete="CASCADE"), primary_key=True)
    group_id: Mapped[int] = mapped_column(ForeignKey("groups.id", ondelete="CASCADE"), index=True)
    member_id: Mapped[int] = mapped_column(
        ForeignKey("group_members.id", ondelete="CASCADE"), index=True)
    disk: Mapped[Disk] = relationship(lazy="joined")


class Policy(Base):
    __tablename__ = "policies"
    group_id: Mapped[int] = mapped_column(
        ForeignKey("groups.id", ondelete="CASCADE"), primary_key=True)
    rpo_seconds: Mapped[int | None] = mapped_column(Integer, default=None)  # None: no schedule
    keep_last: Mapped[int] = mapped_column(Integer, default=24)
    keep_within_seconds: Mapped[int] = mapped_column(Integer, default=0)
    pause_budget_ms: Mapped[int] = mapped_column(Integer, default=2000)
    lease_ms: Mapped[int] = mapped_column(Integer, default=5000)
    replication_target_id: Mapped[int | None] = mapped_column(
        ForeignKey("sites.id", ondelete="SET NULL"), default=None)
    quiesce: Mapped[Quiesce] = mapped_column(_enum(Quiesce, "quiesce"), default=Quiesce.crash)
    # A drill of the newest DR recovery point this often (services/drill_schedule.py);
    # None: drills only when asked for.
    drill_every_seconds: Mapped[int | None] = mapped_column(Integer, default=None)
    version: Mapped[int] = mapped_column(Integer, default=1)
    group: Mapped[Group] = relationship(back_populates="policy")
    replication_target: Mapped[Site | None] = relationship(lazy="joined")
    __table_args__ = (
        CheckConstraint("rpo_seconds IS NULL OR rpo_seconds > 0", name="rpo_positive"),
        CheckConstraint("keep_last >= 1", name="keep_last_min"),
        CheckConstraint("keep_within_seconds >= 0", name="keep_within_min"),
        CheckConstraint("pause_budget_ms > 0", name="budget_positive"),
        CheckConstraint("lease_ms > 0", name="lease_positive"),
        CheckConstraint("drill_every_seconds IS NULL OR drill_every_seconds > 0",
                        name="drill_every_positive"),
    )


class GroupSnapshot(Base):
    __tablename__ = "group_snapshots"
    id: Mapped[int] = mapped_column(primary_key=True)
    group_id: Mapped[int] = mapped_column(ForeignKey("groups.id", ondelete="CASCADE"), index=True)
    txn: Mapped[str] = mapped_column(String(64), unique=True)
    state: Mapped[SnapState] = mapped_column(_enum(SnapState, "snap_state"),
                                             default=SnapState.pending)
    inflight_group_id: Mapped[int | None] = mapped_column(Integer, default=None, unique=True)
    trigger: Mapped[str] = mapped_column(String(16), default="manual")
    job_id: Mapped[str | None] = mapped_column(String(36), default=None, index=True)
    requested_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    started_at: Mapped[dt.datetime | None] = mapped_column(default=None)
    # The instant the cut was fixed (every VM paused, COMMITTING written).
    cut_at: Mapped[dt.datetime | None] = mapped_column(default=None)
    finished_at: Mapped[dt.datetime | None] = mapped_column(default=None)
    max_pause_ms: Mapped[float | None] = mapped_column(Float, default=None)
    duration_ms: Mapped[float | None] = mapped_column(Float, default=None)
    # Reached: the weakest level of its members (crash | fs-freeze).
    consistency: Mapped[str | None] = mapped_column(String(16), default=None)
    # Requested: the group policy's quiesce when the snapshot ran.
    quiesce: Mapped[str | None] = mapped_column(String(16), default=None)
    # Set by replication: a DR recovery point / the base of the next increment.
    dr_verified_at: Mapped[dt.datetime | None] = mapped_column(default=None)
    replication_base: Mapped[bool] = mapped_column(Boolean, default=False)
    error_code: Mapped[str | None] = mapped_column(String(64), default=None)
    error: Mapped[str | None] = mapped_column(Text, default=None)
    members: Mapped[list[MemberSnapshot]] = relationship(
        back_populates="group_snapshot", cascade="all, delete-orphan",
        order_by="MemberSnapshot.id")
    __table_args__ = (
        Index("ix_group_snapshots_group_state", "group_id", "state"),
        CheckConstraint("inflight_group_id IS NULL OR inflight_group_id = group_id",
                        name="inflight_matches"),
    )


class MemberSnapshot(Base):
    __tablename__ = "member_snapshots"
    id: Mapped[int] = mapped_column(primary_key=True)
    group_snapshot_id: Mapped[int] = mapped_column(
        ForeignKey("group_snapshots.id", ondelete="CASCADE"), index=True)
    disk_id: Mapped[int | None] = mapped_column(
        ForeignKey("disks.id", ondelete="SET NULL"), default=None)
    host: Mapped[str] = mapped_column(String(64))
    vm: Mapped[str] = mapped_column(String(128))
    disk: Mapped[str] = mapped_column(String(200))  # "<vm>/<node>"
    name: Mapped[str] = mapped_column(String(255))  # cp.<group>.<txn>
    state: Mapped[str] = mapped_column(String(16), default="planned")  # planned|present|deleted
    consistency: Mapped[str | None] = mapped_column(String(16), default=None)
    method: Mapped[str | None] = mapped_column(String(32), default=None)
    stop_ms: Mapped[float | None] = mapped_column(Float, default=None)
    barrier_ms: Mapped[float | None] = mapped_column(Float, default=None)
    snapshot_ms: Mapped[float | None] = mapped_column(Float, default=None)
    cont_ms: Mapped[float | None] = mapped_column(Float, default=None)
    paused_ms: Mapped[float | None] = mapped_column(Float, default=None)
    # quiesce fs-freeze (agent-protocol §4.3): time spent freezing the guest
    # before the pause, thawing it after, and why it fell back to crash
    # (`consistency` above is the level the member reached).
    freeze_ms: Mapped[float | None] = mapped_column(Float, default=None)
    thaw_ms: Mapped[float | None] = mapped_column(Float, default=None)
    freeze_error: Mapped[str | None] = mapped_column(Text, default=None)
    # How the agent cut the member's VM: "live" (disks switched onto
    # overlays with the VM running, its network held), "redirect" (that
    # switch in the pause, the snapshot after `cont`) or "in_pause"
    # (agent-protocol §5.1; migration 0013).
    pause_path: Mapped[str | None] = mapped_column(String(16), default=None)
    # Why a VM that can take the redirect cut was cut in the pause (its
    # pause followed the backend); migration 0017.
    pause_path_why: Mapped[str | None] = mapped_column(Text, default=None)
    # Why the thaw after `cont` failed (agent-protocol §4.4): the snapshot
    # stands, but the guest may still be frozen (migration 0005).
    thaw_error: Mapped[str | None] = mapped_column(Text, default=None)
    group_snapshot: Mapped[GroupSnapshot] = relationship(back_populates="members")


class Job(Base):
    __tablename__ = "jobs"
    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    kind: Mapped[str] = mapped_column(String(32), index=True)
    state: Mapped[JobState] = mapped_column(_enum(JobState, "job_state"), default=JobState.queued)
    progress: Mapped[float] = mapped_column(Float, default=0.0)
    message: Mapped[str] = mapped_column(String(255), default="")
    group_id: Mapped[int | None] = mapped_column(
        ForeignKey("groups.id", ondelete="SET NULL"), default=None, index=True)
    host_id: Mapped[int | None] = mapped_column(
        ForeignKey("hosts.id", ondelete="SET NULL"), default=None)
    snapshot_id: Mapped[int | None] = mapped_column(
        ForeignKey("group_snapshots.id", ondelete="SET NULL"), default=None)
    params: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    result: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    error_code: Mapped[str | None] = mapped_column(String(64), default=None)
    error: Mapped[str | None] = mapped_column(Text, default=None)
    created_by: Mapped[str | None] = mapped_column(String(64), default=None)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    started_at: Mapped[dt.datetime | None] = mapped_column(default=None)
    finished_at: Mapped[dt.datetime | None] = mapped_column(default=None)
    __table_args__ = (
        # One drill of a group queued or running at a time, kept by the
        # database: two requests that both saw none cannot both insert
        # (services/drills.py answers the loser 409 drill_in_progress;
        # migration 0016).
        Index("uq_jobs_one_active_drill", "group_id", unique=True,
              sqlite_where=text("kind = 'drill' AND state IN ('queued', 'running')"),
              postgresql_where=text("kind = 'drill' AND state IN ('queued', 'running')")),
    )


class JobEvent(Base):
    """One step of a job, as it happened: the job's own record of what it did.

    `t_s` counts from the job's origin (a failover: the HTTP request), `at`
    is the wall clock.  `status`: ok, failed, skipped or info."""

    __tablename__ = "job_events"
    id: Mapped[int] = mapped_column(primary_key=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    seq: Mapped[int] = mapped_column(Integer)
    at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    t_s: Mapped[float | None] = mapped_column(Float, default=None)
    step: Mapped[str] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(16), default="ok")
    detail: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    __table_args__ = (UniqueConstraint("job_id", "seq", name="uq_job_events_job_seq"),)


class Webhook(Base):
    """A subscription: events of these kinds are POSTed to `url`, signed with
    HMAC-SHA256 by the secret in `secret_file` (a path on the control plane
    hosts: the secret itself is never stored here, nor logged)."""

    __tablename__ = "webhooks"
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    url: Mapped[str] = mapped_column(String(2048))
    events: Mapped[list[str]] = mapped_column(JSON, default=list)
    secret_file: Mapped[str] = mapped_column(String(1024))
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)


class WebhookDelivery(Base):
    """One event for one subscription, until it is delivered or given up."""

    __tablename__ = "webhook_deliveries"
    id: Mapped[int] = mapped_column(primary_key=True)
    webhook_id: Mapped[int] = mapped_column(
        ForeignKey("webhooks.id", ondelete="CASCADE"), index=True)
    event: Mapped[str] = mapped_column(String(64))
    payload: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    state: Mapped[str] = mapped_column(String(16), default="pending", index=True)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    last_status: Mapped[int | None] = mapped_column(Integer, default=None)
    last_error: Mapped[str | None] = mapped_column(Text, default=None)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    next_attempt_at: Mapped[dt.datetime] = mapped_column(default=utcnow, index=True)
    delivered_at: Mapped[dt.datetime | None] = mapped_column(default=None)


class PrunedJobFailures(Base):
    """Failed jobs that history pruning deleted, counted per kind and code:
    `cutpoint_job_failures_total` is a counter, and it must not go down
    when old jobs go (services/history.py)."""

    __tablename__ = "pruned_job_failures"
    kind: Mapped[str] = mapped_column(String(32), primary_key=True)
    error_code: Mapped[str] = mapped_column(String(64), primary_key=True)
    count: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), default=0)


class RpoMiss(Base):
    __tablename__ = "rpo_misses"
    id: Mapped[int] = mapped_column(primary_key=True)
    group_id: Mapped[int] = mapped_column(ForeignKey("groups.id", ondelete="CASCADE"), index=True)
    at: Mapped[dt.datetime] = mapped_column(default=utcnow, index=True)
    reason: Mapped[str] = mapped_column(String(64))
    detail: Mapped[str] = mapped_column(Text, default="")
    achieved_rpo_s: Mapped[float | None] = mapped_column(Float, default=None)
    rpo_seconds: Mapped[int] = mapped_column(Integer)
    snapshot_id: Mapped[int | None] = mapped_column(
        ForeignKey("group_snapshots.id", ondelete="SET NULL"), default=None)


class ApiToken(Base):
    __tablename__ = "api_tokens"
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    role: Mapped[Role] = mapped_column(_enum(Role, "role"))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    last_used_at: Mapped[dt.datetime | None] = mapped_column(default=None)
    revoked_at: Mapped[dt.datetime | None] = mapped_column(default=None)


class AuditEntry(Base):
    __tablename__ = "audit_log"
    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"),
                                    primary_key=True)
    at: Mapped[dt.datetime] = mapped_column(default=utcnow, index=True)
    actor: Mapped[str | None] = mapped_column(String(64), default=None)
    role: Mapped[str | None] = mapped_column(String(16), default=None)
    method: Mapped[str] = mapped_column(String(8))
    path: Mapped[str] = mapped_column(String(512))
    status: Mapped[int] = mapped_column(Integer)
    request_id: Mapped[str] = mapped_column(String(36))
    remote: Mapped[str | None] = mapped_column(String(64), default=None)
    detail: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)


# --- DR: replication, DR retention, fencing, drills --------------------------


class MemberReplication(Base):
    """One member disk of a group snapshot copied to the DR site by cutpoint-sync.

    pending --> copying --> verified
                      \\--> failed
    The group snapshot becomes a DR recovery point (dr_verified_at) only when
    every row of its latest attempt is verified (invariant 5).
    """

    __tablename__ = "member_replications"
    id: Mapped[int] = mapped_column(primary_key=True)
    group_snapshot_id: Mapped[int] = mapped_column(
        ForeignKey("group_snapshots.id", ondelete="CASCADE"), index=True)
    attempt: Mapped[int] = mapped_column(Integer, default=1)
    disk: Mapped[str] = mapped_column(String(200))  # "<vm>/<node>"
    pool: Mapped[str] = mapped_column(String(128))
    image: Mapped[str] = mapped_column(String(255))
    snap: Mapped[str] = mapped_column(String(255))
    base: Mapped[str | None] = mapped_column(String(255), default=None)
    target_site: Mapped[str] = mapped_column(String(64))
    state: Mapped[str] = mapped_column(String(16), default="pending")
    full: Mapped[bool | None] = mapped_column(Boolean, default=None)
    bytes_shipped: Mapped[int] = mapped_column(BigInteger, default=0)
    bytes_changed: Mapped[int] = mapped_column(BigInteger, default=0)
    seconds: Mapped[float | None] = mapped_column(Float, default=None)
    throughput_mbps: Mapped[float | None] = mapped_column(Float, default=None)
    started_at: Mapped[dt.datetime | None] = mapped_column(default=None)
    finished_at: Mapped[dt.datetime | None] = mapped_column(default=None)
    error: Mapped[str | None] = mapped_column(Text, default=None)


class DrPolicy(Base):
    """Retention at the DR site, separate from the primary's (invariant 6 holds at both)."""

    __tablename__ = "dr_policies"
    group_id: Mapped[int] = mapped_column(
        ForeignKey("groups.id", ondelete="CASCADE"), primary_key=True)
    keep_last: Mapped[int] = mapped_column(Integer, default=48)
    keep_within_seconds: Mapped[int] = mapped_column(Integer, default=0)
    __table_args__ = (CheckConstraint("keep_last >= 1", name="dr_keep_last_min"),)


class FencingEpoch(Base):
    """Raised at every failover: the site named here is the only writer from `at` on."""

    __tablename__ = "fencing_epochs"
    id: Mapped[int] = mapped_column(primary_key=True)
    group_id: Mapped[int] = mapped_column(ForeignKey("groups.id", ondelete="CASCADE"), index=True)
    epoch: Mapped[int] = mapped_column(Integer)
    active_site: Mapped[str] = mapped_column(String(64))
    fenced_site: Mapped[str] = mapped_column(String(64))
    job_id: Mapped[str | None] = mapped_column(String(36), default=None)
    at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    __table_args__ = (UniqueConstraint("group_id", "epoch", name="uq_fencing_group_epoch"),)


class LockFence(Base):
    """The newest fencing token the database has seen per group lock
    (api/grouplock.py): a write carrying an older token is refused."""

    __tablename__ = "lock_fences"
    kind: Mapped[str] = mapped_column(String(16), primary_key=True)
    group_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    token: Mapped[int] = mapped_column(BigInteger)
    claimed_at: Mapped[dt.datetime] = mapped_column(default=utcnow)


class VmDefinition(Base):
    """A VM's persistent definition as its agent gave it (`vm.definition`:
    libvirt's inactive domain XML, or a qmp VM's start command), one row per
    version: a new version only when its sha256 changes.  DR rewrites the
    newest to start the VM there (services/vm_definitions.py)."""

    __tablename__ = "vm_definitions"
    id: Mapped[int] = mapped_column(primary_key=True)
    vm_id: Mapped[int] = mapped_column(ForeignKey("vms.id", ondelete="CASCADE"), index=True)
    # the VM's identity when captured (a libvirt domain UUID), and where
    uid: Mapped[str | None] = mapped_column(String(64), default=None)
    host: Mapped[str] = mapped_column(String(128))
    version: Mapped[int] = mapped_column(Integer)
    format: Mapped[str] = mapped_column(String(32))
    sha256: Mapped[str] = mapped_column(String(64))
    definition: Mapped[str] = mapped_column(Text)
    captured_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    __table_args__ = (UniqueConstraint("vm_id", "version", name="uq_vm_definitions_version"),)


class RecoveryPlan(Base):
    """A group's recovery plan (coordinator/dr/plan.py: boot groups with
    readiness rules and delays, hooks, the network map per purpose, drill
    checks), one row per version; the newest is the group's plan.  Drills
    and failover use it (services/plans.py; migration 0016)."""

    __tablename__ = "recovery_plans"
    id: Mapped[int] = mapped_column(primary_key=True)
    group_id: Mapped[int] = mapped_column(ForeignKey("groups.id", ondelete="CASCADE"),
                                          index=True)
    version: Mapped[int] = mapped_column(Integer)
    body: Mapped[dict[str, Any]] = mapped_column(JSON)
    sha256: Mapped[str] = mapped_column(String(64))
    created_by: Mapped[str | None] = mapped_column(String(64), default=None)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    __table_args__ = (UniqueConstraint("group_id", "version", name="uq_recovery_plans_version"),)
