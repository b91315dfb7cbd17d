"""Group snapshots of the PostgreSQL drill VM through the real coordinator.

Starts one ``cutpointd`` (the agent, built in ``build/agent``) on loopback
with a throw-away CA, configured with the drill VM's second QMP monitor and
its group disks, writes a group file, and takes each group snapshot with
``cutpoint snapshot --group-file G --json`` (two-phase commit, GCVM §4.4.4).
The snapshot names are the coordinator's ``cp.<group>.<txn>``.

The disks are either

- RBD images (``"rbd:pool/image"``, with ``ceph`` = the lab site): a
  ``[ceph]`` section and ``method = rbd``, so the agent pauses the VM, takes
  one librbd snapshot per disk and resumes it (the PostgreSQL drill), or
- qcow2 files (a ``Path``): ``method = qmp``, one QMP transaction of internal
  snapshots, atomic across the VM's disks (the Cassandra drill).

With ``qga`` (the VM's guest-agent socket) and ``quiesce="fs-freeze"`` the
group file asks for a guest fs-freeze around the pause (agent-protocol
§4.3, with the agent's fallback to crash-consistent).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml  # type: ignore[import-untyped]

REPO = Path(__file__).resolve().parents[2]
CUTPOINTD = REPO / "build" / "agent" / "cutpointd"
MAKE_CA = REPO / "scripts" / "make-lab-ca.sh"
GROUP_DISKS = ("cpwal", "cpdata", "cpjournal")


class CoordinatorRunError(RuntimeError):
    """The agent or the snapshot command failed; keeps argv and output."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class AgentAndGroup:
    workdir: Path
    vm_name: str
    group_file: Path
    db_url: str
    proc: subprocess.Popen[bytes]
    port: int

    def snapshot(self) -> dict[str, Any]:
        """One group snapshot; returns the coordinator's JSON result."""
        argv = [str(REPO / ".venv" / "bin" / "cutpoint"), "snapshot",
                "--group-file", str(self.group_file), "--db", self.db_url,
                "--json"]
        p = subprocess.run(argv, capture_output=True, text=True, timeout=120,
                           check=False)
        lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
        if p.returncode != 0 or not lines:
            raise CoordinatorRunError(
                f"{' '.join(argv)} rc={p.returncode}\nstdout:{p.stdout}\n"
                f"stderr:{p.stderr}\nagent log tail:\n{self.log_tail()}")
        res: dict[str, Any] = json.loads(lines[-1])
        return res

    def log_tail(self) -> str:
        try:
            return (self.workdir / "cutpointd.log").read_text()[-2000:]
        except FileNotFoundError:
            return ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)


Disk = Path | str      # qcow2 file, or "rbd:pool/image"


def _disk_line(node: str, d: Disk) -> str:
    if isinstance(d, str):
        if not d.startswith("rbd:") or "/" not in d:
            raise ValueError(f"disk {node}: {d!r} is not rbd:pool/image")
        return f"disk.{node} = {d}"
    return f"disk.{node} = qcow2:{d}"


def agent_config(workdir: Path, certs: Path, port: int,
                 vms: dict[str, tuple[Path, dict[str, Disk]]],
                 ceph: dict[str, Any] | None = None,
                 qga: dict[str, Path] | None = None, *,
                 host: str = "pg-host", address: str = "127.0.0.1",
                 cert: str = "pg-agent") -> str:
    """The cutpointd INI: one ``[vm]`` per VM; ``method = rbd`` (with the
    ``[ceph]`` section) when all its disks are RBD, else ``qmp``."""
    lines = [
        "[agent]", f"host = {host}", f"listen = {address}:{port}",
        f"journal = {workdir / 'agent-journal'}", "qmp_timeout_ms = 5000",
        "", "[tls]", f"ca = {certs / 'ca.pem'}",
        f"cert = {certs / (cert + '.pem')}", f"key = {certs / (cert + '.key')}",
    ]
    if ceph is not None:
        lines += ["", "[ceph]", f"conf = {ceph['ceph_conf']}",
                  f"id = {ceph.get('client_id', 'admin')}"]
        if ceph.get("keyring"):
            lines.append(f"keyring = {ceph['keyring']}")
    for name, (qmp_sock, disks) in vms.items():
        rbd = all(isinstance(d, str) for d in disks.values())
        if rbd and ceph is None:
            raise ValueError(f"VM {name}: RBD disks need the ceph site")
        lines += ["", f"[vm {name}]", "driver = qmp", f"qmp = {qmp_sock}",
                  f"method = {'rbd' if rbd else 'qmp'}"]
        if qga and qga.get(name):
            lines.append(f"qga = {qga[name]}")
        lines += [_disk_line(node, d) for node, d in disks.items()]
    return "\n".join(lines) + "\n"


def make_certs(certs: Path) -> None:
    """A throw-away CA, the agent's certificate (127.0.0.1) and the
    coordinator's."""
    for args in ([str(certs)], [str(certs), "issue", "pg-agent", "agent", "127.0.0.1"],
                 [str(certs), "issue", "coordinator", "coordinator"]):
        subprocess.run([str(MAKE_CA), *args], check=True, capture_output=True)


def start(workdir: Path, vm_name: str, qmp_sock: Path,
          disks: dict[str, Disk], group: str = "pg", *,
          ceph: dict[str, Any] | None = None, qga: Path | None = None,
          quiesce: str = "crash") -> AgentAndGroup:
    """``disks`` maps QEMU node name (disk1..) -> qcow2 file or
    ``rbd:pool/image``; RBD disks need ``ceph`` (a lab site)."""
    return start_many(workdir, {vm_name: (qmp_sock, disks)}, group,
                      ceph=ceph, qga={vm_name: qga} if qga else None,
                      quiesce=quiesce)


def start_many(workdir: Path, vms: dict[str, tuple[Path, dict[str, Disk]]],
               group: str = "pg", *, ceph: dict[str, Any] | None = None,
               qga: dict[str, Path] | None = None,
               quiesce: str = "crash") -> AgentAndGroup:
    """One agent driving several VMs (``vms``: name -> (QMP socket, node ->
    disk)); the group file names all of them, so one group snapshot pauses
    every VM before any member snapshot (the Cassandra drill)."""
    vm_name = next(iter(vms))
    if quiesce not in ("crash", "fs-freeze"):
        raise ValueError(f"quiesce must be crash or fs-freeze, not {quiesce!r}")
    if quiesce == "fs-freeze" and not qga:
        raise ValueError("quiesce fs-freeze needs the VMs' guest-agent sockets")
    if not CUTPOINTD.exists():
        raise CoordinatorRunError(f"{CUTPOINTD} is not built (ninja -C build)")
    certs = workdir / "certs"
    port = _free_port()
    text = agent_config(workdir, certs, port, vms, ceph, qga)  # bad input: here
    workdir.mkdir(parents=True, exist_ok=True)
    make_certs(certs)
    conf = workdir / "cutpointd.conf"
    conf.write_text(text)
    chk = subprocess.run([str(CUTPOINTD), "-n", "-c", str(conf)],
                         capture_output=True, text=True, check=False)
    if chk.returncode != 0:
        raise CoordinatorRunError(f"cutpointd -n rejected {conf}: "
                                  f"{chk.stdout}{chk.stderr}")
    with open(workdir / "cutpointd.log", "wb") as log:
        proc = subprocess.Popen([str(CUTPOINTD), "-c", str(conf)],
                                stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise CoordinatorRunError(
                    "cutpointd did not listen: "
                    + (workdir / "cutpointd.log").read_text()) from None
            time.sleep(0.1)
    gf = workdir / "group.yaml"
    doc: dict[str, Any] = {
        "group": group, "lease_ms": 5000, "budget_ms": 5000,
        "tls": {"ca": str(certs / "ca.pem"),
                "cert": str(certs / "coordinator.pem"),
                "key": str(certs / "coordinator.key")},
        "agents": [{"name": "pg-host", "address": "127.0.0.1", "port": port,
                    "vms": [{"name": n, "disks": list(d)}
                            for n, (_q, d) in vms.items()]}],
    }
    if quiesce != "crash":
        doc["quiesce"] = quiesce
    gf.write_text(yaml.safe_dump(doc))
    return AgentAndGroup(workdir, vm_name, gf,
                         f"sqlite:///{workdir / 'coordinator.db'}", proc, port)


HostVMs = dict[str, tuple[Path, dict[str, Disk]]]


@dataclass
class HostAgentsAndGroup(AgentAndGroup):
    """Several agents, one per lab host namespace, and one group file
    naming all of them (``start_hosts``)."""
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    hosts: list[str] = field(default_factory=list)

    def log_tail(self) -> str:
        out = []
        for h in self.hosts:
            try:
                text = (self.workdir / h / "cutpointd.log").read_text()
            except FileNotFoundError:
                continue
            out.append(f"[{h}] {text[-1500:]}")
        return "\n".join(out)

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                os.kill(p.pid, signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(p.pid, signal.SIGKILL)
                p.wait(timeout=10)


def start_hosts(workdir: Path, hosts: dict[str, tuple[str, str, HostVMs]],
                group: str = "pg", *, ceph: dict[str, Any] | None = None,
                env: dict[str, str] | None = None) -> HostAgentsAndGroup:
    """One ``cutpointd`` per lab host: ``hosts`` maps a host name to (its
    network namespace, its address there, its VMs as in ``start_many``).
    Each agent runs inside its namespace (``ip netns exec``) listening on
    the host address, with a certificate for that address; the group file
    lists every agent, so one group snapshot spans the hosts (prepare on
    all of them before any commit)."""
    if not hosts:
        raise ValueError("start_hosts needs at least one host")
    if not CUTPOINTD.exists():
        raise CoordinatorRunError(f"{CUTPOINTD} is not built (ninja -C build)")
    certs = workdir / "certs"
    port = _free_port()
    texts = {h: agent_config(workdir / h, certs, port, vms, ceph,
                             host=h, address=addr, cert=f"agent-{h}")
             for h, (_ns, addr, vms) in hosts.items()}  # bad input: here
    workdir.mkdir(parents=True, exist_ok=True)
    subprocess.run([str(MAKE_CA), str(certs)], check=True, capture_output=True)
    subprocess.run([str(MAKE_CA), str(certs), "issue", "coordinator", "coordinator"],
                   check=True, capture_output=True)
    res = HostAgentsAndGroup(workdir, next(iter(hosts)),
                             workdir / "group.yaml",
                             f"sqlite:///{workdir / 'coordinator.db'}",
                             None, port, [], list(hosts))  # type: ignore[arg-type]
    try:
        for h, (ns, addr, _vms) in hosts.items():
            subprocess.run([str(MAKE_CA), str(certs), "issue", f"agent-{h}",
                            "agent", addr], check=True, capture_output=True)
            (workdir / h).mkdir(parents=True, exist_ok=True)
            conf = workdir / h / "cutpointd.conf"
            conf.write_text(texts[h])
            chk = subprocess.run([str(CUTPOINTD), "-n", "-c", str(conf)],
                                 capture_output=True, text=True, check=False)
            if chk.returncode != 0:
                raise CoordinatorRunError(f"cutpointd -n rejected {conf}: "
                                          f"{chk.stdout}{chk.stderr}")
            with open(workdir / h / "cutpointd.log", "wb") as log:
                # `ip netns exec` execs in place: the pid is cutpointd's.
                res.procs.append(subprocess.Popen(
                    ["ip", "netns", "exec", ns, str(CUTPOINTD), "-c",
                     str(conf)], stdout=log, stderr=subprocess.STDOUT,
                    env={**os.environ, **(env or {})}))
        for (h, (ns, addr, _vms)), proc in zip(hosts.items(), res.procs):
            deadline = time.monotonic() + 10
            while True:
                try:
                    socket.create_connection((addr, port), timeout=1).close()
                    break
                except OSError:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        raise CoordinatorRunError(
                            f"cutpointd of {h} (netns {ns}) did not listen on "
                            f"{addr}:{port}: "
                            + (workdir / h / "cutpointd.log").read_text()
                        ) from None
                    time.sleep(0.1)
    except BaseException:
        res.stop()
        raise
    doc: dict[str, Any] = {
        "group": group, "lease_ms": 5000, "budget_ms": 5000,
        "tls": {"ca": str(certs / "ca.pem"),
                "cert": str(certs / "coordinator.pem"),
                "key": str(certs / "coordinator.key")},
        "agents": [{"name": h, "address": addr, "port": port,
                    "vms": [{"name": n, "disks": list(d)}
                            for n, (_q, d) in vms.items()]}
                   for h, (_ns, addr, vms) in hosts.items()],
    }
    res.group_file.write_text(yaml.safe_dump(doc))
    return res
