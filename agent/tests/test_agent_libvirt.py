"""The libvirt driver's opt-in raw QMP: prepare → commit of a qcow2 disk.

A transient `type='qemu'` domain with one qcow2 disk is created through the
real libvirtd (started by libvirt_env if it is not running); cutpointd uses
`[libvirt] uri` with virDomainSuspend/Resume and, because the config says
`qmp_passthrough = yes`, a QMP `transaction` through
virDomainQemuMonitorCommand on libvirt's node of the disk `vda`.  That
path marks the domain tainted (custom-monitor), which the test asserts: it
is why it is off by default (test_agent_libvirt_rbd_lab.py shows the
default path leaves no taint).  No Ceph is needed, but root and libvirt
are.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import coordinator_context
from cutpoint.agentclient import AgentClient
from cutpoint.lab.agents import CA_SCRIPT, cutpointd_path, stop_agent_pid
from libvirt_agent import log_since
from libvirt_env import libvirtd_running

pytestmark = pytest.mark.lab

DOMAIN = "cp-agenttest-lv1"
# disks are named by their target device
NODE = "vda"
LOG = Path(f"/var/log/libvirt/qemu/{DOMAIN}.log")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def virsh(uri: str, *args: str) -> str:
    return subprocess.run(["virsh", "-c", uri, *args], check=True, capture_output=True,
                          text=True).stdout


@pytest.fixture(params=["configured", "discovered"])
def libvirt_agent(request: pytest.FixtureRequest,
                  tmp_path: Path) -> Iterator[tuple[dict, Path, str]]:
    """The domain named in a [vm] section, or found through `discover = yes`."""
    if os.geteuid() != 0:
        pytest.skip("needs root")
    # libvirt runs QEMU as libvirt-qemu: the disk must be in a directory it
    # can traverse (pytest's tmp_path is 0700).
    vdir = Path(tempfile.mkdtemp(prefix="cp-agenttest-", dir="/var/tmp"))
    vdir.chmod(0o755)
    disk = vdir / "lv1.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(disk), "16M"], check=True)
    xml = tmp_path / "dom.xml"
    xml.write_text(f"""<domain type='qemu'>
  <name>{DOMAIN}</name>
  <memory unit='MiB'>64</memory>
  <vcpu>1</vcpu>
  <os><type arch='x86_64' machine='pc'>hvm</type></os>
  <devices>
    <emulator>/usr/bin/qemu-system-x86_64</emulator>
    <disk type='file' device='disk'>
      <driver name='qemu' type='qcow2'/>
      <source file='{disk}'/>
      <target dev='vda' bus='virtio'/>
    </disk>
  </devices>
</domain>
""")
    certs = tmp_path / "certs"
    subprocess.run([str(CA_SCRIPT), str(certs), "issue", "agent", "agent", "127.0.0.1"], check=True)
    subprocess.run([str(CA_SCRIPT), str(certs), "issue", "coordinator", "coordinator"], check=True)
    with libvirtd_running() as uri:
        subprocess.run(["virsh", "-c", uri, "destroy", DOMAIN], check=False, capture_output=True)
        offset = LOG.stat().st_size if LOG.exists() else 0
        virsh(uri, "create", str(xml))
        port = free_port()
        cfg = tmp_path / "agent.ini"
        cfg.write_text(f"""[agent]
host = libvirt-test
listen = 127.0.0.1:{port}
journal = {tmp_path / 'journal'}

[tls]
ca = {certs / 'ca.pem'}
cert = {certs / 'agent.pem'}
key = {certs / 'agent.key'}

[libvirt]
uri = {uri}
qmp_passthrough = yes
""" + ("discover = yes\n" if request.param == "discovered" else f"""
[vm {DOMAIN}]
driver = libvirt
domain = {DOMAIN}
disk.{NODE} = qcow2:{disk}
"""))
        log = open(tmp_path / "agent.log", "wb")  # noqa: SIM115 (closed in finally)
        p = subprocess.Popen([str(cutpointd_path()), "-c", str(cfg)], stderr=log,
                             stdout=log)
        try:
            t0 = time.monotonic()
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                    break
                except OSError:
                    assert p.poll() is None, (tmp_path / "agent.log").read_text()
                    assert time.monotonic() - t0 < 20
                    time.sleep(0.05)
            yield {"address": "127.0.0.1", "port": port, "pid": p.pid, "log_offset": offset}, \
                certs, uri
        finally:
            stop_agent_pid(p.pid)
            p.wait(timeout=10)
            log.close()
            subprocess.run(["virsh", "-c", uri, "destroy", DOMAIN], check=False, capture_output=True)
            shutil.rmtree(vdir, ignore_errors=True)


async def test_libvirt_prepare_commit(libvirt_agent: tuple[dict, Path, str]) -> None:
    rec, certs, uri = libvirt_agent
    disk = f"{DOMAIN}/{NODE}"
    async with AgentClient(rec["address"], rec["port"],
                           ssl_context=coordinator_context(certs)) as c:
        async def ready() -> bool:
            inv = await c.inventory()
            return any(v["name"] == DOMAIN and v["ready"] for v in inv["vms"])

        t0 = time.monotonic()
        while not await ready():
            assert time.monotonic() - t0 < 20, "the domain is not ready"
            await asyncio.sleep(0.05)
        inv = await c.inventory()
        # (a libvirtd that was already running may have other domains)
        mine = [v for v in inv["vms"] if v["name"] == DOMAIN]
        assert [(v["driver"], v["state"]) for v in mine] == [("libvirt", "running")]
        assert [(d["id"], d["backend"]) for d in mine[0]["disks"]] == [(disk, "qcow2")]
        await c.prepare("lv-t1", [DOMAIN], 5000)
        assert virsh(uri, "domstate", DOMAIN).strip() == "paused"
        res = await c.commit("lv-t1", {disk: "cp.lvtest.lv-t1"}, 5000)
        vm = res["vms"][0]
        assert vm["method"] == "qmp-transaction"
        assert vm["disks"][0]["ok"] is True
        assert virsh(uri, "domstate", DOMAIN).strip() == "running"
        # the snapshot is in the qcow2 file (through QMP query-block, via libvirt)
        assert "cp.lvtest.lv-t1" in await c.snapshot_list(disk)
        ab = await c.abort("lv-t1")
        assert ab["deleted"] == [{"disk": disk, "name": "cp.lvtest.lv-t1"}]
        assert await c.snapshot_list(disk) == []
    # the price of raw QMP, and why it is off by default
    assert "is tainted: custom-monitor" in log_since(LOG, rec["log_offset"])
