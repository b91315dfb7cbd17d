"""Cassandra recovery drill on the Debian image under QEMU/TCG (issue 8
item 3).  Runs under ``make drills`` (marker ``slow``): two Cassandra 5.0
VMs under TCG take minutes to start, twice (primary and restored copies).

Real parts only: the mmdebstrap image with Cassandra's jars from Maven
Central (built once, cached by recipe hash), QEMU, a bridge and two taps of
the drill's own (10.79.0.0/24), Cassandra at RF 2 with the commit log on
its own disk (group sync), the CL=ALL writer and its operation log, and
group snapshots of both VMs through cutpointd + ``cutpoint snapshot
--group-file``.  No Ceph, so no lab lock.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from cutpoint.checkers import cassdrill

pytestmark = [pytest.mark.lab, pytest.mark.slow,
              pytest.mark.skipif(os.geteuid() != 0, reason="needs root")]


def _summary(rep: dict) -> str:
    return json.dumps({"primary": rep["primary"], "drills": [
        {k: d[k] for k in ("passed", "reasons", "rto_startup_complete_s",
                           "rto_read_all_s", "rto_check_done_s")}
        | {"snap": d["snapshot"], "oplog_last": d["check"]["oplog_last"],
           "rows": d["check"]["rows"],
           "replayed": {n["name"]: n["replayed_mutations"]
                        for n in d["check"]["nodes"]},
           "recovery_log": {n["name"]: n["recovery_log"]
                            for n in d["check"]["nodes"]}}
        for d in rep["drills"]]}, indent=1)


def test_group_snapshot_of_two_cassandra_nodes_recovers(tmp_path: Path) -> None:
    """One group snapshot of both nodes (four disks) under CL=ALL load: the
    copies boot, both nodes replay their commit logs and see each other UP,
    the snapshot's operation log is a prefix of the full one, and every
    logged write reads back at ALL with its value."""
    rep = cassdrill.run(tmp_path / "drill", snapshots=1,
                        interval=float(os.environ.get("CP_CASS_INTERVAL",
                                                      "20")))
    print(_summary(rep))     # the figures quoted in docs/drills.md (-s)
    d = rep["drills"][0]
    assert d["passed"], _summary(rep)
    c = d["check"]
    assert all(n["replay_complete"] for n in c["nodes"])
    assert c["oplog_prefix"] and c["oplog_last"] > 0
    assert c["missing"] == 0 and c["wrong_value"] == 0
    # The load went on after the snapshot: the cmp check compared something.
    assert c["oplog_full_bytes"] > c["oplog_snapshot_bytes"]
    assert d["snapshot"]["name"].startswith("cp.cass.")
    assert (tmp_path / "drill" / "report.html").read_text().count("PASS") == 1
