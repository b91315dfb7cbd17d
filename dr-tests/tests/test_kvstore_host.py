"""cp-kvstore on the host: several real processes on 127.0.0.1, files as
disks, kill -9, then the recovery checker.

Power loss is simulated with --simulate-power-loss: each process keeps
its writes in an in-process "page cache" that reaches the file only on
fsync, so kill -9 drops exactly what was not synced, like a power cut.
The negative control runs the servers with --no-fsync (the clients'
journals, the oracle, stay synced): only "acknowledged survives" may
fail.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
from cutpoint.checkers import kvstore as kv
from hostcluster import HostCluster, cluster_factory

ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / "build/dr-tests/workloads/kvstore/cp-kvstore"
NODES = 3
PARTS = 6


class Cluster(HostCluster):
    binary = BIN
    nodes = NODES
    node_args = ("--partitions", str(PARTS))

    def check(self) -> kv.Verdict:
        return kv.check_disks(self.disks)


@pytest.fixture
def cluster(tmp_path: Path):
    yield from cluster_factory(Cluster, tmp_path)


def run_load(c: Cluster, seconds: float) -> None:
    c.start()
    c.wait_log("serving on")
    time.sleep(seconds)
    c.kill9()


def test_kill9_then_cold_restart_checks_pass(cluster) -> None:
    c = cluster()
    run_load(c, 4)
    v = c.check()
    assert v.ok, v.as_dict()
    assert v.stats["acked_mutations"] > 50, v.stats
    offline = dict(v.digests)

    # cold restart of the servers alone: load, replay, reconcile, serve;
    # with no new writes the live digests are the offline prediction
    c.start("--role", "server")
    c.wait_log("serving on")
    live = kv.check_live(c.peers, PARTS, v)
    assert live.ok, live.as_dict()
    assert live.digests == offline
    c.kill9()

    # the clients continue with new op ids after their journals
    c.start("--ops", "30")
    c.wait_log("done:", timeout=120)
    v2 = kv.check_live(c.peers, PARTS, c.check())
    c.kill9()
    assert v2.ok, v2.as_dict()
    assert v2.stats["intents"] >= v.stats["intents"] + NODES * 30


def test_compaction_under_kill9(cluster) -> None:
    """NoVoHT-style rewrite after every 2 removes: the other half, sync,
    header with gen+1, sync.  Killed mid-run, every check still holds."""
    c = cluster(["--compact-removes", "2"])
    run_load(c, 4)
    compactions = sum(c.log(i).count("compacted: gen") for i in range(NODES))
    assert compactions >= 10, c.logs()
    v = c.check()
    assert v.ok, v.as_dict()
    assert v.stats["acked_mutations"] > 50, v.stats
    # the compacted halves load again: live digests are the offline ones
    c.start("--role", "server")
    c.wait_log("serving on")
    live = kv.check_live(c.peers, PARTS, v)
    assert live.ok, live.as_dict()


def test_nofsync_fails_only_acked_survives(cluster) -> None:
    c = cluster(["--no-fsync"])
    run_load(c, 3)
    v = c.check()
    assert v.stats["acked_mutations"] > 20, v.stats
    assert v.failed() == ["acked_survives"], v.as_dict()


def test_staggered_copies_fail(cluster, tmp_path: Path) -> None:
    """Disks copied one after another under load (no coordinated cut): the
    late disks hold acks and dependent writes the early ones never saw."""
    c = cluster()
    c.start()
    c.wait_log("serving on")
    time.sleep(1)
    copies = []
    for i, d in enumerate(c.disks):
        dst = tmp_path / f"copy{i}.img"
        shutil.copyfile(d, dst)
        copies.append(dst)
        time.sleep(1)
    c.kill9()
    v = kv.check_disks(copies)
    assert not v.ok
    assert "acked_survives" in v.failed(), v.as_dict()


def test_damaged_middle_record_is_reported(cluster) -> None:
    c = cluster()
    run_load(c, 2)
    assert c.check().ok
    # damage one byte of the 3rd record of partition 0 on its primary
    d = kv.read_disk(c.disks[0])
    off = kv.SB_SIZE + 512 + 0 * d.region_size
    with open(c.disks[0], "r+b") as f:
        f.seek(off)
        buf = f.read(4096)
        pos = 0
        for _ in range(2):
            length = int.from_bytes(buf[pos + 8:pos + 12], "little")
            pos += (16 + length + 7) & ~7
        f.seek(off + pos + 20)
        f.write(bytes([buf[pos + 20] ^ 0xFF]))
    v = c.check()
    assert "replay_clean" in v.failed()
    assert any("middle of the log" in x for x in v.violations["replay_clean"])


def test_not_a_kvstore_disk(tmp_path: Path) -> None:
    p = tmp_path / "zero.img"
    p.write_bytes(bytes(8192))
    with pytest.raises(kv.KvCheckError, match="not a cp-kvstore disk"):
        kv.check_disks([p])
