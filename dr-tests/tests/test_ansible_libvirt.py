"""The host role's libvirt side, run for real: `tasks_from: libvirt` of
cutpoint_host (ansible-playbook on localhost) against a libvirtd of the
test's own (dr-tests/lab/libvirt.py: its own /etc/libvirt/secrets and
/run/libvirt in a mount namespace; this machine's libvirt is not touched).

It checks that the role installs the Ceph key as a libvirt secret with the
inventory's UUID and usage, writes the agent's [libvirt] keys (validated by
`cutpointd -n`), changes nothing on a second run, replaces only the value
when the keyring's key changes (honestly in check mode), and never prints
the key.  Then cutpointd runs with the file the role wrote: discovery takes
only the domains that match the name pattern and carry the metadata
element, and drops one whose element is removed; and, with the
definition-signing key and definition_paths the role installed, refuses a
signed definition that names a host file outside those paths (FORBIDDEN,
naming the element) and starts none of it.

Needs root (mount namespace, libvirtd), libvirtd and build/agent/cutpointd;
no Ceph, no lab network, so it does not take the lab lock.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cutpoint.lab.libvirt import LibvirtHost

ROOT = Path(__file__).resolve().parents[2]
ANSIBLE = ROOT / "ansible"
BIN = Path(sys.executable).parent
AGENT = ROOT / "build" / "agent" / "cutpointd"
CA_SCRIPT = ROOT / "scripts" / "make-lab-ca.sh"

pytestmark = pytest.mark.lab

SECRET_UUID = "5d0c3e6a-8f4b-4c21-9a7e-2b1f0e9d8c71"
NS = "https://cutpoint.dev/xmlns/agent/1"


@pytest.fixture()
def libvirtd(tmp_path: Path) -> Iterator[LibvirtHost]:
    if os.geteuid() != 0 or not shutil.which("libvirtd") or not shutil.which("unshare"):
        pytest.skip("needs root, libvirtd and unshare")
    if not AGENT.is_file():
        pytest.skip("build/agent/cutpointd is not built")
    # a short path: the socket path must fit sockaddr_un
    h = LibvirtHost(Path(f"/tmp/cp-anslv-{os.getpid()}"))
    h.start()
    try:
        yield h
    finally:
        h.stop()


def _keyring(path: Path, key: str) -> None:
    path.write_text(f"[client.cptest]\n\tkey = {key}\n\tcaps mon = \"allow r\"\n")
    path.chmod(0o600)


def _play(tmp_path: Path, extra: dict, *args: str) -> tuple[int, int, str]:
    """Runs the role's libvirt tasks: (rc, changed count of the recap, output)."""
    play = tmp_path / "libvirt.yml"
    play.write_text(json.dumps([{
        "name": "The host role's libvirt side", "hosts": "localhost",
        "connection": "local", "gather_facts": False,
        "tasks": [{"name": "The role's libvirt tasks run",
                   "ansible.builtin.include_role": {"name": "cutpoint_host",
                                                    "tasks_from": "libvirt"}}]}]))
    env = dict(os.environ, PATH=f"{BIN}:{os.environ.get('PATH', '')}",
               ANSIBLE_CONFIG=str(ANSIBLE / "ansible.cfg"),
               ANSIBLE_LOCAL_TEMP="/tmp/.ansible-tmp", ANSIBLE_ROLES_PATH=str(ANSIBLE / "roles"),
               ANSIBLE_LIBRARY=str(ANSIBLE / "library"))
    extra = {"ansible_python_interpreter": sys.executable, **extra}
    r = subprocess.run([str(BIN / "ansible-playbook"), "-v", "-i", "localhost,", str(play),
                        "-e", json.dumps(extra), *args], env=env, capture_output=True,
                       text=True, timeout=600, check=False)
    out = r.stdout + r.stderr
    m = re.search(r"localhost\s*:\s*ok=\d+\s+changed=(\d+)", out)
    return r.returncode, int(m.group(1)) if m else -1, out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _domain_xml(name: str, tagged: bool) -> str:
    meta = f"<metadata><cutpoint:managed xmlns:cutpoint='{NS}'/></metadata>" if tagged else ""
    return (f"<domain type='qemu'><name>{name}</name>{meta}<memory unit='MiB'>64</memory>"
            "<os><type arch='x86_64'>hvm</type></os></domain>")


async def _vm_names(port: int, certs: Path) -> set[str]:
    from cutpoint.agentclient import AgentClient, client_context

    ctx = client_context(certs / "ca.pem", certs / "coordinator.pem", certs / "coordinator.key")
    async with AgentClient("127.0.0.1", port, ssl_context=ctx) as c:
        inv = await c.inventory()
    return {v["name"] for v in inv["vms"]}


async def _start_refused(port: int, certs: Path, spec: dict) -> tuple[str, str]:
    from cutpoint.agentclient import AgentClient, AgentError, client_context

    ctx = client_context(certs / "ca.pem", certs / "coordinator.pem", certs / "coordinator.key")
    async with AgentClient("127.0.0.1", port, ssl_context=ctx) as c:
        try:
            r = await c.call("vm.start", {"spec": spec}, timeout=30)
        except AgentError as exc:
            return exc.code, exc.message
    return "", f"started: {r}"


def _wait_names(port: int, certs: Path, want: set[str], timeout: float = 30) -> set[str]:
    from cutpoint.agentclient.errors import AgentConnectError

    t0, names = time.monotonic(), set()
    while time.monotonic() - t0 < timeout:
        try:
            names = asyncio.run(_vm_names(port, certs))
        except (OSError, AgentConnectError):
            names = set()
        if names == want:
            return names
        time.sleep(0.2)
    return names


def test_host_role_libvirt_secret_and_discovery_config(tmp_path: Path,
                                                      libvirtd: LibvirtHost) -> None:
    certs, etc = tmp_path / "ca", tmp_path / "etc"
    subprocess.run([str(CA_SCRIPT), str(certs)], check=True, capture_output=True)
    subprocess.run([str(CA_SCRIPT), str(certs), "issue", "hv1", "agent", "127.0.0.1"],
                   check=True, capture_output=True)
    subprocess.run([str(CA_SCRIPT), str(certs), "issue", "coordinator", "coordinator"],
                   check=True, capture_output=True)
    etc.mkdir()
    for src, dst in (("ca.pem", "ca.pem"), ("hv1.pem", "agent.pem"), ("hv1.key", "agent.key")):
        shutil.copy(certs / src, etc / dst)
    (etc / "revoked").write_text("")
    key = base64.b64encode(os.urandom(28)).decode()
    keyring = tmp_path / "ceph.client.cptest.keyring"
    _keyring(keyring, key)
    port = _free_port()
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cutpoint.api.services import vmdef_sign

    sign_key = Ed25519PrivateKey.generate()
    extra = {"cutpoint_host_manage": False, "cutpoint_host_name": "hv1",
             "cutpoint_host_address": "127.0.0.1", "cutpoint_host_port": port,
             "cutpoint_host_config_dir": str(etc), "cutpoint_host_binary": str(AGENT),
             "cutpoint_host_journal": str(tmp_path / "journal"),
             "cutpoint_host_ceph_id": "cptest",
             "cutpoint_host_libvirt_uri": libvirtd.uri,
             "cutpoint_host_libvirt_discover": True,
             "cutpoint_host_libvirt_manage": "cp-ans-*",
             "cutpoint_host_libvirt_manage_metadata": True,
             "cutpoint_host_libvirt_secret_uuid": SECRET_UUID,
             "cutpoint_host_libvirt_secret_keyring": str(keyring),
             "cutpoint_host_libvirt_definition_key_pem":
                 vmdef_sign.public_pem(sign_key).decode(),
             "cutpoint_host_libvirt_definition_paths": ["/var/lib/cutpoint/boot",
                                                        str(tmp_path / "console")]}

    t0 = time.monotonic()
    rc, changed, out1 = _play(tmp_path, extra)
    t1 = time.monotonic() - t0
    assert rc == 0, out1
    assert changed == 3, out1                       # the secret, the key, agent.ini
    t0 = time.monotonic()
    rc, changed, out2 = _play(tmp_path, extra)
    t2 = time.monotonic() - t0
    assert rc == 0 and changed == 0, out2
    print(f"\nfirst run {t1:.1f}s, second run {t2:.1f}s changed=0")

    ini = (etc / "agent.ini").read_text()
    libvirt = ini[ini.index("[libvirt]"):]
    assert f"uri = {libvirtd.uri}\n" in libvirt
    assert "discover = yes\nmanage = cp-ans-*\nmanage_metadata = yes\n" in libvirt, ini
    assert f"definition_key = {etc}/definition-signing.pub\n" in libvirt, ini
    assert f"definition_paths = /var/lib/cutpoint/boot {tmp_path}/console\n" in libvirt, ini
    assert (etc / "definition-signing.pub").read_bytes() == vmdef_sign.public_pem(sign_key)
    listing = libvirtd.virsh("secret-list") or ""
    print(listing)
    assert re.search(rf"^\s*{SECRET_UUID}\s+ceph client\.cptest secret\s*$", listing, re.MULTILINE), listing
    assert (libvirtd.virsh("secret-get-value", SECRET_UUID) or "").strip() == key

    # a new key: check mode reports the change and makes none; then it is set
    key2 = base64.b64encode(os.urandom(28)).decode()
    _keyring(keyring, key2)
    rc, changed, out3 = _play(tmp_path, extra, "--check")
    assert rc == 0 and changed == 1, out3
    assert (libvirtd.virsh("secret-get-value", SECRET_UUID) or "").strip() == key
    rc, changed, out4 = _play(tmp_path, extra)
    assert rc == 0 and changed == 1, out4
    assert (libvirtd.virsh("secret-get-value", SECRET_UUID) or "").strip() == key2
    assert '"value_set": true' in out4 and '"defined": false' in out4, out4
    for out in (out1, out2, out3, out4):
        assert key not in out and key2 not in out

    # the agent, with the file the role wrote, discovers only what it manages
    for name, tagged in (("cp-ans-tagged", True), ("cp-ans-plain", False),
                         ("other-tagged", True)):
        (tmp_path / f"{name}.xml").write_text(_domain_xml(name, tagged))
        libvirtd.virsh("define", str(tmp_path / f"{name}.xml"))
    log = open(tmp_path / "agent.log", "wb")  # noqa: SIM115 - closed in finally
    p = subprocess.Popen([str(AGENT), "-c", str(etc / "agent.ini")], stdout=log, stderr=log)
    try:
        names = _wait_names(port, certs, {"cp-ans-tagged"})
        assert names == {"cp-ans-tagged"}, (tmp_path / "agent.log").read_text()
        # tagged later: adopted from the define event, no restart
        libvirtd.virsh("metadata", "cp-ans-plain", NS, "--key", "cutpoint", "--set",
                       "<managed/>", "--config")
        names = _wait_names(port, certs, {"cp-ans-tagged", "cp-ans-plain"})
        assert names == {"cp-ans-tagged", "cp-ans-plain"}, (tmp_path / "agent.log").read_text()
        # the element removed: no longer listed
        libvirtd.virsh("metadata", "cp-ans-tagged", NS, "--remove", "--config")
        names = _wait_names(port, certs, {"cp-ans-plain"})
        assert names == {"cp-ans-plain"}, (tmp_path / "agent.log").read_text()
        # a signed definition with a console log outside definition_paths
        hostile = _domain_xml("cp-ans-signed", True).replace(
            "</os>", "</os><devices><serial type='pty'><log file='/etc/shadow'/></serial>"
            "</devices>")
        why = asyncio.run(_start_refused(port, certs, vmdef_sign.spec(
            sign_key, "cp-ans-signed", hostile)))
        assert why[0] == "FORBIDDEN" and "<log file='/etc/shadow'>" in why[1], why
        assert libvirtd.virsh("domstate", "cp-ans-signed", check=False) is None
    finally:
        p.terminate()
        p.wait(timeout=20)
        log.close()
