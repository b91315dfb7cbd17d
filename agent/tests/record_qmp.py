#!/usr/bin/env python3
"""Records real QMP exchanges into agent/tests/qmp-replies/*.txt fixtures.

Starts qemu-system-x86_64 (TCG, no guest OS needed) with a qcow2 disk on a
blockdev node named disk0, talks raw QMP over its UNIX socket and writes each
scenario as lines:  `> {json sent}` and `< {json received}` (verbatim).
The C test test_qmp.c replays the `<` lines over a socketpair.

       record_qmp.py OUTDIR --hold
records what the live cut's network hold (agent/hold.c) asks QEMU
(test_hold.c): hold-*.txt.

Usage: record_qmp.py OUTDIR   (needs qemu-system-x86_64 and qemu-img)

       record_qmp.py OUTDIR --bound [--rbd CONF POOL/IMAGE USER]
records only what the QMP backend's pause bound reads (storage/snap_qmp.c):
query-named-block-nodes of the qcow2 nodes above, and with --rbd of a node
`disk0` on an existing RBD image (a Ceph cluster is needed: the lab's).
The rbd recording names CONF; test_snap_qmp writes its own file there.
"""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class Raw:
    def __init__(self, path: str) -> None:
        self.s = socket.socket(socket.AF_UNIX)
        self.s.connect(path)
        self.f = self.s.makefile("rb")
        self.log: list[str] = []

    def recv(self) -> dict:
        line = self.f.readline().decode().rstrip("\r\n")
        if not line:
            raise EOFError("QMP closed")
        self.log.append("< " + line)
        return json.loads(line)

    def send(self, obj: dict) -> None:
        line = json.dumps(obj)
        self.log.append("> " + line)
        self.s.sendall(line.encode() + b"\n")

    def call(self, obj: dict) -> dict:
        self.send(obj)
        while True:
            m = self.recv()
            if "return" in m or "error" in m:
                return m

    def dump(self, path: Path) -> None:
        path.write_text("\n".join(self.log) + "\n")
        self.log = []


def _wait_sock(sock: Path) -> None:
    for _ in range(200):
        if sock.exists():
            return
        time.sleep(0.05)


def _stop(q: subprocess.Popen[bytes]) -> None:
    q.terminate()
    try:
        q.wait(timeout=10)
    except subprocess.TimeoutExpired:
        q.kill()
        q.wait()


@contextmanager
def _monitor(tmp: Path, extra: list[str]) -> Iterator[Raw]:
    """A guest-less QEMU with extra arguments, its monitor past
    qmp_capabilities (nothing logged yet); stopped after the block."""
    sock = tmp / "qmp.sock"
    q = subprocess.Popen(["qemu-system-x86_64", "-machine", "accel=tcg", "-nographic",
                          "-nodefaults", "-m", "64", "-display", "none", "-serial", "null",
                          "-qmp", f"unix:{sock},server=on,wait=off", *extra])
    try:
        _wait_sock(sock)
        c = Raw(str(sock))
        c.recv()
        c.call({"execute": "qmp_capabilities", "id": 1})
        c.log = []
        yield c
    finally:
        _stop(q)
        sock.unlink(missing_ok=True)


def record_bound(out: Path, rbd: list[str]) -> int:
    """query-named-block-nodes of a qcow2 VM, and of an rbd node if asked."""
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="cp-qmp-rec-"))
    disk = tmp / "d0.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(disk), "16M"], check=True)
    runs = [("query-named-block-nodes-qcow2.txt",
             [f"driver=file,filename={disk},node-name=disk0-file",
              "driver=qcow2,file=disk0-file,node-name=disk0"])]
    if rbd:
        conf, image, user = rbd
        pool, name = image.split("/", 1)
        runs.append(("query-named-block-nodes-rbd.txt",
                     [(f"driver=rbd,node-name=disk0,pool={pool},image={name},"
                       f"conf={conf},user={user}")]))
    for fixture, blockdevs in runs:
        with _monitor(tmp, [a for b in blockdevs for a in ("-blockdev", b)]) as c:
            c.call({"execute": "query-named-block-nodes", "id": 2,
                    "arguments": {"flat": True}})
            c.dump(out / fixture)
    disk.unlink()
    tmp.rmdir()
    return 0


def record_hold(out: Path) -> int:
    """What the live cut's hold (agent/hold.c) asks: a VM with one NIC (id
    nic0, netdev net0) and one device without a netdev, then one with an
    ivshmem device (a channel past QEMU's network layer)."""
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="cp-qmp-rec-"))
    nic = ["-netdev", "user,id=net0", "-device", "virtio-net-pci,netdev=net0,id=nic0",
           "-device", "virtio-rng-pci"]
    ivshmem = ["-object", "memory-backend-ram,id=shm0,size=1M",
               "-device", "ivshmem-plain,memdev=shm0"]
    fid = "cutpoint-hold-net0"
    for name, extra in (("nic", nic), ("ivshmem", nic + ivshmem)):
        with _monitor(tmp, extra) as c:
            n = 2
            usable = True
            # hold_ready: the devices, with and without an id, and their netdev
            for root in ("/machine/peripheral", "/machine/peripheral-anon"):
                kids = c.call({"execute": "qom-list", "id": n, "arguments": {"path": root}})
                n += 1
                for k in kids["return"]:
                    if not k["type"].startswith("child<"):
                        continue
                    if "ivshmem" in k["type"]:
                        usable = False
                        break
                    c.call({"execute": "qom-get", "id": n, "arguments": {
                        "path": f"{root}/{k['name']}", "property": "netdev"}})
                    n += 1
                if not usable:
                    break
            c.dump(out / f"hold-list-{name}.txt")
            if not usable:
                continue
            c.call({"execute": "object-add", "id": n, "arguments": {
                "qom-type": "filter-buffer", "id": fid, "netdev": "net0", "queue": "rx",
                "interval": 4294967295, "status": "off"}})
            c.dump(out / "hold-add.txt")
            for st in ("on", "off"):
                c.call({"execute": "qom-set", "id": 20, "arguments": {
                    "path": f"/objects/{fid}", "property": "status", "value": st}})
            c.dump(out / "hold-on-off.txt")
            c.call({"execute": "qom-list", "id": 22, "arguments": {"path": "/objects"}})
            c.call({"execute": "qom-set", "id": 23, "arguments": {
                "path": f"/objects/{fid}", "property": "status", "value": "off"}})
            c.dump(out / "hold-discover.txt")
            # a second run of the agent finds the filter there: taken over
            c.call({"execute": "object-add", "id": 24, "arguments": {
                "qom-type": "filter-buffer", "id": fid, "netdev": "net0", "queue": "rx",
                "interval": 4294967295, "status": "off"}})
            c.call({"execute": "qom-set", "id": 25, "arguments": {
                "path": f"/objects/{fid}", "property": "status", "value": "off"}})
            c.dump(out / "hold-taken-over.txt")
            # a QEMU started since has no such filter
            c.call({"execute": "qom-set", "id": 26, "arguments": {
                "path": "/objects/cutpoint-hold-gone", "property": "status",
                "value": "on"}})
            c.dump(out / "hold-gone.txt")
    tmp.rmdir()
    return 0


def main() -> int:
    out = Path(sys.argv[1])
    if "--hold" in sys.argv:
        return record_hold(out)
    if "--bound" in sys.argv:
        rbd = sys.argv[sys.argv.index("--rbd") + 1:][:3] if "--rbd" in sys.argv else []
        return record_bound(out, rbd)
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="cp-qmp-rec-"))
    disk = tmp / "d0.qcow2"
    disk1 = tmp / "d1.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(disk), "16M"], check=True)
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(disk1), "16M"], check=True)
    sock = tmp / "qmp.sock"
    q = subprocess.Popen([
        "qemu-system-x86_64", "-machine", "accel=tcg", "-nographic", "-nodefaults",
        "-m", "64", "-display", "none", "-serial", "null",
        "-qmp", f"unix:{sock},server=on,wait=off",
        "-blockdev", f"driver=file,filename={disk},node-name=disk0-file",
        "-blockdev", "driver=qcow2,file=disk0-file,node-name=disk0",
        "-device", "virtio-blk-pci,drive=disk0",
        "-blockdev", f"driver=file,filename={disk1},node-name=disk1-file",
        "-blockdev", "driver=qcow2,file=disk1-file,node-name=disk1",
        "-device", "virtio-blk-pci,drive=disk1",
    ])
    try:
        for _ in range(100):
            if sock.exists():
                break
            time.sleep(0.05)
        c = Raw(str(sock))
        c.recv()
        c.dump(out / "greeting.txt")
        c.call({"execute": "qmp_capabilities", "id": 1})
        c.dump(out / "capabilities.txt")
        c.call({"execute": "query-status", "id": 2})
        c.dump(out / "query-status-running.txt")
        # stop: the reply and the STOP event; the event usually comes first.
        c.call({"execute": "stop", "id": 3})
        time.sleep(0.2)
        c.call({"execute": "query-status", "id": 4})
        c.dump(out / "stop-with-event.txt")
        c.call({"execute": "cont", "id": 5})
        time.sleep(0.2)
        c.call({"execute": "query-status", "id": 6})
        c.dump(out / "cont-with-event.txt")
        c.call({"execute": "no-such-command", "id": 7})
        c.dump(out / "error-unknown-command.txt")
        c.call({"execute": "transaction", "id": 8, "arguments": {"actions": [
            {"type": "blockdev-snapshot-internal-sync",
             "data": {"device": "nodisk", "name": "s1"}}]}})
        c.dump(out / "error-bad-device.txt")
        c.call({"execute": "stop", "id": 9})
        c.call({"execute": "transaction", "id": 10, "arguments": {"actions": [
            {"type": "blockdev-snapshot-internal-sync",
             "data": {"device": d, "name": "cp.g.t1"}} for d in ("disk0", "disk1")]}})
        c.call({"execute": "cont", "id": 11})
        c.dump(out / "transaction-snapshot.txt")
        c.call({"execute": "query-block", "id": 12})
        c.dump(out / "query-block-snapshots.txt")
        c.call({"execute": "blockdev-snapshot-delete-internal-sync", "id": 13,
                "arguments": {"device": "disk0", "name": "nosuch"}})
        c.dump(out / "error-snapshot-delete-absent.txt")
        c.call({"execute": "quit", "id": 14})
        try:
            while True:
                c.recv()
        except (EOFError, OSError):
            pass
        c.dump(out / "quit.txt")
    finally:
        try:
            q.wait(timeout=5)
        except subprocess.TimeoutExpired:
            q.kill()
            q.wait()
        for p in tmp.iterdir():
            p.unlink()
        tmp.rmdir()
    return 0


if __name__ == "__main__":
    sys.exit(main())
