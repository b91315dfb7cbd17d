"""Issue 9 "Must show" 1-5 against real VMs (slow; `make test-ansible`).

Boots Debian "host" image VMs (dr-tests/images/debian/host, systemd + sshd,
packages pre-baked) under QEMU on a private bridge in the root namespace
(10.78.0.0/24, not used by the lab), then drives them with ansible-playbook
over SSH exactly as an operator would:

1. site.yml on one control VM and one host VM;
2. cutpointd active under systemd, answering mutual-TLS hello from the
   control VM; the host in the API with its certificate's fingerprint; API,
   worker and beat active;
3. site.yml again: changed=0 everywhere;
4. add-host.yml on a second host VM, which then appears in the API;
5. rotate-certs.yml: the agent refuses the old coordinator certificate and
   accepts the new one.

Each step prints its wall time (a record, not an assertion).
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
ANSIBLE = ROOT / "ansible"
BIN = Path(sys.executable).parent
BRIDGE, GW, PREFIX = "cpans0", "10.78.0.1", 24
VMS = {"control1": ("10.78.0.10", 2048), "hv1": ("10.78.0.11", 1024),
       "hv2": ("10.78.0.12", 1024)}
LOCK = "/run/lock/cutpoint-ansible-vms.lock"
TIMES: dict[str, float] = {}


def _sh(*argv: str, check: bool = True, **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), check=check, capture_output=True, text=True, **kw)


class Vm:
    def __init__(self, name: str, addr: str, mem: int, tap: str, work: Path):
        self.name, self.addr, self.mem, self.tap, self.work = name, addr, mem, tap, work
        self.proc: subprocess.Popen[bytes] | None = None
        self.console = work / f"{name}.console.log"

    def start(self, image: Any, authkey: str) -> None:
        disk = self.work / f"{self.name}.qcow2"
        _sh("qemu-img", "create", "-q", "-f", "qcow2", "-F", image.root_format,
            "-b", str(image.root), str(disk))
        # A run killed before its teardown leaves its tap; the lock says no run owns it now.
        _sh("ip", "link", "del", self.tap, check=False)
        _sh("ip", "tuntap", "add", "dev", self.tap, "mode", "tap")
        _sh("ip", "link", "set", self.tap, "master", BRIDGE, "up")
        mac = f"52:54:00:78:00:{int(self.addr.rsplit('.', 1)[1]):02x}"
        cmdline = (f"{image.cmdline} cp.ip={self.addr}/{PREFIX} cp.gw={GW} cp.name={self.name} "
                   f"cp.authkey={authkey}")
        self.proc = subprocess.Popen([
            "qemu-system-x86_64", "-machine", "pc,accel=tcg", "-nodefaults", "-smp", "1",
            "-m", str(self.mem), "-kernel", str(image.kernel), "-initrd", str(image.initrd),
            "-append", cmdline, "-drive", f"file={disk},if=virtio,format=qcow2,cache=unsafe",
            "-netdev", f"tap,id=n0,ifname={self.tap},script=no,downscript=no",
            "-device", f"virtio-net-pci,netdev=n0,mac={mac}",
            "-display", "none", "-serial", f"file:{self.console}", "-monitor", "none",
            "-no-reboot"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT, start_new_session=True)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
        _sh("ip", "link", "del", self.tap, check=False)


class Lab:
    def __init__(self, work: Path, image: Any):
        self.work, self.image = work, image
        self.key = work / "id_ed25519"
        _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.key))
        self.authkey = base64.b64encode(Path(f"{self.key}.pub").read_bytes().strip()).decode()
        self.vms = {n: Vm(n, a, m, f"cpans-{n}"[:15], work) for n, (a, m) in VMS.items()}
        self.ca = work / "ca"
        self.hosts_in_inventory = ["hv1"]

    def ssh(self, vm: str, cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return _sh("ssh", "-i", str(self.key), "-o", "StrictHostKeyChecking=no",
                   "-o", "UserKnownHostsFile=/dev/null", "-o", "ConnectTimeout=5",
                   "-o", "LogLevel=ERROR", "-o", "BatchMode=yes", f"root@{self.vms[vm].addr}",
                   cmd, check=check, timeout=300)

    def wait_ssh(self, vm: str, deadline_s: float = 600) -> None:
        end = time.monotonic() + deadline_s
        while True:
            p = self.vms[vm].proc
            assert p is not None and p.poll() is None, \
                f"{vm} QEMU exited: {self.vms[vm].console.read_text(errors='replace')[-3000:]}"
            if self.ssh(vm, "systemctl is-system-running --wait >/dev/null 2>&1; true",
                        check=False).returncode == 0:
                return
            if time.monotonic() > end:
                raise AssertionError(f"{vm}: no SSH after {deadline_s}s; console tail: "
                                     f"{self.vms[vm].console.read_text(errors='replace')[-3000:]}")
            time.sleep(5)

    def inventory(self) -> Path:
        ssh_args = "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null"
        wheel = next((self.work / "wheels").glob("cutpoint-*.whl"))
        inv = {"all": {
            "vars": {"ansible_user": "root", "ansible_ssh_private_key_file": str(self.key),
                     "ansible_ssh_common_args": ssh_args,
                     "ansible_python_interpreter": "/usr/bin/python3",
                     "cutpoint_ca_dir": str(self.ca),
                     "cutpoint_control_secrets_dir": str(self.work / "secrets"),
                     "cutpoint_control_wheel_src": str(wheel)},
            "children": {
                "cutpoint_control": {"hosts": {"control1": {"ansible_host": VMS["control1"][0]}}},
                "cutpoint_hosts": {"hosts": {
                    h: {"ansible_host": VMS[h][0], "cutpoint_host_site": "primary"}
                    for h in self.hosts_in_inventory}}}}}
        p = self.work / "inventory.json"
        p.write_text(json.dumps(inv, indent=1))
        return p

    def playbook(self, name: str, *extra: str) -> dict[str, dict[str, int]]:
        env = self._env()
        t0 = time.monotonic()
        r = subprocess.run([str(BIN / "ansible-playbook"), "-i", str(self.inventory()), name,
                            *extra], cwd=ANSIBLE, env=env, capture_output=True, text=True,
                           check=False, timeout=3600)
        dt = time.monotonic() - t0
        log = self.work / f"{name}.{len(TIMES)}.log"
        log.write_text(r.stdout + r.stderr)
        TIMES[f"{name} {' '.join(extra)}".strip() + f" #{len(TIMES)}"] = dt
        print(f"\n{name} {' '.join(extra)}: {dt:.1f} s (log {log})")
        assert r.returncode == 0, (r.stdout + r.stderr)[-6000:]
        recap: dict[str, dict[str, int]] = {}
        for m in re.finditer(r"^(\S+)\s+:\s+((?:\w+=\d+\s*)+)$", r.stdout, re.MULTILINE):
            recap[m.group(1)] = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(2))}
        print("recap:", recap)
        return recap

    def api_hosts(self) -> dict[str, dict[str, Any]]:
        out = self.ssh("control1", "python3 - <<'EOF'\n"
                       "import json, urllib.request\n"
                       "t = open('/etc/cutpoint/ansible-admin.token').read().strip()\n"
                       "r = urllib.request.Request('http://127.0.0.1:8470/v1/hosts',"
                       " headers={'Authorization': 'Bearer ' + t})\n"
                       "print(urllib.request.urlopen(r).read().decode())\nEOF").stdout
        return {h["name"]: h for h in json.loads(out)["items"]}

    def _env(self) -> dict[str, str]:
        return dict(os.environ, PATH=f"{BIN}:{os.environ['PATH']}",
                    ANSIBLE_CONFIG=str(ANSIBLE / "ansible.cfg"), ANSIBLE_FORCE_COLOR="0",
                    ANSIBLE_LOCAL_TEMP=str(self.work / "ansible-tmp"),
                    ANSIBLE_PIPELINING="1", ANSIBLE_TIMEOUT="60")

    def hello_from_control(self, host: str, cert: str, key: str) -> tuple[bool, dict[str, Any]]:
        """The hello module run on the control VM against the agent of `host`."""
        args = {"host": VMS[host][0], "ca": "/etc/cutpoint/agent-tls/ca.pem",
                "cert": cert, "key": key, "expect_host": host}
        r = subprocess.run([str(BIN / "ansible"), "-i", str(self.inventory()), "control1",
                            "-m", "cutpoint_agent_hello", "-a", json.dumps(args)],
                           cwd=ANSIBLE, env=self._env(), capture_output=True, text=True,
                           check=False, timeout=300)
        m = re.search(r"control1 \| (SUCCESS|FAILED!) => (\{.*\})", r.stdout, re.DOTALL)
        assert m, r.stdout + r.stderr
        return m.group(1) == "SUCCESS", json.loads(m.group(2))


def _fp(pem: Path) -> str:
    return hashlib.sha256(ssl.PEM_cert_to_DER_cert(pem.read_text())).hexdigest()


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    if os.geteuid() != 0 or shutil.which("qemu-system-x86_64") is None:
        pytest.skip("needs root and qemu-system-x86_64")
    if not (ROOT / "build" / "agent" / "cutpointd").is_file():
        pytest.fail("build/agent/cutpointd is not built (ninja -C build)")
    # the host role installs the agent from the .deb this makes
    subprocess.run([str(ROOT / "scripts" / "package.sh")], check=True, timeout=600)
    from cutpoint.lab import debian_image
    lockf = open(LOCK, "w")  # noqa: SIM115 - held for the module's whole run
    fcntl.flock(lockf, fcntl.LOCK_EX)
    work = tmp_path_factory.mktemp("ansible-vms")
    t0 = time.monotonic()
    image = debian_image.build("debian-host")
    TIMES["image build or cache"] = time.monotonic() - t0
    # the control role installs the product wheel make package wrote (no test bed in it)
    (work / "wheels").mkdir()
    for whl in (ROOT / "out" / "packages").glob("cutpoint-*.whl"):
        shutil.copy2(whl, work / "wheels")
    _sh("ip", "link", "del", BRIDGE, check=False)
    _sh("ip", "link", "add", BRIDGE, "type", "bridge")
    _sh("ip", "addr", "add", f"{GW}/{PREFIX}", "dev", BRIDGE)
    _sh("ip", "link", "set", BRIDGE, "up")
    lab = Lab(work, image)
    try:
        t0 = time.monotonic()
        for vm in lab.vms.values():
            vm.start(image, lab.authkey)
        for name in lab.vms:
            lab.wait_ssh(name)
        TIMES["boot 3 VMs to SSH"] = time.monotonic() - t0
        print(f"\nboot of 3 VMs to SSH: {TIMES['boot 3 VMs to SSH']:.1f} s")
        yield lab
    finally:
        for vm in lab.vms.values():
            vm.stop()
        _sh("ip", "link", "del", BRIDGE, check=False)
        print("\ntimes (s):", json.dumps({k: round(v, 1) for k, v in TIMES.items()}, indent=1))
        lockf.close()


def test_1_site_converges_control_and_host(lab: Lab) -> None:
    recap = lab.playbook("site.yml")
    assert recap["control1"]["failed"] == 0 and recap["hv1"]["failed"] == 0
    assert recap["hv1"]["changed"] > 0


def test_2_results_on_the_vms(lab: Lab) -> None:
    assert lab.ssh("hv1", "systemctl is-active cutpointd").stdout.strip() == "active"
    ok, reply = lab.hello_from_control("hv1", "/etc/cutpoint/agent-tls/coordinator.pem",
                                       "/etc/cutpoint/agent-tls/coordinator.key")
    assert ok and reply["hello"]["host"] == "hv1", reply
    assert reply["peer_fingerprint"] == _fp(lab.ca / "hv1.pem")
    hosts = lab.api_hosts()
    assert hosts["hv1"]["cert_fingerprint"] == _fp(lab.ca / "hv1.pem")
    assert hosts["hv1"]["address"] == VMS["hv1"][0] and hosts["hv1"]["site"] == "primary"
    states = lab.ssh("control1", "systemctl is-active cutpoint-api cutpoint-worker cutpoint-beat",
                     check=False).stdout.split()
    assert states == ["active", "active", "active"]


def test_3_second_run_changes_nothing(lab: Lab) -> None:
    recap = lab.playbook("site.yml")
    assert {h: r["changed"] for h, r in recap.items()} == {h: 0 for h in recap}, recap


def test_4_add_host(lab: Lab) -> None:
    lab.hosts_in_inventory.append("hv2")
    recap = lab.playbook("add-host.yml", "-e", "cutpoint_new_host=hv2")
    assert "hv1" not in recap and recap["hv2"]["failed"] == 0
    assert lab.ssh("hv2", "systemctl is-active cutpointd").stdout.strip() == "active"
    hosts = lab.api_hosts()
    assert hosts["hv2"]["cert_fingerprint"] == _fp(lab.ca / "hv2.pem")


def test_5_rotate_certs(lab: Lab) -> None:
    old = lab.work / "old-coordinator"
    old.mkdir()
    for f in ("coordinator.pem", "coordinator.key"):
        shutil.copy2(lab.ca / f, old / f)
    lab.ssh("control1", "mkdir -p /root/old && cp /etc/cutpoint/agent-tls/coordinator.* /root/old/")
    recap = lab.playbook("rotate-certs.yml")
    assert all(r["failed"] == 0 for r in recap.values())
    # The agent now trusts only the new CA: the old coordinator certificate is
    # refused in the handshake, the new one gets a hello.
    ok, bad = lab.hello_from_control("hv1", "/root/old/coordinator.pem", "/root/old/coordinator.key")
    print("hello with the old coordinator certificate:", bad.get("msg"))
    assert not ok and "UNKNOWN_CA" in bad["msg"], bad
    ok, good = lab.hello_from_control("hv1", "/etc/cutpoint/agent-tls/coordinator.pem",
                                      "/etc/cutpoint/agent-tls/coordinator.key")
    assert ok and good["hello"]["host"] == "hv1", good
    assert _fp(old / "coordinator.pem") != _fp(lab.ca / "coordinator.pem")
    assert lab.api_hosts()["hv1"]["cert_fingerprint"] == _fp(lab.ca / "hv1.pem")
