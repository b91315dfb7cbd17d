"""Hypervisor hosts for tests that move a VM between hosts: one libvirtd
(and its virtlogd) per host, each in a mount namespace of its own.

On one machine, libvirtd keeps its state in fixed places (/run/libvirt,
/etc/libvirt/qemu, /etc/libvirt/secrets, /var/lib/libvirt,
/var/log/libvirt, /var/cache/libvirt), so two of them would share their domains.  Each `LibvirtHost` bind-mounts
a directory of its own over those in a private mount namespace
(`unshare --mount`) and starts the daemons there; the namespace lives as
long as they do.  Its socket is reached from outside through the bind
source: `qemu:///system?socket=DIR/run/libvirt-sock`.  Each has its own
`host_uuid`, as two machines would, so libvirt lets a domain migrate
between them.  QEMU runs on this machine either way: what differs is which
libvirtd, and so which agent, owns the domain.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path

MOUNTS = {"run": "/run/libvirt", "etc": "/etc/libvirt/qemu", "lib": "/var/lib/libvirt",
          "secrets": "/etc/libvirt/secrets",
          "log": "/var/log/libvirt", "cache": "/var/cache/libvirt"}


class LibvirtHost:
    def __init__(self, d: Path) -> None:
        self.dir = d
        self.uri = f"qemu:///system?socket={d / 'run' / 'libvirt-sock'}"

    def _pid(self, name: str) -> int:
        try:
            return int((self.dir / f"{name}.pid").read_text().strip())
        except (OSError, ValueError):
            return 0

    def start(self, timeout: float = 30) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)
        for sub, target in MOUNTS.items():
            (self.dir / sub).mkdir(parents=True)
            # On a machine where libvirtd never ran (a fresh one without
            # systemd), /run/libvirt does not exist yet: the bind needs it.
            Path(target).mkdir(parents=True, exist_ok=True)
        (self.dir / "libvirtd.conf").write_text(f'host_uuid = "{uuid.uuid4()}"\n')
        binds = " && ".join(f"mount --bind {self.dir / k} {v}" for k, v in MOUNTS.items())
        subprocess.run(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c",
             (f"{binds} && virtlogd -d -p {self.dir / 'virtlogd.pid'} && "
              f"libvirtd -d -f {self.dir / 'libvirtd.conf'} -p {self.dir / 'libvirtd.pid'}")],
            check=True)
        t0 = time.monotonic()
        while self.virsh("version", check=False) is None:
            if time.monotonic() - t0 > timeout:
                raise RuntimeError(f"libvirtd of {self.dir} did not answer in {timeout:.0f}s")
            time.sleep(0.2)

    def virsh(self, *args: str, check: bool = True) -> str | None:
        r = subprocess.run(["virsh", "-c", self.uri, *args], check=False,
                           capture_output=True, text=True)
        if r.returncode != 0:
            if check:
                raise AssertionError(f"virsh {' '.join(args)}: {r.stderr.strip()}")
            return None
        return r.stdout

    def stop(self) -> None:
        """Destroy its domains, then stop its daemons (they take the
        namespace with them)."""
        for name in (self.virsh("list", "--name", check=False) or "").split():
            self.virsh("destroy", name, check=False)
        for name in ("libvirtd", "virtlogd"):
            pid = self._pid(name)
            if pid <= 0:
                continue
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
            for _ in range(100):
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.05)
            else:
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.dir, ignore_errors=True)
