"""Benchmark: the in-pause part of four ways to cut one VM's RBD disks.

On one lab VM (TCG, RBD disks), per added backend latency
(cutpoint.lab.backend_latency), pause_designs_probe.py times:
today's path (the RBD snapshots inside the pause), redirect on pause
(blockdev-snapshot onto prepared qcow2-on-RBD overlays, then snapshot and
block-commit after `cont`), the same switch without `stop` ("live": the
vCPUs run, the guest's block I/O waits on the transaction alone) and
copy-before-write fleecing (bitmap and
blockdev-backup sync=none in the pause).  It prints a table and returns a
JSON-able document; it never asserts on time.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import asdict, dataclass, field
from typing import Any

from cutpoint.bench.groupsnap import HERE, SYSTEM_PYTHON, BenchError, Log, _f, summary

DESIGNS = ("today", "redirect", "live", "fleecing")


@dataclass
class DesignsConfig:
    rounds: int = 10
    disks: int = 3
    workload: str = "none"
    backend_latency_ms: list[int] = field(default_factory=lambda: [0, 500])
    designs: list[str] = field(default_factory=lambda: list(DESIGNS))
    # live: how long the guest's outbound packets stay held after its
    # switch, the stand-in for the wait for COMMIT (about 8 ms p50 at the
    # issue's shape, docs/benchmarks.md); 0 = no hold.
    hold_ms: int = 10

    def lab_params(self) -> dict[str, Any]:
        # Raw QEMU: the probe drives the VM's own QMP socket.
        return {"hosts": 1, "vms_per_host": 1, "disks": self.disks,
                "workload": self.workload, "disk_size_mb": 64, "driver": "qemu"}


def _probe(status: dict[str, Any], cfg: DesignsConfig, tag: str) -> dict[str, Any]:
    vm = next(v for v in status["vms"] if v.get("site", "primary") == "primary")
    site = status["sites"]["primary"]
    plan = {"qmp": vm["qmp"], "conf": site["ceph_conf"], "client_id": site["client_id"],
            "keyring": site["keyring"], "qemu_conf": site.get("qemu_conf") or site["ceph_conf"],
            "pool": vm["disks"][0]["pool"], "rounds": cfg.rounds, "designs": cfg.designs,
            "tag": tag,
            "disks": [{"node": d["node"], "image": d["image"], "size_mb": d["size_mb"]}
                      for d in vm["disks"]]}
    if "live" in cfg.designs and cfg.hold_ms:
        # net0: the netdev of a raw-QEMU lab VM (cutpoint.lab.vms).
        plan["hold"] = {"netdev": "net0", "netns": vm["host"], "address": vm["address"],
                        "hold_ms": cfg.hold_ms}
    argv = [SYSTEM_PYTHON, str(HERE / "pause_designs_probe.py")]
    res = subprocess.run(argv, input=json.dumps(plan), capture_output=True, text=True,
                         timeout=1800, check=False)
    if res.returncode != 0:
        raise BenchError(f"{' '.join(argv)} failed (rc={res.returncode}): "
                         f"{res.stderr.strip()[-1500:]}")
    out: dict[str, Any] = json.loads(res.stdout)
    return out


def run_designs(status: dict[str, Any], cfg: DesignsConfig, log: Log) -> dict[str, Any]:
    from cutpoint.lab.backend_latency import set_backend_latency
    site = status["sites"]["primary"]
    rows = []
    try:
        for lat in cfg.backend_latency_ms:
            mon = set_backend_latency(site, lat)
            log(f"designs: backend latency +{lat} ms (mon {mon})")
            raw = _probe(status, cfg, f"l{lat}")
            for design in cfg.designs:
                row: dict[str, Any] = {"backend_latency_ms": lat, "design": design}
                for key, xs in raw[design].items():
                    row[key] = {"samples": xs, **summary(xs)}
                if design == "live" and "ping" in raw:
                    row["ping"] = _ping(raw["ping"], log)
                log(f"designs: +{lat} ms {design}: pause p50 "
                    f"{_f(row['pause_ms']['p50'])} ms, p99 {_f(row['pause_ms']['p99'])} ms")
                rows.append(row)
    finally:
        set_backend_latency(site, 0)
    return {"benchmark": "pause-designs", "config": asdict(cfg),
            "lab": {"accel": status.get("accel"), "vm_disks": cfg.disks}, "rows": rows}


def _ping(p: dict[str, Any], log: Log) -> dict[str, Any]:
    """The guest's replies during the run: those to echoes sent inside a
    hold must all arrive, after its release."""
    out = {k: p[k] for k in ("replies_in_hold", "replies_outside", "lost")}
    for key in ("rtt_in_hold_ms", "rtt_outside_ms", "arrival_after_release_ms"):
        out[key] = {"samples": p[key], **summary(p[key])}
    early = [x for x in p["arrival_after_release_ms"] if x < 0]
    out["arrived_before_release"] = len(early)
    log(f"designs: live hold: {out['replies_in_hold']} replies to echoes sent in a hold, "
        f"{len(early)} of them before its release; {out['replies_outside']} outside; "
        f"{out['lost']} lost")
    return out


def hold_table(doc: dict[str, Any]) -> str:
    """The live design's network hold, one line per backend latency."""
    lines = [("| backend latency | hold on / release p50 (ms) | held p50 / p99 (ms) | "
              "replies to echoes sent in a hold | of which came through it | reply after release "
              "p50 / max (ms) | rtt outside p50 / p99 (ms) | lost |"), "|" + "---|" * 8]
    for r in doc["rows"]:
        if r["design"] != "live" or "ping" not in r:
            continue
        g, a, o = r["ping"], r["ping"]["arrival_after_release_ms"], r["ping"]["rtt_outside_ms"]
        lines.append(
            f"| +{r['backend_latency_ms']} ms | {_f(r['hold_on_ms']['p50'])} / "
            f"{_f(r['release_ms']['p50'])} | {_f(r['held_ms']['p50'])} / "
            f"{_f(r['held_ms']['p99'])} | {g['replies_in_hold']} | "
            f"{g['arrived_before_release']} | {_f(a['p50'])} / {_f(a['max'])} | "
            f"{_f(o['p50'])} / {_f(o['p99'])} | {g['lost']} |")
    return "\n".join(lines) if len(lines) > 2 else ""


def designs_table(doc: dict[str, Any]) -> str:
    lines = [("| backend latency | design | pause p50 / p99 / max (ms) | of which cut "
             "p50 / p99 (ms) | stop / cont p50 (ms) | before the pause p50 (ms) | "
             "backend after cont p50 (ms) | commit or cleanup p50 (ms) | rounds |"),
             "|" + "---|" * 9]
    for r in doc["rows"]:
        p, c = r["pause_ms"], r["cut_ms"]
        before = r.get("prepare_ms", {}).get("p50")
        after = (r.get("commit_ms") or r.get("cleanup_ms") or {}).get("p50")
        backend = r["backend_ms"]["p50"] if r["design"] != "today" else None
        lines.append(
            f"| +{r['backend_latency_ms']} ms | {r['design']} | {_f(p['p50'])} / "
            f"{_f(p['p99'])} / {_f(p['max'])} | {_f(c['p50'])} / {_f(c['p99'])} | "
            f"{_f(r['stop_ms']['p50'])} / {_f(r['cont_ms']['p50'])} | {_f(before)} | "
            f"{_f(backend)} | {_f(after)} | {p['n']} |")
    hold = hold_table(doc)
    return "\n".join(lines) + (f"\n\nThe live design's network hold:\n\n{hold}" if hold else "")
