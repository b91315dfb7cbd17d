"""Drill checks: what a drill runs once its VMs are ready.

A check is a function of the drill's context

    check(ctx: CheckContext) -> {"ok": bool, "summary": str, ...}

`ctx` has the DR `site` (a CephSite), the drill's clones (`images`:
`ImageRef`s, in VM then disk order), the drill's VMs (`vms`: each its
name in the drill, the group's VM it copies, and the agent that started
it), the check's `params` and `timeout_s`, and `guest_exec(vm, ...)` and
`addresses(vm)` into a VM through its agent (guest.py).  Whatever else it
returns goes into the drill report, with the check's output (`output`).
A check that raises, or runs past its timeout, is a failed check.  A
function of two arguments, `check(site, images)` (the older form), is
still called so.

A drill names its checks as `CheckSpec`s (`{"name", "params",
"timeout_s"}`, or a bare name): declared per group or per drill request
through the API.

    get(name)   the check called `name`, or UnknownCheck
    known()     every name get() accepts
    register(name, check)   add one in this process
    run(spec, ctx)          one check with its timeout, as the drill runs it

Built in: `writer` (the writer workload's proof, writer_records.py), and
in checks_builtin.py `guest-exec`, `tcp`, `http`, `script`, `postgres`,
`cassandra`.  Other packages register theirs under the entry-point group
`cutpoint.drill_checks` (plugins.py).
"""

from __future__ import annotations

import inspect
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cutpoint.coordinator.dr import plugins
from cutpoint.coordinator.dr.site import CephSite, ImageRef

Check = Callable[..., dict[str, Any]]
DEFAULT_TIMEOUT_S = 300.0


class UnknownCheck(LookupError):
    """No check of that name (the message lists the known ones), or it cannot be loaded."""


class CheckError(ValueError):
    """A check asked with parameters it cannot use (the message says why)."""


@dataclass(frozen=True)
class DrillVM:
    name: str  # its name in the drill (drill-<id>-<vm> through the agents)
    original: str  # the group's VM it is a copy of
    agent: Any = None  # the AgentRef that started it; None: a booter of its own


@dataclass(frozen=True)
class CheckSpec:
    name: str
    params: dict[str, Any] = field(default_factory=dict)
    timeout_s: float = DEFAULT_TIMEOUT_S

    @classmethod
    def parse(cls, c: str | dict[str, Any] | CheckSpec) -> CheckSpec:
        if isinstance(c, CheckSpec):
            return c
        if isinstance(c, str):
            return cls(c)
        if not isinstance(c, dict) or not isinstance(c.get("name"), str):
            raise CheckError(f"a check is a name or {{name, params, timeout_s}}, not {c!r}")
        extra = set(c) - {"name", "params", "timeout_s"}
        if extra:
            raise CheckError(f"check {c['name']}: unknown key(s) {sorted(extra)}")
        t = c.get("timeout_s")
        if t is not None and (not isinstance(t, int | float) or not 0 < t <= 3600):
            raise CheckError(f"check {c['name']}: timeout_s is 1-3600 seconds")
        p = c.get("params")
        p = {} if p is None else p
        if not isinstance(p, dict):
            raise CheckError(f"check {c['name']}: params is an object")
        return cls(c["name"], dict(p), float(t or DEFAULT_TIMEOUT_S))

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "params": self.params, "timeout_s": self.timeout_s}


@dataclass
class CheckContext:
    site: CephSite
    images: list[ImageRef]
    vms: list[DrillVM] = field(default_factory=list)
    params: dict[str, Any] = field(default_factory=dict)
    timeout_s: float = DEFAULT_TIMEOUT_S
    tls: tuple[str, str, str] | None = None
    drill_id: str = ""
    _addresses: dict[str, list[str]] = field(default_factory=dict)
    # The recovery point's DR snapshots the clones (`images`) were made from.
    points: list[ImageRef] = field(default_factory=list)

    def vm(self, name: str | None = None) -> DrillVM:
        """A drill VM by its drill name or the group VM's name; the first
        one when `name` is None."""
        if not self.vms:
            raise CheckError("the drill has no VMs a check can reach")
        if name is None:
            return self.vms[0]
        for v in self.vms:
            if name in (v.name, v.original):
                return v
        raise CheckError(f"no drill VM {name!r} (the drill's: "
                         f"{', '.join(v.original for v in self.vms)})")

    def selected(self) -> list[DrillVM]:
        """params.vm (one name), params.vms (a list), or every VM."""
        if "vm" in self.params:
            return [self.vm(str(self.params["vm"]))]
        if "vms" in self.params:
            return [self.vm(str(n)) for n in self.params["vms"]]
        return list(self.vms)

    def guest_exec(self, vm: DrillVM, path: str, args: list[str] | None = None,
                   input: str | None = None, timeout_s: float | None = None) -> Any:
        from cutpoint.coordinator.dr import guest

        if vm.agent is None or self.tls is None:
            raise CheckError(f"{vm.original}: its guest is not reachable through an agent "
                             "(this drill's booter starts VMs of its own)")
        return guest.run(self.tls, vm.agent, vm.name, path, args, input,
                         timeout_s or self.timeout_s)

    def addresses(self, vm: DrillVM) -> list[str]:
        """The VM's IPv4 addresses, as the guest reports them (`ip -4 -o addr`
        run in it through guest-exec): its addresses on the drill network."""
        if vm.name not in self._addresses:
            r = self.guest_exec(vm, "/bin/sh", ["-c", "ip -4 -o addr show scope global"],
                                timeout_s=30)
            self._addresses[vm.name] = [w.split("/")[0] for ln in r.stdout.splitlines()
                                        for k, w in zip(ln.split(), ln.split()[1:],
                                                        strict=False) if k == "inet"]
        return self._addresses[vm.name]


def writer(ctx: CheckContext) -> dict[str, Any]:
    """The writer's records on every image of the recovery point are exactly
    1..p, each once.  Read from the DR snapshots the clones were made from
    (`points`), not from the clones: a booted copy's writer starts a run of
    its own on its clone before the check reads it."""
    from cutpoint.coordinator.dr.writer_records import CephImageSpec, scan_specs

    v = scan_specs([CephImageSpec(ctx.site, i) for i in (ctx.points or ctx.images)])
    return {"ok": v.ok, "summary": v.summary(), "verdict": v.as_dict(),
            "read": [str(i) for i in (ctx.points or ctx.images)]}


_REGISTRY: dict[str, Check] = {"writer": writer}


def _builtins() -> None:
    from cutpoint.coordinator.dr import checks_builtin

    for name, fn in checks_builtin.BUILTIN.items():
        _REGISTRY.setdefault(name, fn)


def register(name: str, check: Check) -> None:
    if not name or not callable(check):
        raise ValueError(f"a check needs a name and a function, got {name!r}, {check!r}")
    _REGISTRY[name] = check


def known() -> list[str]:
    _builtins()
    return sorted(set(_REGISTRY) | set(plugins.names(plugins.DRILL_CHECKS)))


def get(name: str) -> Check:
    _builtins()
    builtin = _REGISTRY.get(name)
    if builtin is not None:
        return builtin
    try:
        found = plugins.load(plugins.DRILL_CHECKS, name)
    except plugins.PluginError as exc:
        raise UnknownCheck(str(exc)) from exc
    if found is None:
        raise UnknownCheck(f"no drill check named {name!r} (known: {', '.join(known())})")
    if not callable(found):
        raise UnknownCheck(f"drill check {name!r} is not a function: {found!r}")
    check: Check = found
    _REGISTRY[name] = check
    return check


def _call(fn: Check, ctx: CheckContext) -> dict[str, Any]:
    try:
        n = len([p for p in inspect.signature(fn).parameters.values()
                 if p.default is inspect.Parameter.empty
                 and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)])
    except (TypeError, ValueError):
        n = 1
    return fn(ctx.site, list(ctx.images)) if n == 2 else fn(ctx)


def run(spec: CheckSpec, ctx: CheckContext) -> dict[str, Any]:
    """One check, bounded by spec.timeout_s: {name, params, ok, summary,
    seconds, ...}.  A check still running at its timeout is failed (its
    thread is left to end on its own; what it runs in a guest has its own
    deadline there)."""
    t0 = time.monotonic()
    box: dict[str, Any] = {}

    def go() -> None:
        try:
            box["r"] = _call(get(spec.name), ctx)
        except Exception as exc:  # noqa: BLE001  a crashed check is a failed check
            box["r"] = {"ok": False, "summary": f"check crashed: {type(exc).__name__}: {exc}"}

    th = threading.Thread(target=go, name=f"check-{spec.name}", daemon=True)
    th.start()
    th.join(spec.timeout_s)
    r = box.get("r") or {"ok": False, "summary": f"timed out after {spec.timeout_s:.0f} s"}
    return {"name": spec.name, "params": spec.params, "timeout_s": spec.timeout_s,
            "seconds": round(time.monotonic() - t0, 3), **r}
