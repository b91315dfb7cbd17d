"""`cutpoint-lab bench quiesce`: pause with and without fs-freeze, same run.

Issue 8 item 4.  Everything goes through the real parts: one Debian
PostgreSQL VM (``debian-pg`` image, QEMU/TCG, qemu-guest-agent inside, under
pgbench + ledger load), one ``cutpointd`` on loopback that drives it through
its second QMP monitor and its guest-agent socket (config key ``qga``), and
the coordinator's ``take_group_snapshot`` (two-phase commit, one
transaction log).  Rounds alternate ``quiesce: crash`` and
``quiesce: fs-freeze`` on the same VM.  Then the guest agent is stopped
inside the guest (``guest-exec`` of ``kill -STOP`` on qemu-ga itself: the
virtio-serial port stays open, nothing answers) and more ``fs-freeze``
rounds show the fallback to crash consistency, recorded per member.

No Ceph is used (qcow2 group disks, QMP transaction), so, like the
PostgreSQL drill, this does not take the lab lock.  It prints a table and
returns a JSON-able document; it never asserts on time.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import statistics
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

Log = Callable[[str], None]
MODES = ("crash", "fs-freeze")
# Per-row columns of the table (agent-measured, ms, except prepare/total
# which the coordinator measures).
COLUMNS = ("freeze_ms", "stop_ms", "snapshot_ms", "paused_ms", "thaw_ms",
           "prepare_ms", "total_ms")


class QuiesceBenchError(RuntimeError):
    """A step of the benchmark failed; says which and what came back."""


@dataclass
class Rig:
    """A running Debian VM, its agent and a group spec per quiesce mode."""

    vm: Any                      # cutpoint.checkers.guestvm.DebianVM
    agent: subprocess.Popen[bytes]
    workdir: Path
    port: int
    certs: Path
    disks: dict[str, Path]       # node -> qcow2
    freeze_timeout_ms: int

    def spec(self, quiesce: str, group: str = "qz") -> Any:
        from cutpoint.coordinator import AgentSpec, GroupSpec, TlsSpec, VMSpec
        return GroupSpec(
            name=group, lease_ms=5000, budget_ms=5000, quiesce=quiesce,
            freeze_timeout_ms=self.freeze_timeout_ms,
            tls=TlsSpec(str(self.certs / "ca.pem"), str(self.certs / "coordinator.pem"),
                        str(self.certs / "coordinator.key")),
            agents=(AgentSpec(name="qz-host", address="127.0.0.1", port=self.port,
                              vms=(VMSpec("qz-vm", tuple(self.disks)),)),))

    def agent_log(self) -> str:
        try:
            return (self.workdir / "cutpointd.log").read_text()[-3000:]
        except FileNotFoundError:
            return ""

    def stop(self) -> None:
        if self.agent.poll() is None:
            self.agent.terminate()
            try:
                self.agent.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.agent.kill()
                self.agent.wait(timeout=10)
        self.vm.kill()


def wait_guest_agent(vm: Any, timeout: float) -> float:
    """Poll the guest agent (guest-sync-delimited) until it answers; returns
    the seconds waited.  The connection is closed again: the chardev serves
    one client, and that must be cutpointd."""
    from cutpoint.checkers.quiesce import QGA, QGAError
    t0 = time.monotonic()
    last = "no attempt"
    while time.monotonic() - t0 < timeout:
        if vm.proc is not None and vm.proc.poll() is not None:
            raise QuiesceBenchError(f"VM exited; console tail:\n{vm.console_text()[-2000:]}")
        try:
            q = QGA(vm.qga_path, 2.0)
            try:
                q.sync(2.0)
                return time.monotonic() - t0
            finally:
                q.close()
        except (QGAError, OSError) as exc:
            last = str(exc)
        time.sleep(1.0)
    raise QuiesceBenchError(f"guest agent did not answer within {timeout:.0f} s "
                            f"(last: {last}); console tail:\n{vm.console_text()[-2000:]}")


def stop_guest_agent(vm: Any) -> dict[str, Any]:
    """Make the guest agent stop answering without closing its port:
    ``guest-exec /bin/sh -c 'kill -STOP $PPID'`` (the shell's parent is
    qemu-ga).  Checks that a sync then times out."""
    from cutpoint.checkers.quiesce import QGA, QGAError
    q = QGA(vm.qga_path, 2.0)
    try:
        q.sync(2.0)
        ret = q.execute("guest-exec", 5.0, {"path": "/bin/sh",
                                             "arg": ["-c", "kill -STOP $PPID"]})
    finally:
        q.close()
    time.sleep(1.0)
    q = QGA(vm.qga_path, 1.0)
    try:
        q.sync(1.0)
    except QGAError as exc:
        return {"guest_exec": ret, "check": str(exc)}
    finally:
        q.close()
    raise QuiesceBenchError("the guest agent still answers after kill -STOP")


def start_rig(workdir: Path, *, freeze_timeout_ms: int = 5000, load: bool = True,
              boot_timeout: float = 900.0, log: Log = print) -> Rig:
    """Boot the VM, wait for its guest agent (and for the load with
    `load`), start cutpointd with `qga` configured."""
    from cutpoint.checkers import pgcoord
    from cutpoint.checkers.guestvm import DebianVM
    from cutpoint.checkers.pgdrill import group_disks
    from cutpoint.lab.debian_image import build

    if not pgcoord.CUTPOINTD.exists():
        raise QuiesceBenchError(f"{pgcoord.CUTPOINTD} is not built (ninja -C build)")
    image = build("debian-pg")
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    vm = DebianVM(image, workdir / "vm", group_disks(workdir / "vm"),
                  "cp.mode=load cp.pgbench_rate=20")
    t0 = time.monotonic()
    vm.start()
    agent = None
    try:
        waited = wait_guest_agent(vm, boot_timeout)
        log(f"guest agent answers {waited:.1f} s after QEMU start")
        if load:
            vm.wait_console(r"CPSTATE ledger-start", boot_timeout)
            log(f"pgbench + ledger running {time.monotonic() - t0:.1f} s after QEMU start")
        certs = workdir / "certs"
        for args in ([str(certs)], [str(certs), "issue", "qz-agent", "agent", "127.0.0.1"],
                     [str(certs), "issue", "coordinator", "coordinator"]):
            subprocess.run([str(pgcoord.MAKE_CA), *args], check=True, capture_output=True)
        port = pgcoord._free_port()
        disks = {vm.node_of[d.serial]: d.file for d in vm.disks}
        conf = workdir / "cutpointd.conf"
        conf.write_text("\n".join([
            "[agent]", "host = qz-host", f"listen = 127.0.0.1:{port}",
            f"journal = {workdir / 'agent-journal'}", "qmp_timeout_ms = 5000",
            f"freeze_timeout_ms = {freeze_timeout_ms}", "",
            "[tls]", f"ca = {certs / 'ca.pem'}", f"cert = {certs / 'qz-agent.pem'}",
            f"key = {certs / 'qz-agent.key'}", "",
            "[vm qz-vm]", "driver = qmp", f"qmp = {vm.qmp_agent_path}",
            f"qga = {vm.qga_path}", "method = qmp",
            *[f"disk.{n} = qcow2:{f}" for n, f in disks.items()]]) + "\n")
        chk = subprocess.run([str(pgcoord.CUTPOINTD), "-n", "-c", str(conf)],
                             capture_output=True, text=True, check=False)
        if chk.returncode != 0:
            raise QuiesceBenchError(f"cutpointd -n rejected {conf}: {chk.stdout}{chk.stderr}")
        with open(workdir / "cutpointd.log", "wb") as out:
            agent = subprocess.Popen([str(pgcoord.CUTPOINTD), "-c", str(conf)],
                                     stdout=out, stderr=subprocess.STDOUT)
        rig = Rig(vm, agent, workdir, port, certs, disks, freeze_timeout_ms)
        _wait_listen(rig)
        return rig
    except BaseException:
        if agent is not None and agent.poll() is None:
            agent.kill()
            agent.wait(timeout=10)
        vm.kill()
        raise


def _wait_listen(rig: Rig) -> None:
    import socket
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", rig.port), timeout=1).close()
            return
        except OSError:
            if rig.agent.poll() is not None or time.monotonic() > deadline:
                raise QuiesceBenchError("cutpointd did not listen: " + rig.agent_log()) \
                    from None
            time.sleep(0.1)


def row(result: Any, phase: str) -> dict[str, Any]:
    """One group snapshot as a table row (one VM in the group)."""
    v = result.vms[0]
    return {"phase": phase, "quiesce": result.quiesce, "txn": result.txn,
            "state": result.state, "consistency": v.consistency,
            "freeze_ms": v.freeze_ms, "stop_ms": v.stop_ms, "snapshot_ms": v.snapshot_ms,
            "paused_ms": v.paused_ms, "thaw_ms": v.thaw_ms,
            "prepare_ms": result.timings.get("prepare_ms"),
            "total_ms": result.timings.get("total_ms"),
            "freeze_error": v.freeze_error, "reason": result.reason,
            "vm": v.to_dict()}


async def take_rounds(rig: Rig, plan: list[tuple[str, str]], *, gap_s: float = 1.0,
                      log: Log = print) -> list[dict[str, Any]]:
    """Group snapshots through the real coordinator, one per (phase, quiesce)."""
    from cutpoint.coordinator import TxLog, pool_for, take_group_snapshot

    txlog = TxLog(f"sqlite:///{rig.workdir / 'coordinator.db'}")
    pool = pool_for(rig.spec("crash"))
    rows = []
    try:
        for phase, q in plan:
            res = await take_group_snapshot(rig.spec(q), txlog, pool=pool)
            r = row(res, phase)
            r["log"] = _log_vm(txlog, res.txn)
            rows.append(r)
            log(f"{phase:>10} {q:>9} -> {res.state} {r['consistency']} "
                f"pause {_f(r['paused_ms'])} ms freeze {_f(r['freeze_ms'])} ms "
                f"thaw {_f(r['thaw_ms'])} ms {r['freeze_error'] or ''}")
            await asyncio.sleep(gap_s)
    finally:
        await pool.close()
        txlog.dispose()
    return rows


async def record_replies(rig: Rig, label: str) -> dict[str, Any]:
    """One fs-freeze prepare + commit straight through the agent client;
    returns the agent's raw replies (the coordinator's unit tests replay
    them: coordinator/tests/data/quiesce_replies.json)."""
    from cutpoint.agentclient import AgentPool
    from cutpoint.agentclient.tls import client_context

    spec = rig.spec("fs-freeze")
    assert spec.tls is not None
    txn = f"rec-{label}-{int(time.time())}"
    async with AgentPool(client_context(spec.tls.ca, spec.tls.cert, spec.tls.key)) as pool:
        c = pool.get("127.0.0.1", rig.port)
        prep = await c.prepare(txn, ["qz-vm"], 5000, quiesce="fs-freeze",
                               timeout=spec.prepare_wait_ms / 1000)
        com = await c.commit(txn, {f"qz-vm/{n}": spec.snapshot_name(txn) for n in rig.disks},
                             5000, timeout=20)
    return {"txn": txn, "prepare": prep, "commit": com}


def _log_vm(txlog: Any, txn: str) -> dict[str, Any] | None:
    """The per-VM row of the transaction log (what the coordinator stored)."""
    rec = txlog.get(txn)
    if rec is None or not rec.vms:
        return None
    v = rec.vms[0]
    return {k: v.get(k) for k in ("consistency", "freeze_ms", "thaw_ms", "freeze_error",
                                  "paused_ms")}


def run(workdir: Path, *, rounds: int = 5, dead_rounds: int = 2,
        freeze_timeout_ms: int = 5000, load: bool = True, record: bool = False,
        log: Log = print) -> dict[str, Any]:
    """The whole benchmark; returns the JSON document."""
    t0 = time.monotonic()
    rig = start_rig(workdir, freeze_timeout_ms=freeze_timeout_ms, load=load, log=log)
    try:
        boot_s = time.monotonic() - t0
        time.sleep(2)
        plan = [("live", m) for _ in range(rounds) for m in MODES]
        rows = asyncio.run(take_rounds(rig, plan, log=log))
        replies = {}
        if record:
            replies["live"] = asyncio.run(record_replies(rig, "live"))
        dead: dict[str, Any] = {}
        if dead_rounds:
            dead = stop_guest_agent(rig.vm)
            log(f"guest agent stopped inside the guest: {dead['check']}")
            rows += asyncio.run(take_rounds(
                rig, [("dead-agent", "fs-freeze")] * dead_rounds + [("dead-agent", "crash")],
                log=log))
            if record:
                replies["dead"] = asyncio.run(record_replies(rig, "dead"))
        if replies:
            (workdir / "agent-replies.json").write_text(json.dumps(replies, indent=1))
        agent_log = rig.agent_log()
    finally:
        rig.stop()
    doc = {"benchmark": "quiesce", "workdir": str(workdir),
           "params": {"rounds": rounds, "dead_rounds": dead_rounds,
                      "freeze_timeout_ms": freeze_timeout_ms, "load": load,
                      "lease_ms": 5000, "budget_ms": 5000},
           "boot_s": round(boot_s, 1), "rows": rows, "dead_agent": dead,
           "summary": summarize(rows),
           "agent_log_tail": agent_log.splitlines()[-20:]}
    (workdir / "quiesce.json").write_text(json.dumps(doc, indent=2))
    return doc


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (phase, quiesce): n, levels reached, min/median/max per column."""
    out = []
    keys = sorted({(r["phase"], r["quiesce"]) for r in rows},
                  key=lambda k: (k[0] != "live", k[1]))
    for phase, q in keys:
        rs = [r for r in rows if (r["phase"], r["quiesce"]) == (phase, q)]
        s: dict[str, Any] = {"phase": phase, "quiesce": q, "n": len(rs),
                             "states": _count(r["state"] for r in rs),
                             "consistency": _count(str(r["consistency"]) for r in rs)}
        for c in COLUMNS:
            xs = sorted(float(r[c]) for r in rs if r[c] is not None)
            s[c] = ({"min": round(xs[0], 1), "median": round(statistics.median(xs), 1),
                     "max": round(xs[-1], 1)} if xs else None)
        out.append(s)
    return out


def _count(it: Any) -> dict[str, int]:
    d: dict[str, int] = {}
    for x in it:
        d[x] = d.get(x, 0) + 1
    return d


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def table(doc: dict[str, Any]) -> str:
    head = ("phase", "quiesce", "n", "reached", "pause ms min/med/max", "freeze ms med",
            "thaw ms med", "prepare ms med", "total ms med")
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    def med(s: dict[str, Any], c: str) -> str:
        return "-" if s[c] is None else f"{s[c]['median']:.1f}"

    for s in doc["summary"]:
        p = s["paused_ms"]
        pause = "-" if p is None else f"{p['min']:.1f} / {p['median']:.1f} / {p['max']:.1f}"
        reached = ", ".join(f"{k} x{v}" for k, v in s["consistency"].items())
        lines.append(" | ".join((s["phase"], s["quiesce"], str(s["n"]), reached, pause,
                                 med(s, "freeze_ms"), med(s, "thaw_ms"),
                                 med(s, "prepare_ms"), med(s, "total_ms"))))
    return "\n".join(lines)


def cli(
    json_out: Annotated[str | None, typer.Option("--json", help="write the results here")] = None,
    rounds: Annotated[int, typer.Option(help="crash + fs-freeze pairs, live guest agent")] = 5,
    dead_rounds: Annotated[int, typer.Option(help="fs-freeze rounds, guest agent stopped")] = 2,
    freeze_timeout_ms: Annotated[int, typer.Option(help="the agent's freeze_timeout_ms")] = 5000,
    workdir: Annotated[str, typer.Option(help="scratch directory (VM disks)")] =
        "/tmp/cp-bench-quiesce",
) -> None:
    """Pause with and without fs-freeze through the real coordinator and agent.

    One Debian PostgreSQL VM under load (TCG), cutpointd on loopback with the
    guest agent configured; rounds alternate crash and fs-freeze; then the
    guest agent is stopped inside the guest and fs-freeze falls back to crash.
    Prints a table, writes JSON with --json.  Needs root; no lab lock (no Ceph).
    """
    if rounds < 1 or dead_rounds < 0:
        raise typer.BadParameter("--rounds must be >= 1 and --dead-rounds >= 0")
    try:
        doc = run(Path(workdir), rounds=rounds, dead_rounds=dead_rounds,
                  freeze_timeout_ms=freeze_timeout_ms, record=True,
                  log=lambda m: typer.echo(m))
    except (QuiesceBenchError, subprocess.CalledProcessError, TimeoutError,
            RuntimeError) as exc:
        typer.echo(f"cutpoint-lab bench quiesce: error: {exc}", err=True)
        raise typer.Exit(1) from None
    typer.echo("")
    typer.echo(table(doc))
    if json_out:
        Path(json_out).write_text(json.dumps(doc, indent=2) + "\n")
        typer.echo(f"\nwrote {json_out}")


# -- a local rig without a guest OS (fast tests) -------------------------------
@dataclass
class LocalRig:
    """Two QEMU processes without a guest OS (QMP and the block layer are
    all the agent touches) and one cutpointd on 127.0.0.1: vm1 has a
    guest-agent channel that nobody answers, vm2 has no `qga` configured."""

    dir: Path
    qemus: list[subprocess.Popen[bytes]]
    agent: subprocess.Popen[bytes]
    port: int
    certs: Path

    def stop(self) -> str:
        """Stop everything, remove the directory; returns the agent's log."""
        from cutpoint.lab.agents import stop_agent_pid

        stop_agent_pid(self.agent.pid)
        self.agent.wait(timeout=10)
        for q in self.qemus:
            q.kill()
            q.wait()
        text = (self.dir / "agent.log").read_text(errors="replace")
        shutil.rmtree(self.dir, ignore_errors=True)
        return text


def start_local_rig(d: Path, freeze_timeout_ms: int = 1000) -> LocalRig:
    """`d` should be short (UNIX socket paths < 108 bytes)."""
    import socket

    from cutpoint.lab.agents import CA_SCRIPT, cutpointd_path

    certs = d / "certs"
    for args in ([str(certs), "issue", "agent", "agent", "127.0.0.1"],
                 [str(certs), "issue", "coordinator", "coordinator", "127.0.0.1"]):
        subprocess.run([str(CA_SCRIPT), *args], check=True, capture_output=True)
    qemus: list[subprocess.Popen[bytes]] = []
    sections = []
    agent = None
    try:
        for v in ("vm1", "vm2"):
            argv = ["qemu-system-x86_64", "-machine", "accel=tcg", "-nodefaults", "-display",
                    "none", "-m", "64", "-serial", "null",
                    "-qmp", f"unix:{d / v}.sock,server=on,wait=off"]
            if v == "vm1":
                argv += ["-device", "virtio-serial",
                         "-chardev", f"socket,path={d / v}.qga,server=on,wait=off,id=qga0",
                         "-device", "virtserialport,chardev=qga0,name=org.qemu.guest_agent.0"]
            f = d / f"{v}.qcow2"
            subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(f), "16M"],
                           check=True)
            argv += ["-blockdev",
                     f"driver=qcow2,node-name=disk0,file.driver=file,file.filename={f}",
                     "-device", "virtio-blk-pci,drive=disk0"]
            qemus.append(subprocess.Popen(argv))
            qga = f"qga = {d / v}.qga\n" if v == "vm1" else ""
            sections.append(f"[vm {v}]\nqmp = {d / v}.sock\n{qga}method = qmp\n"
                            f"disk.disk0 = qcow2:{f}\n")
        for v in ("vm1", "vm2"):
            t0 = time.monotonic()
            while not (d / f"{v}.sock").exists():
                if time.monotonic() - t0 > 20:
                    raise QuiesceBenchError("QEMU did not create its QMP socket")
                time.sleep(0.05)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        cfg = d / "agent.ini"
        cfg.write_text(f"[agent]\nhost = local\nlisten = 127.0.0.1:{port}\n"
                       f"journal = {d / 'journal'}\nqmp_timeout_ms = 2000\n"
                       f"freeze_timeout_ms = {freeze_timeout_ms}\n\n"
                       f"[tls]\nca = {certs / 'ca.pem'}\ncert = {certs / 'agent.pem'}\n"
                       f"key = {certs / 'agent.key'}\n\n" + "\n".join(sections))
        with open(d / "agent.log", "wb") as log:
            agent = subprocess.Popen([str(cutpointd_path()), "-c", str(cfg)], stdout=log,
                                     stderr=log)
        rig = LocalRig(d, qemus, agent, port, certs)
        t0 = time.monotonic()
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                return rig
            except OSError:
                if agent.poll() is not None or time.monotonic() - t0 > 20:
                    raise QuiesceBenchError("cutpointd did not listen: "
                                            + (d / "agent.log").read_text()) from None
                time.sleep(0.05)
    except BaseException:
        if agent is not None and agent.poll() is None:
            agent.kill()
            agent.wait(timeout=10)
        for q in qemus:
            q.kill()
            q.wait()
        raise
