"""Bring up libvirtd for a test when it is not running (no systemd here).

`libvirtd_running()` is a context manager: if `virsh -c qemu:///system
version` fails, it starts `virtlogd -d` and `libvirtd -d`, waits for the
socket, and on exit stops exactly the daemons it started (by their pid
files).  A libvirtd that was already running is left alone.
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
