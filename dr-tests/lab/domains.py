"""The lab in libvirt mode (`--driver libvirt`): a libvirtd per host, the
primary VMs as libvirt domains with RBD disks behind a cephx secret.

    network up -> libvirtd + virtlogd in each host's netns (libvirt.py)
    Ceph up    -> per site, a libvirt secret (ceph) holding client.cutpoint's
                  key, defined on each of the site's hosts with one UUID
                  (as Ansible installs it, ansible/roles/host)
    disks      -> each VM: `virsh define` of domain_xml(), `virsh start`

A lab domain is what a deployment's would be, so the product meets the
shape it meets there (api/tests/data/domains/lab-rbd.xml is one libvirt
dumped): direct kernel boot of the tiny image (the kernel command line of
raw-QEMU mode), RBD `<disk type='network'>` disks as `client.cutpoint`
(not admin) with `<auth>` naming the secret, a bridge interface on the
host's `br0` (its tap named by libvirt, `vnetN`: a name in the XML would
go with it to DR, where two hosts' VMs meet), a pty serial console
whose output virtlogd writes to the VM's console file, and a guest agent
channel.  Every device is one that vmdef_rewrite.py signs for DR, so a
lab VM can be failed over from its captured definition.

QEMU's Ceph client reads `<state>/libvirt/ceph-client.conf` (`<config
file=>`): the sites' monitors come from `<host>`, so one conf serves both
sites, and it keeps Ceph's per-client admin socket
(`$cluster-$name.$pid.$cctid.asok`, see ceph.py: a socket shared by the
site's clients made a QEMU's RBD attach wait 10 s while the socket's
holder was SIGSTOPped) and the rados op timeouts of raw-QEMU mode.

The DR hosts' libvirtds get the DR site's secret, and the first DR host's
agent the public half of the lab's definition-signing key (`signing_key`),
so failover can start a VM there from its captured definition
(api/services/failover_signed.py; status `libvirt.definition_targets`).
A signed definition names only host files the DR site allows
(api/services/vmdef_policy.py, agent/defpolicy.h; `dr_files`): the lab's
DR site allows the guest image's kernel and initrd directory (direct
kernel boot), its own console directory `<state>/libvirt/dr-console`
(a DR guest's console is `<name>.serial0.log` there, not the primary's
file) and the Ceph client conf; the DR agent's `[libvirt]
definition_paths` lists the same.
"""

from __future__ import annotations

import re
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape, quoteattr

from cutpoint.lab.errors import LabError
from cutpoint.lab.libvirt import LibvirtHost
from cutpoint.lab.proc import pid_alive

ROLE = "cutpoint"   # the cephx client of the domains' disks (ceph.CLIENTS)
BRIDGE = "br0"      # each host namespace's bridge (net.py)


def libvirt_dir(state: Path) -> Path:
    return state / "libvirt"


def host_of(status: dict[str, Any], name: str) -> LibvirtHost:
    h = status["libvirt"]["hosts"][name]
    return LibvirtHost(h["dir"], h["netns"])


def start_hosts(status: dict[str, Any], mark: str, log: Any = print) -> dict[str, Any]:
    """libvirtd + virtlogd in every lab host's namespace; returns status `libvirt`."""
    state = Path(status["state_dir"])
    hosts = {h["name"]: {"dir": str(libvirt_dir(state) / h["name"]), "netns": h["netns"],
                         "site": h["site"]} for h in status["hosts"]}
    for h in hosts.values():
        h["uri"] = LibvirtHost(h["dir"]).uri

    def one(name: str) -> None:
        LibvirtHost(hosts[name]["dir"], hosts[name]["netns"], mark).start()

    with ThreadPoolExecutor(max_workers=4) as ex:
        list(ex.map(one, hosts))
    log(f"libvirt: libvirtd + virtlogd in {', '.join(hosts)}")
    return {"hosts": hosts, "secrets": {}}


def client_conf(state: Path, op_timeout_s: int) -> str:
    """The Ceph client conf of the domains' QEMUs (see the module doc)."""
    d = libvirt_dir(state)
    run = d / "ceph-run"
    run.mkdir(parents=True, exist_ok=True)
    run.chmod(0o1777)  # QEMU runs as libvirt's QEMU user, not root
    timeouts = (f"rados osd op timeout = {op_timeout_s}\n"
                f"rados mon op timeout = {op_timeout_s}\n") if op_timeout_s > 0 else ""
    p = d / "ceph-client.conf"
    p.write_text("# cutpoint lab: the Ceph client of libvirt domains' QEMUs "
                 "(cutpoint.lab.domains)\n[client]\n"
                 f"admin socket = {run}/$cluster-$name.$pid.$cctid.asok\n"
                 "log file = /dev/null\n" + timeouts)
    p.chmod(0o644)
    return str(p)


def _key(keyring: str) -> str:
    m = re.search(r"key\s*=\s*(\S+)", Path(keyring).read_text())
    if not m:
        raise LabError(f"no key in {keyring}")
    return m.group(1)


def define_secrets(status: dict[str, Any]) -> None:
    """Per site, one secret UUID holding client.cutpoint's key, defined on
    every libvirtd of the site's hosts (ephemeral='no' private='yes', as a
    deployment keeps it)."""
    lv = status["libvirt"]
    d = libvirt_dir(Path(status["state_dir"]))
    for site, s in status["sites"].items():
        client = s["clients"][ROLE]
        sid = lv["secrets"].get(site, {}).get("uuid") or str(uuid.uuid4())
        lv["secrets"][site] = {"uuid": sid, "user": client["client_id"]}
        xml = d / f"secret-{site}.xml"
        xml.write_text(f"<secret ephemeral='no' private='yes'><uuid>{sid}</uuid>"
                       f"<usage type='ceph'><name>client.{client['client_id']} lab {site}"
                       f"</name></usage></secret>\n")
        keyfile = d / f"secret-{site}.key"
        keyfile.touch(mode=0o600)
        keyfile.write_text(_key(client["keyring"]))
        try:
            for name, h in lv["hosts"].items():
                if h["site"] != site:
                    continue
                host = host_of(status, name)
                host.virsh("secret-define", str(xml))
                host.virsh("secret-set-value", "--secret", sid, "--file", str(keyfile))
        finally:
            keyfile.unlink(missing_ok=True)


def signing_key(status: dict[str, Any]) -> None:
    """The lab's definition-signing key pair (Ed25519, PEM): the private half
    for the control plane (`definition_signing_key`), the public half for
    the DR agent ([libvirt] definition_key)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    d = libvirt_dir(Path(status["state_dir"]))
    key = Ed25519PrivateKey.generate()
    priv, pub = d / "definition-signing.pem", d / "definition-signing.pub"
    priv.touch(mode=0o600)
    priv.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    pub.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                  serialization.PublicFormat.SubjectPublicKeyInfo))
    lv = status["libvirt"]
    lv["signing_key"], lv["definition_key"] = str(priv), str(pub)
    dr = next((h for h in status["hosts"] if h["site"] == "dr"), None)
    if dr is not None:
        # The control plane's `definition_targets` entry of site dr.
        sec = lv["secrets"]["dr"]
        files = dr_files(Path(status["state_dir"]), status.get("image") or {})
        Path(files["console_dir"]).mkdir(parents=True, exist_ok=True)
        lv["definition_targets"] = {"dr": {
            "host": dr["name"], "auth_user": sec["user"], "secret_uuid": sec["uuid"],
            "mon_hosts": [mon_host(status["sites"]["dr"])], "networks": {BRIDGE: BRIDGE},
            **files}}


def dr_files(state: Path, image: dict[str, Any]) -> dict[str, Any]:
    """The host files the lab's DR site lets a signed definition name: its
    `definition_targets` fields boot_paths, console_dir and ceph_conf."""
    boot = sorted({str(Path(image[k]).parent) for k in ("kernel", "initrd") if image.get(k)})
    d = libvirt_dir(state)
    return {"boot_paths": boot, "console_dir": str(d / "dr-console"),
            "ceph_conf": str(d / "ceph-client.conf")}


def dr_console(status: dict[str, Any], name: str) -> Path:
    """Where a domain started at DR from its signed definition logs its
    serial console (the rewrite's <log file=>)."""
    return Path(status["libvirt"]["definition_targets"]["dr"]["console_dir"]) / \
        f"{name}.serial0.log"


def definition_paths(status: dict[str, Any]) -> str:
    """The DR agent's [libvirt] definition_paths: what dr_files allows."""
    t = (status.get("libvirt") or {}).get("definition_targets", {}).get("dr") or {}
    return " ".join([*t.get("boot_paths", []), *(t[k] for k in ("console_dir", "ceph_conf")
                                                  if t.get(k))])


def mon_host(site: dict[str, Any]) -> str:
    """The site's monitor as "address:port" (its v1 address: what libvirt's
    `<host name= port=>` gives QEMU)."""
    return next(a for a in site["mon_addrs"] if a.startswith("v1:"))[3:]


def plan_vm(vm: dict[str, Any], status_lv: dict[str, Any]) -> None:
    """The libvirt fields of a VM's status entry (vms.plan)."""
    h = status_lv["hosts"][vm["host"]]
    d = Path(h["dir"])
    vm.update(driver="libvirt", uri=h["uri"], pidfile=str(d / "run" / "qemu" / f"{vm['name']}.pid"),
              domain_log=str(d / "log" / "qemu" / f"{vm['name']}.log"))
    vm.pop("qmp", None)
    for k, disk in enumerate(vm["disks"]):
        disk["node"] = f"vd{chr(ord('a') + k)}"  # the agent names a libvirt disk by target dev


def domain_xml(vm: dict[str, Any], image: dict[str, Any], accel: str, cmdline: str,
               site: dict[str, Any], secret: dict[str, str], conf: str,
               memory_mb: int) -> str:
    addr, _, port = mon_host(site).rpartition(":")
    disks = "".join(f"""
    <disk type='network' device='disk'>
      <driver name='qemu' type='raw' cache='none'/>
      <auth username={quoteattr(secret['user'])}>
        <secret type='ceph' uuid='{secret['uuid']}'/>
      </auth>
      <source protocol='rbd' name={quoteattr(f"{d['pool']}/{d['image']}")}>
        <host name='{addr}' port='{port}'/>
        <config file={quoteattr(conf)}/>
      </source>
      <target dev='{d['node']}' bus='virtio'/>
      <address type='pci' domain='0x0000' bus='0x00' slot='{hex(4 + k)}' function='0x0'/>
    </disk>""" for k, d in enumerate(vm["disks"]))
    kvm = accel == "kvm"
    return f"""<domain type='{"kvm" if kvm else "qemu"}'>
  <name>{escape(vm['name'])}</name>
  <memory unit='MiB'>{memory_mb}</memory>
  <vcpu placement='static'>1</vcpu>
  <os>
    <type arch='x86_64' machine='pc'>hvm</type>
    <kernel>{escape(image['kernel'])}</kernel>
    <initrd>{escape(image['initrd'])}</initrd>
    <cmdline>{escape(cmdline)}</cmdline>
  </os>
  <cpu mode='custom' match='exact' check='none'>
    <model fallback='forbid'>{"kvm64" if kvm else "qemu64"}</model>
  </cpu>
  <on_poweroff>destroy</on_poweroff>
  <on_reboot>destroy</on_reboot>
  <on_crash>destroy</on_crash>
  <devices>
    <emulator>/usr/bin/qemu-system-x86_64</emulator>{disks}
    <controller type='usb' model='none'/>
    <interface type='bridge'>
      <mac address='{vm['mac']}'/>
      <source bridge='{BRIDGE}'/>
      <model type='virtio'/>
      <address type='pci' domain='0x0000' bus='0x00' slot='0x03' function='0x0'/>
    </interface>
    <serial type='pty'>
      <log file={quoteattr(vm['console'])} append='off'/>
      <target port='0'/>
    </serial>
    <channel type='unix'>
      <target type='virtio' name='org.qemu.guest_agent.0'/>
    </channel>
    <memballoon model='none'/>
  </devices>
</domain>
"""


def start(vms: list[dict[str, Any]], status: dict[str, Any], xmls: dict[str, str]) -> None:
    """`virsh define` + `virsh start` of each VM on its host's libvirtd."""
    def one(vm: dict[str, Any]) -> None:
        host = host_of(status, vm["host"])
        Path(vm["console"]).unlink(missing_ok=True)
        p = Path(vm["dir"]) / "domain.xml"
        p.write_text(xmls[vm["name"]])
        host.virsh("define", str(p))
        host.virsh("start", vm["name"], timeout=90)
        vm["uuid"] = (host.virsh("domuuid", vm["name"]) or "").strip()
        ifs = (host.virsh("domiflist", vm["name"]) or "").splitlines()[2:]
        vm["tap"] = ifs[0].split()[0] if ifs and ifs[0].split() else ""
        vm["pid"] = host.domain_pid(vm["name"])
        if not pid_alive(vm["pid"]):
            raise LabError(f"{vm['name']}: libvirt started the domain but its QEMU is gone "
                           f"(see {vm['domain_log']})")

    with ThreadPoolExecutor(max_workers=4) as ex:
        list(ex.map(one, vms))


def down(state: Path, status: dict[str, Any] | None) -> list[str]:
    """Destroy and undefine every domain, undefine the secrets and stop the
    daemons of each lab libvirtd (from the status, and any libvirt dir
    with a pid file: a lab whose status was lost); returns what went."""
    dirs = {Path(h["dir"]): h.get("netns") for h in
            ((status or {}).get("libvirt") or {}).get("hosts", {}).values()}
    base = libvirt_dir(state)
    if base.is_dir():
        for d in base.iterdir():
            if (d / "libvirtd.pid").exists() or (d / "virtlogd.pid").exists():
                dirs.setdefault(d, None)
    gone: list[str] = []
    for d, ns in sorted(dirs.items()):
        host = LibvirtHost(d, ns)
        gone += [f"{x} on {d.name}" for x in host.clear()]
        gone += host.stop(remove=False)
    return gone


def log_offsets(vms: list[dict[str, Any]]) -> dict[str, int]:
    """Each libvirt VM's domain log size now: where `tainted` starts reading."""
    out = {}
    for vm in vms:
        p = Path(vm["domain_log"])
        out[vm["name"]] = p.stat().st_size if p.exists() else 0
    return out


def tainted(vm: dict[str, Any], since: int = 0) -> list[str]:
    """The `tainted` lines libvirt wrote to the domain's log after offset
    `since` (libvirt logs `Domain id=N is tainted: custom-monitor` when raw
    QMP goes to the domain, and other taints the same way)."""
    with open(vm["domain_log"], "rb") as f:
        f.seek(since)
        text = f.read().decode(errors="replace")
    return [ln for ln in text.splitlines() if "tainted" in ln]


def destroy(status: dict[str, Any], host: str, names: list[str]) -> list[str]:
    """Destroy and undefine the domains `names` of `host`'s libvirtd (its
    secrets stay); returns those it found."""
    h = host_of(status, host)
    gone = []
    for n in names:
        found = h.virsh("destroy", n, check=False, timeout=30) is not None
        found = h.virsh("undefine", n, check=False, timeout=30) is not None or found
        if found:
            gone.append(n)
    return gone
