"""When a booted VM counts as ready: its readiness rule.

A rule, per VM (a drill request, a group's drill settings or a recovery
plan give it as a dict):

    {"kind": "guest-ping", "timeout_s": 240}
        the agent lists the VM running, and its qemu-guest-agent answers
        guest-ping (vm.guest_ping through the agent that started it)
    {"kind": "tcp", "port": 5432, "address": "10.99.0.11", "timeout_s": 240}
        the agent lists the VM running, and a TCP connection to
        address:port opens, from the control plane: the drill network
        must be reachable from where the worker runs (docs/drills.md,
        "Probing the drill network")
    "delay_s": N (either kind): wait N s more after it is ready (a recovery
        plan's pause before the next boot group)

The default is guest-ping.  No console line is read: the product path
knows nothing of a lab guest's console.

    wait(booter, req, guests, timeout_s, on_event)   until each is ready
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass
from typing import Any

GUEST_PING = "guest-ping"
TCP = "tcp"
KINDS = (GUEST_PING, TCP)


class RuleError(ValueError):
    """A readiness rule that cannot be used (the message says why)."""


@dataclass(frozen=True)
class Readiness:
    kind: str = GUEST_PING
    port: int | None = None
    address: str | None = None
    timeout_s: float | None = None
    delay_s: float = 0.0

    @classmethod
    def parse(cls, d: dict[str, Any] | None) -> Readiness:
        if not d:
            return cls()
        if not isinstance(d, dict):
            raise RuleError(f"a readiness rule is an object, not {d!r}")
        extra = set(d) - {"kind", "port", "address", "timeout_s", "delay_s"}
        if extra:
            raise RuleError(f"readiness: unknown key(s) {sorted(extra)}")
        kind = d.get("kind", GUEST_PING)
        if kind not in KINDS:
            raise RuleError(f"readiness kind {kind!r}: one of {', '.join(KINDS)}")
        port = d.get("port")
        if kind == TCP:
            if not isinstance(port, int) or not 0 < port < 65536:
                raise RuleError("readiness tcp needs a port (1-65535)")
            if not d.get("address"):
                raise RuleError("readiness tcp needs the address the control plane reaches "
                                "the VM at on the drill network")
        for k in ("timeout_s", "delay_s"):
            v = d.get(k)
            if v is not None and (not isinstance(v, int | float) or v < 0 or v > 3600):
                raise RuleError(f"readiness {k}: a number of seconds 0-3600")
        return cls(kind, port, d.get("address"), d.get("timeout_s"),
                   float(d.get("delay_s") or 0))

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind}
        if self.kind == TCP:
            out |= {"port": self.port, "address": self.address}
        if self.timeout_s is not None:
            out["timeout_s"] = self.timeout_s
        if self.delay_s:
            out["delay_s"] = self.delay_s
        return out

    def __str__(self) -> str:
        return "guest-ping" if self.kind == GUEST_PING else f"tcp {self.address}:{self.port}"


def tcp_open(address: str, port: int, timeout_s: float = 2) -> bool:
    try:
        socket.create_connection((address, port), timeout=timeout_s).close()
        return True
    except OSError:
        return False


def wait(booter: Any, req: Any, guests: list[Any], timeout_s: float,
         on_event: Any = None) -> None:
    """Until every guest is ready by its rule (req.readiness[vm], default
    guest-ping), each within its own timeout_s (else `timeout_s`).  Emits
    `ready` with the rule and the seconds it took per VM; raises BootError
    naming what each VM that did not get ready last showed."""
    from cutpoint.coordinator.dr import guest
    from cutpoint.coordinator.dr.boot import BootError

    t0 = time.monotonic()
    rules = {g.vm: Readiness.parse(req.readiness.get(g.vm)) for g in guests}
    pending = {g.vm for g in guests}
    last: dict[str, str] = {}
    delays: dict[str, float] = {}
    while pending:
        states = booter.states(req, sorted(pending))
        for vm in sorted(pending):
            r = rules[vm]
            if vm in delays:
                if time.monotonic() >= delays[vm]:
                    pending.discard(vm)
                continue
            state = states.get(vm, "absent")
            if state != "running":
                last[vm] = f"state {state}"
                continue
            if r.kind == GUEST_PING:
                assert req.tls is not None
                try:
                    guest.ping(req.tls, req.agents[vm], vm, 2)
                    ok = True
                except guest.GuestError as exc:
                    ok, last[vm] = False, f"running; guest-ping: {exc}"
            else:
                assert r.address and r.port
                ok = tcp_open(r.address, r.port)
                if not ok:
                    last[vm] = f"running; tcp {r.address}:{r.port} not open"
            if ok:
                took = round(time.monotonic() - t0, 3)
                if on_event:
                    on_event("ready", {"vm": vm, "rule": r.as_dict(), "ready_s": took})
                if r.delay_s:
                    delays[vm] = time.monotonic() + r.delay_s
                else:
                    pending.discard(vm)
        late = [vm for vm in pending if vm not in delays and
                time.monotonic() - t0 > (rules[vm].timeout_s or timeout_s)]
        if late:
            raise BootError("not ready: " + "; ".join(
                f"{vm} ({rules[vm]}, {rules[vm].timeout_s or timeout_s:.0f} s): "
                f"{last.get(vm, 'never listed')}" for vm in sorted(late)), guests)
        if pending:
            time.sleep(getattr(booter, "poll_s", 0.5))
