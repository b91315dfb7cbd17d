"""A lab hypervisor host's libvirtd: libvirtd and virtlogd of its own.

On one machine, libvirtd keeps its state in fixed places (/run/libvirt,
/etc/libvirt/qemu, /etc/libvirt/secrets, /var/lib/libvirt,
/var/log/libvirt, /var/cache/libvirt), so two of them would share their
domains and secrets.  Each `LibvirtHost` bind-mounts a directory of its
own over those in a private mount namespace (`unshare --mount`) and starts
the daemons there; the namespace lives as long as they do.  With `netns`
the daemons start inside that network namespace (a lab host's), so the
QEMUs libvirtd starts have the host's network: its bridge `br0`, its
route to the Ceph sites.

Its socket is reached from outside through the bind source (a path-bound
UNIX socket is reachable from any network namespace):
`qemu:///system?socket=DIR/run/libvirt-sock`.  What libvirtd writes under
/run/libvirt (domain pid files: `DIR/run/qemu/<name>.pid`) and
/var/log/libvirt (domain logs: `DIR/log/qemu/<name>.log`) is read from
outside the same way.  Each has its own `host_uuid`, as two machines
would, so libvirt lets a domain migrate between them.

The daemons carry the lab mark (cutpoint.lab.proc.MARK) when `mark` is
given, so `cutpoint-lab down` finds them without the state dir.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path

from cutpoint.lab.proc import MARK, pid_alive

MOUNTS = {"run": "/run/libvirt", "etc": "/etc/libvirt/qemu", "lib": "/var/lib/libvirt",
          "secrets": "/etc/libvirt/secrets",
          "log": "/var/log/libvirt", "cache": "/var/cache/libvirt"}
DAEMONS = ("libvirtd", "virtlogd")  # stop order


class LibvirtError(RuntimeError):
    pass


class LibvirtHost:
    def __init__(self, d: Path | str, netns: str | None = None,
                 mark: str | None = None) -> None:
        self.dir = Path(d)
        self.netns = netns
        self.mark = mark
        self.uri = f"qemu:///system?socket={self.dir / 'run' / 'libvirt-sock'}"

    def pid(self, name: str) -> int:
        """The pid of daemon `name` (libvirtd, virtlogd), 0 if unknown."""
        try:
            return int((self.dir / f"{name}.pid").read_text().strip())
        except (OSError, ValueError):
            return 0

    _pid = pid

    def domain_pid(self, domain: str) -> int:
        """The pid of a running domain's QEMU (libvirt's pid file), 0 if none."""
        try:
            return int((self.dir / "run" / "qemu" / f"{domain}.pid").read_text().strip())
        except (OSError, ValueError):
            return 0

    def domain_log(self, domain: str) -> Path:
        """libvirt's log of the domain (/var/log/libvirt/qemu/<name>.log in
        this host's mount namespace)."""
        return self.dir / "log" / "qemu" / f"{domain}.log"

    def start(self, timeout: float = 30) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)
        for sub, target in MOUNTS.items():
            (self.dir / sub).mkdir(parents=True)
            # On a machine where libvirtd never ran (a fresh one without
            # systemd), /run/libvirt does not exist yet: the bind needs it.
            Path(target).mkdir(parents=True, exist_ok=True)
        (self.dir / "libvirtd.conf").write_text(f'host_uuid = "{uuid.uuid4()}"\n')
        binds = " && ".join(f"mount --bind {self.dir / k} {v}" for k, v in MOUNTS.items())
        argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                (f"{binds} && virtlogd -d -p {self.dir / 'virtlogd.pid'} && "
                 f"libvirtd -d -f {self.dir / 'libvirtd.conf'} -p {self.dir / 'libvirtd.pid'}")]
        if self.netns:
            argv = ["ip", "netns", "exec", self.netns, *argv]
        env = dict(os.environ)
        if self.mark:
            env[MARK] = self.mark
        r = subprocess.run(argv, check=False, capture_output=True, text=True, env=env)
        if r.returncode != 0:
            raise LibvirtError(f"libvirtd of {self.dir} did not start: {r.stderr.strip()}")
        t0 = time.monotonic()
        while self.virsh("version", check=False) is None:
            if time.monotonic() - t0 > timeout:
                raise LibvirtError(f"libvirtd of {self.dir} did not answer in {timeout:.0f}s")
            time.sleep(0.2)

    def virsh(self, *args: str, check: bool = True, timeout: float = 120) -> str | None:
        r = subprocess.run(["virsh", "-c", self.uri, *args], check=False,
                           capture_output=True, text=True, timeout=timeout)
        if r.returncode != 0:
            if check:
                raise LibvirtError(f"virsh {' '.join(args)}: {r.stderr.strip()}")
            return None
        return r.stdout

    def running(self) -> bool:
        return any(_alive(self.pid(n)) for n in DAEMONS)

    def clear(self) -> list[str]:
        """Destroy and undefine every domain, undefine every secret; returns
        what went.  A libvirtd that does not answer is left to stop()."""
        gone: list[str] = []
        if not _alive(self.pid("libvirtd")):
            return gone
        for name in (self.virsh("list", "--all", "--name", check=False, timeout=30)
                     or "").split():
            if self.virsh("destroy", name, check=False, timeout=30) is not None:
                gone.append(f"domain {name} (destroyed)")
            if self.virsh("undefine", name, "--nvram", check=False, timeout=30) is not None \
                    or self.virsh("undefine", name, check=False, timeout=30) is not None:
                gone.append(f"domain {name} (undefined)")
        out = self.virsh("secret-list", check=False, timeout=30) or ""
        for line in out.splitlines()[2:]:
            parts = line.split()
            if parts and self.virsh("secret-undefine", parts[0], check=False,
                                    timeout=30) is not None:
                gone.append(f"secret {parts[0]}")
        return gone

    def stop(self, remove: bool = True) -> list[str]:
        """Destroy its domains, then stop its daemons (they take the
        namespace with them); returns what was stopped."""
        stopped: list[str] = []
        for name in (self.virsh("list", "--name", check=False, timeout=30) or "").split():
            if self.virsh("destroy", name, check=False, timeout=30) is not None:
                stopped.append(f"domain {name} (destroyed)")
        for name in DAEMONS:
            pid = self.pid(name)
            if _alive(pid):
                _terminate(pid)
                stopped.append(f"{name} of {self.dir.name} (pid {pid})")
        if remove:
            shutil.rmtree(self.dir, ignore_errors=True)
        return stopped


def _alive(pid: int) -> bool:
    return pid_alive(pid)


def _terminate(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGCONT)  # a test may have stopped it
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    for _ in range(100):
        if not _alive(pid):
            return
        time.sleep(0.05)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
