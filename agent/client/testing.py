"""Test helpers for code that talks to agents: a throwaway PKI and an
in-process protocol peer.

`AgentPeer` is a *peer* of the code under test, not the agent itself: it
speaks docs/agent-protocol.md over real mutual TLS 1.3 sockets and keeps an
in-memory model of paused VMs and member snapshots, with one switch per
fault (refuse prepare, hang, fail a disk's snapshot).  The real proofs run
against `cutpointd` in the lab; these peers let the coordinator's state
machine be tested in milliseconds.  Not used in production.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import ipaddress
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cutpoint.agentclient.errors import FrameError
from cutpoint.agentclient.framing import encode_frame, read_frame
from cutpoint.agentclient.tls import server_context

# -- PKI ------------------------------------------------------------------
# The roles of the usual test PKI's two names.
PKI_ROLES = {"agent": "agent", "coordinator": "coordinator"}


def make_pki(directory: str | Path, names: dict[str, list[str]],
             roles: dict[str, str] | None = None) -> dict[str, dict[str, str]]:
    """Make `ca.pem`/`ca.key` and one cert per name (IP SANs from the list).

    roles: name -> coordinator|operator|agent, written as the SAN URI
    spiffe://cutpoint/<role> that cutpointd authorizes by (agent-protocol
    §1.5); a name without one gets a certificate with no role.
    Returns {name: {"cert": path, "key": path}, "ca": {"cert": ca.pem}}.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC)

    def write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
        path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
        path.chmod(0o600)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "cutpoint test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - dt.timedelta(minutes=5))
          .not_valid_after(now + dt.timedelta(days=2))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True,
                                       crl_sign=True, content_commitment=False,
                                       key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False,
                                       decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    (d / "ca.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    write_key(ca_key, d / "ca.key")
    out: dict[str, dict[str, str]] = {"ca": {"cert": str(d / "ca.pem")}}
    for name, ips in names.items():
        key = ec.generate_private_key(ec.SECP256R1())
        sans: list[x509.GeneralName] = [x509.DNSName(name)]
        sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
        if roles and name in roles:
            sans.append(x509.UniformResourceIdentifier(f"spiffe://cutpoint/{roles[name]}"))
        cert = (x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
                .issuer_name(ca_name).public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - dt.timedelta(minutes=5))
                .not_valid_after(now + dt.timedelta(days=2))
                .add_extension(x509.SubjectAlternativeName(sans), critical=False)
                .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                      ExtendedKeyUsageOID.CLIENT_AUTH]),
                               critical=False)
                .sign(ca_key, hashes.SHA256()))
        (d / f"{name}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        write_key(key, d / f"{name}.key")
        out[name] = {"cert": str(d / f"{name}.pem"), "key": str(d / f"{name}.key")}
    return out


# -- the peer ---------------------------------------------------------------
def _ms(t0: float, t1: float) -> float:
    return (t1 - t0) * 1000


@dataclass
class PeerVM:
    name: str
    disks: list[str]
    state: str = "running"
    snapshots: dict[str, set[str]] = field(default_factory=dict)   # node -> names
    # (event, monotonic time) — "stop"/"cont", shared clock across peers in
    # one process, so a test can check the cut (invariant 1).
    history: list[tuple[str, float]] = field(default_factory=list)
    stop_t: float = 0.0


@dataclass
class PeerTxn:
    txn: str
    vms: list[str]
    state: str            # prepared | committing | committed | failed | expired | aborted
    lease: asyncio.TimerHandle | None = None
    stop_ms: dict[str, float] = field(default_factory=dict)
    reply: dict[str, Any] | None = None       # stored commit reply (idempotence)
    created: dict[str, str] = field(default_factory=dict)  # disk id -> snap name
    # vm -> {consistency, freeze_ms, thaw_ms, freeze_error, thaw_error?}
    # (agent-protocol §4.3, §4.4)
    quiesce: dict[str, dict[str, Any]] = field(default_factory=dict)


class AgentPeer:
    """An in-process agent-protocol server over mutual TLS 1.3."""

    def __init__(self, host: str, vms: dict[str, list[str]], *, ca: str, cert: str,
                 key: str, address: str = "127.0.0.1") -> None:
        self.host = host
        self.address = address
        self.port = 0
        self.vms = {n: PeerVM(n, list(d), snapshots={x: set() for x in d})
                    for n, d in vms.items()}
        self.txns: dict[str, PeerTxn] = {}
        self.requests: list[dict[str, Any]] = []
        self._ctx = server_context(ca, cert, key)
        self._server: asyncio.base_events.Server | None = None
        self._conns: set[asyncio.StreamWriter] = set()
        # Faults, one switch each.
        self.refuse: dict[str, str] = {}        # cmd -> error code to answer
        self.hang: set[str] = set()             # cmds never answered
        self.delay: dict[str, float] = {}       # cmd -> seconds before it is handled
        self.fail_snapshot: set[str] = set()    # disk ids whose snapshot fails
        self.lie_snapshot: set[str] = set()     # reported done, never created
        self.snapshot_delay_s = 0.002
        # quiesce fs-freeze: per VM the facts the agent replies (recorded
        # from cutpointd: coordinator/tests/data/quiesce_replies.json); a VM
        # not listed falls back to crash like a VM without a `qga` socket.
        # The freezes take freeze_delay_s, before any VM is stopped.
        self.quiesce_facts: dict[str, dict[str, Any]] = {}
        self.freeze_delay_s = 0.0
        # Called with each request before it is handled (e.g. to look into
        # the coordinator's log at that instant).
        self.on_request: Callable[[dict[str, Any]], None] | None = None

    # -- lifecycle --------------------------------------------------------
    async def start(self) -> int:
        self._server = await asyncio.start_server(self._serve, self.address, 0,
                                                  ssl=self._ctx)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for w in list(self._conns):
            w.close()
        for t in self.txns.values():
            if t.lease:
                t.lease.cancel()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1)

    def cmds(self) -> list[str]:
        return [r.get("cmd", "?") for r in self.requests]

    def all_snapshots(self) -> dict[str, set[str]]:
        return {f"{v.name}/{n}": set(s) for v in self.vms.values()
                for n, s in v.snapshots.items()}

    # -- transport ------------------------------------------------------------
    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._conns.add(writer)
        tasks: set[asyncio.Task[None]] = set()
        try:
            while True:
                try:
                    req = await read_frame(reader)
                except FrameError as exc:
                    writer.write(encode_frame({"id": None, "ok": False, "error": {
                        "code": "BAD_FRAME", "message": str(exc)}}))
                    break
                if req is None:
                    break
                # §1.3: requests are handled concurrently.
                t = asyncio.create_task(self._handle(req, writer))
                tasks.add(t)
                t.add_done_callback(tasks.discard)
        except (ConnectionError, OSError):
            pass
        finally:
            self._conns.discard(writer)
            with contextlib.suppress(Exception):
                writer.close()

    async def _handle(self, req: dict[str, Any], writer: asyncio.StreamWriter) -> None:
        self.requests.append(req)
        if self.on_request is not None:
            self.on_request(req)
        cmd = req.get("cmd")
        rid = req.get("id")
        if cmd in self.hang:
            return
        if cmd in self.delay:
            await asyncio.sleep(self.delay[cmd])
        try:
            if cmd in self.refuse:
                raise _Err(self.refuse[cmd], f"{cmd} refused by test fault")
            fn = getattr(self, "_cmd_" + str(cmd).replace(".", "_"), None)
            if fn is None:
                raise _Err("UNKNOWN_COMMAND", f"unknown command {cmd!r}")
            result = await fn(req.get("args") or {})
            reply: dict[str, Any] = {"id": rid, "ok": True, "result": result}
        except _Err as e:
            reply = {"id": rid, "ok": False,
                     "error": {"code": e.code, "message": e.message}}
            if e.result is not None:
                reply["result"] = e.result
        with contextlib.suppress(Exception):
            writer.write(encode_frame(reply))
            await writer.drain()

    # -- VM model -------------------------------------------------------------
    def _stop(self, vm: PeerVM) -> float:
        t0 = time.monotonic()
        vm.state = "paused"
        vm.stop_t = t0
        vm.history.append(("stop", t0))
        return _ms(t0, time.monotonic())

    def _cont(self, vm: PeerVM) -> float:
        t0 = time.monotonic()
        if vm.state == "paused":
            vm.state = "running"
            vm.history.append(("cont", t0))
        return _ms(t0, time.monotonic())

    def _expire(self, txn: str) -> None:
        t = self.txns[txn]
        if t.state == "prepared":
            for n in t.vms:
                self._cont(self.vms[n])
            t.state = "expired"

    # -- commands of agent-protocol §4 ------------------------------------------
    async def _cmd_hello(self, a: dict[str, Any]) -> dict[str, Any]:
        return {"version": "peer", "protocol": 1, "host": self.host, "drivers": ["peer"],
                "capabilities": ["hello", "inventory", "prepare", "commit", "abort",
                                 "resume", "snapshot.list", "snapshot.delete"],
                "snapshot_methods": ["peer"]}

    async def _cmd_inventory(self, a: dict[str, Any]) -> dict[str, Any]:
        return {"vms": [{"name": v.name, "driver": "peer", "state": v.state,
                         "method": "peer",
                         "disks": [{"id": f"{v.name}/{d}", "node": d, "backend": "peer"}
                                   for d in v.disks]} for v in self.vms.values()]}

    async def _cmd_prepare(self, a: dict[str, Any]) -> dict[str, Any]:
        txn, names, lease_ms = a["txn"], list(a["vms"]), int(a["lease_ms"])
        quiesce = a.get("quiesce", "crash")
        if quiesce not in ("crash", "fs-freeze"):
            raise _Err("BAD_REQUEST", f'args.quiesce must be "crash" or "fs-freeze", '
                       f'got "{quiesce}"')
        ft = a.get("freeze_timeout_ms")
        if ft is not None and (isinstance(ft, bool) or not isinstance(ft, int)
                               or not 1 <= ft <= 600000):
            raise _Err("BAD_REQUEST", "args.freeze_timeout_ms must be an integer 1..600000")
        t = self.txns.get(txn)
        if t is not None:
            if t.state == "prepared" and t.vms == names:
                return self._prepared(t, lease_ms)
            code = {"expired": "EXPIRED", "aborted": "ABORTED"}.get(t.state, "BAD_REQUEST")
            raise _Err(code, f"txn {txn} is {t.state}")
        for n in names:
            if n not in self.vms:
                raise _Err("UNKNOWN_VM", f"unknown vm {n}")
            if any(n in x.vms and x.state in ("prepared", "committing")
                   for x in self.txns.values()):
                raise _Err("BUSY", f"vm {n} is in another live txn")
        t = PeerTxn(txn, names, "prepared")
        for n in names:
            t.quiesce[n] = {"consistency": "crash", "freeze_ms": 0.0, "thaw_ms": None,
                            "freeze_error": None}
        if quiesce == "fs-freeze":
            # All freezes before any stop, as cutpointd does.
            for n in names:
                self.vms[n].history.append(("freeze", time.monotonic()))
            await asyncio.sleep(self.freeze_delay_s)
            for n in names:
                t.quiesce[n] = dict(self.quiesce_facts.get(n) or {
                    "consistency": "crash", "freeze_ms": 0.0, "thaw_ms": None,
                    "freeze_error": f"no qga socket configured for vm {n}"})
        for n in names:
            t.stop_ms[n] = self._stop(self.vms[n])
        t.lease = asyncio.get_running_loop().call_later(lease_ms / 1000, self._expire, txn)
        self.txns[txn] = t
        return self._prepared(t, lease_ms)

    @staticmethod
    def _prepared(t: PeerTxn, lease_ms: int) -> dict[str, Any]:
        return {"txn": t.txn, "state": "prepared", "lease_ms": lease_ms,
                "vms": [{"vm": n, "stop_ms": t.stop_ms[n],
                         **{k: v for k, v in t.quiesce.get(n, {}).items()
                            if k not in ("thaw_ms", "thaw_error")}} for n in t.vms]}

    async def _cmd_commit(self, a: dict[str, Any]) -> dict[str, Any]:
        txn, snaps = a["txn"], dict(a["snapshots"])
        t = self.txns.get(txn)
        if t is None:
            raise _Err("UNKNOWN_TXN", f"txn {txn} was never prepared")
        if t.reply is not None:
            if t.reply.get("ok"):
                return dict(t.reply["result"])
            raise _Err(t.reply["error"]["code"], t.reply["error"]["message"],
                       t.reply.get("result"))
        if t.state == "expired":
            raise _Err("EXPIRED", f"lease of txn {txn} expired")
        if t.state == "aborted":
            raise _Err("ABORTED", f"txn {txn} was aborted")
        for disk in snaps:
            vm, _, node = disk.partition("/")
            if vm not in t.vms or node not in self.vms[vm].disks:
                raise _Err("UNKNOWN_DISK", f"disk {disk} is not in txn {txn}")
        if t.lease:
            t.lease.cancel()
        t.state = "committing"
        arrived = time.monotonic()
        vms_out, failed = [], []
        for n in t.vms:
            vm = self.vms[n]
            s0 = time.monotonic()
            disks = []
            for disk, name in snaps.items():
                if not disk.startswith(n + "/"):
                    continue
                d0 = time.monotonic()
                await asyncio.sleep(self.snapshot_delay_s)
                ok = disk not in self.fail_snapshot
                if not ok:
                    failed.append(disk)
                elif disk not in self.lie_snapshot:
                    vm.snapshots[disk.partition("/")[2]].add(name)
                    t.created[disk] = name
                disks.append({"disk": disk, "name": name, "ok": ok,
                              "snapshot_ms": _ms(d0, time.monotonic())})
            s1 = time.monotonic()
            cont_ms = self._cont(vm)
            vms_out.append({"vm": n, "stop_ms": t.stop_ms[n],
                            "barrier_ms": _ms(vm.stop_t, arrived) - t.stop_ms[n],
                            "snapshot_ms": _ms(s0, s1), "cont_ms": cont_ms,
                            "paused_ms": _ms(vm.stop_t, time.monotonic()),
                            "method": "peer", "disks": disks, **t.quiesce.get(n, {})})
        result = {"txn": txn, "state": "committed", "vms": vms_out}
        if failed:
            t.state = "failed"
            err = {"code": "SNAPSHOT_FAILED", "message": f"snapshot of {failed} failed"}
            t.reply = {"ok": False, "error": err, "result": result}
            raise _Err(err["code"], err["message"], result)
        t.state = "committed"
        t.reply = {"ok": True, "result": result}
        return result

    async def _cmd_abort(self, a: dict[str, Any]) -> dict[str, Any]:
        txn = a["txn"]
        t = self.txns.get(txn)
        if t is None:
            t = self.txns[txn] = PeerTxn(txn, [], "aborted")
        if t.lease:
            t.lease.cancel()
        resumed, timings = [], []
        for n in t.vms:
            if self.vms[n].state == "paused":
                cont_ms = self._cont(self.vms[n])
                resumed.append(n)
                q = t.quiesce.get(n, {})
                timings.append({"vm": n, "cont_ms": cont_ms,
                                "thaw_ms": q.get("thaw_ms"),
                                "thaw_error": q.get("thaw_error")})
        targets = dict(t.created)
        targets.update(a.get("snapshots") or {})
        deleted, not_deleted = [], []
        for disk, name in targets.items():
            vm, _, node = disk.partition("/")
            if vm not in self.vms or node not in self.vms[vm].snapshots:
                not_deleted.append({"disk": disk, "name": name, "error": "unknown disk"})
                continue
            if name in self.vms[vm].snapshots[node]:
                self.vms[vm].snapshots[node].discard(name)
                deleted.append({"disk": disk, "name": name})
        t.state = "aborted"
        return {"txn": txn, "state": "aborted", "resumed": resumed, "deleted": deleted,
                "not_deleted": not_deleted, "timings": timings}

    async def _cmd_resume(self, a: dict[str, Any]) -> dict[str, Any]:
        return {"vms": [{"vm": n, "cont_ms": self._cont(self.vms[n])} for n in a["vms"]]}

    def _disk(self, disk: str) -> tuple[PeerVM, str]:
        vm, _, node = disk.partition("/")
        if vm not in self.vms or node not in self.vms[vm].snapshots:
            raise _Err("UNKNOWN_DISK", f"unknown disk {disk}")
        return self.vms[vm], node

    async def _cmd_snapshot_list(self, a: dict[str, Any]) -> dict[str, Any]:
        vm, node = self._disk(a["disk"])
        return {"disk": a["disk"], "snapshots": [{"name": n}
                                                 for n in sorted(vm.snapshots[node])]}

    async def _cmd_snapshot_delete(self, a: dict[str, Any]) -> dict[str, Any]:
        vm, node = self._disk(a["disk"])
        present = a["name"] in vm.snapshots[node]
        vm.snapshots[node].discard(a["name"])
        return {"disk": a["disk"], "name": a["name"], "deleted": present}


class _Err(Exception):
    def __init__(self, code: str, message: str, result: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.result = code, message, result
