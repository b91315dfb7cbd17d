"""The lab's two Ceph clusters as the replication benchmark sees them: the
`ceph` CLI, whether a cluster still does background work (settle), the
snapshot trimmer's pace, the OSDs' CPU time, and the memstore OSD's write
ceiling (`rbd bench`), measured in the same run as the methods."""

from __future__ import annotations

import json
import os
import re
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from cutpoint.bench.replication import (
    MiB,
    ReplicationError,
    _checked,
    create_image,
    rbd,
    remove_image,
    spec,
)


def ceph(site: dict[str, Any], *args: str, timeout: float = 60) -> str:
    argv = ["ceph", "-c", site["ceph_conf"], "--id", site.get("client_id", "admin"),
            "--keyring", site["keyring"], *args]
    return _checked(argv, timeout)


def dead_osds(status: dict[str, Any]) -> list[str]:
    """Names of the sites whose OSD process is gone (empty: all alive)."""
    dead = []
    for name in ("primary", "dr"):
        pid = status["sites"][name].get("pids", {}).get("osd.0")
        if pid and not os.path.exists(f"/proc/{pid}"):
            dead.append(name)
    return dead


def busy_reasons(pg_ls: Any) -> list[str]:
    """What a cluster is still doing in the background, from the JSON of
    `ceph pg ls`; empty when idle.  A PG that is not exactly active+clean
    (snaptrim, snaptrim_wait, peering, ...) or still has snapshots queued
    for trimming is busy."""
    stats = pg_ls.get("pg_stats", []) if isinstance(pg_ls, dict) else pg_ls
    states: dict[str, int] = {}
    queued = 0
    for pg in stats:
        st = str(pg.get("state", "?"))
        if st != "active+clean":
            states[st] = states.get(st, 0) + 1
        queued += int(pg.get("snaptrimq_len", 0) or 0)
    out = [f"{n} pg {st}" for st, n in sorted(states.items())]
    if queued:
        out.append(f"{queued} snapshots queued for trimming")
    return out


def _osd_ids(site: dict[str, Any]) -> list[int]:
    return [int(i) for i in json.loads(ceph(site, "osd", "ls", "--format", "json"))]


def cluster_busy(site: dict[str, Any]) -> list[str]:
    """busy_reasons() of one site, on PG stats the OSDs have just sent.

    The mgr hears from the OSDs only every few seconds, so right after a
    snapshot or image removal `ceph pg ls` can still say active+clean
    (seen: idle for 3 s after the 256 MiB images were removed, then
    snaptrim for minutes).  Each OSD is asked to flush its PG stats first,
    and the mgr's copy is read once it has that report (the way Ceph's own
    tests wait: flush_pg_stats, then `ceph osd last-stat-seq`)."""
    seqs = {i: int(ceph(site, "tell", f"osd.{i}", "flush_pg_stats").strip() or 0)
            for i in _osd_ids(site)}
    deadline = time.monotonic() + 30
    for i, seq in seqs.items():
        while int(ceph(site, "osd", "last-stat-seq", f"osd.{i}").strip()) < seq:
            if time.monotonic() > deadline:
                return [f"osd.{i} stats not reported within 30 s"]
            time.sleep(0.1)
    return busy_reasons(json.loads(ceph(site, "pg", "ls", "--format", "json")))


def both_sites(status: dict[str, Any]) -> list[str]:
    names = ("primary", "dr")
    with ThreadPoolExecutor(2) as ex:
        got = list(ex.map(lambda n: cluster_busy(status["sites"][n]), names))
    return [f"{n}: {r}" for n, why in zip(names, got) for r in why]


def settle(status: dict[str, Any], timeout: float, log: Any = print,
           interval: float = 0.3) -> tuple[float, list[str]]:
    """Wait until both clusters have no background work; returns (seconds
    waited, what they were doing when the wait began)."""
    t0 = time.monotonic()
    if dead := dead_osds(status):
        raise ReplicationError(["settle"], -1, "", f"the OSD of {', '.join(dead)} is gone")
    first = why = both_sites(status)
    while why:
        if time.monotonic() - t0 > timeout:
            log(f"  clusters still busy after {timeout:.0f} s, timing anyway: {why}")
            return time.monotonic() - t0, first + ["TIMEOUT"]
        time.sleep(interval)
        if dead := dead_osds(status):
            raise ReplicationError(["settle"], -1, "", f"the OSD of {', '.join(dead)} is gone")
        why = both_sites(status)
    return time.monotonic() - t0, first


# osd_snap_trim_sleep while the bench runs.  0 would mean "the device
# class default", which is osd_snap_trim_sleep_hdd = 5 s per batch for
# memstore: the trimming of one removed 256 MiB image with 5 snapshots
# then lasted over 80 s (and the old bench timed its 1 GiB copies inside
# it); at 1 ms it took under 6 s.  Trimming is waited out before every
# timed pair either way; this only shortens the wait.
TRIM_SLEEP = "0.001"


def trim_sleep(status: dict[str, Any],
                want: dict[str, str | None]) -> dict[str, str | None]:
    """Set osd_snap_trim_sleep per site (None: remove the setting);
    returns what each site's config database held before."""
    before: dict[str, str | None] = {}
    for name, value in want.items():
        site = status["sites"][name]
        dump = json.loads(ceph(site, "config", "dump", "--format", "json"))
        before[name] = next((str(e["value"]) for e in dump
                             if e.get("name") == "osd_snap_trim_sleep"
                             and e.get("section") == "osd"), None)
        if value is None:
            ceph(site, "config", "rm", "osd", "osd_snap_trim_sleep")
        else:
            ceph(site, "config", "set", "osd", "osd_snap_trim_sleep", value)
    return before


def osd_cpu(status: dict[str, Any]) -> float:
    """CPU seconds (user + system) used so far by both sites' OSDs."""
    tck = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for name in ("primary", "dr"):
        pid = status["sites"][name].get("pids", {}).get("osd.0")
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tck
        except (OSError, IndexError, ValueError):
            return float("nan")
    return total


def load() -> float:
    return os.getloadavg()[0]



# rbd bench's summary line: "elapsed: N ops: N ops/sec: X bytes/sec: Y [unit]"
# (a plain number of bytes, or a figure with a binary unit in some releases).
_BYTES_PER_SEC = re.compile(r"^elapsed:.*bytes/sec:\s*([0-9.]+)\s*([KMGT]i?B/s)?",
                            re.MULTILINE)
_UNIT = {None: 1, "": 1, "B/s": 1, "KiB/s": 1 << 10, "MiB/s": 1 << 20, "GiB/s": 1 << 30,
         "TiB/s": 1 << 40}


def bench_rate(out: str) -> float | None:
    """Bytes per second from `rbd bench`'s output (None: no summary line)."""
    found = _BYTES_PER_SEC.findall(out)
    if not found:
        return None
    num, unit = found[-1]
    return float(num) * _UNIT.get(unit or None, 1)


def write_ceiling(site: dict[str, Any], io_kib: int, total: int = 256 * MiB,
                  threads: int = 16, image: str = "bench-ceiling") -> float:
    """MiB/s that `rbd bench --io-type write` reaches on a fresh image of the
    site (16 writes in flight, random offsets below 4 MiB writes, sequential
    at 4 MiB): the OSD's write rate for that write size, the ceiling of
    any replication method writing there.  The image is removed after.
    Without a summary line, total over the process's wall time."""
    remove_image(site, image)
    create_image(site, image, total)
    try:
        t0 = time.monotonic()
        out = rbd(site, "bench", "--io-type", "write", "--io-size", str(io_kib * 1024),
                  "--io-threads", str(threads), "--io-total", str(total),
                  "--io-pattern", "seq" if io_kib >= 4096 else "rand", spec(site, image),
                  timeout=900)
        wall = time.monotonic() - t0
    finally:
        remove_image(site, image)
    rate = bench_rate(out)
    return (rate if rate is not None else total / wall) / MiB
