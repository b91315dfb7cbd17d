"""`cutpoint-lab bench agent`: pause-window latencies of cutpointd per snapshot method.

On one lab host with 2 VMs x 2 RBD disks (Ceph with the tuned paxos
settings), it runs `rounds` group snapshots (prepare → commit of every
disk) through the real agent, once with the librbd method and once with the
QMP `transaction` method, in the same run and lab.  It reports p50/p99/max
of the `stop`, `cont`, snapshot and whole-pause latencies the agent measured
(per VM), plus the ratio QMP/librbd of the snapshot p50.  It prints a table
and writes JSON.  It is a benchmark, never a timed test.
"""

from __future__ import annotations

import asyncio
import json
import math
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

from cutpoint.agentclient import AgentClient, client_context
from cutpoint.lab import agents as A

METHODS = ("rbd", "qmp")
METRICS = ("stop_ms", "snapshot_ms", "cont_ms", "paused_ms", "barrier_ms")
LAB_PARAMS: dict[str, Any] = {"hosts": 1, "vms_per_host": 2, "disks": 2, "backend": "rbd",
                              "paxos": "tuned", "dr_hosts": 1}


def percentile(xs: list[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100)."""
    if not xs:
        return float("nan")
    s = sorted(xs)
    k = max(1, math.ceil(p / 100 * len(s)))
    return s[k - 1]


def summarize(xs: list[float]) -> dict[str, float]:
    return {"n": len(xs), "p50": percentile(xs, 50), "p99": percentile(xs, 99),
            "max": max(xs) if xs else float("nan")}


async def run_method(status: dict[str, Any], certs: Path, method: str, rounds: int,
                     log: Any) -> dict[str, Any]:
    host = status["hosts"][0]
    vms = [vm for vm in status["vms"] if vm["host"] == host["name"]]
    names = [vm["name"] for vm in vms]
    disks = [f"{vm['name']}/{d['node']}" for vm in vms for d in vm["disks"]]
    A.stop_agents(status)
    for j in A.agents_dir(status).glob("*/journal"):
        j.unlink()
    rec = A.start_agent(status, host, certs, method=method)
    samples: dict[str, list[float]] = {m: [] for m in METRICS}
    per_disk: list[float] = []
    group_ms: list[float] = []
    used: set[str] = set()
    txns: list[str] = []
    ctx = client_context(certs / "ca.pem", certs / "coordinator.pem", certs / "coordinator.key")
    try:
        async with AgentClient(rec["address"], rec["port"], ssl_context=ctx) as c:
            await c.hello()
            for i in range(rounds):
                txn = f"bench-{method}-{i}-{int(time.time() * 1000) % 100000}"
                txns.append(txn)
                t0 = time.monotonic()
                await c.prepare(txn, names, 10000)
                res = await c.commit(txn, {d: f"cp.bench.{txn}" for d in disks}, 10000)
                group_ms.append((time.monotonic() - t0) * 1000)
                for vm in res["vms"]:
                    used.add(vm["method"])
                    for m in METRICS:
                        samples[m].append(float(vm[m]))
                    per_disk.extend(float(d["snapshot_ms"]) for d in vm["disks"])
            log(f"{method}: {rounds} rounds done; deleting {len(txns)} group snapshots")
            for txn in txns:
                await c.abort(txn)
    finally:
        A.stop_agent_pid(rec["pid"])
    out: dict[str, Any] = {m: summarize(samples[m]) for m in METRICS}
    out["disk_snapshot_ms"] = summarize(per_disk)
    out["group_roundtrip_ms"] = summarize(group_ms)
    out["method_reported"] = sorted(used)
    out["samples"] = samples
    return out


def table(results: dict[str, Any]) -> str:
    rows = [("stop", "stop_ms"), ("snapshot (per VM, 2 disks)", "snapshot_ms"),
            ("snapshot (per disk)", "disk_snapshot_ms"), ("cont", "cont_ms"),
            ("pause window", "paused_ms"), ("prepare+commit round trip", "group_roundtrip_ms")]
    head = f"| {'latency (ms)':<28} | " + " | ".join(
        f"{m} p50 | {m} p99 | {m} max" for m in ("librbd", "QMP txn")) + " |"
    sep = "|" + "-" * 30 + "|" + "|".join(["------:"] * 6) + "|"
    lines = [head, sep]
    for label, key in rows:
        cells = []
        for m in METHODS:
            s = results[m][key]
            cells += [f"{s['p50']:.2f}", f"{s['p99']:.2f}", f"{s['max']:.2f}"]
        lines.append(f"| {label:<28} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def run(rounds: int = 50, json_out: str | None = None, keep_lab: bool = False,
        log: Any = print) -> dict[str, Any]:
    """Bring up the lab (under its lock), bench both methods, tear down."""
    from cutpoint.lab import config as C
    from cutpoint.lab import down as lab_down
    from cutpoint.lab import lock
    from cutpoint.lab import up as lab_up

    with lock.lab_lock(wait=True, log=log):
        status = lab_up.up(C.LabConfig(**LAB_PARAMS), log=log)
        certs = Path(tempfile.mkdtemp(prefix="cp-bench-certs-"))
        try:
            A.make_certs(certs, status["hosts"])
            results: dict[str, Any] = {}
            for m in METHODS:
                results[m] = asyncio.run(run_method(status, certs, m, rounds, log))
        finally:
            A.stop_agents(status)
            if not keep_lab:
                lab_down.down(log=log)
    ratio = results["qmp"]["snapshot_ms"]["p50"] / results["rbd"]["snapshot_ms"]["p50"]
    doc = {
        "benchmark": "agent",
        "rounds": rounds,
        "lab": LAB_PARAMS,
        "machine": {"cpus": __import__("os").cpu_count(), "kernel": platform.release(),
                    "accel": status.get("accel")},
        "results": {m: {k: v for k, v in r.items() if k != "samples"}
                    for m, r in results.items()},
        "samples": {m: r["samples"] for m, r in results.items()},
        "snapshot_p50_ratio_qmp_over_rbd": ratio,
        "table_markdown": table(results),
    }
    log("")
    log(doc["table_markdown"])
    log(f"\nsnapshot p50 ratio QMP-transaction / librbd: {ratio:.2f}")
    if json_out:
        Path(json_out).write_text(json.dumps(doc, indent=2) + "\n")
        log(f"wrote {json_out}")
    return doc
