"""Booting VMs at a site: the `Booter` protocol, and the product's booter.

A boot request names VMs and the disk images (RBD, at `site`) they boot
from, what for (`failover`: the replicated images; `drill`: clones), and a
tag that names what this boot starts.  A booter:

    preflight(req)                       -> [Unbootable]  what it could not start,
                                                      found without starting anything
    start(req, on_event)                 -> [Guest]   start every VM
    wait_ready(req, guests, timeout_s, on_event)      until each is ready
    stop(req, guests)                    -> [error]   stop what it started
    leftovers(req)                       -> {kind: [item]}  what still exists

A failover asks `preflight` before it stops anything at the primary
(coordinator/dr/preconditions.py): a VM the booter already knows it cannot
start must stop the failover while production still runs.

`AgentBooter` is the product's booter: it starts and stops VMs through the
site's agents (`vm.start{spec: {vm}}`, `vm.stop{vm}`, docs/agent-protocol.md
4.9), the agents being those the request names (the control plane finds
them among its registered hosts: the one whose inventory lists the VM).
A VM no agent of the site defines may come with a signed definition
(`specs`: `vm.start{spec: {vm, xml, sig}}`, the VM's captured libvirt
definition rewritten for the site): its agent then need not list it, but
must say `signed_definitions` in its hello.  A
VM is ready when its agent reports it running.  Other booters are plugged
in by name (entry-point group `cutpoint.booters`, see plugins.py) and chosen
with the `booter` setting.

Drills boot clones of the replicated images.  An agent starts only the
VMs its configuration defines, and a clone is none of them: a drill sends
each VM's captured definition rewritten for the clone (its disks, the
name `drill-<id>-<vm>`, a new UUID, every interface on the isolated drill
network: api/services/drill_boot.py, with vmdef_rewrite.py), signed and
`transient`, so that `vm.stop` leaves no domain defined.  `AgentBooter`
refuses a drill VM that comes without such a spec.  A drill VM is ready by
its readiness rule (readiness.py: running plus guest-ping, or a TCP port
open), never by a console line.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from cutpoint.coordinator.dr import plugins
from cutpoint.coordinator.dr.site import CephSite

EventHook = Callable[[str, dict[str, Any]], None]

FAILOVER = "failover"
DRILL = "drill"


class BootError(RuntimeError):
    """A boot failed; `guests` are the VMs started before it (the caller stops them)."""

    def __init__(self, message: str, guests: list[Guest] | None = None) -> None:
        self.guests = list(guests or [])
        super().__init__(message)


class DrillBootUnsupported(BootError):
    """This booter cannot boot a drill's clones."""


class NoAgent(BootError):
    """No agent of the site is known to start a VM of the request."""


class UnknownBooter(LookupError):
    """No booter of that name (the message lists the known ones)."""


DRILL_REFUSAL = (
    "the agent booter boots a drill's clones only from each VM's captured definition, "
    "rewritten for the clone and signed (definition_signing_key, and a "
    "definition_targets entry with a drill_network for the DR site)")


@dataclass(frozen=True)
class BootDisk:
    node: str  # the VM's disk node (disk0, ...)
    image: str  # the RBD image at the request's site
    pool: str = "rbd"  # its logical pool (the site maps it: CephSite.pools)


@dataclass(frozen=True)
class BootVM:
    name: str
    disks: tuple[BootDisk, ...]


@dataclass(frozen=True)
class AgentRef:
    address: str
    port: int
    # SHA-256 of the agent's certificate: the client refuses any other, even
    # one the CA signed (the product's booter always has it; None: CA only).
    cert_sha256: str | None = None

    def __str__(self) -> str:
        return f"{self.address}:{self.port}"


@dataclass
class BootRequest:
    purpose: str  # FAILOVER or DRILL
    site: CephSite | None  # the Ceph site of the images; None: a preflight's, which reads none
    vms: list[BootVM]
    tag: str  # names what this boot starts: "drill-<id>", "failover-<job>"
    workload: str = "none"  # what the guests run after boot, where a booter can say
    agents: dict[str, AgentRef] = field(default_factory=dict)  # VM -> the agent that starts it
    # VM -> the vm.start spec of a definition the control plane signed
    # ({vm, xml, sig}: its captured definition rewritten for the site), for
    # a VM its agent's config does not define; other VMs: {vm}.
    specs: dict[str, dict[str, Any]] = field(default_factory=dict)
    tls: tuple[str, str, str] | None = None  # (ca, cert, key) to reach the agents
    evidence_dir: str | None = None  # where a booter may keep consoles and logs
    # VM -> its readiness rule (readiness.Readiness.parse: guest-ping by
    # default for a drill; a failover without rules waits for `running`)
    readiness: dict[str, dict[str, Any]] = field(default_factory=dict)
    start_timeout_s: float = 180
    check_timeout_s: float = 10  # `preflight`: each agent must answer within it


@dataclass(frozen=True)
class Unbootable:
    """A VM of a request that the booter could not start (`preflight`).

    `why`: "no_agent" (no agent is named for it), "agent_unreachable" (its
    agent did not answer), "unknown_vm" (its agent does not define it),
    "cannot_start" (anything else the booter knows)."""

    vm: str
    why: str
    message: str

    def __str__(self) -> str:
        return f"{self.vm}: {self.message}"


@dataclass
class Guest:
    """A VM a booter started (or found running)."""

    vm: str
    agent: str | None = None
    start_ms: float | None = None
    already_running: bool = False
    detail: dict[str, Any] = field(default_factory=dict)  # the booter's own: console, pid...

    def as_dict(self) -> dict[str, Any]:
        return {"vm": self.vm, "agent": self.agent, "start_ms": self.start_ms,
                "already_running": self.already_running, **self.detail}


class Booter(Protocol):
    purposes: frozenset[str]  # what it can boot: FAILOVER, DRILL

    def preflight(self, req: BootRequest) -> list[Unbootable]: ...

    def start(self, req: BootRequest, on_event: EventHook | None = None) -> list[Guest]: ...

    def wait_ready(self, req: BootRequest, guests: list[Guest], timeout_s: float,
                   on_event: EventHook | None = None) -> None: ...

    def stop(self, req: BootRequest, guests: list[Guest]) -> list[str]: ...

    def leftovers(self, req: BootRequest) -> dict[str, list[str]]: ...


BUILTIN: dict[str, Callable[[], Booter]] = {}


def known_booters() -> list[str]:
    return sorted(set(BUILTIN) | set(plugins.names(plugins.BOOTERS)))


def load_booter(name: str) -> Booter:
    """The booter called `name`: built in, or registered under `cutpoint.booters`."""
    factory = BUILTIN.get(name)
    if factory is None:
        try:
            factory = plugins.load(plugins.BOOTERS, name)
        except plugins.PluginError as exc:
            raise UnknownBooter(str(exc)) from exc
    if factory is None:
        raise UnknownBooter(f"no booter named {name!r} (known: {', '.join(known_booters())})")
    booter: Booter = factory()
    return booter


# -- the product's booter: the site's agents ---------------------------------


class AgentBooter:
    """Start and stop VMs through the agents of the site (`vm.start`, `vm.stop`)."""

    purposes = frozenset({FAILOVER, DRILL})
    # A drill's VMs are started only from signed definitions (the drill
    # builds them: coordinator/dr/drill.py `DrillSpec.definitions`).
    needs_definitions = True
    poll_s = 0.5
    adopt_wait_s = 15.0  # stop: how long a drill VM may take to be adopted

    def preflight(self, req: BootRequest) -> list[Unbootable]:
        """Each VM's agent is named, answers within `req.check_timeout_s`,
        has `vm.start` and lists the VM in its inventory (a standby it
        starts).  Asks `hello` and `inventory` only: nothing is started."""
        if req.purpose not in self.purposes:
            return [Unbootable(v.name, "cannot_start", f"the agent booter cannot boot for "
                               f"{req.purpose!r}") for v in req.vms]
        out = [Unbootable(v.name, "no_agent", "no agent of the site is known to start it: "
                          "register the DR host whose agent defines it and sync its inventory")
               for v in req.vms if v.name not in req.agents]
        if req.tls is None:
            return out + [Unbootable(v.name, "no_agent", "no agent certificate configured "
                                     "(agent_ca, agent_cert, agent_key)")
                          for v in req.vms if v.name in req.agents]
        by_agent: dict[AgentRef, list[str]] = {}
        for v in req.vms:
            if v.name in req.agents:
                by_agent.setdefault(req.agents[v.name], []).append(v.name)
        replies = asyncio.run(self._hello_inventories(req, list(by_agent),
                                                      req.check_timeout_s))
        for agent, r in replies.items():
            vms = by_agent[agent]
            if isinstance(r, BaseException):
                out += [Unbootable(vm, "agent_unreachable", f"agent {agent}: {_why(r)}")
                        for vm in vms]
                continue
            hello, inv = r
            if "vm.start" not in hello.get("capabilities", []):
                out += [Unbootable(vm, "cannot_start", f"agent {agent} has no vm.start")
                        for vm in vms]
                continue
            listed = {v["name"]: v.get("state", "?") for v in inv.get("vms", [])}
            for vm in vms:
                if vm in req.specs and vm not in listed:
                    if not hello.get("signed_definitions"):
                        out.append(Unbootable(vm, "cannot_start", f"agent {agent} takes no "
                                              "signed definition ([libvirt] definition_key "
                                              "unset)"))
                elif vm not in listed:
                    out.append(Unbootable(vm, "unknown_vm", f"agent {agent} does not define "
                                          "it (not in its inventory)"))
                elif listed[vm] == "unknown":
                    out.append(Unbootable(vm, "cannot_start", f"agent {agent} lists it in "
                                          "state unknown (its QMP does not answer)"))
        order = {v.name: k for k, v in enumerate(req.vms)}
        return sorted(out, key=lambda u: order.get(u.vm, 0))

    def start(self, req: BootRequest, on_event: EventHook | None = None) -> list[Guest]:
        if req.purpose == DRILL:
            bare = [v.name for v in req.vms if not req.specs.get(v.name, {}).get("xml")
                    or not req.specs[v.name].get("transient")]
            if bare:
                raise DrillBootUnsupported(f"{', '.join(bare)}: no signed transient "
                                           f"definition; {DRILL_REFUSAL}")
        if req.purpose not in self.purposes:
            raise BootError(f"the agent booter cannot boot for {req.purpose!r}")
        by_agent = self._by_agent(req)
        replies = asyncio.run(self._each_agent(req, by_agent, "vm.start",
                                               lambda vm: {"spec": req.specs.get(
                                                   vm, {"vm": vm})},
                                               req.start_timeout_s))
        guests: list[Guest] = []
        errors: list[str] = []
        for agent, per_vm in replies.items():
            for vm, r in per_vm.items():
                if isinstance(r, BaseException):
                    errors.append(f"{vm}: vm.start on {agent}: {_why(r)}")
                    continue
                g = Guest(vm, str(agent), r.get("start_ms"), bool(r.get("already_running")))
                guests.append(g)
                if on_event:
                    on_event("vm_start", {"vm": vm, "agent": str(agent),
                                          "start_ms": r.get("start_ms"),
                                          "command_ms": r.get("command_ms"),
                                          "already_running": g.already_running})
        order = {v.name: k for k, v in enumerate(req.vms)}
        guests.sort(key=lambda g: order[g.vm])
        if errors:
            raise BootError("; ".join(errors), guests)
        return guests

    def wait_ready(self, req: BootRequest, guests: list[Guest], timeout_s: float,
                   on_event: EventHook | None = None) -> None:
        """Until every guest is ready: by its readiness rule for a drill or
        when the request gives rules (readiness.py); otherwise until its
        agent lists it `running` in its inventory."""
        if req.purpose == DRILL or req.readiness:
            from cutpoint.coordinator.dr import readiness

            readiness.wait(self, req, guests, timeout_s, on_event)
            return
        end = time.monotonic() + timeout_s
        pending = {g.vm for g in guests}
        last: dict[str, str] = {}
        while pending:
            for vm, state in self.states(req, sorted(pending)).items():
                last[vm] = state
                if state == "running":
                    pending.discard(vm)
                    if on_event:
                        on_event("ready", {"vm": vm})
            if not pending:
                return
            if time.monotonic() > end:
                raise BootError(f"not running after {timeout_s:.0f}s: "
                                + ", ".join(f"{vm} ({last.get(vm, 'not listed')})"
                                            for vm in sorted(pending)), guests)
            time.sleep(self.poll_s)

    def states(self, req: BootRequest, vms: list[str]) -> dict[str, str]:
        """Each VM's run state as its agent's inventory lists it ('absent' if not listed)."""
        by_agent = self._by_agent(BootRequest(req.purpose, req.site,
                                              [v for v in req.vms if v.name in vms],
                                              req.tag, agents=req.agents, tls=req.tls))
        out = dict.fromkeys(vms, "absent")
        for agent, inv in asyncio.run(self._inventories(req, list(by_agent))).items():
            if isinstance(inv, BaseException):
                for vm in by_agent[agent]:
                    out[vm] = f"agent unreachable: {_why(inv)}"
                continue
            listed = {v["name"]: v.get("state", "?") for v in inv.get("vms", [])}
            for vm in by_agent[agent]:
                out[vm] = listed.get(vm, "absent")
        return out

    def stop(self, req: BootRequest, guests: list[Guest]) -> list[str]:
        names = {g.vm for g in guests}
        vms = [v for v in req.vms if v.name in names]
        if not vms:
            return []
        try:
            by_agent = self._by_agent(BootRequest(req.purpose, req.site, vms, req.tag,
                                                  agents=req.agents, tls=req.tls))
        except BootError as exc:
            return [str(exc)]
        replies = asyncio.run(self._each_agent(req, by_agent, "vm.stop",
                                               lambda vm: {"vm": vm}, 60))
        # A drill VM its agent has not adopted yet (discovery follows
        # libvirt's event, usually within milliseconds): asked again for a
        # while, never left running because the agent did not know it yet.
        end = time.monotonic() + (self.adopt_wait_s if req.purpose == DRILL else 0)
        while time.monotonic() < end:
            again = {agent: [vm for vm, r in per_vm.items() if _unknown_vm(r)]
                     for agent, per_vm in replies.items()}
            again = {a: vms for a, vms in again.items() if vms}
            if not again:
                break
            time.sleep(self.poll_s)
            for agent, per_vm in asyncio.run(self._each_agent(
                    req, again, "vm.stop", lambda vm: {"vm": vm}, 60)).items():
                replies[agent].update(per_vm)
        return [f"{vm}: vm.stop on {agent}: {_why(r)}"
                for agent, per_vm in replies.items() for vm, r in per_vm.items()
                if isinstance(r, BaseException)]

    def leftovers(self, req: BootRequest) -> dict[str, list[str]]:
        """The request's VMs that their agents still list as anything but shut
        off (an unreachable agent's are listed: nobody can say they stopped);
        for a drill, anything but absent (its transient domains leave no
        definition once stopped).  Nothing for VMs no agent was named for."""
        if req.purpose not in self.purposes:
            return {}
        try:
            states = self.states(req, [v.name for v in req.vms])
        except NoAgent:
            return {}
        gone = ("absent",) if req.purpose == DRILL else ("shutoff", "absent")
        return {"vms": sorted(f"{vm} ({s})" for vm, s in states.items() if s not in gone)}

    # -- agent calls --

    @staticmethod
    def _by_agent(req: BootRequest) -> dict[AgentRef, list[str]]:
        missing = [v.name for v in req.vms if v.name not in req.agents]
        if missing:
            raise NoAgent(f"no agent of the site is known to start {', '.join(missing)}: "
                          "register the site's host whose agent defines these VMs, and "
                          "sync its inventory")
        if req.tls is None:
            raise NoAgent("no agent certificate configured (agent_ca, agent_cert, agent_key)")
        out: dict[AgentRef, list[str]] = {}
        for v in req.vms:
            out.setdefault(req.agents[v.name], []).append(v.name)
        return out

    @staticmethod
    async def _each_agent(req: BootRequest, by_agent: dict[AgentRef, list[str]], method: str,
                          params: Callable[[str], dict[str, Any]], timeout_s: float) \
            -> dict[AgentRef, dict[str, dict[str, Any] | BaseException]]:
        """`method` for every VM, the VMs of one agent on one connection, all in parallel."""
        from cutpoint.agentclient.client import AgentClient
        from cutpoint.agentclient.tls import client_context

        assert req.tls is not None
        ctx = client_context(*req.tls)

        async def one(agent: AgentRef, vms: list[str]) \
                -> dict[str, dict[str, Any] | BaseException]:
            try:
                async with AgentClient(agent.address, agent.port, ssl_context=ctx,
                                       cert_sha256=agent.cert_sha256,
                                       connect_timeout=10, call_timeout=timeout_s) as c:
                    res = await asyncio.gather(*(c.call(method, params(vm)) for vm in vms),
                                               return_exceptions=True)
            except Exception as exc:  # noqa: BLE001  the agent itself: every VM of it failed
                return dict.fromkeys(vms, exc)
            return dict(zip(vms, res, strict=True))

        agents = list(by_agent)
        done = await asyncio.gather(*(one(a, by_agent[a]) for a in agents))
        return dict(zip(agents, done, strict=True))

    @staticmethod
    async def _hello_inventories(req: BootRequest, agents: list[AgentRef], timeout_s: float) \
            -> dict[AgentRef, tuple[dict[str, Any], dict[str, Any]] | BaseException]:
        from cutpoint.agentclient.client import AgentClient
        from cutpoint.agentclient.tls import client_context

        assert req.tls is not None
        ctx = client_context(*req.tls)

        async def one(agent: AgentRef) -> tuple[dict[str, Any], dict[str, Any]] | BaseException:
            try:
                async with AgentClient(agent.address, agent.port, ssl_context=ctx,
                                       cert_sha256=agent.cert_sha256,
                                       connect_timeout=timeout_s,
                                       call_timeout=timeout_s) as c:
                    hello: dict[str, Any] = await c.call("hello", {})
                    inv: dict[str, Any] = await c.call("inventory", {})
                    return hello, inv
            except Exception as exc:  # noqa: BLE001  reported per VM by the caller
                return exc

        done = await asyncio.gather(*(one(a) for a in agents))
        return dict(zip(agents, done, strict=True))

    @staticmethod
    async def _inventories(req: BootRequest, agents: list[AgentRef]) \
            -> dict[AgentRef, dict[str, Any] | BaseException]:
        from cutpoint.agentclient.client import AgentClient
        from cutpoint.agentclient.tls import client_context

        assert req.tls is not None
        ctx = client_context(*req.tls)

        async def one(agent: AgentRef) -> dict[str, Any] | BaseException:
            try:
                async with AgentClient(agent.address, agent.port, ssl_context=ctx,
                                       cert_sha256=agent.cert_sha256,
                                       connect_timeout=10, call_timeout=30) as c:
                    inv: dict[str, Any] = await c.call("inventory", {})
                    return inv
            except Exception as exc:  # noqa: BLE001  reported per VM by the caller
                return exc

        done = await asyncio.gather(*(one(a) for a in agents))
        return dict(zip(agents, done, strict=True))


def _unknown_vm(r: object) -> bool:
    from cutpoint.agentclient.errors import AgentReplyError

    return isinstance(r, AgentReplyError) and r.code == "UNKNOWN_VM"


def _why(exc: BaseException) -> str:
    from cutpoint.agentclient.errors import AgentReplyError

    if isinstance(exc, AgentReplyError):
        return f"{exc.code}: {exc.message}"
    return f"{type(exc).__name__}: {exc}"


BUILTIN["agent"] = AgentBooter
