"""`cutpoint-lab bench control-plane`: API latency and scheduler capacity.

Part 1, API latency: a fresh SQLite database with G groups, the API under
uvicorn (one process), sequential requests over HTTP/1.1 keep-alive:
reads (group, snapshot list, RPO status) and snapshot requests (POST →
202).  Reports p50/p99/max in ms.

Part 2, capacity: for each N in the steps, a fresh database with N groups
(one single-disk VM each) on a 60 s RPO, one Celery worker (by default one
process with the threads pool, 32 threads: `--pool prefork -c 2` is the
old shape) and one beat, against an in-process agent-protocol peer over mutual TLS
(`cutpoint.agentclient.testing.AgentPeer`, 2 ms per member snapshot: the
control plane is what is measured, not QEMU or Ceph).  After `duration`
seconds it counts committed snapshots and RPO misses, the agent round
trips the peer answered (every request is one: prepare, commit,
snapshot.list) per second, and the worker's CPU seconds (/proc) per
committed snapshot.  The capacity is the largest N with no miss.

Prints a table and writes JSON; a benchmark is never a timed test (machines differ,
so a time limit would only measure the machine).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from cutpoint.api import services_local
from cutpoint.api.db import get_sessionmaker
from cutpoint.api.migrate import upgrade
from cutpoint.api.models import GroupSnapshot, Host, Role, RpoMiss, Site, SnapState
from cutpoint.api.schemas.groups import GroupCreate, MemberAdd
from cutpoint.api.schemas.policy import PolicyUpdate
from cutpoint.api.services import groups, inventory, tokens
from sqlalchemy import func, select

SECRET = "bench-secret-0123456789abcdef"
QUEUES = "cutpoint.snapshots,cutpoint.default,cutpoint.scheduler,cutpoint.inventory"
CELERY = [sys.executable, "-m", "celery", "-A", "cutpoint.api.worker:celery_app"]


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(p / 100 * (len(xs) - 1)))]


def _seed(db: str, n: int, *, address: str, port: int, rpo: int | None) -> str:
    sf = get_sessionmaker(db)
    with sf() as s:
        site = Site(name="primary")
        s.add(site)
        s.flush()
        host = Host(name="peer", site_id=site.id, address=address, port=port)
        s.add(host)
        s.flush()
        inventory.apply(s, host, {"vms": [
            {"name": f"vm{i}", "state": "running",
             "disks": [{"id": f"vm{i}/disk0", "node": "disk0", "backend": "rbd"}]}
            for i in range(n)]})
        for i in range(n):
            g = groups.create(s, GroupCreate(name=f"g{i}", policy=PolicyUpdate(
                rpo_seconds=rpo, lease_ms=2000, pause_budget_ms=1000)))
            groups.add_member(s, g, MemberAdd(vm=f"vm{i}"))
        _, tok = tokens.create(s, "bench", Role.admin, SECRET)
    return tok


class Peer:
    """An AgentPeer on its own event loop thread."""

    def __init__(self, pki: dict[str, dict[str, str]], n: int) -> None:
        from cutpoint.agentclient.testing import AgentPeer

        self.loop = asyncio.new_event_loop()
        self.peer = AgentPeer("peer", {f"vm{i}": ["disk0"] for i in range(n)},
                              ca=pki["ca"]["cert"], cert=pki["agent"]["cert"],
                              key=pki["agent"]["key"])
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.port = asyncio.run_coroutine_threadsafe(self.peer.start(), self.loop).result(10)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.peer.stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


def _start(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    out = open(log, "ab")  # noqa: SIM115  owned by the child
    return subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT,
                            start_new_session=True)


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
    for p in procs:
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def api_latency(tmp: Path, redis_url: str, n_groups: int, n_req: int) -> dict[str, Any]:
    db = f"sqlite:///{tmp}/lat.db"
    upgrade(db)
    tok = _seed(db, n_groups, address="127.0.0.1", port=1, rpo=None)
    port = services_local.free_port()
    env = {**os.environ, "CUTPOINT_DATABASE_URL": db, "CUTPOINT_REDIS_URL": redis_url,
           "CUTPOINT_TOKEN_SECRET": SECRET}
    api = _start([sys.executable, "-m", "uvicorn", "--factory", "cutpoint.api.app:create_app",
                  "--port", str(port), "--no-access-log", "--log-level", "warning"],
                 env, tmp / "api.log")
    out: dict[str, Any] = {}
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}",
                          headers={"Authorization": f"Bearer {tok}"}, timeout=30) as c:
            for _ in range(200):
                try:
                    if c.get("/healthz").status_code == 200:
                        break
                except httpx.HTTPError:
                    time.sleep(0.05)
            cases = {
                "GET /v1/groups/{g}": lambda i: c.get(f"/v1/groups/g{i % n_groups}"),
                "GET /v1/groups/{g}/snapshots": lambda i: c.get(
                    f"/v1/groups/g{i % n_groups}/snapshots"),
                "GET /v1/groups/{g}/rpo": lambda i: c.get(f"/v1/groups/g{i % n_groups}/rpo"),
                "POST /v1/groups/{g}/snapshots": lambda i: c.post(f"/v1/groups/g{i}/snapshots"),
            }
            for name, fn in cases.items():
                k = min(n_req, n_groups) if name.startswith("POST") else n_req
                lat = []
                for i in range(k):
                    t0 = time.perf_counter()
                    r = fn(i)
                    lat.append((time.perf_counter() - t0) * 1000)
                    if r.status_code >= 400:
                        raise RuntimeError(f"{name}: {r.status_code} {r.text[:300]}")
                out[name] = {"n": k, "p50_ms": statistics.median(lat),
                             "p99_ms": pct(lat, 99), "max_ms": max(lat)}
    finally:
        _stop([api])
    return out


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process and of its live children: the
    worker's own (threads pool), or with its pool processes (prefork)."""
    total = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    pids = [pid]
    try:
        pids += [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        pass
    for p in pids:
        try:
            f = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(f[11]) + int(f[12])) / tick
    return total


def _fresh_db(step: Path, eps: Any) -> str:
    """A new, migrated database for one step: a SQLite file, or (eps given)
    a new database on the bench's PostgreSQL server."""
    if eps is None:
        db = f"sqlite:///{step}/cap.db"
    else:
        from sqlalchemy import create_engine, text

        name = f"cap_{step.name.replace('-', '_')}_{os.getpid()}"
        eng = create_engine(eps.admin_url(), isolation_level="AUTOCOMMIT")
        with eng.connect() as c:
            c.execute(text(f"CREATE DATABASE {name}"))
        eng.dispose()
        db = eps.admin_url(name)
    upgrade(db)
    return db


def capacity_step(tmp: Path, redis_port: int, pki: dict[str, dict[str, str]], n: int,
                  rpo: int, duration: float, pool: str = "threads",
                  concurrency: int = 32, pg: Any = None) -> dict[str, Any]:
    step = tmp / f"cap-{n}"
    step.mkdir()
    db = _fresh_db(step, pg)
    peer = Peer(pki, n)
    _seed(db, n, address="127.0.0.1", port=peer.port, rpo=rpo)
    redis_url = f"redis://127.0.0.1:{redis_port}/9"
    import redis

    redis.Redis.from_url(redis_url).flushdb()
    env = {**os.environ, "CUTPOINT_DATABASE_URL": db, "CUTPOINT_REDIS_URL": redis_url,
           "CUTPOINT_TOKEN_SECRET": SECRET, "CUTPOINT_AGENT_CA": pki["ca"]["cert"],
           "CUTPOINT_AGENT_CERT": pki["coordinator"]["cert"],
           "CUTPOINT_AGENT_KEY": pki["coordinator"]["key"],
           "CUTPOINT_RETENTION_INTERVAL_S": "3600", "CUTPOINT_INVENTORY_INTERVAL_S": "3600"}
    procs = [
        _start([*CELERY, "worker", "-Q", QUEUES, "-P", pool, "-c", str(concurrency),
                "--loglevel", "WARNING", "-n", f"bench{n}@%h"], env, step / "worker.log"),
        _start([*CELERY, "beat", "-s", str(step / "beat"), "--loglevel", "WARNING"],
               env, step / "beat.log"),
    ]
    t0 = time.monotonic()
    load0 = os.getloadavg()[0]
    cpu, round_trips = 0.0, 0
    try:
        time.sleep(duration)
        cpu = _cpu_s(procs[0].pid)
        round_trips = len(peer.peer.requests)
    finally:
        _stop(procs)
        peer.stop()
    sf = get_sessionmaker(db)
    with sf() as s:
        committed = s.scalar(select(func.count()).select_from(GroupSnapshot).where(
            GroupSnapshot.state == SnapState.committed)) or 0
        failed = s.scalar(select(func.count()).select_from(GroupSnapshot).where(
            GroupSnapshot.state.in_([SnapState.aborted, SnapState.failed]))) or 0
        misses = s.scalar(select(func.count()).select_from(RpoMiss)) or 0
        missed_groups = s.scalar(select(func.count(func.distinct(RpoMiss.group_id)))) or 0
        pauses = [p for p in s.scalars(select(GroupSnapshot.max_pause_ms).where(
            GroupSnapshot.max_pause_ms.is_not(None)))]
        durs = [d for d in s.scalars(select(GroupSnapshot.duration_ms).where(
            GroupSnapshot.state == SnapState.committed)) if d is not None]
        reasons = dict(s.execute(select(RpoMiss.reason, func.count()).group_by(RpoMiss.reason))
                       .all())
        errors = dict(s.execute(select(GroupSnapshot.error_code, func.count()).where(
            GroupSnapshot.state.in_([SnapState.aborted, SnapState.failed]))
            .group_by(GroupSnapshot.error_code)).all())
        first = list(s.execute(select(GroupSnapshot.group_id, func.min(GroupSnapshot.cut_at))
                               .where(GroupSnapshot.state == SnapState.committed)
                               .group_by(GroupSnapshot.group_id)).all())
        t_start = min((c for _, c in first), default=None)
        t_last_first = max((c for _, c in first), default=None)
    secs = time.monotonic() - t0
    return {"groups": n, "rpo_s": rpo, "seconds": round(secs, 1),
            "pool": pool, "concurrency": concurrency,
            "committed": committed, "failed": failed, "rpo_misses": misses,
            "groups_with_miss": missed_groups, "miss_reasons": reasons,
            "loadavg_1m": [round(load0, 2), round(os.getloadavg()[0], 2)],
            "failure_codes": errors,
            "groups_captured": len(first),
            "first_round_spread_s": (t_last_first - t_start).total_seconds()
            if t_start and t_last_first else None,
            "agent_round_trips": round_trips,
            "agent_round_trips_per_s": round(round_trips / duration, 1),
            "snapshots_per_s": round(committed / duration, 2),
            "worker_cpu_s": round(cpu, 1),
            "worker_cpu_ms_per_snapshot": round(1000 * cpu / committed, 2) if committed else None,
            "snapshot_duration_p50_ms": statistics.median(durs) if durs else None,
            "pause_p50_ms": statistics.median(pauses) if pauses else None}


def run(*, out: Path, steps: list[int], rpo: int = 60, duration: float | None = None,
        latency_groups: int = 200, latency_requests: int = 300, pool: str = "threads",
        concurrency: int = 32, keep_going: bool = False,
        database: str = "sqlite") -> dict[str, Any]:
    from cutpoint.agentclient.testing import PKI_ROLES, make_pki

    tmp = Path(tempfile.mkdtemp(prefix="cp-bench-"))
    if database == "postgresql":
        tmp.chmod(0o711)  # the postgres user reaches its data directory through it
    eps = services_local.start(tmp / "svc", postgres=database == "postgresql")
    res: dict[str, Any] = {"machine": {"cpus": os.cpu_count()}, "database": database,
                           "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                           "worker": {"pool": pool, "concurrency": concurrency},
                           "latency": {}, "capacity": []}
    try:
        res["latency"] = api_latency(tmp, eps.redis_url, latency_groups, latency_requests)
        pki = make_pki(tmp / "pki", {"agent": ["127.0.0.1"], "coordinator": []}, roles=PKI_ROLES)
        for n in steps:
            r = capacity_step(tmp, int(eps.redis_port or 0), pki, n, rpo,
                              duration if duration is not None else 2 * rpo + 10,
                              pool=pool, concurrency=concurrency,
                              pg=eps if database == "postgresql" else None)
            res["capacity"].append(r)
            print(json.dumps(r), file=sys.stderr, flush=True)
            if r["rpo_misses"] and not keep_going:
                break
        ok = [r["groups"] for r in res["capacity"] if not r["rpo_misses"]]
        res["max_groups_without_miss"] = max(ok) if ok else 0
    finally:
        services_local.destroy(tmp / "svc")
        if os.environ.get("CUTPOINT_BENCH_KEEP"):
            print(f"kept {tmp} (CUTPOINT_BENCH_KEEP)", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    out.write_text(json.dumps(res, indent=2))
    return res


def print_table(res: dict[str, Any]) -> None:
    print(f"{'request':34} {'n':>5} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")
    for name, r in res["latency"].items():
        print(f"{name:34} {r['n']:5d} {r['p50_ms']:8.2f} {r['p99_ms']:8.2f} {r['max_ms']:8.2f}")
    print()
    print(f"{'groups':>6} {'rpo s':>5} {'secs':>5} {'committed':>9} {'failed':>6} "
          f"{'misses':>6} {'dur p50 ms':>10} {'snap/s':>6} {'agent rt/s':>10} "
          f"{'cpu ms/snap':>11} {'1st round s':>11}")
    for r in res["capacity"]:
        d = r["snapshot_duration_p50_ms"]
        sp = r.get("first_round_spread_s")
        print(f"{r['groups']:6d} {r['rpo_s']:5d} {r['seconds']:5.0f} {r['committed']:9d} "
              f"{r['failed']:6d} {r['rpo_misses']:6d} {d if d is None else round(d, 1)!s:>10} "
              f"{r['snapshots_per_s']:6.2f} {r['agent_round_trips_per_s']:10.1f} "
              f"{r['worker_cpu_ms_per_snapshot']!s:>11} {sp if sp is None else round(sp, 1)!s:>11}")
    print(f"\nlargest group count kept on a {res['capacity'][0]['rpo_s'] if res['capacity'] else '-'}"
          f" s RPO with no miss: {res.get('max_groups_without_miss')}")


def control_plane(
    out: Path = Path("out/bench-control-plane.json"),
    steps: str = "25,100,400",
    rpo: int = 60,
    duration: float | None = None,
    pool: str = "threads",
    concurrency: int = 32,
    keep_going: bool = False,
    database: str = "sqlite",
) -> None:
    """Control-plane benchmark: API p50/p99 and scheduler capacity at an RPO."""
    out.parent.mkdir(parents=True, exist_ok=True)
    res = run(out=out, steps=[int(x) for x in steps.split(",") if x], rpo=rpo,
              duration=duration, pool=pool, concurrency=concurrency, keep_going=keep_going,
              database=database)
    print_table(res)
    print(f"JSON: {out}")
