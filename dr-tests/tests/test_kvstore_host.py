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

import os
import random
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
from cutpoint.checkers import kvstore as kv

ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / "build/dr-tests/workloads/kvstore/cp-kvstore"
NODES = 3
PARTS = 6


def free_base(nodes: int) -> int:
    """A random base port whose node ports (and +1) are all free now."""
    for _ in range(100):
        base = random.randrange(20000, 60000, 100)
        try:
            for i in range(nodes):
                for port in (base + 10 * i, base + 10 * i + 1):
                    with socket.socket() as s:
                        s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
    raise RuntimeError("no free port range")


class Cluster:
    def __init__(self, tmp: Path, extra: list[str] | None = None) -> None:
        self.tmp = tmp
        base = free_base(NODES)
        self.peers = [f"127.0.0.1:{base + 10 * i}" for i in range(NODES)]
        self.disks = [tmp / f"node{i}.img" for i in range(NODES)]
        for d in self.disks:
            if not d.exists():
                with open(d, "wb") as f:
                    f.truncate(16 << 20)
        self.extra = extra or []
        self.procs: list[subprocess.Popen[bytes]] = []
        self.run = 0

    def start(self, *args: str) -> None:
        self.run += 1
        for i in range(NODES):
            with open(self.tmp / f"node{i}.run{self.run}.log", "wb") as log:
                self.procs.append(subprocess.Popen(
                    [str(BIN), "--node", str(i), "--peers", ",".join(self.peers),
                     "--disk", str(self.disks[i]), "--partitions", str(PARTS),
                     "--simulate-power-loss", *self.extra, *args],
                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True))

    def log(self, i: int) -> str:
        return (self.tmp / f"node{i}.run{self.run}.log").read_text()

    def wait_log(self, text: str, timeout: float = 60) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if all(text in self.log(i) for i in range(NODES)):
                return
            for p in self.procs:
                assert p.poll() is None, f"a node exited: {self.logs()}"
            time.sleep(0.2)
        raise AssertionError(f"no '{text}' in every log:\n{self.logs()}")

    def logs(self) -> str:
        return "\n".join(f"--- node {i}\n{self.log(i)[-2000:]}" for i in range(NODES))

    def kill9(self) -> None:
        for p in self.procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
        self.procs = []

    def check(self) -> kv.Verdict:
        return kv.check_disks(self.disks)


@pytest.fixture
def cluster(tmp_path: Path):
    assert BIN.exists(), f"{BIN} is not built (ninja -C build)"
    made: list[Cluster] = []

    def make(extra: list[str] | None = None) -> Cluster:
        c = Cluster(tmp_path, extra)
        made.append(c)
        return c
    yield make
    for c in made:
        c.kill9()


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
