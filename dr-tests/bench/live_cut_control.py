"""The negative control of the live cut's network hold: a group of VMs cut
live by the test bed itself, one after another `skew_ms` apart, with or
without their sent packets held from each VM's cut until the last one's.

Run with the system Python, which has Debian's python3-rbd bindings:

    /usr/bin/python3 live_cut_control.py < PLAN.json

PLAN: {"vms": [pause_designs_probe plan per VM, each with "hold":
{"netdev"}], "skew_ms": N, "hold": bool, "snap": name}.  No agent may run
(the probes hold the VMs' QMP sockets).  Per VM: one qcow2 overlay per
disk on a new RBD image, made while it runs; then per VM in order, with
the hold the filter on, and the `transaction` switching its disks (its
cut; the vCPUs never stop), skew_ms between VMs; then the bases' RBD
snapshots `snap` (what a checker reads), every hold released, the
overlays merged back and removed.  The snapshots are left for the caller.

With "hold": true this is the agent's live cut with a wider skew; with
false, a VM's records sent after its cut reach VMs cut later: the writer
checker must find the gap (test_gcvm_experiments.py (f)).  Kept free of
project imports, as pause_designs_probe.py, whose Probe it drives.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from pause_designs_probe import Probe, snap_all


def main() -> int:
    plan = json.load(sys.stdin)
    probes = [Probe(p) for p in plan["vms"]]
    out: dict[str, Any] = {"cut_ms": [], "held_ms": []}
    try:
        overlays = [[pr._qcow2_on_rbd(k, "ov", None) for k in range(len(pr.disks))]
                    for pr in probes]
        held_at: list[float] = []
        for i, (pr, ovs) in enumerate(zip(probes, overlays)):
            if i:
                time.sleep(plan["skew_ms"] / 1000.0)
            if plan["hold"]:
                pr._hold("on")
                held_at.append(time.perf_counter())
            acts = [{"type": "blockdev-snapshot", "data": {"node": d["node"], "overlay": ov}}
                    for d, ov in zip(pr.disks, ovs)]
            t0 = time.perf_counter()
            pr.q.cmd("transaction", actions=acts)
            out["cut_ms"].append((time.perf_counter() - t0) * 1000.0)
        # every VM is cut: what the agent's COMMIT marks
        for pr in probes:
            snap_all(pr.images, plan["snap"])
        for pr, t in zip(probes, held_at):
            pr._hold("off")
            out["held_ms"].append((time.perf_counter() - t) * 1000.0)
        for pr, ovs in zip(probes, overlays):
            pr.merge_back(ovs)
            for k in range(len(ovs)):
                pr._drop(k, "ov")
    finally:
        for pr in probes:
            pr.close()
    json.dump(out, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
