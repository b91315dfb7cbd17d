"""Benchmark of the guest stores (issue 7): cp-kvstore and cp-sharedlog
throughput and latency inside the lab, without and with group snapshots
every 10 s, measured in the same run (phases alternate).

    python -m cutpoint.bench.stores [--store kvstore|sharedlog|both]
        [--phase-s 40] [--rounds 2] [--interval-s 10] [--json OUT]

The clients print, every N operations (`--progress`: 50 for kvstore, 10
for sharedlog), the window's rate and latency percentiles
(`rate= p50= p99= max=`, milliseconds, measured around the store call).
A phase is the byte range of every console written during it, so no guest
clock is trusted.  Throughput is N x windows / phase seconds, summed over
the clients; latencies are the median of the
windows' p50 and p99, and the largest max.  It prints a table and writes
JSON; it asserts nothing about time.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

WINDOW = re.compile(r"client \d+: (?:op|seq) \d+.*rate=([\d.]+) p50=([\d.]+) "
                    r"p99=([\d.]+) max=([\d.]+)")
CLI = [str(Path(sys.executable).parent / "cutpoint")]
# a progress line every N ops: fine enough for the slower store to have
# many windows per phase
EVERY = {"kvstore": 50, "sharedlog": 10}
ARGS = {"kvstore": "--progress=50", "sharedlog": "--interval-ms=20,--progress=10"}
PROGRESS = {"kvstore": r"client \d+: op \d+", "sharedlog": r"client \d+: seq \d+"}


def _sizes(vms: list[dict[str, Any]]) -> list[int]:
    return [os.path.getsize(v["console"]) for v in vms]


def _windows(vms: list[dict[str, Any]], start: list[int],
             end: list[int]) -> list[tuple[float, float, float, float]]:
    out = []
    for vm, a, b in zip(vms, start, end, strict=True):
        with open(vm["console"], "rb") as f:
            f.seek(a)
            text = f.read(b - a).decode(errors="replace")
        out += [tuple(map(float, m.groups())) for m in WINDOW.finditer(text)]
    return out  # type: ignore[return-value]


def _phase(vms: list[dict[str, Any]], seconds: float, snap: Any,
           every: int) -> dict[str, Any]:
    start, t0 = _sizes(vms), time.monotonic()
    pauses: list[float] = []
    snaps = 0
    while time.monotonic() - t0 < seconds:
        if snap is not None:
            t = time.monotonic()
            pauses += snap()
            snaps += 1
            time.sleep(max(0.0, snap.interval - (time.monotonic() - t)))
        else:
            time.sleep(0.5)
    dt = time.monotonic() - t0
    w = _windows(vms, start, _sizes(vms))
    return {
        "seconds": round(dt, 1), "windows": len(w), "snapshots": snaps,
        "ops_per_s": round(every * len(w) / dt, 1),
        "p50_ms": round(statistics.median(x[1] for x in w), 2) if w else None,
        "p99_ms": round(statistics.median(x[2] for x in w), 2) if w else None,
        "max_ms": round(max(x[3] for x in w), 2) if w else None,
        "pause_ms_max": round(max(pauses), 2) if pauses else None,
        "pause_ms_median": round(statistics.median(pauses), 2) if pauses else None,
    }


class _Snapper:
    def __init__(self, group_file: Path, db: str, interval: float) -> None:
        self.file, self.db, self.interval = group_file, db, interval

    def __call__(self) -> list[float]:
        res = subprocess.run([*CLI, "snapshot", "--group-file", str(self.file),
                              "--db", self.db, "--json"], capture_output=True,
                             text=True, timeout=120, check=False)
        if res.returncode != 0:
            raise RuntimeError(f"cutpoint snapshot failed: {res.stderr[-1000:]}")
        doc, _ = json.JSONDecoder().raw_decode(res.stdout, res.stdout.index("{"))
        return [v["paused_ms"] for v in doc.get("vms", [])
                if v.get("paused_ms") is not None]


def bench_store(store: str, phase_s: float, rounds: int, interval: float,
                log: Any = print) -> dict[str, Any]:
    from cutpoint.lab import config as C
    from cutpoint.lab import down as lab_down
    from cutpoint.lab import lock
    from cutpoint.lab import up as lab_up
    from cutpoint.lab.agents import start_agents, stop_agents
    from cutpoint.lab.groupfile import write_group_file
    cfg = C.LabConfig(hosts=2, vms_per_host=2, disks=1, workload=store,
                      workload_args=ARGS[store], disk_size_mb=64)
    with lock.lab_lock(wait=True, log=log), tempfile.TemporaryDirectory() as tmp:
        status = lab_up.up(cfg, log=log)
        try:
            certs = Path(status["state_dir"]) / "certs"
            start_agents(status, certs)
            gf = Path(tmp) / "group.yaml"
            write_group_file(status, gf, certs_dir=certs, group=store)
            snap = _Snapper(gf, f"sqlite:///{tmp}/coordinator.db", interval)
            vms = status["vms"]
            rx = re.compile(PROGRESS[store])
            deadline = time.monotonic() + 300
            while not all(rx.search(Path(v["console"]).read_text(errors="replace"))
                          for v in vms):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{store}: no client progress after 300 s")
                time.sleep(1)
            phases = []
            for r in range(rounds):
                for name, s in (("baseline", None), ("snapshots", snap)):
                    p = _phase(vms, phase_s, s, EVERY[store])
                    p.update(store=store, round=r + 1, phase=name)
                    log(f"{store} round {r + 1} {name}: {p}")
                    phases.append(p)
            stop_agents(status)
        finally:
            lab_down.down(log=log)
    return {"store": store, "vms": 4, "hosts": 2, "accel": status.get("accel"),
            "phase_s": phase_s, "interval_s": interval, "phases": phases,
            "summary": _summary(phases)}


def _summary(phases: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in ("baseline", "snapshots"):
        ps = [p for p in phases if p["phase"] == name and p["windows"]]
        out[name] = {
            "ops_per_s": round(statistics.mean(p["ops_per_s"] for p in ps), 1) if ps else None,
            "p50_ms": round(statistics.median(p["p50_ms"] for p in ps), 2) if ps else None,
            "p99_ms": round(statistics.median(p["p99_ms"] for p in ps), 2) if ps else None,
        }
    b, s = out["baseline"]["ops_per_s"], out["snapshots"]["ops_per_s"]
    out["throughput_ratio"] = round(s / b, 3) if b and s else None
    return out


def table(results: list[dict[str, Any]]) -> str:
    head = (f"{'store':10} {'round':>5} {'phase':10} {'ops/s':>8} {'p50 ms':>8} "
            f"{'p99 ms':>8} {'max ms':>8} {'snaps':>5} {'pause p50':>9} {'pause max':>9}")
    lines = [head]
    for r in results:
        for p in r["phases"]:
            lines.append(
                f"{p['store']:10} {p['round']:>5} {p['phase']:10} {p['ops_per_s']:>8} "
                f"{p['p50_ms']!s:>8} {p['p99_ms']!s:>8} {p['max_ms']!s:>8} "
                f"{p['snapshots']:>5} {p['pause_ms_median']!s:>9} {p['pause_ms_max']!s:>9}")
        s = r["summary"]
        lines.append(f"{r['store']:10} ratio snapshots/baseline throughput = "
                     f"{s['throughput_ratio']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--store", choices=["kvstore", "sharedlog", "both"], default="both")
    ap.add_argument("--phase-s", type=float, default=40)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--interval-s", type=float, default=10)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    stores = ["kvstore", "sharedlog"] if a.store == "both" else [a.store]
    results = [bench_store(s, a.phase_s, a.rounds, a.interval_s) for s in stores]
    print(table(results))
    if a.json:
        a.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
