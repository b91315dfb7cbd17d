"""Group snapshots of the PostgreSQL drill VM through the real coordinator.

Starts one ``cutpointd`` (the agent, built in ``build/agent``) on loopback
with a throw-away CA, configured with the drill VM's second QMP monitor and
its three group disks (qcow2, method ``qmp``: one QMP transaction, atomic
across the VM's disks), writes a group file, and takes each group snapshot
with ``cutpoint snapshot --group-file G --json`` (two-phase commit, GCVM
§4.4.4).  The snapshot names are the coordinator's ``cp.<group>.<txn>``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
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


def start(workdir: Path, vm_name: str, qmp_sock: Path,
          disks: dict[str, Path], group: str = "pg") -> AgentAndGroup:
    """``disks`` maps QEMU node name (disk1..) -> qcow2 file."""
    return start_many(workdir, {vm_name: (qmp_sock, disks)}, group)


def start_many(workdir: Path, vms: dict[str, tuple[Path, dict[str, Path]]],
               group: str = "pg") -> AgentAndGroup:
    """One agent driving several VMs (``vms``: name -> (QMP socket, node ->
    qcow2 file)); the group file names all of them, so one group snapshot
    pauses every VM before any member snapshot (the Cassandra drill)."""
    vm_name = next(iter(vms))
    if not CUTPOINTD.exists():
        raise CoordinatorRunError(f"{CUTPOINTD} is not built (ninja -C build)")
    workdir.mkdir(parents=True, exist_ok=True)
    certs = workdir / "certs"
    for args in ([str(certs)], [str(certs), "issue", "pg-agent", "127.0.0.1"],
                 [str(certs), "issue", "coordinator"]):
        subprocess.run([str(MAKE_CA), *args], check=True, capture_output=True)
    port = _free_port()
    conf = workdir / "cutpointd.conf"
    lines = [
        "[agent]", "host = pg-host", f"listen = 127.0.0.1:{port}",
        f"journal = {workdir / 'agent-journal'}", "qmp_timeout_ms = 5000",
        "", "[tls]", f"ca = {certs / 'ca.pem'}",
        f"cert = {certs / 'pg-agent.pem'}", f"key = {certs / 'pg-agent.key'}",
    ]
    for name, (qmp_sock, disks) in vms.items():
        lines += ["", f"[vm {name}]", "driver = qmp", f"qmp = {qmp_sock}",
                  "method = qmp"]
        lines += [f"disk.{node} = qcow2:{f}" for node, f in disks.items()]
    conf.write_text("\n".join(lines) + "\n")
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
    gf.write_text(yaml.safe_dump({
        "group": group, "lease_ms": 5000, "budget_ms": 5000,
        "tls": {"ca": str(certs / "ca.pem"),
                "cert": str(certs / "coordinator.pem"),
                "key": str(certs / "coordinator.key")},
        "agents": [{"name": "pg-host", "address": "127.0.0.1", "port": port,
                    "vms": [{"name": n, "disks": list(d)}
                            for n, (_q, d) in vms.items()]}],
    }))
    return AgentAndGroup(workdir, vm_name, gf,
                         f"sqlite:///{workdir / 'coordinator.db'}", proc, port)
