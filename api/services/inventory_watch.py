"""The inventory watch: every agent's `inventory`, every few seconds.

Agents do not call the control plane; they number their inventory instead
(agent-protocol §4.2: `instance` per run, `generation` per change), and
libvirt lifecycle events move it within milliseconds (§11.2).  So the
watch asks every host at once (`inventory_watch_s`, default 2 s) and
writes only for a host whose (instance, generation) moved since the reply
it last applied: a new or undefined domain, a state change, a VM that
moved host, a hypervisor connection that went down.  That bounds how old
`cutpoint vm list` is by the watch period plus one round trip, with a
database write only on change.  The full pull (`inventory_tick`, with
`hello`) still runs every `inventory_interval_s`.

A reply with an identity conflict (vm_identity) is applied without
recording its generation, so the next round applies it again.

The watch also keeps the protected VMs' definitions (vm_definitions.py):
for a host whose inventory moved, each protected VM's `vm.definition`
(a new version when it changed); for a host that did not, only a
protected VM with no version yet (one that just joined a group), so a VM
is captured within a round of joining.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import redis
from cutpoint.api.config import Settings
from cutpoint.api.models import Host
from cutpoint.api.services import agents, inventory, vm_definitions
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

LOCK = "cutpoint:lock:inventory"
# An agent that does not answer within this holds up one round only.
CALL_TIMEOUT_S = 5.0


@contextmanager
def inventory_lock(r: redis.Redis, *, wait_s: float | None) -> Iterator[bool]:
    """One writer of inventories at a time (the watch, the full pull, a
    host sync): two would race to insert the same new VM.  Yields whether
    it got the lock; `wait_s` None: do not wait."""
    lock = r.lock(LOCK, timeout=60, thread_local=False)
    got = lock.acquire(blocking=wait_s is not None, blocking_timeout=wait_s)
    try:
        yield bool(got)
    finally:
        if got:
            try:
                lock.release()
            except redis.exceptions.LockError:
                pass  # expired under a very slow round; the next one is fine


def unchanged(host: Host, inv: dict[str, Any]) -> bool:
    return (inv.get("instance") is not None and inv.get("instance") == host.inventory_instance
            and inv.get("generation") == host.inventory_generation)


def record(session: Session, host: Host, inv: dict[str, Any], counts: dict[str, int]) -> None:
    """Remember which reply was applied (not when some VM was left for
    later: then the next round must apply it again); commit."""
    clean = counts.get("conflicts", 0) == 0
    gen = inv.get("generation")
    host.inventory_instance = str(inv.get("instance"))[:32] if clean and inv.get(
        "instance") else None
    host.inventory_generation = gen if clean and isinstance(gen, int) else None
    session.commit()


async def _ask(hosts: list[Host], settings: Settings) -> list[dict[str, Any] | Exception]:
    async def one(h: Host) -> dict[str, Any] | Exception:
        try:
            return (await agents.call_async(h, settings, [("inventory", {})],
                                            connect_timeout_s=CALL_TIMEOUT_S,
                                            timeout_s=CALL_TIMEOUT_S))[0]
        except agents.AgentCallError as exc:
            return exc
    return list(await asyncio.gather(*(one(h) for h in hosts)))


def watch_round(sf: sessionmaker[Session], settings: Settings) -> dict[str, int]:
    """One round over every pinned host: counts of hosts applied,
    unchanged and unreachable, VMs moved between hosts, and definitions
    stored (new versions)."""
    out = {"applied": 0, "unchanged": 0, "unreachable": 0, "moved": 0, "definitions": 0}
    with sf() as s:
        hosts = list(s.scalars(select(Host).where(Host.cert_fingerprint.is_not(None))
                               .order_by(Host.id)))
        if not hosts:
            return out
        replies = asyncio.run(_ask(hosts, settings))
        for host, inv in zip(hosts, replies, strict=True):
            if isinstance(inv, Exception):
                out["unreachable"] += 1
                if host.reachable is not False or host.last_error != str(inv)[:2000]:
                    host.reachable, host.last_error = False, str(inv)[:2000]
                    host.inventory_generation = None
                    s.commit()
                continue
            if unchanged(host, inv) and host.reachable:
                out["unchanged"] += 1
                out["definitions"] += vm_definitions.refresh_host(
                    s, settings, host, changed=False)["new"]
                continue
            counts = inventory.apply(s, host, inv)
            record(s, host, inv, counts)
            out["applied"] += 1
            out["moved"] += counts["moved"]
            out["definitions"] += vm_definitions.refresh_host(s, settings, host,
                                                              changed=True)["new"]
    return out
