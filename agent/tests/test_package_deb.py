"""`make package`'s Debian package, installed in a clean Debian 12 root and
its unit started as systemd would start it.

The root is mmdebstrap minbase plus only the .deb's Depends (pkgroot.py), so
a library the package forgot to depend on is missing there and the agent
cannot start.  systemd is not PID 1 on test machines, so the test plays its
part for the unit as installed: it runs ExecStartPre, then ExecStart with
NOTIFY_SOCKET and WATCHDOG_USEC (from WatchdogSec), waits for READY=1 and a
WATCHDOG=1 ping (Type=notify), checks the agent answers a mutual-TLS hello,
stops it with KillSignal within TimeoutStopSec, and removes the package.

Needs root (chroot, mounts) and mmdebstrap; a Debian mirror the first time
(the root is cached).  It does not use the lab, so it takes no lab lock.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import coordinator_context
from cutpoint.agentclient import AgentClient

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).parent))
from pkgroot import root_tarball, unpack

CA_SCRIPT = ROOT / "scripts" / "make-lab-ca.sh"
pytestmark = pytest.mark.lab


def _deb() -> Path:
    subprocess.run([str(ROOT / "scripts/package.sh")], cwd=ROOT, check=True, timeout=600,
                   capture_output=True)
    version = (ROOT / "VERSION").read_text().strip()
    arch = subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True,
                          check=True).stdout.strip()
    deb = ROOT / "out" / "packages" / f"cutpoint-agent_{version}_{arch}.deb"
    assert deb.is_file(), deb
    return deb


async def _hello(port: int, certs: Path) -> dict[str, object]:
    client = AgentClient("127.0.0.1", port, ssl_context=coordinator_context(certs))
    try:
        return await client.hello()
    finally:
        await client.close()


def _unit(path: Path) -> dict[str, str]:
    unit: dict[str, str] = {}
    for line in path.read_text().splitlines():
        if "=" in line and not line.lstrip().startswith("#"):
            k, v = line.split("=", 1)
            unit[k.strip()] = v.strip()
    return unit


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    deb = _deb()
    depends = subprocess.run(["dpkg-deb", "-f", str(deb), "Depends"], capture_output=True,
                             text=True, check=True).stdout
    pkgs = [d.split("(")[0].strip() for d in depends.split(",") if d.strip()]
    root = unpack(root_tarball(pkgs), tmp_path_factory.mktemp("pkgroot") / "root")
    mounts = []
    try:
        for what, args in (("proc", ["-t", "proc", "proc"]), ("dev", ["--bind", "/dev"])):
            subprocess.run(["mount", *args, str(root / what)], check=True)
            mounts.append(root / what)
        (root / "tmp" / deb.name).write_bytes(deb.read_bytes())
        r = subprocess.run(["chroot", str(root), "dpkg", "-i", f"/tmp/{deb.name}"],
                           capture_output=True, text=True, timeout=120, check=False)
        assert r.returncode == 0, r.stdout + r.stderr
        yield {"root": root, "deb": deb, "install": r.stdout}
    finally:
        for m in reversed(mounts):
            subprocess.run(["umount", "-l", str(m)], check=False)


def test_the_package_installs_what_it_says(installed: dict[str, object]) -> None:
    root = installed["root"]
    assert isinstance(root, Path)
    for f in ("usr/bin/cutpointd", "usr/bin/cutpoint-sync",
              "lib/systemd/system/cutpointd.service"):
        assert (root / f).is_file(), f
    # every library both binaries load resolves in the clean root
    for b in ("/usr/bin/cutpointd", "/usr/bin/cutpoint-sync"):
        r = subprocess.run(["chroot", str(root), "ldd", b], capture_output=True, text=True,
                           check=False)
        assert r.returncode == 0 and "not found" not in r.stdout, r.stdout + r.stderr
    r = subprocess.run(["chroot", str(root), "cutpoint-sync", "--help"], capture_output=True,
                       text=True, timeout=30, check=False)
    assert "usage" in (r.stdout + r.stderr).lower(), r.stdout + r.stderr


def test_the_unit_starts_notifies_answers_and_stops(installed: dict[str, object],
                                                          tmp_path: Path) -> None:
    root = installed["root"]
    assert isinstance(root, Path)
    unit = _unit(root / "lib/systemd/system/cutpointd.service")
    assert unit["Type"] == "notify" and unit["StartLimitIntervalSec"] == "0", unit
    watchdog_s = int(unit["WatchdogSec"])

    certs = tmp_path / "certs"
    subprocess.run([str(CA_SCRIPT), str(certs), "issue", "agent", "agent", "127.0.0.1"],
                   check=True, capture_output=True)
    subprocess.run([str(CA_SCRIPT), str(certs), "issue", "coordinator", "coordinator"],
                   check=True, capture_output=True)
    etc = root / "etc" / "cutpoint"
    for f in ("ca.pem", "agent.pem", "agent.key"):
        (etc / f).write_bytes((certs / f).read_bytes())
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (etc / "agent.ini").write_text(
        f"[agent]\nhost = pkgtest\nlisten = 127.0.0.1:{port}\n"
        "journal = /var/lib/cutpoint/agent/journal\n\n"
        "[tls]\nca = /etc/cutpoint/ca.pem\ncert = /etc/cutpoint/agent.pem\n"
        "key = /etc/cutpoint/agent.key\n")
    (root / "var/lib/cutpoint/agent").mkdir(parents=True, exist_ok=True)  # StateDirectory=

    pre = subprocess.run(["chroot", str(root), *shlex.split(unit["ExecStartPre"])],
                         capture_output=True, text=True, timeout=30, check=False)
    assert pre.returncode == 0, pre.stdout + pre.stderr

    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock_path = root / "run" / "cp-notify.sock"
    sock_path.unlink(missing_ok=True)
    notify.bind(str(sock_path))
    notify.settimeout(1.0)
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "NOTIFY_SOCKET": "/run/cp-notify.sock",
           "WATCHDOG_USEC": str(watchdog_s * 1_000_000)}
    log = open(tmp_path / "agent.log", "wb")  # noqa: SIM115  closed below
    t0 = time.monotonic()
    agent = subprocess.Popen(["chroot", str(root), *shlex.split(unit["ExecStart"])],
                             env=env, stdout=log, stderr=log)
    try:
        seen: list[tuple[float, str]] = []
        while time.monotonic() - t0 < watchdog_s and not (
                any("READY=1" in m for _, m in seen) and any("WATCHDOG=1" in m for _, m in seen)):
            assert agent.poll() is None, (tmp_path / "agent.log").read_text()
            try:
                seen.append((time.monotonic() - t0, notify.recv(4096).decode()))
            except TimeoutError:
                continue
        print("notify:", [(round(t, 2), m) for t, m in seen])
        assert any("READY=1" in m for _, m in seen), seen
        assert any("WATCHDOG=1" in m for _, m in seen), seen

        hello = asyncio.run(_hello(port, certs))
        assert hello["host"] == "pkgtest", hello

        sig = getattr(signal, unit.get("KillSignal", "SIGTERM"))
        t_stop = time.monotonic()
        agent.send_signal(sig)
        rc = agent.wait(timeout=float(unit.get("TimeoutStopSec", "30")))
        print(f"stopped by {sig.name} in {time.monotonic() - t_stop:.2f} s, rc {rc}")
        assert rc == 0, (tmp_path / "agent.log").read_text()
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
        log.close()
        notify.close()
        sock_path.unlink(missing_ok=True)

    r = subprocess.run(["chroot", str(root), "dpkg", "-r", "cutpoint-agent"],
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    assert not (root / "usr/bin/cutpointd").exists()
    os.sync()
