"""The lab lock: one lab per machine, flock on /run/lock/cutpoint-lab.lock.

A process that already holds the lock for a longer span (a test session,
scripts/demo.sh) exports CUTPOINT_LAB_LOCK_HELD=1 so that the `cutpoint-lab`
commands it runs do not try to take it a second time.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from cutpoint.lab import config as C
from cutpoint.lab.errors import LabBusy

HELD_ENV = "CUTPOINT_LAB_LOCK_HELD"


def _holder(fd: int) -> str:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        return os.read(fd, 200).decode(errors="replace").strip() or "unknown"
    except OSError:
        return "unknown"


@contextmanager
def lab_lock(wait: bool = False, path: str = C.LOCK_PATH, log: Any = print) -> Iterator[None]:
    if os.environ.get(HELD_ENV) == "1":
        yield
        return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            who = _holder(fd)
            if not wait:
                raise LabBusy(f"lab busy: {C.LOCK_PATH} is held by {who}; "
                              "retry later or pass --wait") from None
            log(f"lab lock held by {who}; waiting")
            t0 = time.monotonic()
            fcntl.flock(fd, fcntl.LOCK_EX)
            log(f"lab lock acquired after {time.monotonic() - t0:.0f}s")
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} ({' '.join(_cmdline())})\n".encode(), 0)
        prev = os.environ.get(HELD_ENV)
        os.environ[HELD_ENV] = "1"
        try:
            yield
        finally:
            if prev is None:
                os.environ.pop(HELD_ENV, None)
            else:
                os.environ[HELD_ENV] = prev
    finally:
        os.close(fd)


def _cmdline() -> list[str]:
    try:
        with open(f"/proc/{os.getpid()}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a][:6]
    except OSError:
        return ["?"]
