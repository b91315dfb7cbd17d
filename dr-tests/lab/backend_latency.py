"""The lab's knob for the backend's snapshot latency: a running mon's
Paxos propose interval.

An RBD snapshot waits for its snap id, which the mon allocates in the next
Paxos proposal; proposals are batched every `paxos_propose_interval`.  So
raising that interval on a running mon adds about the same time to every
snapshot, with no restart and nothing else slowed down (reads, writes and
the OSD's own traffic do not go through Paxos).  Latency 0 restores the
lab's tuned values (config.TUNED_PAXOS).

Why not `tc netem` on the mon's address: this machine's kernel has no
netem qdisc (`tc qdisc add ... netem` answers "Specified qdisc kind is
unknown").  Ceph's default settings (`--paxos default`, 1 s) are the same
knob at one fixed value, and need a new lab.

The value is set with `ceph tell mon.a config set`, which overrides the
ceph.conf value the lab wrote, and only in the running mon.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from cutpoint.lab import config as C
from cutpoint.lab.ceph import ceph_cmd
from cutpoint.lab.errors import LabError


def mon_values(latency_ms: int) -> dict[str, str]:
    """The mon settings for an added snapshot latency of latency_ms."""
    if latency_ms < 0:
        raise LabError(f"backend latency must be >= 0 ms, got {latency_ms}")
    if latency_ms == 0:
        return dict(C.TUNED_PAXOS)
    return {"paxos_propose_interval": f"{latency_ms / 1000.0:g}",
            "paxos_min_wait": C.TUNED_PAXOS["paxos_min_wait"]}


def set_backend_latency(site_status: dict[str, Any], latency_ms: int) -> dict[str, str]:
    """Apply latency_ms to the site's running mon; returns what was set."""
    values = mon_values(latency_ms)
    sdir = Path(site_status["ceph_conf"]).parent
    for key, val in values.items():
        argv = ceph_cmd(sdir, "tell", "mon.a", "config", "set", key, val)
        res = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
        if res.returncode != 0:
            raise LabError(f"{' '.join(argv)} failed (rc={res.returncode}): "
                           f"{res.stderr.strip()[-300:]}")
    return values
