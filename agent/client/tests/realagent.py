"""Start the real `cutpointd` (build/agent/cutpointd) on loopback with no VMs,
for client tests that need the real peer but not the lab."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def binary() -> Path:
    return Path(os.environ.get("CUTPOINTD", ROOT / "build" / "agent" / "cutpointd"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class RealAgent:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start(d: Path, pki: dict[str, dict[str, str]]) -> RealAgent:
    port = free_port()
    cfg = d / "agent.ini"
    cfg.write_text(f"""[agent]
host = realagent
listen = 127.0.0.1:{port}
journal = {d / 'journal'}
[tls]
ca = {pki['ca']['cert']}
cert = {pki['agent']['cert']}
key = {pki['agent']['key']}
""")
    log = d / "agent.log"
    with open(log, "wb") as lf:
        proc = subprocess.Popen([str(binary()), "-c", str(cfg)], stdout=lf, stderr=lf,
                                stdin=subprocess.DEVNULL)
    t0 = time.monotonic()
    while time.monotonic() - t0 < 10:
        if proc.poll() is not None:
            raise RuntimeError(f"cutpointd exited: {log.read_text()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return RealAgent(proc, port, log)
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("cutpointd did not listen within 10 s")
