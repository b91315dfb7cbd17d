"""One Debian drill VM under QEMU/TCG, with QMP and the guest agent channel.

Used by the PostgreSQL drill (`cutpoint.checkers.pgdrill`) and the quiesce
prototype (`cutpoint.checkers.quiesce`).  The VM boots directly from the
image's kernel and initrd (extracted at build time), with:

- ``disk0`` the root: a throw-away qcow2 overlay over the cached image;
- ``disk1..N`` the group disks given by the caller, each a virtio-blk device
  whose ``serial`` lets the guest find it (``/dev/disk/by-id/virtio-<serial>``):
  a local qcow2 file, or an RBD image of a lab site (``GuestDisk.rbd``), opened
  with the very ``-blockdev`` the lab's own guests use
  (``cutpoint.lab.vms.qemu_argv``: ``driver=rbd`` with the site's conf/user);
- the serial console written to ``console.log``;
- a QMP socket ``qmp.sock`` and a virtio-serial port
  ``org.qemu.guest_agent.0`` exposed on ``qga.sock``.

With ``netns`` set QEMU runs inside that network namespace (a lab host, so
the guest's Ceph traffic leaves from that host); its sockets are files and
stay reachable from the root namespace.

Block node names follow the lab contract: the format node the device is
attached to is ``diskN``, so QMP ``blockdev-snapshot-internal-sync`` can name
``device: diskN``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cutpoint.lab.debian_image import Image


class QMPError(RuntimeError):
    """A QMP command failed or timed out; keeps what was sent and received."""

    def __init__(self, sent: dict[str, Any], received: Any, why: str):
        self.sent, self.received = sent, received
        super().__init__(f"QMP {sent.get('execute')}: {why}; sent={sent} "
                         f"received={received}")


class QMP:
    """Minimal synchronous QMP client (capabilities negotiated on connect).

    Events are kept in ``events``; every command has a deadline."""

    def __init__(self, path: Path, timeout: float = 30.0):
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(str(path))
        self.buf = b""
        self.events: list[dict[str, Any]] = []
        greeting = self._read()
        if "QMP" not in greeting:
            raise QMPError({}, greeting, "no QMP greeting")
        self.execute("qmp_capabilities")

    def _read(self) -> dict[str, Any]:
        while b"\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise QMPError({}, self.buf.decode(errors="replace"),
                               "QMP socket closed")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        msg: dict[str, Any] = json.loads(line)
        return msg

    def execute(self, cmd: str, args: dict[str, Any] | None = None,
                timeout: float = 30.0) -> Any:
        sent: dict[str, Any] = {"execute": cmd}
        if args:
            sent["arguments"] = args
        self.sock.settimeout(timeout)
        self.sock.sendall(json.dumps(sent).encode() + b"\n")
        while True:
            try:
                msg = self._read()
            except TimeoutError as e:
                raise QMPError(sent, None, f"no reply in {timeout}s") from e
            if "event" in msg:
                self.events.append(msg)
                continue
            if "error" in msg:
                raise QMPError(sent, msg, msg["error"].get("desc", "error"))
            return msg.get("return")

    def close(self) -> None:
        self.sock.close()


@dataclass
class RbdImage:
    """An RBD image on one lab site (``site``: a ``sites[...]`` entry of the
    lab status: ceph_conf, keyring, client_id, pool)."""
    site: dict[str, Any]
    image: str
    pool: str = ""       # "" = the site's pool

    @property
    def spec(self) -> str:
        return f"{self.pool or self.site.get('pool', 'rbd')}/{self.image}"


@dataclass
class GuestDisk:
    serial: str          # cpwal, cpdata, cpjournal
    file: Path | None = None   # qcow2 file (None for an RBD disk)
    size_mb: int = 0     # create a blank qcow2 of this size if file is absent
    rbd: RbdImage | None = None  # the disk is this RBD image (made by the caller)

    def __post_init__(self) -> None:
        if (self.file is None) == (self.rbd is None):
            raise ValueError(f"disk {self.serial}: give exactly one of file "
                             f"and rbd (file={self.file}, rbd={self.rbd})")


def rbd_blockdev(node: str, disk: RbdImage) -> str:
    """The ``-blockdev`` value the lab's guests use for an RBD disk, taken
    from ``cutpoint.lab.vms.qemu_argv`` itself so that both kinds of guest
    open Ceph the same way (driver, conf, user)."""
    from cutpoint.lab.vms import qemu_argv
    pool, image = disk.spec.split("/", 1)
    vm = {"name": "rbd-disk", "workload": "none", "index": 0,
          "address": "0.0.0.0", "console": "", "qmp": "", "tap": "",
          "mac": "", "pidfile": "",
          "disks": [{"node": node, "backend": "rbd", "pool": pool,
                     "image": image, "site": "site"}]}
    argv = qemu_argv(vm, {"kernel": "", "initrd": ""}, "tcg", [],
                     {"site": disk.site}, 0, "")
    return argv[argv.index("-blockdev") + 1]


@dataclass
class DebianVM:
    image: Image
    workdir: Path
    disks: list[GuestDisk]
    cmdline_extra: str = ""
    mem_mb: int = 1024
    proc: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    qmp: QMP | None = None
    node_of: dict[str, str] = field(default_factory=dict)  # serial -> diskN
    # Extra QEMU arguments (e.g. a NIC on a tap for the Cassandra drill).
    extra_argv: list[str] = field(default_factory=list)
    # Run QEMU in this network namespace (a lab host), with these extra
    # environment variables (e.g. the lab mark, so `cutpoint-lab down`
    # finds a guest whose owner died).
    netns: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    # UNIX socket paths are limited to 107 bytes and pytest's tmp_path is
    # long: the sockets live in a short private directory of their own.
    sockdir: Path = field(default_factory=lambda: Path(
        tempfile.mkdtemp(prefix="cpvm.", dir="/tmp")))

    @property
    def console(self) -> Path:
        return self.workdir / "console.log"

    @property
    def qmp_path(self) -> Path:
        return self.sockdir / "qmp.sock"

    @property
    def qga_path(self) -> Path:
        return self.sockdir / "qga.sock"

    @property
    def qmp_agent_path(self) -> Path:
        """The second QMP monitor, for cutpointd."""
        return self.sockdir / "qmp-agent.sock"

    def argv(self) -> list[str]:
        root = self.workdir / "root.qcow2"
        a = [
            "qemu-system-x86_64", "-machine", "pc,accel=tcg", "-m",
            str(self.mem_mb), "-smp", "1", "-nodefaults", "-display", "none",
            "-no-reboot", "-kernel", str(self.image.kernel),
            "-initrd", str(self.image.initrd),
            "-append", f"{self.image.cmdline} {self.cmdline_extra}".strip(),
            "-serial", f"file:{self.console}",
            "-qmp", f"unix:{self.qmp_path},server=on,wait=off",
            # A second monitor for cutpointd: a QMP socket serves one client.
            "-qmp", f"unix:{self.qmp_agent_path},server=on,wait=off",
            "-device", "virtio-serial-pci,id=vser0",
            "-chardev", f"socket,id=qga0,path={self.qga_path},server=on,wait=off",
            "-device", "virtserialport,chardev=qga0,name=org.qemu.guest_agent.0",
        ]
        disks = [GuestDisk("cproot", root)] + self.disks
        for i, d in enumerate(disks):
            self.node_of[d.serial] = f"disk{i}"
            if d.rbd is not None:
                a += ["-blockdev", rbd_blockdev(f"disk{i}", d.rbd)]
            else:
                a += ["-blockdev", (f"driver=file,filename={d.file},"
                                    f"node-name=file{i},cache.direct=off"),
                      "-blockdev", f"driver=qcow2,file=file{i},node-name=disk{i}"]
            a += ["-device", f"virtio-blk-pci,drive=disk{i},serial={d.serial}"]
        a += self.extra_argv
        return ["ip", "netns", "exec", self.netns, *a] if self.netns else a

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.sockdir.mkdir(parents=True, exist_ok=True)
        for p in (self.console, self.qmp_path, self.qga_path,
                  self.qmp_agent_path):
            p.unlink(missing_ok=True)
        root = self.workdir / "root.qcow2"
        root.unlink(missing_ok=True)
        subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-F",
                        self.image.root_format, "-b", str(self.image.root),
                        str(root)], check=True)
        for d in self.disks:
            if d.file is not None and not d.file.exists():
                subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2",
                                str(d.file), f"{d.size_mb}M"], check=True)
        self.started_at = time.monotonic()
        with open(self.workdir / "qemu.out", "wb") as out:
            # `ip netns exec` execs QEMU in place: proc.pid is QEMU's.
            self.proc = subprocess.Popen(self.argv(), stdin=subprocess.DEVNULL,
                                         stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True,
                                         env={**os.environ, **self.env})
        deadline = time.monotonic() + 30
        # The socket file appears a moment before QEMU listens on it.
        while True:
            try:
                self.qmp = QMP(self.qmp_path)
                break
            except (FileNotFoundError, ConnectionRefusedError,
                    ConnectionResetError, QMPError):
                # QMPError: QEMU closed the socket, usually because it is
                # exiting on a bad argument; its output says why.
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                qout = (self.workdir / "qemu.out").read_text(errors="replace")
                self.kill()
                raise RuntimeError(f"QEMU did not start: {qout}")
            time.sleep(0.05)

    def console_text(self) -> str:
        try:
            return self.console.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def wait_console(self, pattern: str, timeout: float) -> re.Match[str]:
        """Wait until the console matches ``pattern``; raise with its tail."""
        rx = re.compile(pattern, re.MULTILINE)
        deadline = time.monotonic() + timeout
        while True:
            m = rx.search(self.console_text())
            if m:
                return m
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"VM exited (rc={self.proc.returncode}) "
                                   f"before /{pattern}/; console tail:\n"
                                   + self.console_text()[-3000:])
            if time.monotonic() > deadline:
                raise TimeoutError(f"no /{pattern}/ on the console in "
                                   f"{timeout}s; tail:\n"
                                   + self.console_text()[-3000:])
            time.sleep(0.25)

    def wait_exit(self, timeout: float) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout=timeout)

    def kill(self) -> None:
        """Stop QEMU: QMP quit, then SIGKILL of its own process group."""
        if self.proc is None:
            shutil.rmtree(self.sockdir, ignore_errors=True)
            return
        if self.proc.poll() is None:
            try:
                if self.qmp is not None:
                    self.qmp.execute("quit", timeout=5)
            except (QMPError, OSError):
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        if self.qmp is not None:
            self.qmp.close()
            self.qmp = None
        shutil.rmtree(self.sockdir, ignore_errors=True)
