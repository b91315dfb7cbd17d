"""Fault injection and outcome reading for the fault matrix (test_faults_*.py).

Each injector does one thing to one real part of the lab and undoes it on
the way out, whatever happened in between:

- `hung(pid)`: SIGSTOP of a process (a QEMU, a Ceph daemon), SIGCONT after;
- `blackhole(lab, host)`: iptables DROP, inside the lab host's network
  namespace, of every packet to or from the agent's port: the coordinator's
  open connection stays open and silent, as across a dead switch; with
  `peer=`, of every TCP packet to or from one address (a Ceph site's);
- `private_redis(tmp)`: a Redis of the test's own, so that kill -9 of it
  touches no other test's broker.

The readers say what happened, from the parts themselves: the agents' own
log (`event=resumed ... paused_ms=`, measured by the agent from `stop` to
the return of `cont`), `rbd snap ls` at the site, the agents' inventory.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from cutpoint.agentclient import AgentPool
from cutpoint.coordinator import GroupSpec, load_group_file, pool_for

# The lab every cell of the suite shares (one bring-up for `make faults`).
# Raw QEMU: its cells hang a VM's QEMU by the pid the lab recorded and were
# written against the qmp driver; the lab's default is libvirt.
FAULT_LAB = pytest.mark.lab_config(hosts=2, vms_per_host=1, disks=2, backend="rbd",
                                   driver="qemu")
MARKS = [pytest.mark.lab, pytest.mark.fault, FAULT_LAB]
# The same with the lab's writer workload in every guest: a write is always
# in flight (the Ceph cells), and a drill's writer check has records to pass
# on (the kill -9 DR cells).
WRITER_LAB = pytest.mark.lab_config(hosts=2, vms_per_host=1, disks=2, backend="rbd",
                                    workload="writer")
WRITER_MARKS = [pytest.mark.lab, pytest.mark.fault, WRITER_LAB]

AGENT_PORT = 7443
# The invariant the matrix checks in every cell: no VM stays paused longer
# than its lease plus this much (stop, cont and the lease timer's own slack).
PAUSE_SLACK_MS = 100


# The coordinator-level cells' group: lease and commit budget (ms).
LEASE_MS = 1000
BUDGET_MS = 1000


@pytest.fixture(name="spec")
def spec_fixture(lab: dict[str, Any], agents: list[dict[str, Any]],
                 tmp_path: Path) -> GroupSpec:
    """`spec`: the lab's primary VMs as one group (LEASE_MS, BUDGET_MS)."""
    from cutpoint.lab.groupfile import write_group_file

    p = tmp_path / "group.yaml"
    write_group_file(lab, p, group="lab", certs_dir=Path(lab["state_dir"]) / "certs",
                     lease_ms=LEASE_MS, budget_ms=BUDGET_MS)
    return load_group_file(p)


@pytest.fixture(name="pool")
async def pool_fixture(spec: GroupSpec) -> AsyncIterator[AgentPool]:
    """`pool`: the coordinator's connections to the group's agents, open."""
    p = pool_for(spec)
    # Open every connection first: the faults below hit a live connection.
    await vm_states(p, spec)
    yield p
    await p.close()


def ceph_pid(lab: dict[str, Any], site: str, daemon: str) -> int:
    """The pid of a lab Ceph daemon (`mon.a`, `osd.0`, `mgr.x`) at `site`."""
    d = Path(lab["sites"][site]["data_dir"]) / "run" / f"{daemon}.pid"
    return int(d.read_text().strip())


def kill9_ceph(lab: dict[str, Any], site: str, daemon: str) -> None:
    """kill -9 of a lab Ceph daemon; returns once it is gone."""
    from cutpoint.lab.proc import pid_alive

    pid = ceph_pid(lab, site, daemon)
    os.kill(pid, signal.SIGKILL)
    t0 = time.monotonic()
    while pid_alive(pid):
        assert time.monotonic() - t0 < 10, f"{daemon} outlived kill -9"
        time.sleep(0.01)


def restart_ceph(lab: dict[str, Any], site: str, daemon: str, timeout: float = 60) -> None:
    """Start a lab Ceph daemon again (as the lab started it, with its mark)
    and wait until the site answers `ceph osd stat` with its OSD up."""
    from cutpoint.lab.ceph import ceph_cmd
    from cutpoint.lab.proc import run

    kind, ident = daemon.split(".", 1)
    d = Path(lab["sites"][site]["data_dir"])
    run([f"ceph-{kind}", "-c", str(d / "ceph.conf"), "-i", ident], mark=str(lab["state_dir"]))
    t0 = time.monotonic()
    while True:
        cp = run(ceph_cmd(d, "osd", "stat", "-f", "json"), check=False, timeout=30)
        try:
            if json.loads(cp.stdout).get("num_up_osds") == 1:
                return
        except ValueError:
            pass
        assert time.monotonic() - t0 < timeout, f"{site} {daemon}: not back: {cp.stderr}"
        time.sleep(0.3)


# -- injectors -----------------------------------------------------------------
@contextlib.contextmanager
def hung(pid: int) -> Iterator[None]:
    """The process stops answering (SIGSTOP) until the block ends (SIGCONT)."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


@contextlib.contextmanager
def hung_osd(lab: dict[str, Any], site: str) -> Iterator[None]:
    """A site's OSD stops answering until the block ends, then is back as
    an OSD with peers would be: the lab's single OSD cannot renew its PGs'
    read leases itself, so they peer anew (lab ceph.renew_pg_leases)."""
    from cutpoint.lab.ceph import renew_pg_leases

    with hung(ceph_pid(lab, site, "osd.0")):
        yield
    took = renew_pg_leases(Path(lab["sites"][site]["data_dir"]))
    print(f"{site} osd.0 back: every PG active+clean after {took:.1f} s")


def _iptables(netns: str, op: str, port: int, peer: str | None) -> None:
    # By port: the agent's traffic (it listens there; the coordinator's
    # connections come in).  By peer: every TCP packet to or from one
    # address, such as a Ceph site's, whatever the port.
    rules = ((("INPUT", "-s", peer), ("OUTPUT", "-d", peer)) if peer else
             (("INPUT", "--dport", str(port)), ("OUTPUT", "--sport", str(port))))
    for chain, side, value in rules:
        subprocess.run(["ip", "netns", "exec", netns, "iptables", op, chain, "-p", "tcp",
                        side, value, "-j", "DROP"], check=True, capture_output=True,
                       timeout=30)


class Blackhole:
    """DROP in one host namespace of the agent port's traffic, or (`peer`)
    of all TCP traffic with one address; `lift()` ends it."""

    def __init__(self, netns: str, port: int = AGENT_PORT, peer: str | None = None) -> None:
        self.netns, self.port, self.peer, self.on = netns, port, peer, False

    def drop(self) -> None:
        _iptables(self.netns, "-I", self.port, self.peer)
        self.on = True

    def lift(self) -> None:
        if self.on:
            _iptables(self.netns, "-D", self.port, self.peer)
            self.on = False


@contextlib.contextmanager
def blackhole(lab: dict[str, Any], host: str, *, now: bool = True,
              peer: str | None = None) -> Iterator[Blackhole]:
    """A Blackhole on lab host `host` (dropping at once unless `now` is
    False: then the test calls `drop()` at the step it aims at); lifted at
    the end of the block in any case.  `peer`: drop every TCP packet with
    that address (e.g. `site_address(lab, "dr")`) instead of the agent port."""
    h = next(x for x in lab["hosts"] if x["name"] == host)
    bh = Blackhole(h["netns"], peer=peer)
    try:
        if now:
            bh.drop()
        yield bh
    finally:
        bh.lift()


def site_address(lab: dict[str, Any], site: str) -> str:
    """The address a lab site's Ceph daemons listen on (mon and OSDs)."""
    return str(lab["sites"][site]["mon_addr"]).rsplit(":", 1)[0]


@contextlib.contextmanager
def private_redis(tmp: Path) -> Iterator[dict[str, Any]]:
    """A Redis on a free loopback port for one test: {"port", "pid", "state"}.
    `kill9(r)` kills it; `restart(r)` brings it back on the same port."""
    from cutpoint.api import services_local

    state = tmp / "redis-svc"
    ep = services_local.start(state, postgres=False)
    r = {"port": int(ep.redis_port or 0), "state": state}
    try:
        yield r
    finally:
        services_local.stop(state)


@contextlib.contextmanager
def fault_plane(lab: dict[str, Any], tmp: Path, redis_port: int, **env: str) -> Iterator[Any]:
    """The control plane of a cell (api/tests/plane.py) on its own Redis:
    the broker redelivers a job whose worker died after 15 s, agent calls
    wait 15 s (vm.stop waits for QEMU to exit), and the periodic retention
    and inventory passes stay out of the way unless `env` says otherwise."""
    from plane import lab_plane  # api/tests/plane.py

    with lab_plane(lab, tmp, redis_port, **{
            "CUTPOINT_BROKER_VISIBILITY_TIMEOUT_S": "15", "CUTPOINT_AGENT_TIMEOUT_S": "15",
            "CUTPOINT_RETENTION_INTERVAL_S": "3600", "CUTPOINT_INVENTORY_INTERVAL_S": "3600",
            **env}) as p:
        yield p


@pytest.fixture(name="redis_box")
def redis_box_fixture(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """`redis_box`: a cell's own Redis (`private_redis`); a test module that
    imports this function has the fixture."""
    with private_redis(tmp_path) as r:
        yield r


def redis_pid(r: dict[str, Any]) -> int:
    return int((Path(r["state"]) / "redis" / "redis.pid").read_text().strip())


def kill9_redis(r: dict[str, Any]) -> None:
    from cutpoint.lab.proc import pid_alive

    pid = redis_pid(r)
    os.kill(pid, signal.SIGKILL)
    t0 = time.monotonic()
    while pid_alive(pid):
        assert time.monotonic() - t0 < 10, "redis-server outlived kill -9"
        time.sleep(0.01)


def restart_redis(r: dict[str, Any]) -> None:
    from cutpoint.api import services_local

    services_local.start(r["state"], postgres=False, redis_port=r["port"])


# -- readers -------------------------------------------------------------------
_RESUMED = re.compile(r"event=resumed vm=(\S+) txn=(\S+) why=(\S+) .*paused_ms=([0-9.]+)")


def pauses(agents: list[dict[str, Any]], txn: str) -> list[dict[str, Any]]:
    """Every resume of `txn` the agents logged: {vm, why, paused_ms, host}."""
    out = []
    for rec in agents:
        text = Path(rec["log"]).read_text(errors="replace")
        for m in _RESUMED.finditer(text):
            if m.group(2) == txn:
                out.append({"vm": m.group(1), "why": m.group(3),
                            "paused_ms": float(m.group(4)), "host": rec["host"]})
    return out


def wait_pauses(agents: list[dict[str, Any]], txn: str, vms: set[str],
                timeout: float) -> list[dict[str, Any]]:
    """pauses() once every VM of `vms` has a resume of `txn` logged."""
    t0 = time.monotonic()
    while True:
        got = pauses(agents, txn)
        if vms <= {p["vm"] for p in got}:
            return got
        assert time.monotonic() - t0 < timeout, \
            f"no resume of {sorted(vms - {p['vm'] for p in got})} logged for {txn}: {got}"
        time.sleep(0.05)


def assert_pause_bound(got: list[dict[str, Any]], lease_ms: int) -> None:
    over = [p for p in got if p["paused_ms"] > lease_ms + PAUSE_SLACK_MS]
    assert not over, f"paused beyond lease {lease_ms} + {PAUSE_SLACK_MS} ms: {over}"


def site_snaps(lab: dict[str, Any], site: str = "primary") -> dict[str, list[str]]:
    """image spec -> snapshot names, for every VM disk at `site`, from Ceph."""
    from cutpoint.lab.ceph import rbd_cmd

    s = lab["sites"][site]
    out = {}
    for vm in lab["vms"]:
        if vm["site"] != site:
            continue
        for d in vm["disks"]:
            spec = f"{d['pool']}/{d['image']}"
            r = subprocess.run(rbd_cmd(s, "snap", "ls", "--format", "json", spec),
                               capture_output=True, text=True, check=True, timeout=60)
            out[spec] = [x["name"] for x in json.loads(r.stdout or "[]")]
    return out


def wait_site_serves(lab: dict[str, Any], site: str, timeout: float) -> float:
    """Seconds until a new Ceph client at `site` can list every VM disk's
    snapshots again (each try bounded by 10 s); on each slow try, prints
    `ceph health detail`.  Fails after `timeout`."""
    from cutpoint.lab.ceph import ceph_cmd, rbd_cmd

    s = lab["sites"][site]
    specs = [f"{d['pool']}/{d['image']}" for vm in lab["vms"] if vm["site"] == site
             for d in vm["disks"]]
    t0 = time.monotonic()
    while True:
        try:
            for spec in specs:
                subprocess.run(rbd_cmd(s, "snap", "ls", spec), capture_output=True,
                               check=True, timeout=10)
            return time.monotonic() - t0
        except (subprocess.TimeoutExpired, subprocess.CalledProcessError) as exc:
            h = subprocess.run(ceph_cmd(Path(s["data_dir"]), "health", "detail"),
                               capture_output=True, text=True, timeout=30, check=False)
            print(f"{site} not serving after {time.monotonic() - t0:.1f} s ({exc}): "
                  f"{h.stdout.strip()[:600]}", flush=True)
            assert time.monotonic() - t0 < timeout, f"{site}: Ceph not serving after {timeout} s"


def snaps_of(lab: dict[str, Any], txn: str) -> list[str]:
    """`image@snapshot` of every member snapshot named after `txn` at the primary."""
    return [f"{img}@{n}" for img, names in site_snaps(lab).items() for n in names
            if n.endswith(f".{txn}")]


async def vm_states(pool: AgentPool, spec: GroupSpec) -> dict[str, str]:
    """VM name -> state, as each agent of the group lists it (QMP query-status)."""
    out = {}
    for a in spec.agents:
        # The same client the coordinator's run takes (pool key, pin, name).
        c = pool.get(a.address, a.port, name=a.name, server_name=a.server_name,
                     cert_sha256=a.cert_sha256)
        inv = await c.inventory(timeout=10)
        out.update({v["name"]: v["state"] for v in inv["vms"]})
    return out


async def wait_running(pool: AgentPool, spec: GroupSpec, timeout: float) -> float:
    """Seconds until every VM of the group runs; fails after `timeout`."""
    t0 = time.monotonic()
    while True:
        states = await vm_states(pool, spec)
        if set(states.values()) == {"running"}:
            return time.monotonic() - t0
        assert time.monotonic() - t0 < timeout, f"VMs not running: {states}"
        await asyncio.sleep(0.05)


def agent_txns(lab: dict[str, Any], settings: Any, site: str = "primary") -> dict[str, Any]:
    """Host -> the `txns` counter of its agent's `stats`: how many
    transactions it has seen (a PREPARE that paused anything counts)."""
    from cutpoint.agentclient import AgentClient, client_context

    ctx = client_context(settings.agent_ca, settings.agent_cert, settings.agent_key)

    async def one(h: dict[str, Any]) -> Any:
        async with AgentClient(h["address"], AGENT_PORT, ssl_context=ctx) as ac:
            return (await ac.call("stats", {}, timeout=10)).get("txns")

    return {h["name"]: asyncio.run(one(h)) for h in lab["hosts"] if h["site"] == site}


def expired_cert(certs: Path, out: Path, name: str, role: str) -> tuple[Path, Path]:
    """A certificate for `name` with role `role`, signed by the CA in `certs`
    (ca.pem, ca.key) with the issue script's names and usages, but whose
    validity ended yesterday: (cert, key), written under `out`."""
    import datetime as dt

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    ca = x509.load_pem_x509_certificate((certs / "ca.pem").read_bytes())
    ca_key = serialization.load_pem_private_key((certs / "ca.key").read_bytes(), None)
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(ca.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(days=3))
            .not_valid_after(now - dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(True, False, False, False, False, False, False,
                                         False, False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                  ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .add_extension(x509.SubjectAlternativeName([
                x509.DNSName(name),
                x509.UniformResourceIdentifier(f"spiffe://cutpoint/{role}")]), critical=False)
            .sign(ca_key, hashes.SHA256()))  # type: ignore[arg-type]
    pem, kpem = out / f"expired-{name}.pem", out / f"expired-{name}.key"
    pem.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    kpem.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    kpem.chmod(0o600)
    return pem, kpem
