"""Group snapshot benchmarks (issue 4, item 7): pause, snapsize, overhead.

Each prints a table and returns a JSON-able document; none asserts on time.

- pause: per VM count, p50/p99/max of the per-VM pause, the backend
  snapshot time, the coordination overhead (pause minus backend) and the
  group total, through the real coordinator and agents (GCVM Fig. 4.14);
  per agent pause_path (agent-protocol §5.1) too.  On the redirect path
  the backend time is that of the snapshots after `cont`, and the
  overhead is the whole pause.
- snapsize: `rbd_snap_create` time against image size (thin) and against
  fill level (GCVM Fig. 4.13, Table 4.1), librbd on an opened image.
- overhead: guest writer throughput without, with, and again without
  periodic group snapshots, in one run (GCVM "Consecutive Snapshots").
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from cutpoint.lab.ceph import rbd_cmd

Log = Callable[[str], None]
HERE = Path(__file__).resolve().parent
SYSTEM_PYTHON = "/usr/bin/python3"  # has Debian's python3-rbd


class BenchError(Exception):
    """A benchmark step failed; carries what was run and what came back."""


# ---- statistics --------------------------------------------------------------

def percentile(xs: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100); None for no data."""
    if not xs:
        return None
    s = sorted(xs)
    k = max(1, math.ceil(q / 100.0 * len(s)))
    return s[k - 1]


def summary(xs: list[float]) -> dict[str, float | int | None]:
    return {"n": len(xs), "p50": percentile(xs, 50), "p99": percentile(xs, 99),
            "max": max(xs) if xs else None,
            "mean": sum(xs) / len(xs) if xs else None}


def _f(v: float | None, fmt: str = "{:.1f}") -> str:
    return "-" if v is None else fmt.format(v)


# ---- pause -------------------------------------------------------------------

@dataclass
class PauseConfig:
    vms: list[int]
    disks: int = 3
    hosts: int = 3
    rounds: int = 20
    warmup: int = 1
    workload: str = "none"
    disk_size_mb: int = 64
    lease_ms: int = 2000
    budget_ms: int = 1000
    # Added snapshot latency of the primary site's backend, one set of rows
    # per value (cutpoint.lab.backend_latency); 0 = the lab's tuned mon.
    backend_latency_ms: list[int] = field(default_factory=lambda: [0])
    # The agents' [agent] pause_path, one set of rows each (agents restarted
    # between): "live" (the switch with the vCPUs running, the network held
    # until COMMIT), "redirect" (the default cut where a VM can take it) or
    # "in_pause" (snapshots inside the pause: the path before redirect).
    pause_paths: list[str] = field(default_factory=lambda: ["redirect"])

    def lab_params(self) -> dict[str, Any]:
        return {"hosts": self.hosts,
                "vms_per_host": math.ceil(max(self.vms) / self.hosts),
                "disks": self.disks, "workload": self.workload,
                "disk_size_mb": self.disk_size_mb,
                **redirect_driver(self.pause_paths)}


def redirect_driver(pause_paths: list[str]) -> dict[str, Any]:
    """The lab's VM driver for rows of these pause paths: only the agent's
    qmp driver takes the redirect cut (agent-protocol §5.1; a libvirt domain
    keeps the cut in the pause), so a bench asked for `redirect` or `live`
    runs raw QEMU VMs; otherwise the lab's default driver."""
    return {"driver": "qemu"} if {"redirect", "live"} & set(pause_paths) else {}


def spread_vms(status: dict[str, Any], n: int) -> list[str]:
    """n primary VMs, taken round-robin over the hosts (so a group of n
    spans min(n, hosts) hosts)."""
    by_host: dict[str, list[str]] = {}
    for vm in status["vms"]:
        if vm.get("site", "primary") == "primary":
            by_host.setdefault(vm["host"], []).append(vm["name"])
    order: list[str] = []
    for i in range(max((len(v) for v in by_host.values()), default=0)):
        for host in sorted(by_host):
            if i < len(by_host[host]):
                order.append(by_host[host][i])
    if n > len(order):
        raise BenchError(f"the lab has {len(order)} primary VMs, {n} wanted")
    return order[:n]


async def _pause_rounds(status: dict[str, Any], cfg: PauseConfig, certs: Path,
                        db_url: str, path: str, log: Log) -> list[dict[str, Any]]:
    from cutpoint.lab.backend_latency import set_backend_latency
    rows = []
    site = status["sites"]["primary"]
    try:
        for lat in cfg.backend_latency_ms:
            mon = set_backend_latency(site, lat)
            log(f"pause: pause_path {path}, backend latency +{lat} ms (mon {mon})")
            for row in await _pause_rows(status, cfg, certs, db_url, lat, log):
                row["pause_path"] = path
                rows.append(row)
    finally:
        set_backend_latency(site, 0)
    return rows


async def _pause_rows(status: dict[str, Any], cfg: PauseConfig, certs: Path,
                      db_url: str, latency_ms: int, log: Log) -> list[dict[str, Any]]:
    from cutpoint.coordinator import TxLog, pool_for, take_group_snapshot
    from cutpoint.lab.groupfile import spec_from_lab
    rows = []
    txlog = TxLog(db_url)
    try:
        for n in cfg.vms:
            names = spread_vms(status, n)
            spec = spec_from_lab(status, group=f"bench-pause-{n}", certs_dir=certs,
                                 vms=names, lease_ms=cfg.lease_ms,
                                 budget_ms=cfg.budget_ms)
            pool = pool_for(spec)
            row: dict[str, Any] = {"backend_latency_ms": latency_ms,
                                   "vms": n, "disks": n * cfg.disks,
                                   "hosts": len({a.name for a in spec.agents}),
                                   "committed": 0, "aborted": 0, "reasons": [],
                                   "pause_ms": [], "snapshot_ms": [],
                                   "overhead_ms": [], "total_ms": [],
                                   "stop_ms": [], "cont_ms": [], "paths": {},
                                   # live cut: how long each VM's sent
                                   # packets were held (until its resume)
                                   "held_ms": [],
                                   # the pause's parts (agent-protocol §3.6,
                                   # §5.1): the switch inside it, the wait
                                   # for COMMIT, and the coordinator's
                                   # COMMITTING write (per round)
                                   "switch_ms": [], "barrier_ms": [],
                                   "log_commit_ms": [], "prepare_ms": [],
                                   # per agent and round: its time before its
                                   # first stop, its journal write; per round:
                                   # last PREPARED minus first (agent skew)
                                   "prestop_ms": [], "journal_ms": [],
                                   "agent_skew_ms": []}
            try:
                for i in range(cfg.warmup + cfg.rounds):
                    r = await take_group_snapshot(spec, txlog, pool=pool)
                    if i < cfg.warmup:  # opens connections: not counted
                        continue
                    if not r.committed:
                        row["aborted"] += 1
                        row["reasons"].append(r.reason)
                        continue
                    row["committed"] += 1
                    for v in r.vms:
                        # the path each member took, as its agent said
                        p = v.pause_path or "unknown"
                        row["paths"][p] = row["paths"].get(p, 0) + 1
                        for key, val in (("pause_ms", v.paused_ms),
                                         ("snapshot_ms", v.snapshot_ms),
                                         ("overhead_ms", v.overhead_ms),
                                         ("stop_ms", v.stop_ms),
                                         ("cont_ms", v.cont_ms),
                                         ("switch_ms", v.switch_ms),
                                         ("held_ms", v.held_ms),
                                         ("barrier_ms", v.barrier_ms)):
                            if val is not None:
                                row[key].append(val)
                    for key in ("total_ms", "log_commit_ms", "prepare_ms"):
                        val = r.timings.get(key)
                        if val is not None:
                            row[key].append(float(val))
                    per_agent = _per_agent(r.timings)
                    for key in ("prestop_ms", "journal_ms"):
                        row[key] += list(per_agent.get(key, {}).values())
                    prepared = list(per_agent.get("prepared_ms", {}).values())
                    if len(prepared) > 1:
                        row["agent_skew_ms"].append(max(prepared) - min(prepared))
            finally:
                await pool.close()
            for key in ("pause_ms", "snapshot_ms", "overhead_ms", "total_ms",
                        "stop_ms", "cont_ms", "switch_ms", "held_ms", "barrier_ms",
                        "log_commit_ms", "prepare_ms", "prestop_ms", "journal_ms",
                        "agent_skew_ms"):
                row[key] = {"samples": row[key], **summary(row[key])}
            log(f"pause: +{latency_ms} ms, {n} VMs x {cfg.disks} disks on "
                f"{row['hosts']} hosts: pause p99 {_f(row['pause_ms']['p99'])} ms, overhead p99 "
                f"{_f(row['overhead_ms']['p99'])} ms ({row['committed']} committed, "
                f"{row['aborted']} aborted)")
            rows.append(row)
    finally:
        txlog.dispose()
    return rows


def _per_agent(timings: dict[str, Any]) -> dict[str, dict[str, float]]:
    """The coordinator's per-agent timings ("prepared_ms:<agent>", ...) as
    {"prepared_ms": {agent: ms}, ...}."""
    out: dict[str, dict[str, float]] = {}
    for k, v in timings.items():
        if ":" in k and isinstance(v, (int, float)):
            name, agent = k.split(":", 1)
            out.setdefault(name, {})[agent] = float(v)
    return out


def run_pause(status: dict[str, Any], cfg: PauseConfig, log: Log) -> dict[str, Any]:
    """Agents on every host, then cfg.rounds group snapshots per VM count."""
    from cutpoint.lab.agents import start_agents, stop_agents
    certs = Path(status["state_dir"]) / "certs"
    rows: list[dict[str, Any]] = []
    for path in cfg.pause_paths:
        start_agents(status, certs, extra=f"\n[agent]\npause_path = {path}\n")
        try:
            with tempfile.TemporaryDirectory(prefix="cp-bench-") as tmp:
                rows += asyncio.run(_pause_rounds(status, cfg, certs,
                                                  f"sqlite:///{tmp}/coord.db", path, log))
        finally:
            stop_agents(status)
    return {"benchmark": "pause", "config": asdict(cfg),
            "lab": {"accel": status.get("accel"), "hosts": len(status["hosts"]),
                    "vms": len(status["vms"])},
            "rows": rows}


def pause_table(doc: dict[str, Any]) -> str:
    head = ("| backend latency | path (members) | VMs | disks | hosts | "
            "pause p50 / p99 / max (ms) | "
            "backend p50 / p99 / max (ms) | overhead p50 / p99 / max (ms) | "
            "group total p50 / p99 / max (ms) | committed / aborted |")
    lines = [head, "|" + "---|" * 10]
    for r in doc["rows"]:
        def trio(k: str, r: dict[str, Any] = r) -> str:
            s = r[k]
            return f"{_f(s['p50'])} / {_f(s['p99'])} / {_f(s['max'])}"
        paths = ", ".join(f"{k} {v}" for k, v in sorted(r.get("paths", {}).items()))
        lines.append(f"| +{r.get('backend_latency_ms', 0)} ms | "
                     f"{r.get('pause_path', '-')} ({paths or '-'}) | {r['vms']} | {r['disks']} | "
                     f"{r['hosts']} | {trio('pause_ms')} | {trio('snapshot_ms')} | "
                     f"{trio('overhead_ms')} | {trio('total_ms')} | "
                     f"{r['committed']} / {r['aborted']} |")
    lines += ["", ("Where the pause goes (per VM: stop, switch, stop done to COMMIT, "
              "cont; per agent: its time before its first stop, of which its journal "
              "write; per group: the prepare round, the spread of the agents' PREPARED, "
              "the COMMITTING write; on the live path there is no stop: its stop and "
              "pause are the switch, and the guest's sent packets are held until "
              "COMMIT, the last column):"), "",
              ("| backend latency | path | stop p50 / p99 (ms) | switch p50 / p99 (ms) | "
              "stop done to COMMIT p50 / p99 (ms) | cont p50 / p99 (ms) | "
              "agent before stops p50 / p99 (ms) | agent journal p50 / p99 (ms) | "
              "prepare round p50 / p99 (ms) | agents' PREPARED spread p50 / p99 (ms) | "
              "COMMITTING write p50 / p99 (ms) | live: network held p50 / p99 (ms) |"),
              "|" + "---|" * 12]
    for r in doc["rows"]:
        def duo(k: str, r: dict[str, Any] = r) -> str:
            s = r.get(k) or {}
            return f"{_f(s.get('p50'))} / {_f(s.get('p99'))}"
        lines.append(f"| +{r.get('backend_latency_ms', 0)} ms | {r.get('pause_path', '-')} | "
                     f"{duo('stop_ms')} | {duo('switch_ms')} | {duo('barrier_ms')} | "
                     f"{duo('cont_ms')} | {duo('prestop_ms')} | {duo('journal_ms')} | "
                     f"{duo('prepare_ms')} | {duo('agent_skew_ms')} | "
                     f"{duo('log_commit_ms')} | {duo('held_ms')} |")
    return "\n".join(lines)


# ---- snapsize ----------------------------------------------------------------

@dataclass
class SnapsizeConfig:
    sizes_gib: list[int]
    fill_pct: list[int]
    fill_image_gib: int = 1
    rounds: int = 20
    pool: str = "rbd"


def _run(argv: list[str], timeout: float = 600) -> str:
    res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if res.returncode != 0:
        raise BenchError(f"command failed (rc={res.returncode}): {' '.join(argv)}: "
                         f"{res.stderr.strip()[-500:]}")
    return res.stdout


def _snaptime(site: dict[str, Any], pool: str, image: str, rounds: int) -> list[float]:
    argv = [SYSTEM_PYTHON, str(HERE / "rbd_snaptime.py"), site["ceph_conf"],
            site.get("client_id", "admin"), site["keyring"], pool, image, str(rounds)]
    out = _run(argv)
    return [float(x) for x in json.loads(out)["snap_ms"]]


def run_snapsize(status: dict[str, Any], cfg: SnapsizeConfig, log: Log) -> dict[str, Any]:
    site = status["sites"]["primary"]
    rows_size, rows_fill = [], []
    made: list[str] = []
    try:
        for gib in cfg.sizes_gib:
            image = f"{cfg.pool}/bench-snapsize-{gib}g"
            _run(rbd_cmd(site, "create", "--size", f"{gib}G", image))
            made.append(image)
            ms = _snaptime(site, cfg.pool, image.split("/", 1)[1], cfg.rounds)
            rows_size.append({"size_gib": gib, "fill_pct": 0, "snap_ms": ms, **summary(ms)})
            log(f"snapsize: {gib} GiB thin: p50 {_f(percentile(ms, 50))} ms")
        size_b = cfg.fill_image_gib << 30
        for pct in cfg.fill_pct:
            image = f"{cfg.pool}/bench-snapfill-{pct}"
            _run(rbd_cmd(site, "create", "--size", f"{cfg.fill_image_gib}G", image))
            made.append(image)
            fill = size_b * pct // 100
            if fill:
                _run(rbd_cmd(site, "bench", "--io-type", "write", "--io-size", "4M",
                             "--io-pattern", "seq", "--io-threads", "4",
                             "--io-total", str(fill), image), timeout=1800)
            ms = _snaptime(site, cfg.pool, image.split("/", 1)[1], cfg.rounds)
            rows_fill.append({"size_gib": cfg.fill_image_gib, "fill_pct": pct,
                              "snap_ms": ms, **summary(ms)})
            log(f"snapsize: {cfg.fill_image_gib} GiB {pct}% full: p50 "
                f"{_f(percentile(ms, 50))} ms")
    finally:
        for image in made:
            subprocess.run(rbd_cmd(site, "rm", "--no-progress", image),
                           capture_output=True, check=False)
    return {"benchmark": "snapsize", "config": asdict(cfg),
            "paxos": status["sites"]["primary"].get("paxos"),
            "by_size": rows_size, "by_fill": rows_fill}


def snapsize_table(doc: dict[str, Any]) -> str:
    lines = ["| series | image size | written | snapshot p50 (ms) | p99 (ms) | max (ms) | n |",
             "|---|---|---|---|---|---|---|"]
    for series, rows in (("size", doc["by_size"]), ("fill", doc["by_fill"])):
        for r in rows:
            lines.append(f"| {series} | {r['size_gib']} GiB | {r['fill_pct']}% | "
                         f"{_f(r['p50'])} | {_f(r['p99'])} | {_f(r['max'])} | {r['n']} |")
    return "\n".join(lines)


# ---- overhead ----------------------------------------------------------------

PROGRESS = re.compile(r"cp-writer: progress vm=(\d+) seq=(\d+)")


@dataclass
class OverheadConfig:
    """Alternating phases without and with snapshots (baseline, snapshots,
    baseline, snapshots, ..., baseline), so that a drift of the machine's
    speed over the run hits both sides alike: every snapshot phase lies
    between two baselines, and is judged against their mean (`bracketed`).
    The writer runs `warmup_s` untimed first: in the runs of 2026-11-27 the
    first baseline, right after the writer started, was the fastest phase
    of the run."""

    interval_s: float = 10.0
    phase_s: float = 30.0
    cycles: int = 3
    warmup_s: float = 30.0
    hosts: int = 2
    disks: int = 3
    # The agents' [agent] pause_path (agent-protocol §5.1); None: the
    # agent's default, unset in their config.
    pause_path: str | None = None

    def lab_params(self) -> dict[str, Any]:
        return {"hosts": self.hosts, "vms_per_host": 1, "disks": self.disks,
                "workload": "writer", "workload_args": "--progress=1",
                "disk_size_mb": 64,
                **redirect_driver([self.pause_path] if self.pause_path else [])}


def writer_seq(status: dict[str, Any]) -> int:
    """The highest seq any guest's writer has reported (ring-global)."""
    best = 0
    for vm in status["vms"]:
        text = Path(vm["console"]).read_text(errors="replace")
        for m in PROGRESS.finditer(text):
            best = max(best, int(m.group(2)))
    return best


def _wait_seq(status: dict[str, Any], at_least: int, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while writer_seq(status) < at_least:
        if time.monotonic() > deadline:
            raise BenchError(f"the guest writer did not reach seq {at_least} in {timeout}s")
        time.sleep(0.5)


async def _overhead_phases(status: dict[str, Any], cfg: OverheadConfig, certs: Path,
                           db_url: str, log: Log) -> list[dict[str, Any]]:
    from cutpoint.coordinator import TxLog, pool_for, take_group_snapshot
    from cutpoint.lab.groupfile import spec_from_lab
    spec = spec_from_lab(status, group="bench-overhead", certs_dir=certs)
    txlog = TxLog(db_url)
    pool = pool_for(spec)
    phases = []
    try:
        plan = [(f"{kind}-{c + 1}", kind == "snapshots")
                for c in range(cfg.cycles) for kind in ("baseline", "snapshots")]
        plan.append((f"baseline-{cfg.cycles + 1}", False))
        if cfg.warmup_s > 0:
            log(f"overhead: warm-up: the writer runs {cfg.warmup_s:.0f} s untimed")
            await asyncio.sleep(cfg.warmup_s)
        for name, snapshots in plan:
            s0, t0 = writer_seq(status), time.monotonic()
            taken, aborted, pauses, paths = 0, 0, [], {}
            next_at = t0
            while time.monotonic() - t0 < cfg.phase_s:
                if snapshots and time.monotonic() >= next_at:
                    r = await take_group_snapshot(spec, txlog, pool=pool)
                    taken += r.committed
                    aborted += not r.committed
                    pauses += [v.paused_ms for v in r.vms if v.paused_ms is not None]
                    for v in r.vms:     # the path each member took, as its agent said
                        paths[v.pause_path or "unknown"] = \
                            paths.get(v.pause_path or "unknown", 0) + 1
                    next_at += cfg.interval_s
                await asyncio.sleep(0.2)
            s1, t1 = writer_seq(status), time.monotonic()
            rate = (s1 - s0) / (t1 - t0)
            phases.append({"phase": name, "with_snapshots": snapshots,
                           "seconds": t1 - t0, "records": s1 - s0,
                           "records_per_s": rate, "snapshots": taken, "aborted": aborted,
                           "pause_ms": summary(pauses), "paths": paths,
                           "loadavg_1m": os.getloadavg()[0]})
            log(f"overhead: {name}: {rate:.1f} records/s over {t1 - t0:.0f} s"
                + (f", {taken} group snapshots" if snapshots else ""))
    finally:
        await pool.close()
        txlog.dispose()
    return phases


def run_overhead(status: dict[str, Any], cfg: OverheadConfig, log: Log) -> dict[str, Any]:
    from cutpoint.lab.agents import start_agents, stop_agents
    certs = Path(status["state_dir"]) / "certs"
    _wait_seq(status, 100)
    start_agents(status, certs, extra=(f"\n[agent]\npause_path = {cfg.pause_path}\n"
                                       if cfg.pause_path else ""))
    try:
        with tempfile.TemporaryDirectory(prefix="cp-bench-") as tmp:
            phases = asyncio.run(_overhead_phases(status, cfg, certs,
                                                  f"sqlite:///{tmp}/coord.db", log))
    finally:
        stop_agents(status)
    base = [p["records_per_s"] for p in phases if not p["with_snapshots"]]
    snap = [p["records_per_s"] for p in phases if p["with_snapshots"]]
    return {"benchmark": "overhead", "config": asdict(cfg),
            "vms": len(status["vms"]), "phases": phases, **overhead_ratios(base, snap)}


def overhead_ratios(base: list[float], snap: list[float]) -> dict[str, Any]:
    """The throughput with snapshots against the baseline.  `ratio`: mean over
    mean.  `bracketed`: each snapshot phase over the mean of the baselines
    just before and after it (there is one more baseline than snapshot
    phases), which cancels a drift that is linear over three phases; its
    median is the verdict, since one disturbed phase moves a mean."""
    base_mean = sum(base) / len(base)
    snap_mean = sum(snap) / len(snap)
    bracketed = [s / ((base[i] + base[i + 1]) / 2) if base[i] + base[i + 1] else None
                 for i, s in enumerate(snap) if i + 1 < len(base)]
    known = sorted(b for b in bracketed if b is not None)
    return {"baseline_records_per_s": base_mean,
            "with_snapshots_records_per_s": snap_mean,
            "ratio": snap_mean / base_mean if base_mean else None,
            "cycle_ratios": [s / b if b else None for b, s in zip(base, snap)],
            "bracketed_ratios": bracketed,
            "bracketed_median": statistics.median(known) if known else None}


def overhead_table(doc: dict[str, Any]) -> str:
    lines = [("| phase | seconds | records | records/s | group snapshots | "
              "pause p50 / max (ms) | path (members) | load (1 min) |"),
             "|---|---|---|---|---|---|---|---|"]
    for p in doc["phases"]:
        pz = p["pause_ms"]
        paths = ", ".join(f"{k} {v}" for k, v in sorted(p.get("paths", {}).items()))
        lines.append(f"| {p['phase']} | {p['seconds']:.0f} | {p['records']} | "
                     f"{p['records_per_s']:.1f} | {p['snapshots']} | "
                     f"{_f(pz['p50'])} / {_f(pz['max'])} | {paths or '-'} | "
                     f"{_f(p.get('loadavg_1m'), '{:.2f}')} |")
    ratio = doc.get("ratio")
    cycles = ", ".join(_f(r * 100 if r else None, "{:.0f}%")
                       for r in doc.get("cycle_ratios", []))
    lines.append("")
    lines.append(f"throughput with snapshots every {doc['config']['interval_s']:g} s: "
                 f"{_f(ratio * 100 if ratio else None)}% of the baseline "
                 f"(means over the phases; per cycle: {cycles or '-'})")
    if doc.get("bracketed_ratios"):
        med = doc.get("bracketed_median")
        each = ", ".join(_f(r * 100 if r else None, "{:.0f}%") for r in doc["bracketed_ratios"])
        lines.append(f"each snapshot phase against the mean of the baselines around it: "
                     f"median {_f(med * 100 if med else None)}% (each: {each}); "
                     f"goal >= 97%: {'met' if med is not None and med >= 0.97 else 'NOT met'}")
    return "\n".join(lines)
