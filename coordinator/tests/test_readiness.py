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
