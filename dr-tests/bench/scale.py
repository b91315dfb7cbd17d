"""`cutpoint-lab bench scale`: coordination against group size (issue 19, goal 2).

Group snapshots of N VMs x D disks, spread round-robin over the lab's
primary hosts, through the real coordinator and the real agents, for each
N in `--vms` (10, 25, 50, 100).  The VMs are QEMU processes with no guest
(`-machine none`: no CPU, no RAM to speak of) and small RBD disks on the
lab's primary Ceph, so that 100 of them fit in memory; QMP `stop`/`cont`
and the member snapshots are the same calls as on a booted guest (stop
drains and flushes the block layer either way).  The bench starts its own
QEMUs and agent configs on a VM-less lab, and removes them afterwards.

Per N it reports the per-VM pause p50/p99, the backend snapshot time and
the coordination overhead (pause minus backend; `cutpoint.bench.groupsnap`
computes them, as for `bench pause`), and, measured in the same run, the
agent round trip (`hello` over the lab's bridge, TLS: what one protocol
step costs at least).  The goal it is read against (issue 19): overhead
p99 <= 2 round trips + 2 ms, and flat in N (within 20 % from 10 to 100).

Prints a table and writes JSON; a benchmark, never a timed test.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from cutpoint.bench.groupsnap import (
    BenchError,
    Log,
    PauseConfig,
    _f,
    _pause_rows,
    summary,
)
from cutpoint.lab.ceph import rbd_cmd
from cutpoint.lab.proc import kill_pids, pid_alive, read_pidfile, run

GOAL_RTTS = 2
GOAL_SLACK_MS = 2.0
GOAL_FLAT = 0.20


@dataclass
class ScaleConfig:
    vms: list[int] = field(default_factory=lambda: [10, 25, 50, 100])
    disks: int = 3
    hosts: int = 4
    rounds: int = 10
    warmup: int = 1
    disk_size_mb: int = 16
    lease_ms: int = 5000
    budget_ms: int = 3000
    rtt_samples: int = 200
    # The agents' [agent] pause_path; None: the agent's default (redirect).
    pause_path: str | None = None
    # The agents' [agent] redirect_inline_max; None: the agent's default.
    redirect_inline_max: int | None = None

    def lab_params(self) -> dict[str, Any]:
        # VM-less: the bench makes its own guest-less QEMUs.
        return {"hosts": self.hosts, "vms_per_host": 0, "disks": self.disks,
                "disk_size_mb": self.disk_size_mb}


def plan(status: dict[str, Any], cfg: ScaleConfig) -> list[dict[str, Any]]:
    """max(cfg.vms) VM records, round-robin over the primary hosts, in the
    shape of the lab status's `vms` (what the agents' configs, the group
    spec and `groupsnap.spread_vms` read)."""
    hosts = [h for h in status["hosts"] if h.get("site", "primary") == "primary"]
    if not hosts:
        raise BenchError("the lab has no primary host")
    site = status["sites"]["primary"]
    root = Path(status["state_dir"]) / "bench-scale"
    out = []
    for i in range(max(cfg.vms)):
        h = hosts[i % len(hosts)]
        name = f"scale-{h['name']}-vm{i // len(hosts) + 1}"
        d = root / name
        out.append({
            "name": name, "host": h["name"], "site": "primary", "dir": str(d),
            "qmp": str(d / "qmp.sock"), "pidfile": str(d / "qemu.pid"), "pid": 0,
            "backend": "rbd",
            "disks": [{"node": f"disk{k}", "backend": "rbd", "pool": site["pool"],
                       "image": f"{name}-disk{k}", "site": "primary",
                       "size_mb": cfg.disk_size_mb} for k in range(cfg.disks)]})
    return out


def qemu_argv(vm: dict[str, Any], site: dict[str, Any]) -> list[str]:
    """A QEMU with no guest: no machine, so no CPU to run and no RAM to
    allocate, only the block layer (the RBD nodes) and QMP."""
    argv = ["qemu-system-x86_64", "-name", f"guest={vm['name']},process=cpscale-{vm['name']}",
            "-nodefaults", "-no-user-config", "-machine", "none", "-display", "none",
            "-qmp", f"unix:{vm['qmp']},server=on,wait=off",
            "-pidfile", vm["pidfile"], "-daemonize"]
    for disk in vm["disks"]:
        argv += ["-blockdev",
                 (f"driver=rbd,node-name={disk['node']},pool={disk['pool']},"
                 f"image={disk['image']},conf={site.get('qemu_conf') or site['ceph_conf']},"
                 f"user={site['client_id']}")]
    return argv


def start_vms(status: dict[str, Any], vms: list[dict[str, Any]], log: Log) -> None:
    site = status["sites"]["primary"]
    mark = str(status["state_dir"])  # `cutpoint-lab down` finds them by it

    def image(disk: dict[str, Any]) -> None:
        run(rbd_cmd(site, "create", "--size", f"{disk['size_mb']}M",
                    f"{disk['pool']}/{disk['image']}"), timeout=120)

    def one(vm: dict[str, Any]) -> None:
        Path(vm["dir"]).mkdir(parents=True, exist_ok=True)
        for f in (vm["qmp"], vm["pidfile"]):
            Path(f).unlink(missing_ok=True)
        run(["ip", "netns", "exec", vm["host"], *qemu_argv(vm, site)], mark=mark, timeout=120)
        vm["pid"] = read_pidfile(Path(vm["pidfile"]))
        if not pid_alive(vm["pid"]):
            raise BenchError(f"{vm['name']}: QEMU exited right after start")

    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=8) as ex:
        list(ex.map(image, [d for vm in vms for d in vm["disks"]]))
    log(f"scale: {sum(len(v['disks']) for v in vms)} RBD images of "
        f"{vms[0]['disks'][0]['size_mb']} MiB in {time.monotonic() - t0:.0f} s")
    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=4) as ex:
        list(ex.map(one, vms))
    log(f"scale: {len(vms)} guest-less QEMUs started in {time.monotonic() - t0:.0f} s")


def stop_vms(status: dict[str, Any], vms: list[dict[str, Any]]) -> None:
    pids = [p for p in (read_pidfile(Path(v["pidfile"])) if Path(v["pidfile"]).exists()
                        else v.get("pid", 0) for v in vms) if p and pid_alive(p)]
    kill_pids(pids)
    site = status["sites"]["primary"]

    def rm(disk: dict[str, Any]) -> None:
        # Member snapshots first (every txn here committed or was aborted
        # and cleaned; purge whatever is left), then the image.
        spec = f"{disk['pool']}/{disk['image']}"
        subprocess.run(rbd_cmd(site, "snap", "purge", "--no-progress", spec),
                       capture_output=True, check=False, timeout=120)
        subprocess.run(rbd_cmd(site, "rm", "--no-progress", spec),
                       capture_output=True, check=False, timeout=120)

    with ThreadPoolExecutor(max_workers=8) as ex:
        list(ex.map(rm, [d for vm in vms for d in vm["disks"]]))


def rss_mib(vms: list[dict[str, Any]]) -> float:
    """Resident memory of the QEMUs, MiB in all."""
    total = 0
    for vm in vms:
        try:
            for line in Path(f"/proc/{vm['pid']}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total / 1024


async def wait_ready(status: dict[str, Any], certs: Path, timeout_s: float = 180) -> float:
    """Until every agent's inventory says each of its VMs is `ready` (its
    disks open: a prepare before that is BUSY "its disks are not open
    yet").  Returns the seconds waited.  The agents open 3 x N RBD disks
    after they start; in the run of 2026-11-28 03:10 the first rounds came
    before that and 9 of 10 aborted."""
    from cutpoint.agentclient import AgentClient, client_context

    ctx = client_context(certs / "ca.pem", certs / "coordinator.pem", certs / "coordinator.key")
    t0 = time.monotonic()
    while True:
        waiting = []
        for h in status["hosts"]:
            async with AgentClient(h["address"], 7443, ssl_context=ctx) as c:
                inv = await c.inventory()
            waiting += [v.get("name") for v in inv.get("vms", []) if not v.get("ready")]
        if not waiting:
            return time.monotonic() - t0
        if time.monotonic() - t0 > timeout_s:
            raise BenchError(f"{len(waiting)} VMs not ready after {timeout_s:.0f} s "
                             f"(disks not open), e.g. {waiting[:3]}")
        await asyncio.sleep(1)


async def agent_rtt(status: dict[str, Any], certs: Path, samples: int) -> dict[str, Any]:
    """Round trips of `hello` to every agent, one at a time, on connections
    opened first: the protocol's cheapest step over the lab's network."""
    from cutpoint.agentclient import AgentClient, client_context

    ctx = client_context(certs / "ca.pem", certs / "coordinator.pem", certs / "coordinator.key")
    ms: list[float] = []
    for h in status["hosts"]:
        async with AgentClient(h["address"], 7443, ssl_context=ctx) as c:
            await c.hello()
            for _ in range(max(1, samples // len(status["hosts"]))):
                t = time.perf_counter()
                await c.hello()
                ms.append((time.perf_counter() - t) * 1000)
    return {"samples": ms, **summary(ms)}


def agent_extra(cfg: ScaleConfig) -> str:
    """The [agent] keys the bench sets in each agent's config."""
    keys = []
    if cfg.pause_path:
        keys.append(f"pause_path = {cfg.pause_path}")
    if cfg.redirect_inline_max is not None:
        keys.append(f"redirect_inline_max = {cfg.redirect_inline_max}")
    return "\n[agent]\n" + "\n".join(keys) + "\n" if keys else ""


def run_scale(status: dict[str, Any], cfg: ScaleConfig, log: Log) -> dict[str, Any]:
    from cutpoint.lab.agents import start_agents, stop_agents

    if max(cfg.vms) > 64 * cfg.hosts:
        raise BenchError(f"{max(cfg.vms)} VMs on {cfg.hosts} hosts: an agent takes 64 at most")
    certs = Path(status["state_dir"]) / "certs"
    vms = plan(status, cfg)
    # The lab's status with our VMs and only the primary hosts: what the
    # agents' configs and the group spec are made from.
    ours = {**status, "vms": vms,
            "hosts": [h for h in status["hosts"] if h.get("site", "primary") == "primary"]}
    extra = agent_extra(cfg)
    try:
        start_vms(status, vms, log)
        mem = rss_mib(vms)
        log(f"scale: QEMU resident memory {mem:.0f} MiB in all")
        start_agents(ours, certs, standby=False, extra=extra)
        log(f"scale: every VM ready (disks open) after "
            f"{asyncio.run(wait_ready(ours, certs)):.1f} s")
        rtt = asyncio.run(agent_rtt(ours, certs, cfg.rtt_samples))
        log(f"scale: agent round trip (hello) p50 {_f(rtt['p50'], '{:.3f}')} ms, "
            f"p99 {_f(rtt['p99'], '{:.3f}')} ms")
        pcfg = PauseConfig(vms=cfg.vms, disks=cfg.disks, hosts=cfg.hosts, rounds=cfg.rounds,
                           warmup=cfg.warmup, lease_ms=cfg.lease_ms, budget_ms=cfg.budget_ms)
        load = [os.getloadavg()[0]]
        with tempfile.TemporaryDirectory(prefix="cp-bench-scale-") as tmp:
            rows = asyncio.run(_pause_rows(ours, pcfg, certs, f"sqlite:///{tmp}/coord.db",
                                           0, log))
        load.append(os.getloadavg()[0])
        rtt_after = asyncio.run(agent_rtt(ours, certs, cfg.rtt_samples))
    finally:
        stop_agents(ours)
        stop_vms(status, vms)
    rtt_all = rtt["samples"] + rtt_after["samples"]
    rtt_sum = summary(rtt_all)
    goal = GOAL_RTTS * float(rtt_sum["p50"] or 0.0) + GOAL_SLACK_MS
    for r in rows:
        r["goal_overhead_p99_ms"] = goal
        p99 = r["overhead_ms"]["p99"]
        r["meets_goal"] = p99 is not None and p99 <= goal
    p99s = [r["overhead_ms"]["p99"] for r in rows if r["overhead_ms"]["p99"] is not None]
    flat = (max(p99s) / min(p99s) - 1) if p99s and min(p99s) > 0 else None
    return {"benchmark": "scale", "config": asdict(cfg),
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "lab": {"accel": status.get("accel"), "hosts": len(ours["hosts"]),
                    "paxos": status["sites"]["primary"].get("paxos")},
            "qemu_rss_mib": mem, "cpus": os.cpu_count(),
            "loadavg_1m": [round(x, 2) for x in load],
            "agent_rtt_ms": {"before": {k: v for k, v in rtt.items() if k != "samples"},
                             "after": {k: v for k, v in rtt_after.items() if k != "samples"},
                             **rtt_sum},
            "goal": {"overhead_p99_max_ms": goal, "flat_within": GOAL_FLAT},
            "overhead_p99_spread": flat, "rows": rows}


def scale_table(doc: dict[str, Any]) -> str:
    rtt = doc["agent_rtt_ms"]
    lines = [("| VMs | disks | hosts | pause p50 / p99 (ms) | backend p50 / p99 (ms) | "
              "overhead p50 / p99 (ms) | of which stop / barrier / cont p99 (ms) | "
              "group total p50 / p99 (ms) | committed / aborted |"),
             "|" + "---|" * 9]
    for r in doc["rows"]:
        def two(k: str, r: dict[str, Any] = r) -> str:
            return f"{_f(r[k]['p50'])} / {_f(r[k]['p99'])}"
        parts = " / ".join(_f(r[k]["p99"]) if k in r else "-"
                           for k in ("stop_ms", "barrier_ms", "cont_ms"))
        lines.append(f"| {r['vms']} | {r['disks']} | {r['hosts']} | {two('pause_ms')} | "
                     f"{two('snapshot_ms')} | {two('overhead_ms')} | {parts} | "
                     f"{two('total_ms')} | {r['committed']} / {r['aborted']} |")
    spread = doc.get("overhead_p99_spread")
    cfg = doc.get("config", {})
    inline = cfg.get("redirect_inline_max")
    paths = "; ".join(f"{r['vms']} VMs: " + (", ".join(f"{k} {v}" for k, v in
                                                       sorted(r.get("paths", {}).items()))
                                             or "none")
                      for r in doc["rows"])
    lines += ["",
              (f"agents' [agent] pause_path {cfg.get('pause_path') or '(default)'}, "
               f"redirect_inline_max {inline if inline is not None else '(default)'}; "
               f"cuts per path: {paths}"),
              (f"{doc.get('cpus')} CPUs, load average (1 min) {doc.get('loadavg_1m')} "
              f"before / after the rounds; QEMU RSS {doc.get('qemu_rss_mib', 0):.0f} MiB"),
              (f"agent round trip (hello, same run): p50 {_f(rtt['p50'], '{:.3f}')} ms, "
              f"p99 {_f(rtt['p99'], '{:.3f}')} ms; goal: overhead p99 <= "
              f"{GOAL_RTTS} x p50 + {GOAL_SLACK_MS:g} ms = "
              f"{doc['goal']['overhead_p99_max_ms']:.2f} ms, flat within "
              f"{GOAL_FLAT:.0%} (seen: overhead p99 spread "
              f"{_f(spread * 100 if spread is not None else None, '{:.0f}')}%)")]
    return "\n".join(lines)


def write_json(doc: dict[str, Any], path: str) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(doc, indent=2) + "\n")
