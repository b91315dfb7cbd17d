"""One single-node Ceph cluster per site: mon `a`, mgr `x`, OSD 0, cephx on.

Bring-up order (each step needs the previous one):

    keyrings (ceph-authtool) -> monmap (monmaptool) -> ceph-mon --mkfs
    -> ceph-mon -> `ceph osd create` -> ceph-osd --mkfs -> ceph-osd
    -> ceph-mgr -> pool `rbd` (size 1) -> `rbd pool init`

All keys (mon., client.admin, osd.0, mgr.x and the control plane's
clients, `CLIENTS`) go into the mon's mkfs keyring, so the mon's auth
database holds them from the start and no bootstrap keyring round trip is
needed.  Daemons listen on the site's address of the lab bridge (see
config.py), never on loopback.

The control plane reaches a site as a cephx client that is not admin, as an
operator's deployment would: `client.cutpoint` with the rbd profiles on the
pool.  `client.cutpoint-ro` may only read, so that tests can show what a
client without enough caps gets.  Both are in the status (`clients`);
`client_id`/`keyring` stay client.admin for the lab's own tools.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from cutpoint.lab import config as C
from cutpoint.lab.errors import LabError
from cutpoint.lab.proc import kill_pids, pid_alive, read_pidfile, run

DAEMONS = ("mgr.x", "osd.0", "mon.a")  # stop order
POOL = "rbd"
# role -> (cephx id, caps).  On the mon, `profile rbd` is the minimum an
# RBD client needs (it may blocklist a dead lock owner); on the OSD and
# mgr it is scoped to the pool, as a deployment would give it.
CLIENTS = {
    "cutpoint": ("cutpoint", {"mon": "profile rbd", "osd": f"profile rbd pool={POOL}",
                              "mgr": f"profile rbd pool={POOL}"}),
    "readonly": ("cutpoint-ro", {"mon": "profile rbd",
                                 "osd": f"profile rbd-read-only pool={POOL}"}),
}


def site_dir(state: Path, site: str) -> Path:
    return state / "ceph" / site


def mon_settings(paxos: str) -> dict[str, str]:
    """The mon settings the lab chooses (recorded in status and docs/lab.md)."""
    s = {
        "mon_allow_pool_size_one": "true",
        "mon_allow_pool_delete": "true",
        "mon_warn_on_pool_no_redundancy": "false",
        "auth_allow_insecure_global_id_reclaim": "false",
    }
    if paxos == "tuned":
        s.update(C.TUNED_PAXOS)
    return s


def write_conf(d: Path, site: str, fsid: str, osd: str, paxos: str) -> Path:
    addr = C.SITE_ADDR[site]
    v2, v1 = C.MON_PORTS[site]
    pmin, pmax = C.DAEMON_PORTS[site]
    mon = "\n".join(f"{k.replace('_', ' ')} = {v}" for k, v in mon_settings(paxos).items())
    if osd == "memstore":
        store = ("osd objectstore = memstore\n"
                 "memstore device bytes = 4294967296\n")
    else:
        store = ("osd objectstore = bluestore\n"
                 # The block file sits next to (not in) the OSD data dir:
                 # mkfs links $osd_data/block to it.
                 f"bluestore block path = {d}/osd/$name.block\n"
                 "bluestore block create = true\n"
                 "bluestore block size = 10737418240\n"  # sparse file, 10 GiB
                 "bluestore fsck on mkfs = false\n"
                 "bluestore cache size = 134217728\n")
    text = f"""# cutpoint lab, site {site} (generated; see docs/lab.md)
[global]
fsid = {fsid}
mon host = [v2:{addr}:{v2},v1:{addr}:{v1}]
public addr = {addr}
cluster addr = {addr}
ms bind port min = {pmin}
ms bind port max = {pmax}
auth cluster required = cephx
auth service required = cephx
auth client required = cephx
keyring = {d}/ceph.client.admin.keyring
run dir = {d}/run
admin socket = {d}/run/$name.asok
pid file = {d}/run/$name.pid
log file = {d}/log/$name.log
mon data = {d}/mon/$name
osd data = {d}/osd/$name
mgr data = {d}/mgr/$name
osd pool default size = 1
osd pool default min size = 1
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 0
mon max pg per osd = 1000
crash dir = {d}/crash
[mon]
{mon}
[osd]
keyring = $osd_data/keyring
{store}osd memory target = 536870912
osd crush update on start = true
[mgr]
keyring = $mgr_data/keyring
mgr initial modules =
[client]
rbd default features = 61
# Ceph's own default for clients: one admin socket per client instance.
# With the daemons' `$name.asok` above shared by every QEMU and agent of
# the site, attaching an RBD image in one VM's QEMU took 10 s while the
# QEMU holding the socket was SIGSTOPped (agent-lab's hung-QEMU test); our
# reading is that a new client checks a socket in use by asking its
# holder, and waits out that request's timeouts.
admin socket = {d}/run/$cluster-$name.$pid.$cctid.asok
"""
    p = d / "ceph.conf"
    p.write_text(text)
    return p


def write_qemu_conf(site_status: dict[str, Any], op_timeout_s: int) -> str:
    """The ceph.conf the site's QEMU guests open their disks with (conf=).

    The site's own conf plus, for QEMU's client, the request timeouts an
    operator sets on a hypervisor host (docs/operations.md): QEMU runs an
    internal RBD snapshot in its main loop, which also serves `cont`, so
    only its Ceph client's timeouts bound that pause.  0: the site's conf
    as it is (no timeout)."""
    conf = Path(site_status["ceph_conf"])
    if op_timeout_s <= 0:
        return str(conf)
    q = conf.with_name("qemu.conf")
    q.write_text(conf.read_text() + f"""
# QEMU's Ceph client (cutpoint.lab.ceph.write_qemu_conf)
[client.{site_status['client_id']}]
rados osd op timeout = {op_timeout_s}
rados mon op timeout = {op_timeout_s}
""")
    return str(q)


def _authtool(*args: str) -> None:
    run(["ceph-authtool", *args])


def ceph_cmd(site_dir_: Path, *args: str) -> list[str]:
    return ["ceph", "-c", str(site_dir_ / "ceph.conf"), "--id", "admin",
            "--connect-timeout", "30", *args]


def _osd0(site_dir_: Path) -> tuple[int, bool, int]:
    """(osdmap epoch, osd.0 up, the epoch osd.0 is up since)."""
    d = json.loads(run(ceph_cmd(site_dir_, "osd", "dump", "-f", "json"), timeout=60).stdout)
    o = next(x for x in d["osds"] if x["osd"] == 0)
    return int(d["epoch"]), bool(o["up"]), int(o["up_from"])


def renew_pg_leases(site_dir_: Path, timeout: float = 120) -> float:
    """Give a lab site's PGs a new peering interval once its OSD is back
    from a stop; returns the seconds until every PG was active+clean in it.

    The lab's one OSD is every PG's only member, so no peer renews a PG's
    read lease: after the OSD is stopped (SIGSTOP) for longer than the
    lease (0.8 x osd_heartbeat_grace, 16 s), its PGs stay `laggy` once it
    is back and the requests queued on them wait for good (ceph/ceph-container
    issue 1682; seen here on 2026-11-27 in the DR OSD hang cell: 28 requests
    stuck 294 s after SIGCONT).  A cluster with peers renews the lease.
    `pg repeer` refuses with one OSD up, so the OSD is marked down: it is
    alive, boots again, and its PGs peer anew (8 s when tried by hand).

    Done only when the OSD is up again in a later epoch and every PG's
    stats come from that epoch (`mapping_epoch`): right after `osd down`
    the PG stats still say active+clean from before, and an OSD back from
    a 62 s stop took 32 s to learn it was marked down (its mon session had
    to be found dead first); a copy started on the stale word failed to
    open its DR image (CI run of 2cb4c1a and its rerun, 2026-11-27).
    """
    t0 = time.monotonic()
    before, _, _ = _osd0(site_dir_)
    run(ceph_cmd(site_dir_, "osd", "down", "0"), timeout=60)
    states: dict[str, str] = {}
    while True:
        _, up, since = _osd0(site_dir_)
        if up and since > before:
            out = run(ceph_cmd(site_dir_, "pg", "ls", "-f", "json"), timeout=60).stdout
            data = json.loads(out)
            stats = data["pg_stats"] if isinstance(data, dict) else data
            states = {x["pgid"]: x["state"] if int(x.get("mapping_epoch", 0)) >= since
                      else f"{x['state']} (stats of epoch {x.get('mapping_epoch')})"
                      for x in stats}
            if states and all(v == "active+clean" for v in states.values()):
                return time.monotonic() - t0
        if time.monotonic() - t0 > timeout:
            raise LabError(f"{site_dir_.name}: osd.0 {'up since epoch ' + str(since) if up else 'down'}"
                           f" (marked down after epoch {before}); PGs not active+clean in a "
                           f"later epoch {timeout:.0f} s after marking it down: {states}")
        time.sleep(1)


def rbd_cmd(site_status: dict[str, Any], *args: str) -> list[str]:
    """argv for the `rbd` CLI against one site of `lab status`."""
    return ["rbd", "-c", site_status["ceph_conf"], "--id", site_status.get("client_id", "admin"),
            "--keyring", site_status["keyring"], *args]


# rbd subcommands that only read: asking again cannot change anything.
_RBD_QUERIES = {"status", "info", "ls", "du", "diff", "export", "lock ls", "snap ls"}


def run_rbd(site_status: dict[str, Any], *args: str,
            timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run the rbd CLI against one site; never raises on its exit code.

    A read-only query whose process died of a signal is run once more.
    Why: in one CI run `rbd status` aborted inside librados's own threads
    (a backtrace and no error) just after a drill's guests opened their
    images; 500 runs of the same query here, idle and under load, never
    crashed.  A crashed CLI is not an answer from the cluster, so the query
    is asked again; the crash's first lines go to stderr so it stays
    visible.  Commands that change state are never repeated."""
    argv = rbd_cmd(site_status, *args)
    p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    query = args[0] in _RBD_QUERIES or " ".join(args[:2]) in _RBD_QUERIES
    if p.returncode < 0 and query:
        print(f"rbd {' '.join(args[:2])}: killed by signal {-p.returncode}, asking "
              f"once more; its stderr began: {p.stderr[:800]!r}", file=sys.stderr)
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                           check=False)
    return p


def up(state: Path, site: str, osd: str, paxos: str, mark: str,
       log: Any = print) -> dict[str, Any]:
    """Create and start the site's cluster; returns its status entry."""
    d = site_dir(state, site)
    for sub in ("run", "log", "mon/mon.a", "osd/osd.0", "mgr/mgr.x", "crash"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    fsid = str(uuid.uuid4())
    conf = write_conf(d, site, fsid, osd, paxos)
    c = str(conf)
    t0 = time.monotonic()
    monkr, adminkr = d / "mon.keyring", d / "ceph.client.admin.keyring"
    _authtool("--create-keyring", str(monkr), "--gen-key", "-n", "mon.", "--cap", "mon", "allow *")
    _authtool("--create-keyring", str(adminkr), "--gen-key", "-n", "client.admin",
              "--cap", "mon", "allow *", "--cap", "osd", "allow *",
              "--cap", "mds", "allow *", "--cap", "mgr", "allow *")
    osdkr, mgrkr = d / "osd/osd.0/keyring", d / "mgr/mgr.x/keyring"
    _authtool("--create-keyring", str(osdkr), "--gen-key", "-n", "osd.0",
              "--cap", "mon", "allow profile osd", "--cap", "mgr", "allow profile osd",
              "--cap", "osd", "allow *")
    _authtool("--create-keyring", str(mgrkr), "--gen-key", "-n", "mgr.x",
              "--cap", "mon", "allow profile mgr", "--cap", "osd", "allow *",
              "--cap", "mds", "allow *")
    clients = {}
    for role, (cid, caps) in CLIENTS.items():
        kr = d / f"ceph.client.{cid}.keyring"
        capargs = [a for k, v in caps.items() for a in ("--cap", k, v)]
        _authtool("--create-keyring", str(kr), "--gen-key", "-n", f"client.{cid}", *capargs)
        kr.chmod(0o600)
        clients[role] = {"client_id": cid, "keyring": str(kr), "caps": caps}
    for kr in (adminkr, osdkr, mgrkr, *(Path(c["keyring"]) for c in clients.values())):
        _authtool(str(monkr), "--import-keyring", str(kr))
    addr = C.SITE_ADDR[site]
    v2, v1 = C.MON_PORTS[site]
    run(["monmaptool", "--create", "--clobber", "--fsid", fsid,
         "--addv", "a", f"[v2:{addr}:{v2},v1:{addr}:{v1}]", str(d / "monmap")])
    run(["ceph-mon", "-c", c, "--mkfs", "-i", "a", "--monmap", str(d / "monmap"),
         "--keyring", str(monkr)], mark=mark)
    run(["ceph-mon", "-c", c, "-i", "a"], mark=mark)
    log(f"{site}: mon a up on {addr}:{v2} ({time.monotonic() - t0:.1f}s)")
    osd_uuid = str(uuid.uuid4())
    osd_id = run(ceph_cmd(d, "osd", "create", osd_uuid)).stdout.strip()
    if osd_id != "0":
        raise LabError(f"{site}: expected osd id 0, mon gave {osd_id!r}")
    run(["ceph-osd", "-c", c, "-i", "0", "--mkfs", "--osd-uuid", osd_uuid], mark=mark,
        timeout=180)
    run(["ceph-osd", "-c", c, "-i", "0"], mark=mark)
    run(["ceph-mgr", "-c", c, "-i", "x"], mark=mark)
    _wait_osd_up(d)
    log(f"{site}: osd.0 ({osd}) and mgr x up ({time.monotonic() - t0:.1f}s)")
    run(ceph_cmd(d, "osd", "pool", "create", POOL, "8", "8"))
    run(["rbd", "-c", c, "--id", "admin", "pool", "init", POOL], timeout=120)
    log(f"{site}: pool {POOL} ready ({time.monotonic() - t0:.1f}s)")
    return {
        "ceph_conf": c, "keyring": str(adminkr), "client_id": "admin", "pool": POOL,
        "clients": clients,
        "mon_addr": f"{addr}:{v2}", "mon_addrs": [f"v2:{addr}:{v2}", f"v1:{addr}:{v1}"],
        "fsid": fsid, "osd_objectstore": osd, "paxos": paxos,
        "mon_settings": mon_settings(paxos), "pids": pids(state, site),
        "data_dir": str(d),
    }


def _wait_osd_up(d: Path, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        cp = run(ceph_cmd(d, "osd", "stat", "-f", "json"), check=False)
        last = cp.stdout.strip() or cp.stderr.strip()
        try:
            if json.loads(cp.stdout).get("num_up_osds") == 1:
                return
        except ValueError:
            pass
        time.sleep(0.3)
    raise LabError(f"osd.0 of {d} not up after {timeout}s (last osd stat: {last})")


def pids(state: Path, site: str) -> dict[str, int]:
    d = site_dir(state, site)
    return {n: read_pidfile(d / "run" / f"{n}.pid") for n in DAEMONS}


def down(state: Path, site: str) -> list[str]:
    """Stop the site's daemons found by pid file; returns what was stopped."""
    stopped = []
    for name, pid in pids(state, site).items():
        if pid and pid_alive(pid):
            kill_pids([pid])
            stopped.append(f"{site} {name} (pid {pid})")
    return stopped
