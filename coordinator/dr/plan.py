"""Recovery plans: the order in which a group's VMs boot at DR, and what runs
around each step.  Drills and failover use the same plan.

    {
      "boot_groups": [
        {"name": "db",  "vms": [{"vm": "db1", "readiness": {"kind": "guest-ping"},
                                 "delay_s": 5}],
         "pre":  [hook, ...],            # before this group's VMs start
         "post": [hook, ...]},           # once every one of them is ready
        {"name": "app", "vms": [{"vm": "app1",
                                 "readiness": {"kind": "tcp", "port": 8080,
                                               "address": "10.99.0.21"}}]}
      ],
      "networks": {"failover": {"br-prod": "br-dr"},   # production -> DR network
                   "drill": "cpdrill0"},               # the isolated drill bridge
      "drill_checks": [{"name": "guest-exec", "params": {...}}, ...]
    }

A hook is `{"kind": "guest-exec", "vm", "path", "args"?, "timeout_s"?}`
(in a VM of this or an earlier boot group, through its agent; it must exit
0) or `{"kind": "script", "path", "args"?, "timeout_s"?}` (on the control
side; exit 0).  A failed hook fails the boot.  VMs of the group that no
boot group names boot last, together.  `delay_s` waits that long after a
VM is ready before its group counts as ready (readiness.py).

    RecoveryPlan.parse(body)                      -> RecoveryPlan (PlanError)
    boot_in_order(booter, req, plan, timeout_s, on_event, names)  -> [Guest]
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
from dataclasses import dataclass, field
from typing import Any

from cutpoint.coordinator.dr.readiness import Readiness, RuleError


class PlanError(ValueError):
    """A plan that cannot be used (the message says why)."""


@dataclass(frozen=True)
class Hook:
    kind: str  # guest-exec | script
    path: str
    args: tuple[str, ...] = ()
    vm: str | None = None
    timeout_s: float = 60

    @classmethod
    def parse(cls, d: Any, where: str) -> Hook:
        if not isinstance(d, dict):
            raise PlanError(f"{where}: a hook is an object")
        extra = set(d) - {"kind", "path", "args", "vm", "timeout_s"}
        if extra:
            raise PlanError(f"{where}: unknown key(s) {sorted(extra)}")
        if d.get("kind") not in ("guest-exec", "script"):
            raise PlanError(f"{where}: kind is guest-exec or script")
        if not isinstance(d.get("path"), str) or not d["path"].startswith("/"):
            raise PlanError(f"{where}: path is an absolute path")
        if d["kind"] == "guest-exec" and not isinstance(d.get("vm"), str):
            raise PlanError(f"{where}: a guest-exec hook names its vm")
        args = d.get("args") or []
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise PlanError(f"{where}: args is a list of strings")
        t = d.get("timeout_s", 60)
        if not isinstance(t, int | float) or not 0 < t <= 3600:
            raise PlanError(f"{where}: timeout_s is 1-3600 seconds")
        return cls(d["kind"], d["path"], tuple(args), d.get("vm"), float(t))


@dataclass(frozen=True)
class PlanVM:
    vm: str
    readiness: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class BootGroup:
    name: str
    vms: tuple[PlanVM, ...]
    pre: tuple[Hook, ...] = ()
    post: tuple[Hook, ...] = ()


@dataclass(frozen=True)
class RecoveryPlan:
    boot_groups: tuple[BootGroup, ...] = ()
    failover_networks: dict[str, str] = field(default_factory=dict)
    drill_network: str | None = None
    drill_checks: tuple[Any, ...] = ()

    @classmethod
    def parse(cls, body: Any) -> RecoveryPlan:
        try:
            return cls._parse(body)
        except (TypeError, ValueError, AttributeError) as exc:
            if isinstance(exc, PlanError):
                raise
            raise PlanError(f"not a plan: {type(exc).__name__}: {exc}") from None

    @classmethod
    def _parse(cls, body: Any) -> RecoveryPlan:
        from cutpoint.coordinator.dr.checks import CheckError, CheckSpec

        if body is None:
            return cls()
        if not isinstance(body, dict):
            raise PlanError("a plan is an object")
        extra = set(body) - {"boot_groups", "networks", "drill_checks"}
        if extra:
            raise PlanError(f"unknown key(s) {sorted(extra)}")
        for key in ("boot_groups", "drill_checks"):
            if not isinstance(body.get(key) or [], list):
                raise PlanError(f"{key} is a list")
        groups: list[BootGroup] = []
        seen: set[str] = set()
        for i, g in enumerate(body.get("boot_groups") or []):
            where = f"boot_groups[{i}]"
            if not isinstance(g, dict) or not isinstance(g.get("vms"), list) or not g["vms"]:
                raise PlanError(f"{where}: an object with a non-empty vms list")
            if set(g) - {"name", "vms", "pre", "post"}:
                raise PlanError(f"{where}: unknown key(s) "
                                f"{sorted(set(g) - {'name', 'vms', 'pre', 'post'})}")
            for k in ("pre", "post"):
                if not isinstance(g.get(k) or [], list):
                    raise PlanError(f"{where}.{k} is a list of hooks")
            vms = []
            for j, v in enumerate(g["vms"]):
                v = {"vm": v} if isinstance(v, str) else v
                if not isinstance(v, dict) or not isinstance(v.get("vm"), str):
                    raise PlanError(f"{where}.vms[{j}]: a VM name or {{vm, readiness, "
                                    "delay_s}")
                if set(v) - {"vm", "readiness", "delay_s"}:
                    raise PlanError(f"{where}.vms[{j}]: unknown key(s)")
                if v["vm"] in seen:
                    raise PlanError(f"VM {v['vm']!r} is in two boot groups")
                seen.add(v["vm"])
                if not isinstance(v.get("readiness") or {}, dict):
                    raise PlanError(f"{where}.vms[{j}]: readiness is an object")
                rule = dict(v.get("readiness") or {})
                if "delay_s" in v:
                    rule["delay_s"] = v["delay_s"]
                try:
                    Readiness.parse(rule)
                except RuleError as exc:
                    raise PlanError(f"{where}.vms[{j}] ({v['vm']}): {exc}") from exc
                vms.append(PlanVM(v["vm"], rule))
            groups.append(BootGroup(
                str(g.get("name") or f"group-{i + 1}"), tuple(vms),
                tuple(Hook.parse(h, f"{where}.pre[{k}]") for k, h in enumerate(g.get("pre") or [])),
                tuple(Hook.parse(h, f"{where}.post[{k}]")
                      for k, h in enumerate(g.get("post") or []))))
        nets = body.get("networks") or {}
        if not isinstance(nets, dict) or set(nets) - {"failover", "drill"}:
            raise PlanError("networks: {failover: {production: DR}, drill: BRIDGE}")
        fo = nets.get("failover") or {}
        if not isinstance(fo, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                               for k, v in fo.items()):
            raise PlanError("networks.failover maps a production network to a DR one")
        drill = nets.get("drill")
        if drill is not None and (not isinstance(drill, str)
                                  or not re.fullmatch(r"[A-Za-z0-9_.-]{1,15}", drill)):
            raise PlanError("networks.drill names the isolated drill bridge (an interface "
                            "name: 1-15 of A-Z a-z 0-9 _ . -)")
        try:
            dchecks = tuple(CheckSpec.parse(c) for c in body.get("drill_checks") or [])
        except CheckError as exc:
            raise PlanError(f"drill_checks: {exc}") from exc
        return cls(tuple(groups), dict(fo), drill, dchecks)

    def groups_for(self, vms: list[str]) -> list[BootGroup]:
        """The boot groups over `vms` (the group's VMs), in order: the plan's
        (only their VMs that are in `vms`), then one of every VM no group
        names."""
        out = []
        for g in self.boot_groups:
            mine = tuple(v for v in g.vms if v.vm in vms)
            if mine:
                out.append(dataclasses.replace(g, vms=mine))
        named = {v.vm for g in out for v in g.vms}
        rest = tuple(PlanVM(v) for v in vms if v not in named)
        if rest:
            out.append(BootGroup("unplanned" if self.boot_groups else "all", rest))
        return out


def _hook(h: Hook, req: Any, names: dict[str, str]) -> str:
    """Runs one hook; its output (raises BootError when it fails)."""
    from cutpoint.coordinator.dr import guest
    from cutpoint.coordinator.dr.boot import BootError

    if h.kind == "script":
        env = {**os.environ, "CP_BOOT_TAG": req.tag, "CP_BOOT_VMS": json.dumps(names)}
        try:
            r = subprocess.run([h.path, *h.args], env=env, capture_output=True, text=True,
                               timeout=h.timeout_s, stdin=subprocess.DEVNULL, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise BootError(f"hook {h.path}: {exc}") from exc
        if r.returncode != 0:
            raise BootError(f"hook {h.path} exited {r.returncode}: {r.stderr.strip()[:300]}")
        return r.stdout
    boot = names.get(h.vm or "", h.vm or "")
    if boot not in req.agents or req.tls is None:
        raise BootError(f"hook {h.path} in {h.vm}: that VM has not been started through an "
                        "agent (a guest-exec hook runs in a VM of this or an earlier group)")
    try:
        r = guest.run(req.tls, req.agents[boot], boot, h.path, list(h.args), None, h.timeout_s)
    except guest.GuestError as exc:
        raise BootError(f"hook {h.path} in {h.vm}: {exc}") from exc
    if r.exitcode != 0:
        raise BootError(f"hook {h.path} in {h.vm} exited {r.exitcode}: {r.stderr.strip()[:300]}")
    return r.stdout


def boot_in_order(booter: Any, req: Any, plan: RecoveryPlan, timeout_s: float,
                  on_event: Any = None, names: dict[str, str] | None = None) -> list[Any]:
    """Boots req.vms group by group: a group's pre hooks, its VMs started,
    each ready by its rule (the plan's, else req.readiness), its post
    hooks; then the next group.  `names`: the group's VM name -> its name in
    req (a drill's `drill-<id>-<vm>`; default the same).  Returns every
    guest started; a BootError carries them (the caller stops them)."""
    from cutpoint.coordinator.dr.boot import BootError

    names = dict(names or {})
    original = {boot: orig for orig, boot in names.items()}  # req's name -> the group's
    orig_of = {v.name: original.get(v.name, v.name) for v in req.vms}
    by_orig = {orig_of[v.name]: v for v in req.vms}
    guests: list[Any] = []
    groups = plan.groups_for(list(by_orig))
    for n, g in enumerate(groups):
        sub = dataclasses.replace(req, vms=[by_orig[v.vm] for v in g.vms],
                                  readiness={**req.readiness, **{
                                      by_orig[v.vm].name: v.readiness for v in g.vms
                                      if v.readiness}})
        if on_event:
            on_event("boot_group", {"status": "started", "group": g.name, "order": n + 1,
                                    "vms": [v.vm for v in g.vms]})
        try:
            for h in g.pre:
                _hook(h, req, {o: b.name for o, b in by_orig.items()})
            started = booter.start(sub, on_event)
            guests += started
            if on_event:
                on_event("boot", {"status": "started", "group": g.name, "started": started})
            booter.wait_ready(sub, started, timeout_s, on_event)
            for h in g.post:
                _hook(h, req, {o: b.name for o, b in by_orig.items()})
        except BootError as exc:
            more = [x for x in exc.guests if x not in guests]
            if not plan.boot_groups:  # no plan: the booter's own error, as it was
                exc.guests = guests + more
                raise
            raise type(exc)(f"boot group {g.name}: {exc}", guests + more) from exc
        if on_event:
            on_event("boot_group", {"status": "ok", "group": g.name, "order": n + 1,
                                    "vms": [v.vm for v in g.vms]})
    return guests
