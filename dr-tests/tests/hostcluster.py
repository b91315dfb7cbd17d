"""A guest store run as real processes on 127.0.0.1, files as disks.

test_kvstore_host.py and test_sharedlog_host.py start their store's
nodes with this: each node gets a port pair and a 16 MiB disk file,
every run logs to its own file, and `kill9` is the simulated power cut
(the nodes run with --simulate-power-loss, so unsynced writes are lost).
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path


def ephemeral_low() -> int:
    """The lowest port the kernel hands out to outgoing connections."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_base(nodes: int) -> int:
    """A random base port whose node ports (and +1) are all free now.

    The range stays below the kernel's ephemeral ports: a port checked free
    here can otherwise be taken by any outgoing connection on the machine
    before the node binds it (a node that exited at start with the port in
    use was seen once in a CI run)."""
    top = min(ephemeral_low(), 60000) - 10 * nodes
    for _ in range(100):
        base = random.randrange(10000, top, 100)
        try:
            for i in range(nodes):
                for port in (base + 10 * i, base + 10 * i + 1):
                    with socket.socket() as s:
                        s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
    raise RuntimeError("no free port range")


class HostCluster:
    """`nodes` processes of `binary`; subclasses add store-specific calls."""

    binary: Path
    nodes: int
    node_args: tuple[str, ...] = ()      # between --disk and the run's extras

    def __init__(self, tmp: Path, extra: list[str] | None = None) -> None:
        self.tmp = tmp
        base = free_base(self.nodes)
        self.peers = [f"127.0.0.1:{base + 10 * i}" for i in range(self.nodes)]
        self.disks = [tmp / f"node{i}.img" for i in range(self.nodes)]
        for d in self.disks:
            if not d.exists():
                with open(d, "wb") as f:
                    f.truncate(16 << 20)
        self.extra = extra or []
        self.procs: list[subprocess.Popen[bytes]] = []
        self.run = 0

    def start(self, *args: str) -> None:
        self.run += 1
        for i in range(self.nodes):
            with open(self.tmp / f"node{i}.run{self.run}.log", "wb") as log:
                self.procs.append(subprocess.Popen(
                    [str(self.binary), "--node", str(i), "--peers", ",".join(self.peers),
                     "--disk", str(self.disks[i]), *self.node_args,
                     "--simulate-power-loss", *self.extra, *args],
                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True))

    def log(self, i: int) -> str:
        return (self.tmp / f"node{i}.run{self.run}.log").read_text()

    def logs(self) -> str:
        return "\n".join(f"--- node {i}\n{self.log(i)[-2000:]}" for i in range(self.nodes))

    def assert_running(self) -> None:
        for p in self.procs:
            assert p.poll() is None, f"a node exited:\n{self.logs()}"

    def wait_log(self, text: str, timeout: float = 60) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if all(text in self.log(i) for i in range(self.nodes)):
                return
            self.assert_running()
            time.sleep(0.2)
        raise AssertionError(f"no '{text}' in every log:\n{self.logs()}")

    def kill9(self) -> None:
        for p in self.procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
        self.procs = []


def cluster_factory(cls: type[HostCluster], tmp: Path) -> Iterator[Callable[..., HostCluster]]:
    """Body of a `cluster` fixture: make clusters, kill them all at the end."""
    assert cls.binary.exists(), f"{cls.binary} is not built (ninja -C build)"
    made: list[HostCluster] = []

    def make(extra: list[str] | None = None) -> HostCluster:
        c = cls(tmp, extra)
        made.append(c)
        return c
    yield make
    for c in made:
        c.kill9()

