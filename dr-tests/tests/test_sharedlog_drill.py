"""Recovery drill of cp-sharedlog on the lab (issue 7, item 4).

Four tiny guests on two primary hosts run 2 shards x 2 storage servers,
3 ordering replicas (Multi-Paxos) and 4 clients. The steps are those of
test_kvstore_drill.py (whose `Drill` helper this reuses):

1. uncoordinated snapshots, replicated to the DR cluster, must fail the
   checker there;
2. the newest coordinated group snapshot under load is replicated
   (coordinator.dr.replicate / cutpoint-sync, every member verified) and its
   DR copies pass offline;
3. clones of the DR copies, on the DR cluster, boot on the DR host with
   `--role=servers`, and `cutpoint-lab check sharedlog --live` subscribes
   through every shard;
4. with `--no-fsync` only "acknowledged present" fails.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from cutpoint.checkers import sharedlog as sl
from test_kvstore_drill import Drill, cutpoint

pytestmark = pytest.mark.lab

# Raw QEMU, as the kvstore drill: both prove the redirect cut.
LAB = {"hosts": 2, "vms_per_host": 2, "disks": 1, "workload": "sharedlog",
       "workload_args": "--interval-ms=20", "disk_size_mb": 32, "driver": "qemu"}


@pytest.mark.lab_config(**LAB)
def test_sharedlog_drill(lab: dict[str, Any], tmp_path: Path) -> None:
    d = Drill(lab, tmp_path, "sharedlog")
    try:
        d.wait_console(r"storage \d+ serving", 1)
        d.wait_console(r"client \d+: seq \d+", 1)

        # 1. uncoordinated snapshots, one after another, replicated: must fail
        unc = d.uncoordinated(f"unc.{int(time.time())}", 2.0)
        d.replicate(unc)                  # the first, full copy to DR
        bad = sl.check_disks(d.export(unc, "unc"))      # read at DR
        print(f"\nuncoordinated: failed {bad.failed()} {bad.stats}")
        assert not bad.ok, bad.as_dict()

        # 2. group snapshots under load; the newest is replicated and its
        #    DR copies are checked offline
        d.group_snapshot()
        d.wait_console(r"client \d+: seq \d+", 2)
        snap = d.group_snapshot()
        d.replicate(snap, verify_full=True)   # incremental; invariant 5 asserted
        disks = d.export(snap, "gs")          # the DR copies
        v = sl.check_disks(disks)
        print(f"group snapshot {snap}: {v.failed() or 'ok'} {v.stats}")
        assert v.ok, v.as_dict()
        assert v.stats["acked"] > 20 and v.stats["shards_active"] == 2, v.stats

        # 3. DR-cluster clones boot on the DR host, cold restart,
        #    subscribe through every shard
        peers = d.boot_restored(snap, "--interval-ms=20,--role=servers", "live")
        d.wait_console(r"storage \d+ serving", 1, vms=d.restored)
        # whichever ordering replica booted first leads; the others follow
        d.wait_console(r"order \d+: leader", 1, vms=d.restored, any_vm=True)
        addrs = ",".join(f"{p}:7800" for p in peers)
        deadline = time.monotonic() + 120
        while True:                # until the new leader ordered the old log
            try:
                if sl._call(f"{peers[0]}:7800", sl.SL_STATUS)[0][3] >= v.stats["ordered"]:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "restored log never caught up"
            time.sleep(1)
        res = cutpoint("check", "sharedlog", *map(str, disks), "--live", addrs, "--json")
        doc = json.loads(res.stdout)
        print(f"live at DR: ok={doc['ok']} failed={doc['failed']} {doc['stats']}")
        assert res.returncode == 0 and doc["ok"], doc

        # 4. fsync off (servers), clients on: only acked_present fails
        d.boot_restored(snap, "--interval-ms=20,--no-fsync,--simulate-power-loss",
                        "nofsync")
        d.wait_console(r"client \d+: seq \d+", 1, vms=d.restored)
        d.pause_restored()
        nv = sl.check_disks(d.export_restored("nofsync"))
        print(f"no-fsync: failed {nv.failed()} {nv.stats}")
        assert nv.failed() == ["acked_present"], nv.as_dict()
    finally:
        d.close()
    assert d.left_at_dr == [], f"scratch left on the DR cluster: {d.left_at_dr}"
