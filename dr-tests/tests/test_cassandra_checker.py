"""Unit tests of the Cassandra drill checker (no VM).  The log lines are
Cassandra 5.0.4's own, as printed by the image's logback configuration."""

from __future__ import annotations

import json

import pytest
from cutpoint.checkers import cassandra as cc

IPS = {"node1": "10.79.0.11", "node2": "10.79.0.12"}


def _console(other: str, replayed: int = 12,
             check: dict | None = None) -> str:
    lines = [
        ("INFO [main] 00:06:06 CommitLog: Replaying /srv/clog/commitlog/"
         "CommitLog-7-1795305507146.log"),
        (f"INFO [main] 00:06:06 CommitLog: Log replay complete, {replayed} "
         "replayed mutations in 84 ms"),
        (f"INFO [GossipStage:1] 00:06:30 Gossiper: Node /{other}:7000 is now "
         "part of the cluster"),
        (f"INFO [GossipStage:1] 00:06:30 Gossiper: InetAddress /{other}:7000 "
         "is now UP"),
        "INFO [main] 00:06:07 CassandraDaemon: Startup complete",
    ]
    if check is not None:
        lines.append("[  201.5] cp-workload[412]: CPCHECK " + json.dumps(check))
    return "\n".join(lines) + "\n"


def _oplog(n: int) -> bytes:
    return b"".join(b"%015d %016x\n" % (i, i * 7919) for i in range(1, n + 1))


GOOD = {"oplog": {"records": 50, "last": 50, "bad": 0, "torn_bytes": 0},
        "read_all": {"ok": True, "rows": 53, "max_id": 53, "missing": 0,
                     "missing_first": [], "wrong_value": 0, "wrong_first": []}}


def _consoles(check: dict | None = GOOD, replay2: bool = True) -> dict:
    c2 = _console("10.79.0.11")
    if not replay2:
        c2 = c2.replace("Log replay complete", "Log replay skipped")
    return {"node1": _console("10.79.0.12", check=check),
            "node2": c2}


def test_a_recovered_cluster_passes() -> None:
    r = cc.check_cluster(_consoles(), IPS, _oplog(50), _oplog(80), "node1")
    assert r.passed, r.reasons
    assert r.oplog_prefix and r.oplog_last == 50 and r.missing == 0
    assert [n.replayed_mutations for n in r.nodes] == [12, 12]
    assert r.nodes[0].saw_up == ["10.79.0.12"]
    assert any("Log replay complete" in x for x in r.nodes[1].recovery_log)


def test_snapshot_oplog_not_a_prefix_fails() -> None:
    snap = bytearray(_oplog(50))
    snap[40] ^= 1
    r = cc.check_cluster(_consoles(), IPS, bytes(snap), _oplog(80), "node1")
    assert not r.passed and not r.oplog_prefix
    assert any("differs at byte 40" in x for x in r.reasons)


def test_a_longer_snapshot_oplog_is_not_a_prefix() -> None:
    assert cc.is_prefix(b"", b"x") and cc.is_prefix(b"ab", b"abc")
    assert not cc.is_prefix(b"abcd", b"abc")


def test_host_and_guest_oplogs_must_agree() -> None:
    """A snapshot log read on the host that is shorter than what the
    restored node read (an ext4 journal not replayed) fails the check."""
    r = cc.check_cluster(_consoles(), IPS, _oplog(7), _oplog(80), "node1")
    assert not r.passed and r.oplog_prefix
    assert any("restored node read 50 operation-log records, the snapshot's "
               "log read on the host has 7" in x for x in r.reasons)


def test_missing_or_wrong_writes_fail() -> None:
    bad = json.loads(json.dumps(GOOD))
    bad["read_all"].update(missing=2, missing_first=[49, 50], wrong_value=1,
                           wrong_first=[7])
    r = cc.check_cluster(_consoles(bad), IPS, _oplog(50), _oplog(50), "node1")
    assert not r.passed
    assert any("2 logged writes are not readable at ALL" in x
               for x in r.reasons)
    assert any("1 logged writes read back with another value" in x
               for x in r.reasons)


def test_no_replay_no_rejoin_no_check_all_reported() -> None:
    cons = _consoles(check=None, replay2=False)
    cons["node1"] = cons["node1"].replace("is now UP", "is now DOWN")
    r = cc.check_cluster(cons, IPS, _oplog(5), _oplog(5), "node1")
    assert not r.passed
    text = "\n".join(r.reasons)
    assert "node2: no 'Log replay complete'" in text
    assert "node1: never saw 10.79.0.12 come UP" in text
    assert "no CPCHECK line" in text


def test_empty_oplog_and_failed_read_at_all_fail() -> None:
    f = {"oplog": {"records": 0, "last": 0, "bad": 0, "torn_bytes": 0},
         "read_all": {"ok": False, "error": "Unavailable: ALL needs 2, 1 alive"}}
    r = cc.check_cluster(_consoles(f), IPS, b"", _oplog(3), "node1")
    assert not r.passed
    assert any("operation log is empty" in x for x in r.reasons)
    assert any("read at ALL failed: Unavailable" in x for x in r.reasons)


def test_unknown_writer_is_a_clear_error() -> None:
    with pytest.raises(cc.CheckerInputError, match="writer node 'node9'"):
        cc.check_cluster(_consoles(), IPS, b"", b"", "node9")


def test_bad_cpcheck_json_is_a_clear_error() -> None:
    cons = _consoles(check=None)
    cons["node1"] += "CPCHECK {not json}\n"
    with pytest.raises(cc.CheckerInputError, match="not JSON"):
        cc.check_cluster(cons, IPS, b"", b"", "node1")
