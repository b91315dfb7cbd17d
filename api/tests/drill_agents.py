"""The setting of the drill-through-agents lab tests: libvirt DR hosts
with agents, the DR site's Ceph, captured definitions in a database.

`DrillBed` brings up, beside the lab (its Ceph sites only):
- two DR hypervisor hosts, each a libvirtd of its own
  (dr-tests/lab/libvirt.py) with the DR site's cephx key as a libvirt
  secret, and a cutpointd (`[libvirt] discover = yes`, `definition_key`:
  the public half of a key made here);
- the drill bridge `cpdrill0` (no address, no uplink: the isolated drill
  network) in the host's network namespace, where libvirt puts the taps;
- for each VM: an RBD image at DR holding a marker line, with a snapshot
  (the "recovery point"), and its captured definition (the tiny guest,
  qemu-ga channel, an RBD disk and an interface on `br-prod` of the
  primary site) in a SQLite database with the sites, hosts and VMs;
- the control plane's Settings: agent certificates, the signing key and
  `definition_targets.dr` (host dr-h1, drill_network cpdrill0).

`vm2` also has a standby row on dr-h2, so the drill starts it there (as
failover would) and `vm1` on dr-h1 (the definition_targets host).
"""

from __future__ import annotations

import functools
import glob
import hashlib
import re
import shutil
import socket
import ssl
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cutpoint.lab.libvirt import LibvirtHost

BRIDGE = "cpdrill0"
RP = "cp.drl.t1"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def guest_xml(name: str, img: dict[str, Any], disk: str, mon: str, user: str,
              secret: str, extra: str = "") -> str:
    host, _, port = mon.rpartition(":")
    return f"""<domain type='qemu'>
  <name>{name}</name>
  <uuid>{uuid.uuid4()}</uuid>
  <memory unit='MiB'>256</memory>
  <vcpu>1</vcpu>
  <os><type arch='x86_64' machine='pc'>hvm</type>
    <kernel>{img['kernel']}</kernel><initrd>{img['initrd']}</initrd>
    <cmdline>console=ttyS0 quiet cp.name={name} cp.ndisks=1{extra}</cmdline></os>
  <devices>
    <emulator>/usr/bin/qemu-system-x86_64</emulator>
    <disk type='network' device='disk'><driver name='qemu' type='raw' cache='none'/>
      <auth username='{user}'><secret type='ceph' uuid='{secret}'/></auth>
      <source protocol='rbd' name='rbd/{disk}'><host name='{host}' port='{port}'/></source>
      <target dev='vda' bus='virtio'/></disk>
    <interface type='bridge'><mac address='52:54:00:aa:00:01'/><source bridge='br-prod'/>
      <model type='virtio'/></interface>
    <serial type='pty'><target port='0'/></serial>
    <channel type='unix'><target type='virtio' name='org.qemu.guest_agent.0'/></channel>
    <memballoon model='none'/>
  </devices>
</domain>
"""


class DrillBed:
    def __init__(self, status: dict[str, Any], tmp: Path, vms: tuple[str, ...] = ("drl-vm1",
                                                                               "drl-vm2")) -> None:
        self.status, self.tmp, self.vms = status, tmp, vms
        self.dr = status["sites"]["dr"]
        self.hosts: list[LibvirtHost] = []
        self.agents: list[tuple[subprocess.Popen[bytes], int, Path]] = []
        self.secret = str(uuid.uuid4())
        self.images = {vm: f"{vm}-vda" for vm in vms}
        self.markers = {vm: f"cutpoint-drill-marker {vm} {uuid.uuid4().hex[:8]}" for vm in vms}

    # -- Ceph --
    def rbd(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        c = self.dr["clients"]["cutpoint"]
        return subprocess.run(["rbd", "--conf", self.dr["ceph_conf"], "--id", c["client_id"],
                               "--keyring", c["keyring"], *args], check=check,
                              capture_output=True, text=True)

    def mon(self) -> str:
        return next(a for a in self.dr["mon_addrs"] if a.startswith("v1:"))[3:]

    def make_images(self) -> None:
        pool = self.dr["pool"]
        for vm, img in self.images.items():
            self._remove_image(pool, img)
            f = self.tmp / f"{img}.raw"
            with open(f, "wb") as out:
                out.write((self.markers[vm] + "\n").encode().ljust(4096, b"\0"))
                out.truncate(16 << 20)
            self.rbd("import", "--no-progress", str(f), f"{pool}/{img}")
            self.rbd("snap", "create", f"{pool}/{img}@{RP}")

    def _remove_image(self, pool: str, img: str) -> None:
        for line in self.rbd("ls", pool).stdout.split():
            if line.startswith("drill-") and line.endswith(img):
                self.rbd("rm", "--no-progress", f"{pool}/{line}", check=False)
        self.rbd("snap", "unprotect", f"{pool}/{img}@{RP}", check=False)
        self.rbd("snap", "purge", "--no-progress", f"{pool}/{img}", check=False)
        self.rbd("rm", "--no-progress", f"{pool}/{img}", check=False)

    # -- hosts --
    def start(self) -> None:
        from cutpoint.lab.agents import CA_SCRIPT

        self.certs = self.tmp / "certs"
        for name, role in (("coordinator", "coordinator"), ("dr-h1", "agent"),
                           ("dr-h2", "agent")):
            subprocess.run([str(CA_SCRIPT), str(self.certs), "issue", name, role, "127.0.0.1"]
                           if role == "agent" else
                           [str(CA_SCRIPT), str(self.certs), "issue", name, role],
                           check=True, capture_output=True)
        self.key = Ed25519PrivateKey.generate()
        (self.tmp / "sign.pem").write_bytes(self.key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption()))
        (self.tmp / "sign.pub").write_bytes(self.key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
        subprocess.run(["ip", "link", "del", BRIDGE], check=False, capture_output=True)
        subprocess.run(["ip", "link", "add", BRIDGE, "type", "bridge"], check=True)
        subprocess.run(["ip", "link", "set", BRIDGE, "up"], check=True)
        c = self.dr["clients"]["cutpoint"]
        key = re.search(r"key\s*=\s*(\S+)", Path(c["keyring"]).read_text())
        assert key, c["keyring"]
        (self.tmp / "cephkey").write_text(key.group(1))
        for i in (1, 2):
            h = LibvirtHost(Path(tempfile.mkdtemp(prefix=f"cp-drl-h{i}-")))
            h.start()
            self.hosts.append(h)
            (self.tmp / "secret.xml").write_text(
                f"<secret ephemeral='no' private='yes'><uuid>{self.secret}</uuid>"
                f"<usage type='ceph'><name>client.{c['client_id']} drill</name></usage>"
                "</secret>")
            h.virsh("secret-define", str(self.tmp / "secret.xml"))
            h.virsh("secret-set-value", "--secret", self.secret, "--file",
                    str(self.tmp / "cephkey"))
            self.agents.append(self._agent(f"dr-h{i}", h))

    def _agent(self, name: str, h: LibvirtHost) -> tuple[subprocess.Popen[bytes], int, Path]:
        from cutpoint.lab.agents import cutpointd_path

        d = self.tmp / name
        d.mkdir()
        port = _free_port()
        cfg = d / "agent.ini"
        cfg.write_text(
            f"[agent]\nhost = {name}\nlisten = 127.0.0.1:{port}\njournal = {d / 'journal'}\n\n"
            f"[tls]\nca = {self.certs / 'ca.pem'}\ncert = {self.certs / (name + '.pem')}\n"
            f"key = {self.certs / (name + '.key')}\n\n"
            f"[libvirt]\nuri = {h.uri}\ndiscover = yes\n"
            f"definition_key = {self.tmp / 'sign.pub'}\n"
            # the tiny guest's kernel and initrd: direct kernel boot
            f"definition_paths = {' '.join(boot_dirs())}\n")
        with open(d / "agent.log", "wb") as log:
            p = subprocess.Popen([str(cutpointd_path()), "-c", str(cfg)], stdout=log,
                                 stderr=log)
        t0 = time.monotonic()
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                assert p.poll() is None, (d / "agent.log").read_text()
                assert time.monotonic() - t0 < 20
                time.sleep(0.05)
        return p, port, d

    def pin(self, name: str) -> str:
        pem = (self.certs / f"{name}.pem").read_text()
        return hashlib.sha256(ssl.PEM_cert_to_DER_cert(pem)).hexdigest()

    # -- control plane --
    def database(self, tiny: dict[str, Any], cmdline: dict[str, str] | None = None) -> Any:
        """The control plane's database; `cmdline`: words added to a VM's
        kernel command line in its captured definition."""
        from cutpoint.api.models import Base, Host, Site, Vm, VmDefinition
        from sqlalchemy import create_engine
        from sqlalchemy.orm import sessionmaker

        eng = create_engine(f"sqlite:///{self.tmp / 'cp.db'}")
        Base.metadata.create_all(eng)
        sf = sessionmaker(eng, expire_on_commit=False)
        pool = self.dr["pool"]
        with sf() as s:
            c = self.dr["clients"]["cutpoint"]
            prim = Site(name="primary")
            dr = Site(name="dr", ceph_pools={"rbd": pool}, ceph_conf=self.dr["ceph_conf"],
                      ceph_client_id=c["client_id"], ceph_keyring=c["keyring"])
            s.add_all([prim, dr])
            s.flush()
            ph = Host(name="prim-h1", site_id=prim.id, address="127.0.0.1", port=1)
            hs = [Host(name=f"dr-h{i}", site_id=dr.id, address="127.0.0.1",
                       port=self.agents[i - 1][1], cert_fingerprint=self.pin(f"dr-h{i}"))
                  for i in (1, 2)]
            s.add_all([ph, *hs])
            s.flush()
            for vm in self.vms:
                v = Vm(name=vm, host_id=ph.id, driver="libvirt", state="running")
                s.add(v)
                s.flush()
                xml = guest_xml(vm, tiny, self.images[vm], "10.77.0.2:6789", "cutpoint-prim",
                                str(uuid.uuid4()), " " + (cmdline or {}).get(vm, ""))
                s.add(VmDefinition(vm_id=v.id, host="prim-h1", version=1,
                                   format="libvirt-domain-xml",
                                   sha256=hashlib.sha256(xml.encode()).hexdigest(),
                                   definition=xml))
            # the standby of every second VM is listed by dr-h2's agent
            for vm in self.vms[1::2]:
                s.add(Vm(name=vm, host_id=hs[1].id, driver="libvirt", state="shutoff"))
            s.commit()
        return sf

    def group(self, sf: Any, name: str = "drl") -> int:
        """Group `name` of the bed's VMs (their disks vda on prim-h1, RBD), replicating
        to dr, with one committed snapshot verified at DR whose member snapshots
        are the bed's recovery point RP.  Returns the group's id."""
        import datetime as dt

        from cutpoint.api.models import (
            Disk,
            Group,
            GroupDisk,
            GroupMember,
            GroupSnapshot,
            MemberSnapshot,
            Policy,
            Site,
            SnapState,
            Vm,
            utcnow,
        )
        from sqlalchemy import select

        with sf() as s:
            dr = s.scalar(select(Site).where(Site.name == "dr"))
            g = Group(name=name)
            s.add(g)
            s.flush()
            s.add(Policy(group_id=g.id, replication_target_id=dr.id))
            cut = utcnow() - dt.timedelta(seconds=20)
            snap = GroupSnapshot(group_id=g.id, txn="t1", state=SnapState.committed,
                                 cut_at=cut, dr_verified_at=cut + dt.timedelta(seconds=5))
            s.add(snap)
            s.flush()
            for vm in self.vms:
                v = s.scalar(select(Vm).where(Vm.name == vm, Vm.driver == "libvirt",
                                              Vm.state == "running"))
                d = Disk(vm_id=v.id, node="vda", key=f"{vm}/vda", backend="rbd", pool="rbd",
                         image=self.images[vm])
                s.add(d)
                s.flush()
                m = GroupMember(group_id=g.id, vm_id=v.id)
                s.add(m)
                s.flush()
                s.add(GroupDisk(disk_id=d.id, group_id=g.id, member_id=m.id))
                s.add(MemberSnapshot(group_snapshot_id=snap.id, disk_id=d.id, host="prim-h1",
                                     vm=vm, disk=f"{vm}/vda", name=RP, state="present"))
            s.commit()
            return int(g.id)

    def settings(self) -> Any:
        from cutpoint.api.config import DefinitionTarget, Settings

        c = self.dr["clients"]["cutpoint"]
        return Settings(
            token_secret="drill-agents-secret-0123", database_url=f"sqlite:///{self.tmp}/cp.db",
            agent_ca=self.certs / "ca.pem", agent_cert=self.certs / "coordinator.pem",
            agent_key=self.certs / "coordinator.key",
            definition_signing_key=self.tmp / "sign.pem",
            definition_targets={"dr": DefinitionTarget(
                host="dr-h1", auth_user=c["client_id"], secret_uuid=self.secret,
                mon_hosts=[self.mon()], drill_network=BRIDGE, boot_paths=boot_dirs())})

    def spec(self, sf: Any, settings: Any, vms: tuple[str, ...] | None = None,
             **kw: Any) -> Any:
        """The DrillSpec of a drill of `vms` (default all) at DR."""
        from cutpoint.api.services import drill_boot
        from cutpoint.coordinator.dr.boot import BootDisk, BootVM
        from cutpoint.coordinator.dr.drill import DrillSpec
        from cutpoint.lab.sites import ceph_site

        return DrillSpec(site=ceph_site(self.status, "dr"), recovery_point=RP,
                         vms=[BootVM(vm, (BootDisk("vda", self.images[vm], "rbd"),))
                              for vm in (vms or self.vms)],
                         report_dir=str(self.tmp / "drills"),
                         definitions=drill_boot.definitions(sf, settings, "dr"),
                         agent_tls=(str(settings.agent_ca), str(settings.agent_cert),
                                    str(settings.agent_key)),
                         boot_timeout_s=240, **kw)

    def domains(self) -> dict[str, list[str]]:
        """Every domain each DR libvirtd knows (running or defined)."""
        return {f"dr-h{i + 1}": (h.virsh("list", "--all", "--name") or "").split()
                for i, h in enumerate(self.hosts)}

    def taps(self) -> list[str]:
        out = subprocess.run(["ip", "-o", "link", "show", "master", BRIDGE], check=False,
                             capture_output=True, text=True).stdout
        return [ln.split(":")[1].strip() for ln in out.splitlines() if ":" in ln]

    def agent_log(self, i: int) -> str:
        return (self.agents[i][2] / "agent.log").read_text(errors="replace")

    def stop(self) -> None:
        from cutpoint.lab.agents import stop_agent_pid

        for p, _, _ in self.agents:
            stop_agent_pid(p.pid)
            p.wait(10)
        for h in self.hosts:
            h.stop()
        subprocess.run(["ip", "link", "del", BRIDGE], check=False, capture_output=True)
        for img in self.images.values():
            self._remove_image(self.dr["pool"], img)


@functools.cache
def tiny_image() -> dict[str, Any]:
    from cutpoint.lab import image

    kernel = max(glob.glob("/boot/vmlinuz-*"))
    return image.build(kernel, log=print)


def boot_dirs() -> list[str]:
    """The directories of the tiny guest's kernel and initrd: what the DR
    site lets a signed definition boot (boot_paths, definition_paths)."""
    img = tiny_image()
    return sorted({str(Path(img[k]).parent) for k in ("kernel", "initrd")})


__all__ = ["BRIDGE", "RP", "DrillBed", "shutil", "tiny_image"]
