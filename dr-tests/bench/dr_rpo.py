"""`cutpoint-lab bench dr-rpo`: the RPO achieved at DR, through the real
control plane (issue 19, goal 4).

One lab (H primary hosts x V VMs x 1 RBD disk, workload `writer`), one agent
per host, `cutpoint server --embedded` (API, worker, beat, SQLite, its own
Redis), the lab's two sites registered as the control plane's cephx client,
and one group of every VM on an RPO schedule, replicated to site `dr`.  Once
the group's first DR recovery point exists (the full copy: not measured),
the bench samples for `minutes`, every `sample_s`:

- `GET /v1/groups/{g}/replication` -> `achieved_dr_rpo_s` (now minus the
  cut of the newest point verified at DR: the data lost if the primary died
  at that instant);
- `GET /v1/groups/{g}/rpo` -> `achieved_rpo_s` (the same at the primary:
  now minus the newest committed cut), the baseline of the same run.

It reports p50/p99/max of both samples, and the per-interval peaks the
`cutpoint_dr_rpo_peak_seconds` histogram is made of (for each DR point, the
DR RPO just before it was verified).  What bounds the DR RPO comes from the
run's own records in the database: for every snapshot verified at DR in the
window, cut -> committed -> replicate job started -> first member copy
started -> last member copy finished -> verified, and each member's
cutpoint-sync time.  A DR RPO peak is about one capture interval plus one
such replication lag.  Prints a table, writes JSON; never a timed test.
"""

from __future__ import annotations

import datetime as dt
import os
import signal
import statistics
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

GROUP = "drrpo"


class DrRpoError(RuntimeError):
    """The benchmark could not run (a step of its setup failed)."""


@dataclass
class DrRpoConfig:
    minutes: float = 10.0
    hosts: int = 2
    vms_per_host: int = 5
    rpo_s: int = 10
    sample_s: float = 1.0
    # Before sampling: the first DR point (a full copy of every disk).
    first_point_timeout_s: float = 600.0
    port: int = 18471

    def lab_params(self) -> dict[str, Any]:
        return {"hosts": self.hosts, "vms_per_host": self.vms_per_host, "disks": 1,
                "workload": "writer"}

    def validate(self) -> None:
        if not 0 < self.minutes <= 240:
            raise DrRpoError(f"--minutes must be in (0, 240], got {self.minutes}")
        if self.hosts * self.vms_per_host < 1:
            raise DrRpoError("the group needs at least one VM")
        if not 1 <= self.rpo_s <= 3600:
            raise DrRpoError(f"--rpo must be 1..3600 s, got {self.rpo_s}")


def pct(xs: list[float], p: float) -> float | None:
    """Nearest-rank percentile (None for no values)."""
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(p / 100 * (len(s) - 1))))]


def stats(xs: list[float]) -> dict[str, Any]:
    return {"n": len(xs), "p50": _r(pct(xs, 50)), "p99": _r(pct(xs, 99)),
            "max": _r(max(xs) if xs else None),
            "mean": _r(statistics.fmean(xs) if xs else None)}


def _r(x: float | None, nd: int = 3) -> float | None:
    return round(x, nd) if x is not None else None


def _s(a: dt.datetime | None, b: dt.datetime | None) -> float | None:
    """b - a in seconds (None if either is missing)."""
    if a is None or b is None:
        return None
    if a.tzinfo is None:
        a = a.replace(tzinfo=dt.UTC)
    if b.tzinfo is None:
        b = b.replace(tzinfo=dt.UTC)
    return (b - a).total_seconds()


def peaks(points: list[tuple[dt.datetime, dt.datetime]]) -> list[float]:
    """For each (cut, reached) point after the first, in order of `reached`:
    `reached` minus the newest cut reached before it: the worst RPO of that
    interval (what metrics_dr._dr_rpo_peaks puts in its histogram)."""
    out: list[float] = []
    newest: dt.datetime | None = None
    for cut, reached in sorted(points, key=lambda p: p[1]):
        if newest is not None:
            d = _s(newest, reached)
            assert d is not None
            out.append(d)
        newest = cut if newest is None else max(newest, cut)
    return out


def timeline(sf: Any, group: str, t_from: dt.datetime, t_to: dt.datetime) -> dict[str, Any]:
    """Per snapshot of the window, from the database: where the time from
    the cut to its verification at DR went, and the peaks at both sites."""
    from cutpoint.api.models import (
        Group,
        GroupSnapshot,
        Job,
        JobState,
        MemberReplication,
        SnapState,
    )
    from sqlalchemy import select

    rows: list[dict[str, Any]] = []
    with sf() as s:
        g = s.scalar(select(Group).where(Group.name == group))
        if g is None:
            raise DrRpoError(f"no group {group} in the database")
        snaps = list(s.scalars(select(GroupSnapshot).where(GroupSnapshot.group_id == g.id)
                               .order_by(GroupSnapshot.id)))
        # Committed, whatever retention did to them since.
        was_committed = (SnapState.committed, SnapState.deleting, SnapState.deleted)
        committed = [x for x in snaps if x.state in was_committed and x.cut_at
                     and x.finished_at]
        reached = {x.id: t for x in committed
                   if (t := _reached_dr(x, s.scalars(select(MemberReplication).where(
                       MemberReplication.group_snapshot_id == x.id)).all())) is not None}
        verified = [x for x in committed if x.id in reached]

        def in_window(t: dt.datetime | None) -> bool:
            return t is not None and t_from <= _aware(t) <= t_to

        dr_points = [(_aware(x.cut_at), reached[x.id]) for x in verified]
        dr_all = peaks(dr_points)
        # Only the intervals that ended inside the window.
        ends = sorted(p[1] for p in dr_points)[1:]
        dr_peaks = [v for v, end in zip(dr_all, ends, strict=True) if t_from <= end <= t_to]
        prim_ends = sorted(_aware(x.finished_at) for x in committed)[1:]
        prim_all = peaks([(_aware(x.cut_at), _aware(x.finished_at)) for x in committed])
        prim_peaks = [v for v, end in zip(prim_all, prim_ends, strict=True)
                      if t_from <= end <= t_to]
        for x in verified:
            if not in_window(reached[x.id]):
                continue
            job = s.scalar(select(Job).where(Job.kind == "replicate", Job.snapshot_id == x.id,
                                             Job.state == JobState.succeeded)
                           .order_by(Job.finished_at.desc()).limit(1))
            att = s.scalars(select(MemberReplication).where(
                MemberReplication.group_snapshot_id == x.id)).all()
            last = max((m.attempt for m in att), default=0)
            ms = [m for m in att if m.attempt == last]
            m_start = min((_aware(m.started_at) for m in ms if m.started_at), default=None)
            m_end = max((_aware(m.finished_at) for m in ms if m.finished_at), default=None)
            rows.append({
                "txn": x.txn, "trigger": x.trigger, "members": len(ms),
                "cut_at": _aware(x.cut_at).isoformat(), "reached_dr_at": reached[x.id].isoformat(),
                "attempts": last,
                "capture_s": _r(_s(x.requested_at, x.cut_at)),
                "commit_s": _r(_s(x.cut_at, x.finished_at)),
                "queued_s": _r(_s(x.finished_at, job.started_at if job else None)),
                "job_to_copy_s": _r(_s(job.started_at if job else None, m_start)),
                "copy_s": _r(_s(m_start, m_end)),
                "to_verified_s": _r(_s(m_end, reached[x.id])),
                "lag_s": _r(_s(x.cut_at, reached[x.id])),
                "member_s": sorted(_r(m.seconds) or 0.0 for m in ms),
                "full": any(bool(m.full) for m in ms),
                "bytes_shipped": sum(m.bytes_shipped for m in ms),
                "bytes_changed": sum(m.bytes_changed for m in ms),
            })
        n_committed = sum(1 for x in committed if in_window(x.finished_at))
        # Retention deletes committed snapshots during the run: they were
        # committed, not failed.
        n_failed = sum(1 for x in snaps if x.state not in was_committed
                       and in_window(x.finished_at))
        rep_failed = s.scalars(select(Job).where(Job.kind == "replicate", Job.group_id == g.id,
                                                 Job.state == JobState.failed)).all()
        rep_failed_n = sum(1 for j in rep_failed if in_window(j.finished_at))
    incr = [r for r in rows if not r["full"]]

    def col(k: str) -> list[float]:
        return [r[k] for r in incr if r[k] is not None]

    member_s = [v for r in incr for v in r["member_s"]]
    return {
        "snapshots_committed": n_committed, "snapshots_not_committed": n_failed,
        "dr_points": len(rows), "dr_points_incremental": len(incr),
        "replicate_jobs_failed": rep_failed_n,
        "primary_peaks_s": stats(prim_peaks), "dr_peaks_s": stats(dr_peaks),
        "phases_s": {k: stats(col(k)) for k in ("capture_s", "commit_s", "queued_s",
                                                "job_to_copy_s", "copy_s", "to_verified_s",
                                                "lag_s")},
        "member_sync_s": stats(member_s),
        "bytes_changed_per_point": stats([float(r["bytes_changed"]) for r in incr]),
        "points": rows,
    }


def _reached_dr(x: Any, members: list[Any]) -> dt.datetime | None:
    """When a committed snapshot was verified at DR, or None if it never was.
    DR retention (the group's DR policy, 50 points by default) removes the
    oldest DR points during a long run and clears their `dr_verified_at`;
    their member copies stay, in state `dr_deleted`, so such a point's
    arrival is its last member copy's end."""
    if x.dr_verified_at is not None:
        return _aware(x.dr_verified_at)
    last = max((m.attempt for m in members), default=0)
    ms = [m for m in members if m.attempt == last]
    if not ms or any(m.state != "dr_deleted" or m.finished_at is None for m in ms):
        return None
    return max(_aware(m.finished_at) for m in ms)


def _aware(t: dt.datetime) -> dt.datetime:
    return t if t.tzinfo is not None else t.replace(tzinfo=dt.UTC)


def _get(client: Any, path: str) -> dict[str, Any]:
    r = client.get(path)
    r.raise_for_status()
    doc = r.json()
    assert isinstance(doc, dict)
    return doc


def _sample(client: Any, cfg: DrRpoConfig, log: Any) -> list[dict[str, Any]]:
    """Every `sample_s` for `minutes`: the achieved RPO at DR and at the primary."""
    out: list[dict[str, Any]] = []
    t_end = time.monotonic() + cfg.minutes * 60
    next_log = time.monotonic() + 30
    while time.monotonic() < t_end:
        t0 = time.monotonic()
        rep = _get(client, f"/v1/groups/{GROUP}/replication?limit=1")
        rpo = _get(client, f"/v1/groups/{GROUP}/rpo")
        out.append({"t": round(time.time(), 3), "dr_rpo_s": rep["achieved_dr_rpo_s"],
                    "rpo_s": rpo["achieved_rpo_s"], "lag_s": rep["replication_lag_s"]})
        if time.monotonic() >= next_log:
            next_log += 30
            log(f"  {len(out)} samples: DR RPO now {rep['achieved_dr_rpo_s']} s, primary "
                f"{rpo['achieved_rpo_s']} s, newest lag {rep['replication_lag_s']} s")
        time.sleep(max(0.0, cfg.sample_s - (time.monotonic() - t0)))
    return out


def run_dr_rpo(status: dict[str, Any], cfg: DrRpoConfig, log: Any = print) -> dict[str, Any]:
    """Control plane up on the running lab, the group on its schedule, then
    sample; everything this started is stopped before returning."""
    import httpx
    from cutpoint.api.db import get_sessionmaker
    from cutpoint.lab.agents import start_agents, stop_agents
    from cutpoint.lab.demo import cp, start_server
    from cutpoint.lab.sites import cli_args

    cfg.validate()
    vms = [v for v in status["vms"] if v["site"] == "primary"]
    if not vms:
        raise DrRpoError("the lab has no primary VMs")
    state = Path(tempfile.mkdtemp(prefix="cutpoint-drrpo-"))
    certs = Path(status["state_dir"]) / "certs"
    server: subprocess.Popen[bytes] | None = None
    t_start, load0 = time.monotonic(), os.getloadavg()[0]
    try:
        for rec in start_agents(status, certs):
            log(f"agent {rec['host']} at {rec['address']}:{rec['port']} pid {rec['pid']}")
        server, env = start_server(state, certs, port=cfg.port, show=False)
        log(f"cutpoint server --embedded on :{cfg.port} (log {state / 'server.log'})")

        def run(*args: str) -> str:
            try:
                return cp(*args, env=env, capture=True)
            except SystemExit as exc:
                raise DrRpoError(str(exc)) from None

        run("site", "add", "primary", *cli_args(status, "primary"))
        run("site", "add", "dr", *cli_args(status, "dr"))
        for h in status["hosts"]:
            if h["site"] == "primary":
                run("host", "add", h["name"], "--site", "primary", "--address", h["address"],
                    "--cert", str(certs / f"{h['name']}.pem"))
        run("group", "create", GROUP, "--rpo", str(cfg.rpo_s), "--lease-ms", "3000",
            "--pause-budget-ms", "2000", "--keep-last", "100", "--replication-target", "dr")
        # No scheduled snapshot of a group that is still being filled: its
        # first DR point must hold every VM (the full copies, not measured).
        run("group", "disable", GROUP)
        for v in vms:
            run("group", "add-vm", GROUP, v["name"])
        run("group", "enable", GROUP)
        client = httpx.Client(base_url=env["CUTPOINT_URL"], timeout=30,
                              headers={"Authorization": f"Bearer {env['CUTPOINT_TOKEN']}"})
        log(f"waiting for the first DR recovery point of {len(vms)} VMs (full copies)")
        t0 = time.monotonic()
        while True:
            rep = _get(client, f"/v1/groups/{GROUP}/replication?limit=1")
            if rep["newest_recovery_point"]:
                break
            if time.monotonic() - t0 > cfg.first_point_timeout_s:
                raise DrRpoError(f"no DR recovery point within {cfg.first_point_timeout_s:.0f} s")
            time.sleep(1)
        log(f"first DR point {rep['newest_recovery_point']} after {time.monotonic() - t0:.1f} s;"
            f" sampling for {cfg.minutes:g} min")
        w_from = dt.datetime.now(dt.UTC)
        samples = _sample(client, cfg, log)
        w_to = dt.datetime.now(dt.UTC)
        sf = get_sessionmaker(f"sqlite:///{state / 'server' / 'cutpoint.db'}")
        tl = timeline(sf, GROUP, w_from, w_to)
    finally:
        if server is not None and server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait()
        stop_agents(status)
    dr = [x["dr_rpo_s"] for x in samples if x["dr_rpo_s"] is not None]
    prim = [x["rpo_s"] for x in samples if x["rpo_s"] is not None]
    return {
        "benchmark": "dr-rpo",
        "config": asdict(cfg),
        "lab": {"hosts": cfg.hosts, "vms": len(vms), "disks_per_vm": 1,
                "disk_size_mb": status.get("config", {}).get("disk_size_mb"),
                "driver": status.get("config", {}).get("driver"), "workload": "writer",
                "osd": "memstore"},
        "window": [w_from.isoformat(), w_to.isoformat()],
        "dr_rpo_samples_s": stats(dr),
        "primary_rpo_samples_s": stats(prim),
        **tl,
        "samples": samples,
        "wall_s": round(time.monotonic() - t_start, 1),
        "load": [round(load0, 2), round(os.getloadavg()[0], 2)],
        "state_dir": str(state),
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def table(doc: dict[str, Any]) -> str:
    c, lab = doc["config"], doc["lab"]
    lines = [(f"DR RPO: {lab['vms']} VMs x 1 disk on {lab['hosts']} hosts, writer, RPO "
              f"{c['rpo_s']} s, {c['minutes']:g} min, a sample every {c['sample_s']:g} s"),
             "",
             "| measure | n | p50 s | p99 s | max s |", "|---|---|---|---|---|"]
    for label, key in (("achieved RPO at DR (samples)", "dr_rpo_samples_s"),
                       ("achieved RPO at the primary (samples)", "primary_rpo_samples_s"),
                       ("DR RPO peak per interval (histogram)", "dr_peaks_s"),
                       ("primary RPO peak per interval", "primary_peaks_s")):
        st = doc[key]
        lines.append(f"| {label} | {st['n']} | {_f(st['p50'])} | {_f(st['p99'])} "
                     f"| {_f(st['max'])} |")
    lines += ["", "Where a DR point's lag goes (incremental points of the window):", "",
              "| phase | p50 s | p99 s | max s |", "|---|---|---|---|"]
    names = {"capture_s": "requested -> cut (capture)", "commit_s": "cut -> committed",
             "queued_s": "committed -> replicate job running",
             "job_to_copy_s": "job running -> first member copy",
             "copy_s": "first member copy -> last member done",
             "to_verified_s": "last member done -> verified at DR",
             "lag_s": "cut -> verified at DR (lag)"}
    for k, label in names.items():
        st = doc["phases_s"][k]
        lines.append(f"| {label} | {_f(st['p50'])} | {_f(st['p99'])} | {_f(st['max'])} |")
    ms = doc["member_sync_s"]
    lines.append(f"| one member's cutpoint-sync run | {_f(ms['p50'])} | {_f(ms['p99'])} "
                 f"| {_f(ms['max'])} |")
    lines.append("")
    lines.append(f"snapshots committed {doc['snapshots_committed']}, not committed "
                 f"{doc['snapshots_not_committed']}; DR points {doc['dr_points']} "
                 f"({doc['dr_points_incremental']} incremental); replicate jobs failed "
                 f"{doc['replicate_jobs_failed']}; changed per point p50 "
                 f"{(doc['bytes_changed_per_point']['p50'] or 0) / 2**20:.2f} MiB")
    p99 = doc["dr_peaks_s"]["p99"]
    lines.append(f"goal DR RPO p99 <= 15 s (per-interval peaks): "
                 f"{'met' if p99 is not None and p99 <= 15 else 'NOT met'} ({_f(p99)} s)")
    return "\n".join(lines)
