"""Running commands and finding lab processes.

Every process the lab starts (Ceph daemons, QEMU) carries the environment
variable CUTPOINT_LAB_MARK.  Teardown finds leftovers by that mark *and* by
name pattern (QEMU guests named `process=cplab-<vm>`, Ceph daemons started
with a lab config `.../ceph/<site>/ceph.conf`), so a crashed lab whose state dir is gone is
still cleaned up.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

from cutpoint.lab.errors import CommandError

MARK = "CUTPOINT_LAB_MARK"


def run(argv: list[str], *, check: bool = True, timeout: float = 120,
        input: str | None = None, env: dict[str, str] | None = None,
        mark: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run argv, capture output; raise CommandError with both streams."""
    full_env = dict(os.environ if env is None else env)
    if mark is not None:
        full_env[MARK] = mark
    try:
        cp = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=timeout,
                            input=input, env=full_env)
    except subprocess.TimeoutExpired as exc:
        raise CommandError(argv, -1, str(exc.stdout or ""),
                           f"timed out after {timeout}s") from exc
    except FileNotFoundError as exc:
        raise CommandError(argv, -1, "", f"not found: {argv[0]}") from exc
    if check and cp.returncode != 0:
        raise CommandError(argv, cp.returncode, cp.stdout, cp.stderr)
    return cp


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return b""


def _lab_ceph_conf(args: list[str]) -> bool:
    """A Ceph daemon started with a lab config (`-c .../ceph/<site>/ceph.conf`)."""
    for i, a in enumerate(args[:-1]):
        if a == "-c" and re.search(r"/ceph/(primary|dr)/ceph\.conf$", args[i + 1]):
            return _read(args[i + 1]).startswith(b"# cutpoint lab")
    return False


def pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    stat = _read(f"/proc/{pid}/stat")
    if not stat:
        return False
    # A zombie is dead for our purposes.
    state = stat.rsplit(b")", 1)[-1].split()[0:1]
    return state != [b"Z"]


def lab_processes() -> list[tuple[int, str]]:
    """(pid, cmdline) of every process that belongs to a lab, any state dir."""
    found = []
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        pid = int(entry)
        raw = _read(f"/proc/{pid}/cmdline")
        if not raw:
            continue
        args = [a.decode(errors="replace") for a in raw.rstrip(b"\0").split(b"\0")]
        exe = os.path.basename(args[0]) if args else ""
        cmd = " ".join(args)
        qemu = exe.startswith("qemu-system")
        cephd = exe in ("ceph-mon", "ceph-mgr", "ceph-osd")
        # Agents started for a lab (cutpoint.lab.agents) and the lab hosts'
        # libvirt daemons (cutpoint.lab.libvirt) carry the mark.
        agentd = exe in ("cutpointd", "libvirtd", "virtlogd")
        if not (qemu or cephd or agentd):
            continue
        # By name pattern first (works without the state dir), then by mark.
        # Only lab guests carry `process=cplab-` (QEMU's -name); other
        # people's QEMUs booting the tiny image (cp.name=...) are not ours.
        ours = ((qemu and "process=cplab-" in cmd)
                or (cephd and _lab_ceph_conf(args))
                or (MARK + "=").encode() in _read(f"/proc/{pid}/environ"))
        if ours and pid_alive(pid):
            found.append((pid, cmd))
    return found


def kill_pids(pids: list[int], grace: float = 3.0) -> list[int]:
    """SIGTERM, wait up to `grace` s, then SIGKILL; returns pids signalled."""
    pids = [p for p in pids if pid_alive(p)]
    for p in pids:
        try:
            os.kill(p, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(pid_alive(p) for p in pids):
        time.sleep(0.05)
    for p in pids:
        if pid_alive(p):
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(pid_alive(p) for p in pids):
        time.sleep(0.05)
    return pids


def read_pidfile(path: Path) -> int:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return 0
