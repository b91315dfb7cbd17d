"""A database VM's drill through the product (issue 18 item 4), on the lab
in libvirt mode: the VM runs at the primary as the lab runs its VMs, and
the drill is the control plane's.

    primary   the VM is a libvirt domain on primary-h1's libvirtd: direct
              kernel boot of the Debian image, every disk an RBD image of
              the primary cluster behind the site's cephx secret (the root
              too: a drill copy needs one, and only RBD images have a copy
              at DR), each group disk found in the guest by its serial
              (cpwal, cpdata, ...), qemu-ga on its channel, an interface
              on the host's bridge.  It boots with cp.mode=idle: the load
              is started afterwards through the agent's vm.guest_exec, so
              a copy booted from its definition runs the database only.
    agents    a cutpointd on primary-h1 (libvirt driver, the domain named)
              and one on dr-h1 (discover = yes, the lab's definition key),
              both the lab's config (cutpoint.lab.agents)
    control   the product's server (`cutpoint server --embedded`: API,
    plane     worker, beat) with the agent booter; into its database the
              test bed writes what an operator's site add, inventory sync
              and group create would: the sites, the two hosts (pinned),
              the VM and its disks from the primary agent's `inventory`
              (services/inventory.apply), its definition captured from the
              agent (services/vm_definitions.refresh_host), the group and
              its policy (replication target dr, no schedule)
    snapshot  coordinated: `cutpoint snapshot --group-file` (the product's
              two-phase commit through the primary agent); uncoordinated
              (the negative control): `rbd snap create` member by member,
              `delay` s apart, no pause.  Either is recorded as the group's
              snapshot with its members (as the capture service records
              one), replicated to DR by the product's replicate_group with
              a full verification, then marked verified at DR
    drill     `cutpoint drill run GROUP --point TXN --plan FILE --json`, as
              an operator runs it: the API queues the drill job, the
              server's worker runs it (clones at DR, the definition
              rewritten for the isolated drill bridge `cpdrill0` of dr-h1
              and signed, started through dr-h1's agent, ready by
              guest-ping, the plan's post hook waits for the database, the
              checks run in the guest through qemu-ga, teardown); the
              evidence is read from `GET /v1/drills/{id}/report`

Nothing of this needs the lab's launcher or console.  The figures each
drill prints (`breakdown`) come from the drill's own timeline.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import ssl
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape, quoteattr

from cutpoint.checkers.rbddrill import DrillImages
from cutpoint.lab import domains
from cutpoint.lab.debian_image import Image
from cutpoint.lab.demo import DRILL_NETWORK, drill_network

DRILL_BRIDGE = DRILL_NETWORK
# The lab of these drills: both Ceph clusters, one host per site, libvirt,
# no tiny guests (their CPU would slow the TCG Debian guests).
LAB = {"hosts": 1, "vms_per_host": 0, "driver": "libvirt"}


@dataclass
class DbVM:
    """One database VM of a drill: its name, the host it runs on, its group
    disks (serial -> MB, in target order vdb, vdc, ...), its kernel
    command line's own words, memory."""
    name: str
    host: str
    disks: dict[str, int]
    cmdline: str = "cp.mode=idle"
    memory_mb: int = 1024
    mac: str = "52:54:00:cd:00:01"
    root_serial: str = "cproot"
    images: dict[str, str] = field(default_factory=dict)   # serial -> image

    def targets(self) -> dict[str, str]:
        """serial -> target dev: the root vda, then the group disks."""
        order = [self.root_serial, *self.disks]
        return {s: f"vd{chr(ord('a') + i)}" for i, s in enumerate(order)}


def domain_xml(vm: DbVM, image: Image, site: dict[str, Any], secret: dict[str, str],
               conf: str, console: Path, pool: str) -> str:
    """The domain of a database VM, in the lab's shape (domains.domain_xml)
    with its disks' serials and its own kernel command line."""
    addr, _, port = domains.mon_host(site).rpartition(":")
    disks = "".join(f"""
    <disk type='network' device='disk'>
      <driver name='qemu' type='raw' cache='none'/>
      <auth username={quoteattr(secret['user'])}>
        <secret type='ceph' uuid='{secret['uuid']}'/>
      </auth>
      <source protocol='rbd' name={quoteattr(f"{pool}/{vm.images[s]}")}>
        <host name='{addr}' port='{port}'/>
        <config file={quoteattr(conf)}/>
      </source>
      <target dev='{dev}' bus='virtio'/>
      <serial>{escape(s)}</serial>
    </disk>""" for s, dev in vm.targets().items())
    return f"""<domain type='qemu'>
  <name>{escape(vm.name)}</name>
  <memory unit='MiB'>{vm.memory_mb}</memory>
  <vcpu placement='static'>1</vcpu>
  <os>
    <type arch='x86_64' machine='pc'>hvm</type>
    <kernel>{escape(str(image.kernel))}</kernel>
    <initrd>{escape(str(image.initrd))}</initrd>
    <cmdline>{escape(image.cmdline + ' ' + vm.cmdline)}</cmdline>
  </os>
  <cpu mode='custom' match='exact' check='none'><model fallback='forbid'>qemu64</model></cpu>
  <on_poweroff>destroy</on_poweroff>
  <on_reboot>destroy</on_reboot>
  <on_crash>destroy</on_crash>
  <devices>
    <emulator>/usr/bin/qemu-system-x86_64</emulator>{disks}
    <controller type='usb' model='none'/>
    <interface type='bridge'>
      <mac address='{vm.mac}'/>
      <source bridge='{domains.BRIDGE}'/>
      <model type='virtio'/>
    </interface>
    <serial type='pty'>
      <log file={quoteattr(str(console))} append='off'/>
      <target port='0'/>
    </serial>
    <channel type='unix'>
      <target type='virtio' name='org.qemu.guest_agent.0'/>
    </channel>
    <memballoon model='none'/>
  </devices>
</domain>
"""


def _pin(certs: Path, name: str) -> str:
    pem = (certs / f"{name}.pem").read_text()
    return hashlib.sha256(ssl.PEM_cert_to_DER_cert(pem)).hexdigest()


class DbDrillBed:
    """The primary VMs, the agents and the control plane of one drill run."""

    def __init__(self, status: dict[str, Any], workdir: Path, image: Image,
                 vms: list[DbVM], group: str, prefix: str) -> None:
        if "libvirt" not in status or not status["libvirt"].get("hosts"):
            raise RuntimeError("a drill through the product needs the lab in libvirt mode "
                               "(lab_config driver='libvirt')")
        self.status, self.workdir, self.image = status, workdir, image
        self.vms, self.group, self.prefix = vms, group, prefix
        self.certs = workdir / "certs"
        self.pool = str(status["sites"]["primary"].get("pool", "rbd"))
        nodes = {}
        sizes = {}
        for vm in vms:
            for s, dev in vm.targets().items():
                key = f"{vm.name}-{s}"
                vm.images[s] = f"{prefix}-{key}"
                nodes[key] = f"{vm.name}/{dev}"
                sizes[key] = vm.disks.get(s, 0)
        self.imgs = DrillImages(status, prefix, sizes, vms[0].name, nodes, workdir / "sync")
        self.agents: list[dict[str, Any]] = []
        self.dr_host = next(h for h in status["hosts"] if h["site"] == "dr")
        self.consoles = {vm.name: workdir / f"{vm.name}.console" for vm in vms}
        self.sf: Any = None
        self.settings: Any = None
        self.server: subprocess.Popen[bytes] | None = None
        self.env: dict[str, str] = {}
        self.group_id = 0
        self.snapshots: list[str] = []

    # -- the primary: images and domains --
    def make_images(self) -> float:
        """The group disks (empty) and each VM's root (the image's root.raw,
        imported sparse) on the primary cluster; returns the seconds taken."""
        t0 = time.monotonic()
        for vm in self.vms:
            for s in vm.disks:
                self.imgs.rbd("primary", "create", "--size", f"{vm.disks[s]}M",
                              self.imgs.spec("primary", vm.images[s]))
                self.imgs.created.append(vm.images[s])
            root = vm.images[vm.root_serial]
            self.imgs.rbd("primary", "import", "--no-progress", str(self.image.root),
                          self.imgs.spec("primary", root), timeout=600)
            self.imgs.created.append(root)
        return time.monotonic() - t0

    def _status_with_vms(self) -> dict[str, Any]:
        """The lab's status with this run's VMs, and the DR site letting a
        signed definition name the Debian image's kernel and initrd too
        (boot_paths: the control plane's target and the DR agent's
        definition_paths)."""
        vms = [{"name": vm.name, "host": vm.host, "site": "primary", "driver": "libvirt",
                "disks": [{"node": dev} for dev in vm.targets().values()]}
               for vm in self.vms]
        lv = self.status["libvirt"]
        dr = dict(lv["definition_targets"]["dr"])
        dr["boot_paths"] = sorted({*dr.get("boot_paths", []),
                                   *(str(Path(f).parent) for f in (self.image.kernel,
                                                                    self.image.initrd))})
        lv = {**lv, "definition_targets": {**lv["definition_targets"], "dr": dr}}
        return {**self.status, "vms": vms, "libvirt": lv}

    def start_vms(self) -> None:
        lv = self.status["libvirt"]
        state = Path(self.status["state_dir"])
        conf_path = domains.libvirt_dir(state) / "ceph-client.conf"
        # the lab's own (its domains' op timeouts), else one without timeouts
        conf = str(conf_path) if conf_path.exists() else domains.client_conf(state, 0)
        for vm in self.vms:
            host = domains.host_of(self.status, vm.host)
            self.consoles[vm.name].unlink(missing_ok=True)
            xml = domain_xml(vm, self.image, self.status["sites"]["primary"],
                             lv["secrets"]["primary"], conf, self.consoles[vm.name], self.pool)
            p = self.workdir / f"{vm.name}.xml"
            p.write_text(xml)
            host.virsh("define", str(p))
            host.virsh("start", vm.name, timeout=90)

    def stop_vms(self) -> None:
        for vm in self.vms:
            host = domains.host_of(self.status, vm.host)
            host.virsh("destroy", vm.name, check=False)
            host.virsh("undefine", vm.name, check=False)

    def console(self, vm: str) -> str:
        p = self.consoles[vm]
        return p.read_text(errors="replace") if p.exists() else ""

    # -- agents --
    def start_agents(self) -> None:
        from cutpoint.lab.agents import make_certs, start_agent, wait_libvirt_ready

        st = self._status_with_vms()
        make_certs(self.certs, self.status["hosts"])
        for h in self.status["hosts"]:
            self.agents.append(start_agent(st, h, self.certs, standby=False))
        wait_libvirt_ready(st, self.certs, [h for h in self.status["hosts"]
                                            if h["site"] == "primary"], timeout=120)
        drill_network(self.dr_host["netns"])  # the demo's isolated bridge, cpdrill0

    def stop_agents(self) -> None:
        from cutpoint.lab.agents import stop_agent_pid

        for a in self.agents:
            stop_agent_pid(a["pid"])
        self.agents = []
        subprocess.run(["ip", "-n", self.dr_host["netns"], "link", "del", DRILL_BRIDGE],
                       check=False, capture_output=True)

    def tls(self) -> tuple[str, str, str]:
        return (str(self.certs / "ca.pem"), str(self.certs / "coordinator.pem"),
                str(self.certs / "coordinator.key"))

    def agent_ref(self, host: str) -> Any:
        from cutpoint.coordinator.dr.boot import AgentRef

        h = next(x for x in self.status["hosts"] if x["name"] == host)
        return AgentRef(h["address"], 7443, _pin(self.certs, host))

    def guest(self, vm: DbVM, script: str, timeout_s: float = 120) -> Any:
        """/bin/sh -c script in the primary guest through its agent."""
        from cutpoint.coordinator.dr import guest

        return guest.run(self.tls(), self.agent_ref(vm.host), vm.name, "/bin/sh",
                         ["-c", script], timeout_s=timeout_s)

    def wait_guest(self, vm: DbVM, script: str, timeout_s: float, what: str) -> Any:
        """Until `script` exits 0 in the guest (qemu-ga up and the condition met)."""
        from cutpoint.coordinator.dr.guest import GuestError

        t0, last = time.monotonic(), ""
        while time.monotonic() - t0 < timeout_s:
            try:
                r = self.guest(vm, script, 60)
                if r.exitcode == 0:
                    return r
                last = f"exit {r.exitcode}: {r.stdout[-300:]} {r.stderr[-300:]}"
            except GuestError as exc:
                last = str(exc)
            time.sleep(2)
        raise TimeoutError(f"{vm.name}: {what} not after {timeout_s:.0f} s ({last}); "
                           f"console tail: {self.console(vm.name)[-1500:]}")

    # -- the control plane --
    def control_plane(self) -> None:
        from cutpoint.api.config import DefinitionTarget, Settings
        from cutpoint.api.models import (
            Disk,
            Group,
            GroupDisk,
            GroupMember,
            Host,
            Policy,
            Site,
            Vm,
        )
        from cutpoint.api.services import agents, inventory, vm_definitions
        from cutpoint.api.services_local import free_port
        from cutpoint.lab.demo import start_server
        from cutpoint.lab.sites import access
        from sqlalchemy import create_engine, select
        from sqlalchemy.orm import sessionmaker

        lv = self._status_with_vms()["libvirt"]
        targets = dict(lv["definition_targets"]["dr"], drill_network=DRILL_BRIDGE)
        # The product's server (API, worker, beat; `cutpoint server
        # --embedded`) with the agent booter: the drills are asked for with
        # `cutpoint drill run`.  The test bed writes the rows an operator's
        # `site add`, inventory sync and `group create` would, into its database.
        state = self.workdir / "plane"
        shutil.rmtree(state, ignore_errors=True)
        state.mkdir(parents=True)
        self.server, self.env = start_server(
            state, self.certs, port=free_port(), show=False, booter="agent", settings={
                "CUTPOINT_DEFINITION_SIGNING_KEY": str(lv["signing_key"]),
                "CUTPOINT_DEFINITION_TARGETS": json.dumps({"dr": targets}),
                "CP_DRILL_DIR": str(self.workdir / "drills")})
        db = state / "server" / "cutpoint.db"
        self.settings = Settings(
            token_secret="db-drill-secret-0123456789", database_url=f"sqlite:///{db}",
            agent_ca=self.certs / "ca.pem", agent_cert=self.certs / "coordinator.pem",
            agent_key=self.certs / "coordinator.key", booter="agent",
            definition_signing_key=Path(lv["signing_key"]),
            definition_targets={"dr": DefinitionTarget(**targets)})
        eng = create_engine(f"sqlite:///{db}")
        self.sf = sessionmaker(eng, expire_on_commit=False)
        with self.sf() as s:
            sites = {}
            for name in ("primary", "dr"):
                a = access(self.status, name)
                sites[name] = Site(name=name, ceph_conf=a["ceph_conf"],
                                   ceph_client_id=a["client_id"], ceph_keyring=a["keyring"],
                                   ceph_pools=a["pools"])
                s.add(sites[name])
            s.flush()
            hosts = {}
            for h in self.status["hosts"]:
                hosts[h["name"]] = Host(name=h["name"], site_id=sites[h["site"]].id,
                                        address=h["address"], port=7443,
                                        cert_fingerprint=_pin(self.certs, h["name"]))
                s.add(hosts[h["name"]])
            s.commit()
            for vm in self.vms:  # the VMs and disks as their agent reports them
                host = hosts[vm.host]
                inv = agents.call(host, self.settings, ("inventory", {}))[0]
                inventory.apply(s, host, inv)
            g = Group(name=self.group)
            s.add(g)
            s.flush()
            s.add(Policy(group_id=g.id, replication_target_id=sites["dr"].id))
            for vm in self.vms:
                v = s.scalar(select(Vm).where(Vm.name == vm.name,
                                              Vm.host_id == hosts[vm.host].id))
                if v is None:
                    raise RuntimeError(f"the agent of {vm.host} does not list {vm.name}: {inv}")
                m = GroupMember(group_id=g.id, vm_id=v.id)
                s.add(m)
                s.flush()
                for d in s.scalars(select(Disk).where(Disk.vm_id == v.id)):
                    s.add(GroupDisk(disk_id=d.id, group_id=g.id, member_id=m.id))
            s.commit()
            self.group_id = int(g.id)
            for vm in self.vms:  # the captured definition (what the watch stores)
                out = vm_definitions.refresh_host(s, self.settings, hosts[vm.host],
                                                  changed=True)
                if out["failed"]:
                    raise RuntimeError(f"capturing {vm.name}'s definition failed: {out}")

    def definition(self, vm: str) -> str:
        from cutpoint.api.models import Vm, VmDefinition
        from sqlalchemy import select

        with self.sf() as s:
            row = s.scalar(select(VmDefinition).join(Vm, Vm.id == VmDefinition.vm_id)
                           .where(Vm.name == vm).order_by(VmDefinition.version.desc()))
            return str(row.definition) if row else ""

    # -- snapshots --
    def group_file(self) -> Path:
        from cutpoint.lab.groupfile import write_group_file

        p = self.workdir / "group.yaml"
        write_group_file(self._status_with_vms(), p, group=self.group, certs_dir=self.certs,
                         lease_ms=3000, budget_ms=2000)
        return p

    def snapshot_coordinated(self) -> dict[str, Any]:
        """`cutpoint snapshot --group-file`: the product's two-phase commit."""
        from cutpoint.checkers.pgcoord import REPO

        argv = [str(REPO / ".venv" / "bin" / "cutpoint"), "snapshot", "--group-file",
                str(self.group_file()), "--db", f"sqlite:///{self.workdir / 'txlog.db'}",
                "--json"]
        p = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
        lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
        if p.returncode != 0 or not lines:
            raise RuntimeError(f"{' '.join(argv)} rc={p.returncode}\n{p.stdout}\n{p.stderr}")
        res: dict[str, Any] = json.loads(lines[-1])
        if res.get("state") != "committed":
            raise RuntimeError(f"group snapshot not committed: {res}")
        names = set(res["snapshots"].values())
        if len(names) != 1:
            raise RuntimeError(f"member snapshots of several names: {res['snapshots']}")
        res["name"] = names.pop()
        return res

    def snapshot_uncoordinated(self, name: str, first: list[str], delay: float) -> float:
        """`rbd snap create` of the members in `first` (``<vm>-<serial>``),
        then `delay` s later of the others: no pause, no coordinator.
        Returns the spread in ms."""
        keys = [f"{vm.name}-{s}" for vm in self.vms for s in vm.targets()]
        t0 = time.monotonic()
        for k in keys:
            if k in first:
                self.imgs.snap_create(k, name)
        time.sleep(delay)
        for k in keys:
            if k not in first:
                self.imgs.snap_create(k, name)
        return (time.monotonic() - t0) * 1e3

    def record(self, name: str, txn: str) -> None:
        """The group snapshot `name` as the control plane records a committed
        one: its row and a member snapshot per disk."""
        from cutpoint.api.models import (
            Disk,
            GroupSnapshot,
            MemberSnapshot,
            SnapState,
            Vm,
            utcnow,
        )
        from sqlalchemy import select

        with self.sf() as s:
            snap = GroupSnapshot(group_id=self.group_id, txn=txn, state=SnapState.committed,
                                 cut_at=utcnow())
            s.add(snap)
            s.flush()
            for vm in self.vms:
                v = s.scalar(select(Vm).where(Vm.name == vm.name))
                for d in s.scalars(select(Disk).where(Disk.vm_id == v.id)):
                    s.add(MemberSnapshot(group_snapshot_id=snap.id, disk_id=d.id,
                                         host=vm.host, vm=vm.name, disk=f"{vm.name}/{d.node}",
                                         name=name, state="present"))
            s.commit()
        self.snapshots.append(txn)

    def replicate(self, name: str, txn: str) -> dict[str, Any]:
        """The product's replication of every member, fully verified; the
        snapshot is then a DR recovery point (invariant 5, checked)."""
        from cutpoint.api.models import GroupSnapshot, utcnow
        from sqlalchemy import select

        rep = self.imgs.replicate(name, verify_full=True)
        with self.sf() as s:
            snap = s.scalar(select(GroupSnapshot).where(GroupSnapshot.txn == txn))
            snap.dr_verified_at = utcnow()
            s.commit()
        return rep

    # -- the drill --
    def drill(self, txn: str, plan: dict[str, Any], checks: list[Any] | None = None) \
            -> tuple[dict[str, Any], dict[str, Any]]:
        """`cutpoint drill run GROUP --point TXN --plan FILE --json` (the
        checks in the plan's drill_checks), as an operator runs it; returns
        the job's report and the evidence `GET /v1/drills/{id}/report` serves."""
        import httpx
        from cutpoint.checkers.pgcoord import REPO

        plan_file = self.workdir / f"plan-{txn}.json"
        plan_file.write_text(json.dumps(dict(plan, drill_checks=checks or [])))
        argv = [str(REPO / ".venv" / "bin" / "cutpoint"), "drill", "run", self.group,
                "--point", txn, "--plan", str(plan_file), "--json", "--timeout", "1800"]
        p = subprocess.run(argv, env=self.env, capture_output=True, text=True,
                           timeout=2000, check=False)
        try:
            job: dict[str, Any] = json.loads(p.stdout)
        except json.JSONDecodeError:
            raise RuntimeError(f"{' '.join(argv)} rc={p.returncode}\n{p.stdout}\n"
                               f"{p.stderr}") from None
        report = job.get("result") or {}
        if not report:
            raise RuntimeError(f"drill job {job.get('id')} {job.get('state')} with no "
                               f"report: {job.get('error_code')}: {job.get('error')}")
        r = httpx.get(f"{self.env['CUTPOINT_URL']}/v1/drills/{job['id']}/report",
                      headers={"Authorization": f"Bearer {self.env['CUTPOINT_TOKEN']}"},
                      timeout=60)
        r.raise_for_status()
        return report, r.json()

    def leftovers(self, tag: str) -> dict[str, list[str]]:
        """What of drill `tag` is still at DR: domains on dr-h1, clones, taps."""
        host = domains.host_of(self.status, self.dr_host["name"])
        doms = [n for n in (host.virsh("list", "--all", "--name") or "").split()
                if n.startswith(tag)]
        clones = [n for n in self.imgs.rbd("dr", "ls", self.imgs.pool("dr")).stdout.split()
                  if n.startswith(tag)]
        out = subprocess.run(["ip", "-n", self.dr_host["netns"], "-o", "link", "show",
                              "master", DRILL_BRIDGE], check=False, capture_output=True,
                             text=True).stdout
        taps = [ln.split(":")[1].strip() for ln in out.splitlines() if ":" in ln]
        return {"domains": doms, "clones": clones, "taps": taps}

    def cleanup(self) -> dict[str, Any]:
        """The server, the primary domains, the agents, every image of the run."""
        if self.server is not None:
            self.server.terminate()
            try:
                self.server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.server.pid, signal.SIGKILL)
                self.server.wait(timeout=30)
            self.server = None
        self.stop_vms()
        self.stop_agents()
        return self.imgs.cleanup()


def breakdown(report: dict[str, Any]) -> dict[str, float | None]:
    """Where a drill's time went, from its timeline (seconds from its start)."""
    tl = report.get("timeline") or []

    def t(step: str, status: str, last: bool = False) -> float | None:
        ts = [float(e["t_s"]) for e in tl if e["step"] == step and e["status"] == status]
        return (max(ts) if last else min(ts)) if ts else None

    clone = t("clone", "ok", True)
    define = t("define", "ok", True)
    start = t("vm_start", "ok", True)
    ready = t("boot", "ok", True)
    hook = t("boot_group", "ok", True)      # after the plan's post hooks
    checks = max([x for x in (t("check", "ok", True), t("check", "failed", True))
                  if x is not None], default=None)
    end = t("cleanup", "ok", True) or t("cleanup", "failed", True)

    def d(a: float | None, b: float | None) -> float | None:
        return round(b - a, 2) if a is not None and b is not None else None

    return {"clone_s": clone, "define_s": d(clone, define), "vm_start_s": d(define, start),
            "boot_to_guest_ping_s": d(start, ready), "ready_to_database_s": d(ready, hook),
            "checks_s": d(hook or ready, checks), "cleanup_s": d(checks, end),
            "total_s": end}
