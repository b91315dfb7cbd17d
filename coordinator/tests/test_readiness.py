"""Readiness rules (coordinator/dr/readiness.py): parsing, and the TCP
probe against a real listening socket and a closed port."""

from __future__ import annotations

import socket

import pytest
from cutpoint.coordinator.dr.readiness import Readiness, RuleError, tcp_open


def test_default_is_guest_ping() -> None:
    assert Readiness.parse(None) == Readiness()
    assert str(Readiness.parse({})) == "guest-ping"
    r = Readiness.parse({"kind": "tcp", "port": 5432, "address": "10.99.0.11",
                         "timeout_s": 120, "delay_s": 5})
    assert r.as_dict() == {"kind": "tcp", "port": 5432, "address": "10.99.0.11",
                           "timeout_s": 120, "delay_s": 5.0}


@pytest.mark.parametrize("rule, why", [
    ({"kind": "console"}, "one of guest-ping, tcp"),
    ({"kind": "tcp", "address": "10.0.0.1"}, "needs a port"),
    ({"kind": "tcp", "port": 70000, "address": "10.0.0.1"}, "needs a port"),
    ({"kind": "tcp", "port": 22}, "needs the address"),
    ({"timeout_s": -1}, "timeout_s"),
    ({"delay_s": "5"}, "delay_s"),
    ({"kind": "guest-ping", "line": "ready"}, "unknown key"),
    ("guest-ping", "an object"),
])
def test_bad_rules_are_refused(rule: object, why: str) -> None:
    with pytest.raises(RuleError, match=why):
        Readiness.parse(rule)  # type: ignore[arg-type]


def test_tcp_probe_open_and_closed() -> None:
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)
        port = srv.getsockname()[1]
        assert tcp_open("127.0.0.1", port, 1)
    assert not tcp_open("127.0.0.1", port, 1)  # closed now: refused


def test_boot_in_order_without_a_plan_keeps_the_booters_error() -> None:
    """No plan: one start of every VM, and the booter's own error type and
    message (a drill report names DrillBootUnsupported as it did); with a
    plan of two groups: the first group's failure names its group, keeps
    the type, and the second group is never started."""
    from cutpoint.coordinator.dr.boot import (
        DRILL,
        AgentBooter,
        BootDisk,
        BootRequest,
        BootVM,
        DrillBootUnsupported,
    )
    from cutpoint.coordinator.dr.plan import RecoveryPlan, boot_in_order
    from cutpoint.coordinator.dr.site import CephSite

    site = CephSite("dr", pools={"rbd": "rbd"}, ceph_conf="/nonexistent/ceph.conf")
    req = BootRequest(DRILL, site, [BootVM(v, (BootDisk("vda", f"{v}-d"),)) for v in
                                    ("a", "b")], "drill-x")
    with pytest.raises(DrillBootUnsupported) as exc:
        boot_in_order(AgentBooter(), req, RecoveryPlan(), 10)
    assert str(exc.value).startswith("a, b: no signed transient definition")
    seen: list[tuple[str, dict]] = []
    plan = RecoveryPlan.parse({"boot_groups": [{"name": "one", "vms": ["b"]},
                                               {"name": "two", "vms": ["a"]}]})
    with pytest.raises(DrillBootUnsupported) as exc:
        boot_in_order(AgentBooter(), req, plan, 10, lambda s, d: seen.append((s, d)))
    assert str(exc.value).startswith("boot group one: b: no signed transient definition")
    assert [(s, d["group"], d["status"]) for s, d in seen] == [("boot_group", "one", "started")]


@pytest.mark.parametrize("body", [{"boot_groups": 5}, {"drill_checks": 3},
                                  {"boot_groups": [{"vms": ["a"], "pre": 5}]},
                                  {"boot_groups": [{"vms": [{"vm": "a", "readiness": [1]}]}]},
                                  {"boot_groups": [{"vms": [5]}]}, {"networks": {"drill": 5}},
                                  {"boot_groups": [{"vms": ["a"], "post": [{"kind": "x"}]}]}])
def test_a_malformed_plan_is_a_plan_error(body: dict) -> None:
    from cutpoint.coordinator.dr.plan import PlanError, RecoveryPlan

    with pytest.raises(PlanError):
        RecoveryPlan.parse(body)


def test_boot_in_order_maps_the_groups_vms_to_their_boot_names() -> None:
    """A drill's request names drill-<id>-<vm>; the plan names the group's
    VMs: each boot group starts its own VMs, under their boot names, in the
    plan's order (a booter that records what it was asked)."""
    from cutpoint.coordinator.dr.boot import DRILL, BootRequest, BootVM, Guest
    from cutpoint.coordinator.dr.plan import RecoveryPlan, boot_in_order

    asked: list[list[str]] = []

    class Recording:
        purposes = frozenset({DRILL})

        def start(self, req: BootRequest, on_event: object = None) -> list[Guest]:
            asked.append([v.name for v in req.vms])
            return [Guest(v.name) for v in req.vms]

        def wait_ready(self, req: BootRequest, guests: list[Guest], timeout_s: float,
                       on_event: object = None) -> None:
            asked[-1].append(f"ready:{sorted(req.readiness)}")

    req = BootRequest(DRILL, None, [BootVM(f"drill-x-{v}", ()) for v in ("a", "b", "c")],
                      "drill-x")
    plan = RecoveryPlan.parse({"boot_groups": [
        {"name": "db", "vms": [{"vm": "b", "delay_s": 1}]}, {"name": "app", "vms": ["a"]}]})
    guests = boot_in_order(Recording(), req, plan, 10, None,
                           {v: f"drill-x-{v}" for v in ("a", "b", "c")})
    assert asked == [["drill-x-b", "ready:['drill-x-b']"], ["drill-x-a", "ready:[]"],
                     ["drill-x-c", "ready:[]"]]
    assert [g.vm for g in guests] == ["drill-x-b", "drill-x-a", "drill-x-c"]
