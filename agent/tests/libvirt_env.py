"""Bring up libvirtd for a test when it is not running (no systemd here).

`libvirtd_running()` is a context manager: if `virsh -c qemu:///system
version` fails, it starts `virtlogd -d` and `libvirtd -d`, waits for the
socket, and on exit stops exactly the daemons it started (by their pid
files).  A libvirtd that was already running is left alone.

`libvirtd_owned()` is the same for tests that stop (SIGSTOP), kill or
restart libvirtd: it yields an `OwnLibvirtd` only for a libvirtd it started
itself, and skips the test when one was already running (not the test's
to stop).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

URI = "qemu:///system"


def _up() -> bool:
    r = subprocess.run(["virsh", "-c", URI, "version"], check=False, capture_output=True,
                       text=True)
    return r.returncode == 0


def _pid(path: str) -> int:
    try:
        return int(Path(path).read_text().strip())
    except (OSError, ValueError):
        return 0


def _stop(pid: int) -> None:
    if pid <= 0:
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    for _ in range(100):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@contextmanager
def libvirtd_running(timeout: float = 30) -> Iterator[str]:
    if _up():
        yield URI
        return
    started: list[str] = []
    if not Path("/run/virtlogd.pid").exists() or _pid("/run/virtlogd.pid") == 0:
        subprocess.run(["virtlogd", "-d"], check=True)
        started.append("/run/virtlogd.pid")
    subprocess.run(["libvirtd", "-d"], check=True)
    started.append("/run/libvirtd.pid")
    try:
        t0 = time.monotonic()
        while not _up():
            if time.monotonic() - t0 > timeout:
                raise RuntimeError(f"libvirtd did not answer on {URI} within {timeout:.0f}s")
            time.sleep(0.2)
        yield URI
    finally:
        for pf in reversed(started):
            _stop(_pid(pf))


class OwnLibvirtd:
    """The libvirtd this test started: its pid, and the faults to inject."""

    pidfile = Path("/run/libvirtd.pid")

    def pid(self) -> int:
        return _pid(str(self.pidfile))

    def kill9(self) -> None:
        pid = self.pid()
        assert pid > 0
        os.kill(pid, signal.SIGKILL)
        for _ in range(100):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.05)

    def start(self, timeout: float = 30) -> None:
        subprocess.run(["libvirtd", "-d"], check=True)
        t0 = time.monotonic()
        while not _up():
            if time.monotonic() - t0 > timeout:
                raise RuntimeError(f"libvirtd did not answer within {timeout:.0f}s")
            time.sleep(0.2)


def domain_pid(name: str) -> int:
    """The pid of a running libvirt domain's QEMU (libvirt's pid file)."""
    return _pid(f"/run/libvirt/qemu/{name}.pid")


@contextmanager
def libvirtd_owned(timeout: float = 30) -> Iterator[OwnLibvirtd]:
    import pytest

    # another test's libvirtd (libvirtd_running) goes away with that test
    t0 = time.monotonic()
    while _up() and time.monotonic() - t0 < 120:
        time.sleep(1)
    if _up():
        pytest.skip("libvirtd was already running: not this test's to stop or kill")
    with libvirtd_running(timeout) as uri:
        assert uri == URI
        own = OwnLibvirtd()
        try:
            yield own
        finally:
            if own.pid() > 0:
                try:
                    os.kill(own.pid(), signal.SIGCONT)
                except (ProcessLookupError, OSError):
                    pass
            if not _up():          # killed by the test: the exit stop needs one
                own.start(timeout)
