"""cp-sharedlog on the host: four real nodes on 127.0.0.1 (2 shards x 2
storage servers, 3 ordering replicas, 4 clients), files as disks, kill -9,
then the recovery checker.

Power loss is simulated with --simulate-power-loss (writes reach the file
only on fsync), see test_kvstore_host.py.  The negative control runs the
servers with --no-fsync: only "acknowledged present" may fail.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
from cutpoint.checkers import sharedlog as sl
from hostcluster import HostCluster, cluster_factory

ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / "build/dr-tests/workloads/sharedlog/cp-sharedlog"
NODES = 4


class Cluster(HostCluster):
    binary = BIN
    nodes = NODES

    def admin(self, *args: str) -> str:
        out = subprocess.run([str(BIN), "--role", "admin", "--peers",
                              ",".join(self.peers), *args],
                             capture_output=True, text=True, timeout=60,
                             check=False)
        assert out.returncode == 0, out.stderr
        return out.stdout

    def status(self) -> int:
        """Records ordered so far (l_max + 1), from storage server 0."""
        return sl._call(self.peers[0], sl.SL_STATUS)[0][3]

    def wait_ordered(self, n: int, timeout: float = 60) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                if self.status() >= n:
                    return
            except OSError:
                pass
            self.assert_running()
            time.sleep(0.2)
        raise AssertionError(f"fewer than {n} records ordered:\n{self.logs()}")

    def check(self, disks: list[Path] | None = None, live: bool = False) -> sl.Verdict:
        return sl.check_disks(disks or self.disks,
                              live=",".join(self.peers) if live else None)


@pytest.fixture
def cluster(tmp_path: Path):
    yield from cluster_factory(Cluster, tmp_path)


def test_kill9_restart_finalize_trim(cluster) -> None:
    c = cluster()
    c.start()
    c.wait_ordered(200)
    c.kill9()
    v = c.check()
    assert v.ok, v.as_dict()
    assert v.stats["acked"] >= 150 and v.stats["shards_active"] == 2, v.stats
    before = v.stats["ordered"]

    # cold restart: old records keep their gsns, new ones go above them;
    # then finalize shard 1 with a grace of 5 cuts and trim a prefix
    c.start("--ops", "40")
    c.wait_ordered(before + 40)
    assert "committed at slot" in c.admin("--finalize", "1", "--grace", "5")
    assert "committed at slot" in c.admin("--trim", "20")
    c.wait_log("done:", timeout=120)
    v2 = c.check(live=True)
    assert v2.ok, v2.as_dict()
    assert v2.stats["finalized"] == [1] and v2.stats["trim"] == 20
    assert v2.stats["acked"] >= v.stats["acked"] + NODES * 30
    # readRecord below the trim point answers TRIMMED (section 3.3.3)
    (_t, status, *_rest), _ = sl._call(c.peers[0], 12, b=5, c=1000)
    assert status == 4
    c.kill9()
    assert c.check().ok


def test_paxos_leader_failover(cluster) -> None:
    """kill -9 of the ordering leader: another replica prepares a higher
    ballot, re-proposes what was accepted, and cuts keep committing."""
    import re
    c = cluster()
    c.start()
    c.wait_ordered(100)
    m = re.search(r"\[(\d+)\] order 0: leader", c.log(0))
    assert m, c.log(0)
    os.kill(int(m.group(1)), signal.SIGKILL)
    before = c.status()
    c.wait_ordered(before + 100)
    assert re.search(r"order [12]: leader with ballot", c.log(1) + c.log(2)), c.logs()
    c.kill9()
    v = c.check()
    assert v.ok, v.as_dict()


def test_nofsync_fails_only_acked_present(cluster) -> None:
    c = cluster(["--no-fsync"])
    c.start()
    c.wait_ordered(150)
    c.kill9()
    v = c.check()
    assert v.stats["acked"] >= 100, v.stats
    assert v.failed() == ["acked_present"], v.as_dict()


def test_staggered_copies_fail(cluster, tmp_path: Path) -> None:
    """Disks copied one after another under load (no coordinated cut):
    the late client journal holds acks the early disks never ordered."""
    c = cluster()
    c.start()
    c.wait_ordered(100)
    copies = []
    for i, d in enumerate(c.disks):
        dst = tmp_path / f"copy{i}.img"
        shutil.copyfile(d, dst)
        copies.append(dst)
        if i == 2:
            start = c.status()
            c.wait_ordered(start + 60)
    c.kill9()
    v = c.check(copies)
    assert not v.ok
    assert "acked_present" in v.failed(), v.as_dict()


def test_damaged_backup_record_is_reported(cluster) -> None:
    c = cluster()
    c.start()
    c.wait_ordered(100)
    c.kill9()
    assert c.check().ok
    region = sl.struct.unpack_from("<Q", c.disks[1].read_bytes(), 24)[0]
    off = sl.SB_SIZE + 1 * region + 512        # node 1, backup segment
    with open(c.disks[1], "r+b") as f:
        f.seek(off + 16 + 4)                    # first record's payload
        b = f.read(1)
        f.seek(off + 16 + 4)
        f.write(bytes([b[0] ^ 0xFF]))
    v = c.check()
    assert "replay_clean" in v.failed() and "no_holes" in v.failed()


def test_random_frames_do_not_kill_the_servers(cluster) -> None:
    """Garbage to a storage server and an ordering replica: they answer or
    close, and the log keeps growing."""
    c = cluster()
    c.start()
    c.wait_ordered(50)
    rnd = random.Random(11)
    host, port = c.peers[3].rsplit(":", 1)
    for p in (int(port), int(c.peers[2].rsplit(":", 1)[1]) + 1):
        for _ in range(200):
            n = rnd.choice([0, 5, 39, 40, 41, 80])
            body = bytearray(rnd.randrange(256) for _ in range(n))
            if n >= 40 and rnd.random() < 0.7:
                body[0] = rnd.choice([1, 2, 3, 4, 6, 12, 13, 14])
                body[32:36] = (n - 40).to_bytes(4, "little")   # consistent dlen
            with socket.create_connection((host, p), timeout=5) as s:
                s.sendall(len(body).to_bytes(4, "little") + bytes(body))
                s.settimeout(0.5)
                try:
                    s.recv(4)
                except TimeoutError:
                    pass
    before = c.status()
    c.wait_ordered(before + 50)


def test_not_a_sharedlog_disk(tmp_path: Path) -> None:
    p = tmp_path / "zero.img"
    p.write_bytes(bytes(8192))
    with pytest.raises(sl.LogCheckError, match="not a cp-sharedlog disk"):
        sl.check_disks([p])


def test_payload_matches_the_client() -> None:
    # the C client writes u32 client | u64 seq | "c<c>.s<seq>:" | filler
    p = sl.payload(3, 17)
    assert p[:12] == sl.struct.pack("<IQ", 3, 17)
    assert p[12:].startswith(b"c3.s17:")
    assert 16 <= len(p) - 12 - len(b"c3.s17:") < 80
