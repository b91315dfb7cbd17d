"""The group spec: what a group snapshot needs to know, independent of where
the group is defined (a YAML group file, or the API's database).

One code path serves both: the group file loader and the control plane each
build a `GroupSpec` and hand it to `take_group_snapshot`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# agent-protocol §4.3/§4.4: txn and snapshot names are 1-128 bytes of this.
NAME_RE = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
# Lease and budget bounds accepted by the agent (agent-protocol §4.3, §4.4).
MAX_MS = 600000
# agent-protocol §4.3: prepare's optional `quiesce`.
QUIESCE_MODES = ("crash", "fs-freeze")
# The agent's fixed guest-agent deadlines around `quiesce: fs-freeze`
# (agent/guest_qga.c QGA_SYNC_MS, QGA_THAW_MS): a guest-sync-delimited before the
# freeze and before the thaw, then the thaw itself after `cont`.
QGA_SYNC_MS = 1000
QGA_THAW_MS = 5000
# The freeze timeout sent in PREPARE when the group does not set one; equal
# to the agents' `[agent] freeze_timeout_ms` default (agent-protocol §9).
DEFAULT_FREEZE_TIMEOUT_MS = 5000
# Transport and scheduling slack on top of the guest-agent deadlines.
QUIESCE_MARGIN_MS = 1000


class SpecError(ValueError):
    """A group spec is invalid; the message names the field."""


@dataclass(frozen=True)
class TlsSpec:
    ca: str
    cert: str
    key: str

    def to_dict(self) -> dict[str, str]:
        return {"ca": self.ca, "cert": self.cert, "key": self.key}


@dataclass(frozen=True)
class VMSpec:
    name: str
    disks: tuple[str, ...]  # node names: disk0, disk1, ... (disk id = vm/node)

    def disk_ids(self) -> list[str]:
        return [f"{self.name}/{d}" for d in self.disks]


@dataclass(frozen=True)
class AgentSpec:
    name: str
    address: str
    port: int = 7443
    vms: tuple[VMSpec, ...] = ()
    server_name: str | None = None  # TLS name to verify; default: address
    # SHA-256 of the agent's own certificate (hex); when set, an agent that
    # presents any other certificate, even one the CA signed, is refused.
    cert_sha256: str | None = None


@dataclass(frozen=True)
class GroupSpec:
    name: str
    agents: tuple[AgentSpec, ...]
    lease_ms: int = 2000
    budget_ms: int = 1000
    # How long the coordinator waits for every PREPARED.  It must be shorter
    # than the lease, or COMMIT could arrive after the agents gave up.
    prepare_timeout_ms: int | None = None
    tls: TlsSpec | None = None
    # Guest quiesce asked of every agent at PREPARE (agent-protocol §4.3):
    # "crash" (pause only) or "fs-freeze" (guest-fsfreeze-freeze through the
    # QEMU guest agent before the pause, crash fallback per VM).
    quiesce: str = "crash"
    # The guest-fsfreeze-freeze deadline sent in PREPARE (fs-freeze only) and
    # used to size the wait for PREPARED.  Each agent uses min(its `[agent]
    # freeze_timeout_ms`, this), so the wait is long enough by construction,
    # whatever the agents' configs say (agent-protocol §4.3).
    freeze_timeout_ms: int = DEFAULT_FREEZE_TIMEOUT_MS
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if self.prepare_timeout_ms is None and isinstance(self.lease_ms, int):
            object.__setattr__(self, "prepare_timeout_ms", max(1, self.lease_ms // 2))
        validate(self)

    @property
    def effective_prepare_timeout_ms(self) -> int:
        if self.prepare_timeout_ms is not None:
            return self.prepare_timeout_ms
        return max(1, self.lease_ms // 2)

    @property
    def freeze_allowance_ms(self) -> int:
        """How long an agent may spend on guest freezes inside PREPARE.

        The agent freezes every VM (sync 1 s + freeze deadline) *before* it
        stops any of them and arms the lease only after the stops, so this
        time is outside its own VMs' pause windows and outside its lease.
        """
        if self.quiesce != "fs-freeze":
            return 0
        return QGA_SYNC_MS + self.freeze_timeout_ms + QUIESCE_MARGIN_MS

    @property
    def thaw_allowance_ms(self) -> int:
        """How much longer COMMIT and ABORT replies may take: the agent thaws
        each guest (sync 1 s + thaw 5 s) after its `cont`, before replying."""
        if self.quiesce != "fs-freeze":
            return 0
        return QGA_SYNC_MS + QGA_THAW_MS + QUIESCE_MARGIN_MS

    @property
    def prepare_wait_ms(self) -> int:
        """The coordinator's whole wait for every PREPARED.

        prepare_timeout_ms (< lease) bounds the part after the pause begins;
        the freeze allowance is added in front of it.  Invariant 2 stays
        with the agent: each agent arms its lease after its own stops, so no
        VM is paused longer than lease + budget whatever we wait here.  In a
        group of several agents a fast agent's VMs may wait paused for a slow
        agent's freeze; if that exceeds their lease they resume, COMMIT gets
        EXPIRED and the group aborts (recorded, never a partial cut).
        """
        return self.effective_prepare_timeout_ms + self.freeze_allowance_ms

    def vms(self) -> list[tuple[AgentSpec, VMSpec]]:
        return [(a, v) for a in self.agents for v in a.vms]

    def snapshot_name(self, txn: str) -> str:
        """DESIGN.md: member snapshots are named cp.<group>.<txn>."""
        return f"cp.{self.name}.{txn}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "lease_ms": self.lease_ms,
            "budget_ms": self.budget_ms,
            "prepare_timeout_ms": self.effective_prepare_timeout_ms,
            "quiesce": self.quiesce, "freeze_timeout_ms": self.freeze_timeout_ms,
            "tls": self.tls.to_dict() if self.tls else None,
            "agents": [{"name": a.name, "address": a.address, "port": a.port,
                        "server_name": a.server_name, "cert_sha256": a.cert_sha256,
                        "vms": [{"name": v.name, "disks": list(v.disks)}
                                for v in a.vms]}
                       for a in self.agents],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any], *, base: Path | None = None) -> GroupSpec:
        """Build from plain data (a parsed group file, or a stored spec).

        Relative TLS paths are resolved against `base` (the group file's
        folder).  Every error names the offending field.
        """
        if not isinstance(d, dict):
            raise SpecError("group: expected a mapping")
        known = {"name", "group", "agents", "lease_ms", "budget_ms",
                 "prepare_timeout_ms", "quiesce", "freeze_timeout_ms", "tls", "certs"}
        unknown = sorted(set(d) - known)
        if unknown:
            raise SpecError(f"unknown key(s) {', '.join(unknown)}; allowed: "
                            f"{', '.join(sorted(known))}")
        name = d.get("name", d.get("group"))
        tls_d = d.get("tls", d.get("certs"))
        tls = None
        if tls_d is not None:
            if not isinstance(tls_d, dict) or set(tls_d) != {"ca", "cert", "key"}:
                raise SpecError("tls: expected a mapping with exactly ca, cert, key")
            tls = TlsSpec(**{k: _path(str(v), base) for k, v in tls_d.items()})
        agents_d = d.get("agents")
        if not isinstance(agents_d, list) or not agents_d:
            raise SpecError("agents: expected a non-empty list")
        agents = []
        for i, a in enumerate(agents_d):
            where = f"agents[{i}]"
            if not isinstance(a, dict):
                raise SpecError(f"{where}: expected a mapping")
            extra_keys = sorted(set(a) - {"name", "address", "port", "vms", "server_name",
                                          "cert_sha256"})
            if extra_keys:
                raise SpecError(f"{where}: unknown key(s) {', '.join(extra_keys)}")
            vms = []
            vms_d = a.get("vms")
            if not isinstance(vms_d, list) or not vms_d:
                raise SpecError(f"{where}.vms: expected a non-empty list")
            for j, v in enumerate(vms_d):
                w2 = f"{where}.vms[{j}]"
                if not isinstance(v, dict) or set(v) - {"name", "disks"}:
                    raise SpecError(f"{w2}: expected a mapping with name and disks")
                disks = v.get("disks")
                if not isinstance(disks, list):
                    raise SpecError(f"{w2}.disks: expected a list of node names")
                vms.append(VMSpec(name=_str(v.get("name"), f"{w2}.name"),
                                  disks=tuple(_str(x, f"{w2}.disks") for x in disks)))
            agents.append(AgentSpec(
                name=_str(a.get("name", a.get("address")), f"{where}.name"),
                address=_str(a.get("address"), f"{where}.address"),
                port=_int(a.get("port", 7443), f"{where}.port", 1, 65535),
                vms=tuple(vms),
                server_name=a.get("server_name"),
                cert_sha256=_fingerprint(a.get("cert_sha256"), f"{where}.cert_sha256")))
        return cls(
            name=_str(name, "name"),
            agents=tuple(agents),
            lease_ms=_int(d.get("lease_ms", 2000), "lease_ms", 1, MAX_MS),
            budget_ms=_int(d.get("budget_ms", 1000), "budget_ms", 1, MAX_MS),
            prepare_timeout_ms=(None if d.get("prepare_timeout_ms") is None else
                                _int(d["prepare_timeout_ms"], "prepare_timeout_ms", 1, MAX_MS)),
            tls=tls,
            quiesce="crash" if d.get("quiesce") is None else d["quiesce"],
            freeze_timeout_ms=(DEFAULT_FREEZE_TIMEOUT_MS if d.get("freeze_timeout_ms") is None
                               else _int(d["freeze_timeout_ms"], "freeze_timeout_ms", 10,
                                         MAX_MS)))


def validate(spec: GroupSpec) -> None:
    if not isinstance(spec.name, str) or not NAME_RE.match(spec.name):
        raise SpecError(f"name: {spec.name!r} must be 1-128 characters of [A-Za-z0-9._-]")
    # The snapshot name cp.<group>.<txn> must itself fit in 128 bytes.
    if len(spec.name) > 80:
        raise SpecError(f"name: {spec.name!r} is longer than 80 characters")
    for label, ms in (("lease_ms", spec.lease_ms), ("budget_ms", spec.budget_ms)):
        if not isinstance(ms, int) or not 1 <= ms <= MAX_MS:
            raise SpecError(f"{label}: {ms!r} must be an integer in 1..{MAX_MS}")
    pt = spec.effective_prepare_timeout_ms
    if not 1 <= pt < spec.lease_ms:
        raise SpecError(f"prepare_timeout_ms: {pt} must be below lease_ms "
                        f"({spec.lease_ms}), or COMMIT could arrive after the lease")
    if spec.quiesce not in QUIESCE_MODES:
        raise SpecError(f"quiesce: {spec.quiesce!r} must be one of "
                        f"{', '.join(QUIESCE_MODES)}")
    ft = spec.freeze_timeout_ms
    if isinstance(ft, bool) or not isinstance(ft, int) or not 10 <= ft <= MAX_MS:
        raise SpecError(f"freeze_timeout_ms: {ft!r} must be an integer in 10..{MAX_MS} "
                        "(sent in PREPARE; each agent uses min(it, its own))")
    if not spec.agents:
        raise SpecError("agents: a group needs at least one agent")
    seen_vm: set[str] = set()
    seen_agent: set[tuple[str, int]] = set()
    for a in spec.agents:
        if (a.address, a.port) in seen_agent:
            raise SpecError(f"agents: {a.address}:{a.port} is listed twice")
        seen_agent.add((a.address, a.port))
        if not a.vms:
            raise SpecError(f"agents[{a.name}].vms: an agent needs at least one VM")
        for v in a.vms:
            if v.name in seen_vm:
                raise SpecError(f"vms: {v.name!r} is listed twice")
            seen_vm.add(v.name)
            if not v.disks:
                raise SpecError(f"vms[{v.name}].disks: a VM needs at least one disk")
            if len(set(v.disks)) != len(v.disks):
                raise SpecError(f"vms[{v.name}].disks: duplicate node name")


def _str(v: Any, where: str) -> str:
    if not isinstance(v, str) or not v:
        raise SpecError(f"{where}: expected a non-empty string, got {v!r}")
    return v


def _int(v: Any, where: str, lo: int, hi: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise SpecError(f"{where}: expected an integer in {lo}..{hi}, got {v!r}")
    return v


def _path(p: str, base: Path | None) -> str:
    path = Path(p).expanduser()
    if not path.is_absolute() and base is not None:
        path = base / path
    return str(path)


def _fingerprint(v: Any, where: str) -> str | None:
    from cutpoint.agentclient.client import normalize_fingerprint

    if v is None:
        return None
    try:
        return normalize_fingerprint(_str(v, where))
    except ValueError as exc:
        raise SpecError(f"{where}: {exc}") from None
