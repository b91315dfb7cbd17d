"""Who may drive an agent, and what a peer may hold: a real cutpointd on
127.0.0.1 with real TLS 1.3 and certificates from the deployment's issue
script (no VMs, no lab lock).

- roles (agent-protocol §1.5): each command allows only the roles of its
  row of agent/commands.def; an agent's certificate, or one without a role,
  runs nothing;
- revocation (§1.6): a serial added to `[tls] revoked` is refused after
  SIGHUP, at the next request of an open connection and at the handshake;
- transport limits (§1.7): the handshake timeout, the connection cap, and a
  dead peer seen within 10 s by TCP keepalive.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import ssl
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cutpoint.lab.agents import CA_SCRIPT, cutpointd_path, stop_agent_pid

pytestmark = pytest.mark.lab


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _no_role_cert(certs: Path, name: str) -> None:
    """A certificate the CA signed as before roles existed: no role URI."""
    (certs / f"{name}.ext").write_text(
        "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n"
        f"extendedKeyUsage=serverAuth,clientAuth\nsubjectAltName=DNS:{name}\n")
    subprocess.run(["openssl", "req", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-keyout",
                    str(certs / f"{name}.key"), "-out", str(certs / f"{name}.csr"),
                    "-subj", f"/CN={name}"], check=True, capture_output=True)
    subprocess.run(["openssl", "x509", "-req", "-in", str(certs / f"{name}.csr"),
                    "-CA", str(certs / "ca.pem"), "-CAkey", str(certs / "ca.key"),
                    "-CAcreateserial", "-out", str(certs / f"{name}.pem"), "-days", "2",
                    "-extfile", str(certs / f"{name}.ext")], check=True, capture_output=True)


def _serial(pem: Path) -> str:
    out = subprocess.run(["openssl", "x509", "-in", str(pem), "-noout", "-serial"],
                         check=True, capture_output=True, text=True).stdout
    return out.strip().split("=", 1)[1]


@pytest.fixture(scope="module")
def certs() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="cp-agent-authz-"))
    try:
        c = d / "certs"
        subprocess.run([str(CA_SCRIPT), str(c)], check=True)
        for name, role, *ips in (("hv1", "agent", "127.0.0.1"), ("hv2", "agent", "127.0.0.1"),
                                 ("coordinator", "coordinator"), ("ops", "operator"),
                                 ("ops2", "operator")):
            subprocess.run([str(CA_SCRIPT), str(c), "issue", name, role, *ips], check=True)
        _no_role_cert(c, "legacy")
        yield c
    finally:
        shutil.rmtree(d, ignore_errors=True)


class Agent:
    def __init__(self, certs: Path, extra: str = "") -> None:
        self.certs = certs
        self.dir = Path(tempfile.mkdtemp(prefix="cp-agent-authz-run-"))
        self.port = _free_port()
        self.revoked = self.dir / "revoked"
        self.revoked.write_text("# serials revoked\n")
        self.cfg = self.dir / "agent.ini"
        self.cfg.write_text(
            f"[agent]\nhost = hv1\nlisten = 127.0.0.1:{self.port}\n"
            f"journal = {self.dir / 'journal'}\n{extra}\n"
            f"[tls]\nca = {certs / 'ca.pem'}\ncert = {certs / 'hv1.pem'}\n"
            f"key = {certs / 'hv1.key'}\nrevoked = {self.revoked}\n")
        self.log = self.dir / "agent.log"
        with open(self.log, "wb") as lf:
            self.proc = subprocess.Popen([str(cutpointd_path()), "-c", str(self.cfg)],
                                         stdout=lf, stderr=lf)
        t0 = time.monotonic()
        while "event=listening" not in self.log.read_text():
            assert self.proc.poll() is None, self.log.read_text()
            assert time.monotonic() - t0 < 20
            time.sleep(0.05)

    def stop(self) -> None:
        """Stops the agent; fails on a sanitizer report in its log
        (CUTPOINTD=build-asan/agent/cutpointd)."""
        stop_agent_pid(self.proc.pid)
        self.proc.wait(timeout=10)
        text = self.log.read_text(errors="replace")
        shutil.rmtree(self.dir, ignore_errors=True)
        assert "Sanitizer" not in text, text[-3000:]

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_log(self, what: str, timeout: float = 10) -> float:
        t0 = time.monotonic()
        while what not in self.text():
            assert time.monotonic() - t0 < timeout, f"no {what!r} in\n{self.text()}"
            time.sleep(0.02)
        return time.monotonic() - t0

    def connect(self, who: str) -> ssl.SSLSocket:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_3
        ctx.load_verify_locations(self.certs / "ca.pem")
        ctx.load_cert_chain(self.certs / f"{who}.pem", self.certs / f"{who}.key")
        return ctx.wrap_socket(socket.create_connection(("127.0.0.1", self.port), timeout=10),
                               server_hostname="127.0.0.1")


@pytest.fixture
def agent(certs: Path) -> Iterator[Agent]:
    a = Agent(certs)
    try:
        yield a
    finally:
        a.stop()


def _call(s: ssl.SSLSocket, cmd: str, args: dict[str, Any] | None = None,
          rid: int = 1) -> dict[str, Any] | None:
    """One request; the reply, or None when the agent closed the connection."""
    body = json.dumps({"id": rid, "cmd": cmd, "args": args or {}}).encode()
    try:
        s.sendall(struct.pack(">I", len(body)) + body)
        head = b""
        while len(head) < 4:
            x = s.recv(4 - len(head))
            if not x:
                return None
            head += x
        n = struct.unpack(">I", head)[0]
        data = b""
        while len(data) < n:
            x = s.recv(n - len(data))
            if not x:
                return None
            data += x
    except (ssl.SSLError, ConnectionError):
        return None
    return dict(json.loads(data))


def _code(reply: dict[str, Any] | None) -> str | None:
    assert reply is not None, "connection closed"
    return None if reply["ok"] else str(reply["error"]["code"])


# The requests every role table test sends: each reaches its handler for a
# coordinator (an answer of the handler's own: UNKNOWN_VM, UNKNOWN_TXN...).
REQUESTS: list[tuple[str, dict[str, Any], str | None]] = [
    ("hello", {}, None),
    ("inventory", {}, None),
    ("stats", {}, None),
    ("snapshot.list", {"disk": "nosuch/d0"}, "UNKNOWN_DISK"),
    ("prepare", {"txn": "t1", "vms": ["nosuch"], "lease_ms": 1000}, "UNKNOWN_VM"),
    ("commit", {"txn": "t1", "snapshots": {}, "budget_ms": 100}, "UNKNOWN_TXN"),
    ("abort", {"txn": "t1"}, None),
    ("resume", {"vms": ["nosuch"]}, "UNKNOWN_VM"),
    ("snapshot.delete", {"disk": "nosuch/d0", "name": "s"}, "UNKNOWN_DISK"),
    ("vm.start", {"spec": {"vm": "nosuch"}}, "UNKNOWN_VM"),
    ("vm.stop", {"vm": "nosuch"}, "UNKNOWN_VM"),
    ("vm.definition", {"vm": "nosuch"}, "UNKNOWN_VM"),
]
OPERATOR_MAY = {"hello", "inventory", "stats", "snapshot.list"}


def test_roles_per_command(agent: Agent) -> None:
    """The coordinator runs everything; the operator only reads; another
    host's agent certificate, this host's own, and a certificate without a
    role run nothing: FORBIDDEN, and a log line naming role and command."""
    for who in ("coordinator", "ops", "hv2", "hv1", "legacy"):
        s = agent.connect(who)
        for i, (cmd, args, handler_code) in enumerate(REQUESTS):
            reply = _call(s, cmd, args, rid=i)
            if who == "coordinator" or (who == "ops" and cmd in OPERATOR_MAY):
                assert _code(reply) == handler_code, (who, cmd, reply)
            else:
                assert _code(reply) == "FORBIDDEN", (who, cmd, reply)
                assert reply is not None and reply["id"] == i
        s.close()
    log = agent.text()
    assert "event=forbidden" in log and "cn=hv2 role=agent cmd=prepare why=role" in log
    assert "cn=legacy role=none cmd=hello why=role" in log
    assert "cn=ops role=operator cmd=vm.start why=role" in log
    refused = [ln for ln in log.splitlines() if "event=forbidden" in ln]
    assert not [ln for ln in refused if "cn=coordinator" in ln]
    assert len([ln for ln in refused if "cn=ops " in ln]) == len(REQUESTS) - len(OPERATOR_MAY)


def test_forbidden_message_names_the_roles(agent: Agent) -> None:
    s = agent.connect("hv2")
    reply = _call(s, "prepare", {"txn": "t", "vms": ["v"], "lease_ms": 100})
    assert reply is not None and reply["error"] == {
        "code": "FORBIDDEN",
        "message": "prepare needs the role coordinator; this certificate's role is agent"}
    # The connection stays usable (a refusal is a reply, not a close).
    assert _code(_call(s, "stats")) == "FORBIDDEN"


def test_revoked_after_sighup(agent: Agent, certs: Path) -> None:
    """ops2's serial is listed: its calls go on until SIGHUP, then its open
    connection is refused at the next request and a new one at the
    handshake; the other certificates are unaffected."""
    before = agent.connect("ops2")
    assert _code(_call(before, "hello")) is None
    serial = _serial(certs / "ops2.pem")
    # The operator revokes it in the CA directory; Ansible copies the list
    # to the host (here: a copy) and reloads the agent (SIGHUP).
    cli = Path(sys.executable).parent / "cutpoint"
    out = subprocess.run([str(cli), "host", "revoke", "ops2",
                          "--ca-dir", str(certs)], check=True, capture_output=True, text=True)
    assert f"serial {serial.lstrip('0')} revoked" in out.stdout, out.stdout
    shutil.copy(certs / "revoked", agent.revoked)
    assert _code(_call(before, "hello")) is None          # not reloaded yet
    fresh = agent.connect("ops2")
    assert _code(_call(fresh, "hello")) is None
    fresh.close()

    os.kill(agent.proc.pid, signal.SIGHUP)
    agent.wait_log("event=revoked_reload result=ok revoked=1")
    reply = _call(before, "hello", rid=7)
    assert reply is not None and reply["error"]["code"] == "FORBIDDEN", reply
    assert serial.lstrip("0") in reply["error"]["message"]
    late = agent.connect("ops2")    # TLS 1.3: the client's side completes...
    assert _call(late, "hello") is None                   # ...then it is closed
    assert f"why=revoked serial={serial.lstrip('0')}" in agent.text()
    ok = agent.connect("ops")
    assert _code(_call(ok, "hello")) is None
    coord = agent.connect("coordinator")
    assert _code(_call(coord, "inventory")) is None

    # A list that does not load leaves the previous one in force.
    agent.revoked.write_text("not-a-serial\n")
    os.kill(agent.proc.pid, signal.SIGHUP)
    agent.wait_log("event=revoked_reload result=failed kept=1")
    assert _code(_call(before, "hello")) == "FORBIDDEN"


def _closed_by_peer(s: socket.socket, within: float) -> float:
    """Seconds until the agent closes s (EOF or reset); fails after within."""
    t0 = time.monotonic()
    s.settimeout(within)
    try:
        assert s.recv(1) == b""
    except ConnectionResetError:
        pass
    return time.monotonic() - t0


def test_handshake_timeout_closes_slow_and_silent_peers(certs: Path) -> None:
    """A connection that never finishes the handshake (silent, or a
    slowloris trickling a ClientHello) is closed after handshake_timeout_ms."""
    a = Agent(certs, "handshake_timeout_ms = 1000")
    try:
        silent = socket.create_connection(("127.0.0.1", a.port))
        trickle = socket.create_connection(("127.0.0.1", a.port))
        t0 = time.monotonic()
        trickle.settimeout(0.2)
        closed = False
        for byte in b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(40):
            try:
                trickle.sendall(bytes([byte]))
                if trickle.recv(1) == b"":
                    closed = True
                    break
            except TimeoutError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
        assert closed, "the trickling peer was never closed"
        assert 0.9 < time.monotonic() - t0 < 3
        assert _closed_by_peer(silent, 3) < 3
        log = a.text()
        assert log.count("why=handshake_timeout") == 2, log
        # A real client is still served.
        assert _code(_call(a.connect("coordinator"), "hello")) is None
    finally:
        a.stop()


def test_connection_cap(certs: Path) -> None:
    """max_connections = 3: three holders (one authenticated, two in the
    handshake) fill it; a fourth is closed at once and logged; once a slot
    frees, a client is served again."""
    a = Agent(certs, "max_connections = 3\nhandshake_timeout_ms = 30000")
    try:
        held = [a.connect("coordinator")]
        assert _code(_call(held[0], "hello")) is None
        held += [socket.create_connection(("127.0.0.1", a.port)) for _ in range(2)]
        a.wait_log("event=listening")
        extra = socket.create_connection(("127.0.0.1", a.port))
        assert _closed_by_peer(extra, 3) < 3
        a.wait_log("why=too_many_connections max_connections=3")
        assert _code(_call(held[0], "stats")) is None      # the holders are served
        held[1].close()
        t0 = time.monotonic()
        while True:                                        # the loop frees the slot
            try:
                s = a.connect("coordinator")
                if _call(s, "hello") is not None:
                    break
            except (ssl.SSLError, ConnectionError):
                pass
            assert time.monotonic() - t0 < 5
            time.sleep(0.1)
    finally:
        a.stop()


def test_dead_peer_seen_within_10s(agent: Agent) -> None:
    """The coordinator's packets to the agent are dropped (iptables on lo,
    this connection's ports only): the half-open connection is closed by the
    agent's keepalive in under 10 s, and logged."""
    if not shutil.which("iptables"):
        pytest.fail("iptables is needed to drop the peer's packets")
    s = agent.connect("coordinator")
    assert _code(_call(s, "hello")) is None
    cport = s.getsockname()[1]
    conn = agent.text().rsplit("event=conn_open conn=", 1)[1].split()[0]
    rule = ["INPUT", "-i", "lo", "-p", "tcp", "-s", "127.0.0.1", "--sport", str(cport),
            "--dport", str(agent.port), "-j", "DROP"]
    subprocess.run(["iptables", "-I", *rule], check=True)
    try:
        t0 = time.monotonic()
        agent.wait_log(f"event=conn_close conn={conn} ", timeout=12)
        took = time.monotonic() - t0
    finally:
        subprocess.run(["iptables", "-D", *rule], check=True)
    print(f"dead peer seen after {took:.1f} s")
    assert took < 10, f"dead peer seen after {took:.1f} s"
    line = agent.text().split(f"event=conn_close conn={conn} ", 1)[1].splitlines()[0]
    assert "why=read_error" in line, line
