"""Results of a group snapshot: state, member snapshots, timings."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from cutpoint.coordinator.txlog import COMMITTED, TxnRecord

VM_TIMING_FIELDS = ("stop_ms", "barrier_ms", "snapshot_ms", "cont_ms", "paused_ms")
# Reported by the agent but not kept in the transaction log: the redirect
# cut's switch inside the pause (prepare reply, agent-protocol §5.1), and
# on the live cut how long the VM's network was held (commit reply).
VM_TIMING_EXTRA = ("switch_ms", "held_ms")
# The quiesce facts of a VM (agent-protocol §4.3, §4.4): times, then the
# level reached and the reason a freeze fell back to crash.
VM_QUIESCE_TIMES = ("freeze_ms", "thaw_ms")
# Weakest first: a group is only as consistent as its weakest member.
CONSISTENCY_ORDER = ("crash", "fs-freeze")


@dataclass
class VMTiming:
    """One VM's pause window, as measured by its agent (agent-protocol §3.6)."""

    vm: str
    agent: str
    stop_ms: float | None = None
    barrier_ms: float | None = None
    snapshot_ms: float | None = None
    cont_ms: float | None = None
    paused_ms: float | None = None
    method: str | None = None
    # How the agent cut the VM (agent-protocol §5.1): "live" (disks switched
    # onto overlays with the vCPUs running, the network held until the
    # resume: paused_ms is the switch, held_ms the hold), "redirect" (that
    # switch in a pause, RBD snapshots after `cont`) or "in_pause" (RBD
    # snapshots inside the pause); None when no reply said.
    pause_path: str | None = None
    # Why a VM was not cut live (agent pause_path = live), or was cut in the
    # pause (the prepare reply's pause_path_why): its pause followed the
    # backend.
    pause_path_why: str | None = None
    switch_ms: float | None = None
    held_ms: float | None = None
    disks: list[dict[str, Any]] = field(default_factory=list)
    # Level reached ("crash" | "fs-freeze", as the agent replied); None when
    # no agent reply said (e.g. the VM's agent was unreachable).
    consistency: str | None = None
    freeze_ms: float | None = None
    thaw_ms: float | None = None
    freeze_error: str | None = None
    # Why the thaw after `cont` failed (agent-protocol §4.4); None if it
    # succeeded or none was due.  Not a snapshot failure, but the guest may
    # still be frozen (its filesystems block writes): an outage to act on.
    thaw_error: str | None = None

    @property
    def overhead_ms(self) -> float | None:
        """Coordination overhead: the pause minus the backend snapshot time
        spent inside it (none on the redirect path: snapshot_ms is then the
        time of the snapshots after `cont`)."""
        if self.pause_path in ("live", "redirect"):
            return self.paused_ms
        if self.paused_ms is None or self.snapshot_ms is None:
            return None
        return self.paused_ms - self.snapshot_ms

    def update(self, d: dict[str, Any]) -> None:
        for k in VM_TIMING_FIELDS + VM_TIMING_EXTRA:
            v = d.get(k)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                setattr(self, k, float(v))
        if isinstance(d.get("method"), str):
            self.method = d["method"]
        if d.get("pause_path") in ("live", "redirect", "in_pause"):
            # A reason belongs to its path: why a VM was not cut live
            # (agent pause_path = live), or was cut in the pause.  The
            # commit reply names the path again without it.
            if d["pause_path"] != self.pause_path or d["pause_path"] == "live":
                self.pause_path_why = None
            self.pause_path = d["pause_path"]
            why = d.get("pause_path_why")
            if d["pause_path"] != "live" and isinstance(why, str) and why:
                self.pause_path_why = why
        for k in VM_QUIESCE_TIMES:
            v = d.get(k)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                setattr(self, k, float(v))
        if isinstance(d.get("consistency"), str):
            self.consistency = d["consistency"]
            # The reply that carries the level also says why it fell back;
            # null there means no error, so an older reason is cleared.
            fe = d.get("freeze_error")
            self.freeze_error = fe if isinstance(fe, str) and fe else None
        elif isinstance(d.get("freeze_error"), str) and d["freeze_error"]:
            self.freeze_error = d["freeze_error"]
        # Only a reply that carries the thaw (COMMIT, or a log row) says
        # anything about it; PREPARE replies have no thaw_* keys.
        if "thaw_error" in d:
            te = d.get("thaw_error")
            self.thaw_error = te if isinstance(te, str) and te else None
        if isinstance(d.get("disks"), list):
            self.disks = [x for x in d["disks"] if isinstance(x, dict)]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["overhead_ms"] = self.overhead_ms
        return d


@dataclass
class GroupSnapshotResult:
    txn: str
    group: str
    state: str
    reason: str | None = None
    snapshots: dict[str, str] = field(default_factory=dict)  # disk id -> name
    vms: list[VMTiming] = field(default_factory=list)
    timings: dict[str, float | None] = field(default_factory=dict)
    errors: list[dict[str, Any]] = field(default_factory=list)
    from_log: bool = False  # True when returned from the log (idempotent repeat)
    quiesce: str = "crash"  # requested; what each VM reached is in vms[].consistency

    @property
    def consistency(self) -> str | None:
        """The level of the group: its weakest member's (None if unknown)."""
        return weakest([v.consistency for v in self.vms])

    @property
    def committed(self) -> bool:
        return self.state == COMMITTED

    def to_dict(self) -> dict[str, Any]:
        return {"txn": self.txn, "group": self.group, "state": self.state,
                "reason": self.reason, "snapshots": dict(self.snapshots),
                "vms": [v.to_dict() for v in self.vms],
                "timings": dict(self.timings), "errors": list(self.errors),
                "from_log": self.from_log, "quiesce": self.quiesce,
                "consistency": self.consistency}

    @classmethod
    def from_record(cls, rec: TxnRecord) -> GroupSnapshotResult:
        vms = []
        for v in rec.vms:
            t = VMTiming(vm=v["vm"], agent=v["agent"])
            t.update(v)
            vms.append(t)
        snaps = {s["disk"]: s["name"] for s in rec.snapshots
                 if rec.state != COMMITTED or s["state"] == "created"}
        return cls(txn=rec.txn, group=rec.group, state=rec.state, reason=rec.reason,
                   snapshots=snaps if rec.state == COMMITTED else {},
                   vms=vms, timings=dict(rec.timings or {}), errors=list(rec.errors),
                   from_log=True, quiesce=str((rec.spec or {}).get("quiesce") or "crash"))


def group_timings(vms: list[VMTiming]) -> dict[str, float | None]:
    """Per-group maxima of the per-VM figures."""
    def mx(vals: list[float | None]) -> float | None:
        xs = [x for x in vals if x is not None]
        return max(xs) if xs else None
    return {
        "pause_max_ms": mx([v.paused_ms for v in vms]),
        "snapshot_max_ms": mx([v.snapshot_ms for v in vms]),
        "overhead_max_ms": mx([v.overhead_ms for v in vms]),
        "barrier_max_ms": mx([v.barrier_ms for v in vms]),
    }


def weakest(levels: list[str | None]) -> str | None:
    """The weakest consistency level of `levels`; None if any is unknown.

    A level this module does not know (a newer agent) ranks below "crash",
    so it is never mistaken for a stronger one.
    """
    if not levels or any(x is None for x in levels):
        return None
    def rank(x: str | None) -> int:
        return CONSISTENCY_ORDER.index(x) if x in CONSISTENCY_ORDER else -1
    return min(levels, key=rank)
