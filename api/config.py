"""Settings: one pydantic-settings class, read from the environment and a file.

Sources, highest priority first: keyword arguments, environment variables
(`CUTPOINT_*`), then the TOML file named by `CUTPOINT_CONFIG` (if set, it must
exist).  Secrets have no default: a process that needs `token_secret` and
does not get it stops at start-up with a message naming the variable.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)


class ConfigFileError(RuntimeError):
    pass


class DefinitionTarget(BaseModel):
    """How a site's libvirt hosts run a VM started from its captured
    definition (services/vmdef_rewrite.py): which registered host's agent
    starts it, the cephx user and libvirt secret UUID its QEMU uses there,
    the monitors ("address:port"), and the map of bridge/network names."""

    model_config = ConfigDict(extra="forbid")
    host: str = Field(min_length=1)
    auth_user: str = Field(min_length=1, pattern=r"^[^\s]+$")
    secret_uuid: str = Field(pattern=r"^[0-9a-fA-F-]{36}$")
    mon_hosts: list[str] = Field(min_length=1)
    networks: dict[str, str] = Field(default_factory=dict)
    # The bridge, on this site's hosts, that drills attach every interface
    # of their copies to: one with no route to production (no uplink, no
    # forwarding).  None: no drill boots through the agents at this site.
    drill_network: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.-]{1,15}$")
    # The host files of this site's hosts a definition may name
    # (services/vmdef_policy.py): directories (or files) of the kernels,
    # initrds, DTBs and firmware of direct kernel boot; anything else is
    # refused.  Empty: no definition with a <kernel> or <loader> is signed.
    boot_paths: list[str] = Field(default_factory=list)
    # The hosts' directory of console logs (a VM's <log file=> becomes
    # <console_dir>/<name>.<device><n>.log); None: logs dropped (pty only).
    console_dir: str | None = None
    # The Ceph client conf of the hosts' QEMUs (<config file=> of each RBD
    # disk); None: dropped (QEMU reads the host's default).
    ceph_conf: str | None = None

    @field_validator("boot_paths")
    @classmethod
    def _abs_paths(cls, v: list[str]) -> list[str]:
        for p in v:
            if not p.startswith("/") or os.path.normpath(p) != p.rstrip("/") or p == "/":
                raise ValueError(f"{p!r}: give an absolute, normal path other than /")
        return v

    @field_validator("console_dir", "ceph_conf")
    @classmethod
    def _abs_path(cls, v: str | None) -> str | None:
        if v is not None and (not v.startswith("/") or os.path.normpath(v) != v or v == "/"):
            raise ValueError(f"{v!r}: give an absolute, normal path other than /")
        return v

    @field_validator("mon_hosts")
    @classmethod
    def _host_port(cls, v: list[str]) -> list[str]:
        for m in v:
            addr, _, port = m.rpartition(":")
            if not addr or not port.isdigit():
                raise ValueError(f"{m!r}: give address:port")
        return v


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="CUTPOINT_", extra="forbid", validate_default=True,
    )

    database_url: str = "sqlite:////var/lib/cutpoint/cutpoint.db"
    redis_url: str = "redis://127.0.0.1:6379/0"
    # HMAC key for API token hashes.  No default: a leaked database alone must
    # not let anyone test guesses offline, and a default would be public.
    token_secret: SecretStr = Field(min_length=16)

    # Agents: mutual TLS per docs/agent-protocol.md.
    agent_ca: Path | None = None
    agent_cert: Path | None = None
    agent_key: Path | None = None
    agent_timeout_s: float = Field(default=10.0, gt=0, le=300)
    # The definition-signing private key (Ed25519, PEM; by path, never
    # logged): failover signs the DR rewrite of a VM's captured definition
    # with it, and the DR agents hold its public half ([libvirt]
    # definition_key).  None: captured definitions are not sent to agents.
    definition_signing_key: Path | None = None
    # Per DR site, how its libvirt hosts run a VM from its captured
    # definition (DefinitionTarget); a site not here gets no signed starts.
    definition_targets: dict[str, DefinitionTarget] = Field(default_factory=dict)

    # Scheduler and jobs.
    scheduler_tick_s: float = Field(default=1.0, gt=0, le=60)
    # Extra head start the scheduler gives a capture beyond its measured
    # duration, so that jitter in beat/worker pickup does not cause misses.
    scheduler_margin_s: float = Field(default=1.0, ge=0, le=3600)
    retention_interval_s: float = Field(default=30.0, gt=0)
    inventory_interval_s: float = Field(default=60.0, gt=0)
    # How often every agent's inventory is polled for changes (cheap: a
    # database write only when the agent's generation moved); it bounds how
    # late `cutpoint vm list` shows a new, gone or moved VM.
    inventory_watch_s: float = Field(default=2.0, gt=0, le=3600)
    # How often in-doubt txns of every group are resolved (also at worker start).
    resolve_interval_s: float = Field(default=60.0, gt=0)
    # The sweeper of orphan member snapshots (services/sweeper.py): how
    # often it runs (also at worker start), and how old an orphan must be
    # before it is deleted.  The grace keeps a pass away from snapshots
    # whose txn has only just ended, and from clock skew between hosts.
    orphan_sweep_interval_s: float = Field(default=900.0, gt=0)
    orphan_grace_s: float = Field(default=3600.0, ge=0)
    # History pruning (services/history.py): finished jobs with their events,
    # and audit entries, older than this many days go; how often it runs.
    history_keep_days: float = Field(default=90.0, ge=1)
    history_prune_interval_s: float = Field(default=3600.0, gt=0)
    # The newest this many drill jobs of each group (their reports, served by
    # GET /v1/drills/{id}/report) are kept whatever their age.
    drill_reports_kept: int = Field(default=20, ge=1, le=10000)
    # How often beat looks for groups whose drill schedule is due.
    drill_tick_s: float = Field(default=60.0, gt=0)
    # How often the sweeper of drill leftovers (services/drill_sweeper.py)
    # looks for clones and VMs tagged by a drill that is no longer running;
    # it also runs at worker start.
    drill_sweep_interval_s: float = Field(default=300.0, gt=0)
    # How often the worker sends the webhook deliveries that are due.
    webhook_tick_s: float = Field(default=2.0, gt=0, le=3600)
    # A group lock outlives a killed worker by at most this long.
    group_lock_ttl_s: float = Field(default=30.0, gt=1, le=3600)
    broker_visibility_timeout_s: int = Field(default=120, ge=10)
    # A job's runner claim (jobclaim.py): a job redelivered while its runner
    # lives is not run twice; a dead runner's claim expires after this long.
    job_claim_ttl_s: float = Field(default=30.0, ge=3, le=600)
    # The beat lock (beat_lock.py): how long a dead beat's lock outlives it,
    # which is how long a standby beat waits before it takes over.
    beat_lock_ttl_s: float = Field(default=30.0, ge=3, le=600)
    celery_eager: bool = False
    # DR jobs (replicate, drill, failover, restore, re-protect, failback) of
    # a group with a DR site go to the queue `cutpoint.site.<DR site name>`
    # instead of `cutpoint.default`, so that only the workers started with
    # `--sites <name>` (those given that site's Ceph access) run them.
    dr_site_queues: bool = False
    worker_metrics_port: int | None = Field(default=None, ge=1, le=65535)

    # What boots VMs at a DR site (failover, drills): `agent`, the site's
    # agents, or a booter another package registers under the entry-point
    # group `cutpoint.booters` (cutpoint.coordinator.dr.boot).
    booter: str = "agent"
    # The deadline of each failover precondition check that asks another
    # system (the DR Ceph cluster, a DR agent): a failover that cannot reach
    # DR says so within it, before anything at the primary is touched.
    failover_check_timeout_s: int = Field(default=10, ge=1, le=120)

    page_max: int = Field(default=500, ge=1, le=10000)
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"

    @property
    def capture_head_start_s(self) -> float:
        """How long before the RPO deadline (less duration and lag) a
        capture is due: the margin plus one tick, because the scheduler
        checks only once per tick, so a due capture can start up to a tick
        late.  With the margin alone the whole margin went to the tick, and
        a lab run saw the achieved RPO at 10.03 s against an RPO of 10."""
        return self.scheduler_margin_s + self.scheduler_tick_s

    @field_validator("database_url")
    @classmethod
    def _known_db(cls, v: str) -> str:
        if not v.startswith(("sqlite://", "postgresql://", "postgresql+psycopg://")):
            raise ValueError("must be a sqlite:// or postgresql+psycopg:// URL")
        if v.startswith("postgresql://"):
            v = "postgresql+psycopg://" + v[len("postgresql://"):]
        return v

    @field_validator("booter")
    @classmethod
    def _known_booter(cls, v: str) -> str:
        from cutpoint.coordinator.dr.boot import known_booters

        if v not in known_booters():
            raise ValueError(f"no booter named {v!r} (known: {', '.join(known_booters())})")
        return v

    @field_validator("redis_url")
    @classmethod
    def _redis(cls, v: str) -> str:
        if not v.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("must be a redis://, rediss:// or unix:// URL")
        return v

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        path = os.environ.get("CUTPOINT_CONFIG")
        if path:
            if not Path(path).is_file():
                raise ConfigFileError(f"CUTPOINT_CONFIG={path}: no such file")
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=path))
        return tuple(sources)


@lru_cache
def get_settings() -> Settings:
    return Settings()  # type: ignore[call-arg]  # values come from env/file
