"""Group-level replication: every member disk of a group snapshot to DR.

    result = replicate_group(src_site, dst_site, members, jobs=2)

Each member is one `cutpoint-sync` copy (docs/replication.md) of
`pool/image@snap` from `src_site` to the same-named image and snapshot at
`dst_site`, incrementally from `base` when the member has one.  Copies go
in parallel, at most `jobs` at a time, through `jobs` `cutpoint-sync
--serve` sessions that each connect to both clusters once and copy one
member after another (`sync_argv` is the one-shot command line of one
member, for tools and tests).  A site is a `CephSite` (site.py): the
engine gets its ceph.conf, cephx id, keyring path and the member's pool as
mapped at that site.  The engine reads a ceph.conf file, so a site given by
mon addresses gets a generated one (`mon_host` only) in the state directory.

Invariant 5: the group snapshot is a DR recovery point only when *every*
member's run ended with a `done` event (its extents checksummed and
verified at DR, the DR snapshot created last as completion marker) and,
with `verify_full`, the full SHA-256 of both sides matched.  One failed
member makes the whole group `failed`; the members that did arrive stay at
DR and are the base of the retry (the engine finds them "already" there).

Member states:  pending --> copying --> verified
                                  \\--> failed
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from cutpoint.coordinator.dr.ceph_errors import CephNotFound
from cutpoint.coordinator.dr.site import CephConnection, CephSite, SiteConfigError

REPO = Path(__file__).resolve().parents[2]  # the source tree, for its build/
DEFAULT_STATE_DIR = "/var/lib/cutpoint/sync"

EventHook = Callable[[str, dict[str, Any]], None]
EXIT_FENCED = 6  # cutpoint-sync: the target image is the live copy (docs/replication.md)


class ReplicationError(RuntimeError):
    """A replication step failed: carries the command and what came back."""

    def __init__(self, message: str, argv: Sequence[str] = (), returncode: int | None = None,
                 stderr: str = "") -> None:
        self.argv = list(argv)
        self.returncode = returncode
        self.stderr = stderr
        super().__init__(message)


def sync_binary() -> str:
    """cutpoint-sync: $CUTPOINT_SYNC, build/storage/sync/cutpoint-sync, or PATH."""
    env = os.environ.get("CUTPOINT_SYNC")
    if env:
        return env
    built = REPO / "build" / "storage" / "sync" / "cutpoint-sync"
    if built.is_file():
        return str(built)
    found = shutil.which("cutpoint-sync")
    if found:
        return found
    raise ReplicationError(f"cutpoint-sync not found (looked at $CUTPOINT_SYNC, {built}, PATH); "
                           "build it with `ninja -C build`")


@dataclass(frozen=True)
class MemberCopy:
    """One member disk to copy: image@snap, incrementally from base if given."""

    image: str
    snap: str
    base: str | None = None
    disk: str = ""  # "<vm>/<node>", for reports
    pool: str = "rbd"  # logical pool: each site maps it to its own (CephSite.pools)


@dataclass
class MemberResult:
    image: str
    snap: str
    base: str | None
    disk: str
    state: str = "pending"  # pending|copying|verified|failed
    full: bool | None = None
    already: bool = False
    bytes_shipped: int = 0
    bytes_changed: int = 0
    bytes_zeroed: int = 0
    bytes_repaired: int = 0  # drift at the target since base, copied back (part of shipped)
    bytes_zero_data: int = 0  # diff data that read as zeroes: zeroed at the target, not shipped
    bytes_zero_skipped: int = 0  # zeroes not even written: the target object was absent
    seconds: float = 0.0
    throughput_mbps: float = 0.0
    verified_full: bool = False
    sha256: str | None = None
    error: str | None = None
    returncode: int | None = None

    @property
    def fenced(self) -> bool:
        """cutpoint-sync refused: the target image is the live copy (exit 6)."""
        return self.returncode == EXIT_FENCED

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class GroupReplication:
    state: str  # verified|failed
    members: list[MemberResult] = field(default_factory=list)
    started_at: float = 0.0  # time.time()
    finished_at: float = 0.0
    bytes_shipped: int = 0
    seconds: float = 0.0

    @property
    def recovery_point(self) -> bool:
        return self.state == "verified"

    def as_dict(self) -> dict[str, Any]:
        return {"state": self.state, "recovery_point": self.recovery_point,
                "bytes_shipped": self.bytes_shipped, "seconds": round(self.seconds, 3),
                "throughput_mbps": round(self.bytes_shipped / 1e6 / self.seconds, 2)
                if self.seconds > 0 else 0.0,
                "started_at": self.started_at, "finished_at": self.finished_at,
                "members": [m.as_dict() for m in self.members]}


def engine_conf(site: CephSite, state_dir: str) -> str:
    """The ceph.conf path cutpoint-sync reads for `site`.

    The engine reads a file; a site given by mon addresses gets one with
    just `mon_host`, written to `state_dir`.  A site with both a file and
    addresses cannot be handed over as one file without rewriting the
    operator's: refused."""
    if site.ceph_conf and site.mon_host:
        raise ReplicationError(f"site {site.name}: cutpoint-sync takes a ceph.conf or mon "
                               "addresses, not both")
    if site.ceph_conf:
        return site.ceph_conf
    path = Path(state_dir) / f"ceph-{site.name}.conf"
    text = ("# written by cutpoint for cutpoint-sync: the site's mon addresses\n"
            f"[global]\nmon_host = {','.join(site.mon_host)}\n")
    if not path.is_file() or path.read_text() != text:
        tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
    return str(path)


def site_args(prefix: str, site: CephSite, pool: str, state_dir: str) -> list[str]:
    """cutpoint-sync's options for one side: conf, cephx id, keyring path, pool here."""
    argv = [f"--{prefix}-conf", engine_conf(site, state_dir), f"--{prefix}-id",
            site.client_id, f"--{prefix}-pool", site.pool(pool)]
    if site.keyring:
        argv += [f"--{prefix}-keyring", site.keyring]
    return argv


def sync_argv(src: CephSite, dst: CephSite, m: MemberCopy, *,
              verify_full: bool = False, rate_mbps: float | None = None,
              state_dir: str = DEFAULT_STATE_DIR, full_resync: bool = False,
              epoch: int = 0) -> list[str]:
    """`epoch`: the fencing epoch the source site is active under; the engine
    refuses a target image that is the live copy since it or a newer one."""
    argv = [sync_binary(), *site_args("src", src, m.pool, state_dir),
            *site_args("dst", dst, m.pool, state_dir),
            "--image", m.image, "--snap", m.snap, "--state-dir", state_dir,
            "--progress-ms", "500", "--epoch", str(epoch),
            # The sites' own bound on one Ceph request (the engine has one
            # for both connections): without it the engine's 60 s default
            # held a group's replication far longer behind a hung DR OSD.
            "--op-timeout", str(max(src.op_timeout_s, dst.op_timeout_s))]
    if m.base:
        argv += ["--base", m.base]
    if verify_full:
        argv.append("--verify-full")
    if full_resync:
        argv.append("--full-resync")
    if rate_mbps:
        argv += ["--rate-mbps", f"{rate_mbps:g}"]
    return argv


class _GroupStop:
    """Set once, by the first member that fails, with why."""

    def __init__(self) -> None:
        self._event, self._lock, self.why = threading.Event(), threading.Lock(), ""

    def set(self, why: str) -> None:
        with self._lock:
            if not self._event.is_set():
                self.why = why
                self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()

    def wait(self, seconds: float) -> bool:
        return self._event.wait(seconds)


# An engine whose copied bytes have not grown for this long, once it has
# begun copying extents, is stopped.  One request may take up to the op
# timeout (the larger of the two sites', which the engine uses) before it
# fails; bytes that have not grown for two of them mean requests time out
# one after another; behind a hung DR OSD, with a 30 s op timeout, the
# engine went on for 150 s before it failed on its own (the lab's cell).  A copying run reports
# progress every 500 ms.  Opening and diffing a large image, before the
# first report, are bounded by the run's deadline only; so is a run with
# --verify-full, whose hash of the whole image at the end reports nothing.
# Under a rate limit, the engine's workers take turns on one clock and a
# worker's bytes count when its whole object is written: 16 MiB's time at
# that rate is added (four default 4 MiB objects; an image with larger
# objects under a low rate may need the job's deadline instead).
STALL_OP_TIMEOUTS = 2
STALL_MIN_S = 60.0
RATE_SLACK_BYTES = 16 << 20


def stall_bound_s(op_timeout_s: float, rate_mbps: float | None = None) -> float:
    """Seconds without progress after which a copy is stopped."""
    bound = max(STALL_MIN_S, STALL_OP_TIMEOUTS * op_timeout_s)
    if rate_mbps:
        bound += RATE_SLACK_BYTES / (rate_mbps * 1e6)
    return bound


class _Watch:
    """One engine run: whether it has begun copying, when its copied bytes
    last grew, and why it was stopped."""

    def __init__(self) -> None:
        self.bytes, self.why, self.copying = -1, "", False
        self.started = self.advanced = time.monotonic()

    def progress(self, ev: dict[str, Any]) -> None:
        nbytes = int(ev.get("bytes") or 0) + int(ev.get("zeroed") or 0)
        if nbytes > self.bytes:
            self.bytes, self.advanced = nbytes, time.monotonic()
        self.copying = True


def _stop_when(proc: subprocess.Popen[str], stop: _GroupStop, watch: _Watch,
               deadline: float, stall_s: float | None,
               finished: threading.Event | None = None) -> None:
    """Kills the engine once `stop` is set (another member failed), its
    progress stalls, or the copy's deadline passes: reading its output alone
    would wait for as long as the engine runs, and an engine behind a hung
    OSD says nothing.  Returns without killing once `finished` is set (the
    copy ended; the serve session goes on with the next one)."""
    while proc.poll() is None and not (finished is not None and finished.is_set()):
        stopped = stop.wait(0.2)
        if finished is not None and finished.is_set():
            return
        now = time.monotonic()
        if stopped:
            watch.why = f"stopped: {stop.why}"
        elif stall_s and watch.copying and now - watch.advanced > stall_s:
            watch.why = (f"stopped: no progress for {now - watch.advanced:.0f} s (timed out; "
                         f"bound {stall_s:.0f} s)")
        elif now > deadline:
            watch.why = f"stopped: the copy timed out after {deadline - watch.started:.0f} s"
        else:
            continue
        if proc.poll() is None:
            proc.kill()
        return


def serve_argv(src: CephSite, dst: CephSite, pool: str, *, verify_full: bool = False,
               rate_mbps: float | None = None, state_dir: str = DEFAULT_STATE_DIR,
               epoch: int = 0) -> list[str]:
    """`cutpoint-sync --serve` for a run of copies src -> dst: the sites'
    access (their pools mapped from logical `pool`, each request names its
    own), and what every copy of the run shares: the fencing epoch, the
    rate limit, full verification and the sites' op timeout."""
    argv = [sync_binary(), *site_args("src", src, pool, state_dir),
            *site_args("dst", dst, pool, state_dir), "--serve",
            "--state-dir", state_dir, "--progress-ms", "500", "--epoch", str(epoch),
            "--op-timeout", str(max(src.op_timeout_s, dst.op_timeout_s))]
    if verify_full:
        argv.append("--verify-full")
    if rate_mbps:
        argv += ["--rate-mbps", f"{rate_mbps:g}"]
    return argv


def member_request(src: CephSite, dst: CephSite, m: MemberCopy, rid: str) -> dict[str, Any]:
    """One request line of a serve session: the member, its pool as each site maps it."""
    return {"id": rid, "image": m.image, "snap": m.snap, "base": m.base,
            "src_pool": src.pool(m.pool), "dst_pool": dst.pool(m.pool)}


class _Session:
    """One `cutpoint-sync --serve` process: both clusters connected once,
    then one member copied per request (docs/replication.md, "Serve mode").
    Its stderr (key=value logs) is drained on a thread, keeping the tail."""

    def __init__(self, argv: list[str]) -> None:
        self.argv = argv
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, bufsize=1)
        self.tail: list[str] = []
        self._drain = threading.Thread(target=self._read_stderr, daemon=True,
                                       name="cutpoint-sync stderr")
        self._drain.start()

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.tail = (self.tail + [line.rstrip()])[-20:]

    def alive(self) -> bool:
        return self.proc.poll() is None

    def copy(self, src: CephSite, dst: CephSite, m: MemberCopy, res: MemberResult, rid: str,
             on_event: EventHook | None, timeout: float, stop: _GroupStop,
             stall_s: float | None) -> None:
        """Copy one member; res says how it went.  A copy that is stopped,
        stalls or times out kills the session (its next copy needs a new one)."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        res.state = "copying"
        if on_event:
            on_event("member.copying", {"image": m.image, "snap": m.snap, "base": m.base})
        t0 = time.monotonic()
        watch, finished = _Watch(), threading.Event()
        threading.Thread(target=_stop_when,
                         args=(self.proc, stop, watch, t0 + timeout, stall_s, finished),
                         name=f"stop {m.image}", daemon=True).start()
        done: dict[str, Any] | None = None
        err: dict[str, Any] | None = None
        try:
            self.proc.stdin.write(json.dumps(member_request(src, dst, m, rid)) + "\n")
            self.proc.stdin.flush()
            for line in self.proc.stdout:
                try:
                    ev = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if not isinstance(ev, dict):
                    continue
                kind = ev.get("event")
                if kind == "error" and ev.get("id") in (rid, None):
                    err = ev  # None: the session itself failed (a site not connected)
                    break
                if ev.get("id") != rid:
                    continue
                if kind == "done":
                    done = ev
                    break
                if kind == "progress":
                    watch.progress(ev)
                    if on_event:
                        on_event("member.progress", {"image": m.image, **ev})
        except (BrokenPipeError, OSError):
            pass  # the session is gone: judged below
        finally:
            finished.set()
        res.seconds = time.monotonic() - t0
        if done is not None:
            res.returncode = 0
            _judge_done(res, done, verify_full="--verify-full" in self.argv)
        else:
            if err is None and self.alive():
                self.proc.kill()
            rc = int(err["exit"]) if err is not None and "exit" in err else self.proc.wait()
            res.returncode = rc
            res.state = "failed"
            msg = (err or {}).get("message") or (watch.why if watch.why else None) \
                or (self.tail[-1] if self.tail else "no done event")
            if watch.why and err is None:
                msg = watch.why
            res.error = f"cutpoint-sync rc={rc}: {msg}"
        if on_event:
            on_event(f"member.{res.state}", res.as_dict())

    def close(self) -> None:
        end_session(self.proc)
        for f in (self.proc.stdout, self.proc.stderr):
            if f is not None:
                f.close()


def end_session(proc: subprocess.Popen[str], timeout: float = 30) -> int:
    """Ends a `cutpoint-sync --serve` process: EOF on its stdin ends the
    session; one that has not ended within `timeout` is killed.  Returns
    its exit code."""
    try:
        if proc.stdin is not None:
            proc.stdin.close()
    except OSError:
        pass
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def _judge_done(res: MemberResult, done: dict[str, Any], verify_full: bool) -> None:
    """A member's done event into its result (verified unless full
    verification was asked for and not reported)."""
    res.full = bool(done.get("full"))
    res.already = bool(done.get("already"))
    res.bytes_shipped = int(done.get("bytes_shipped", 0))
    res.bytes_changed = int(done.get("bytes_changed", 0))
    res.bytes_zeroed = int(done.get("bytes_zeroed", 0))
    res.bytes_repaired = int(done.get("bytes_repaired", 0))
    res.bytes_zero_data = int(done.get("bytes_zero_data", 0))
    res.bytes_zero_skipped = int(done.get("bytes_zero_skipped", 0))
    res.verified_full = bool(done.get("verified_full"))
    res.sha256 = done.get("dr_sha256")
    if verify_full and not res.already and not res.verified_full:
        res.state = "failed"
        res.error = "full verification was asked for and not reported"
    else:
        res.state = "verified"
    res.throughput_mbps = (res.bytes_shipped / 1e6 / res.seconds) if res.seconds else 0.0


def replicate_group(src: CephSite, dst: CephSite, members: Sequence[MemberCopy],
                    *, jobs: int = 2, verify_full: bool = False,
                    rate_mbps: float | None = None, state_dir: str = DEFAULT_STATE_DIR,
                    on_event: EventHook | None = None,
                    timeout_s: float = 1800, epoch: int = 0) -> GroupReplication:
    """Copy every member (at most `jobs` at once); verified only if all are.
    `epoch`: the group's fencing epoch, passed to every copy.

    The members go through `jobs` `cutpoint-sync --serve` sessions, each
    connected to both clusters once and copying one member after another
    (a process and two cluster connections per member cost about half of
    a small copy: docs/benchmarks.md "Replication")."""
    if not members:
        raise ReplicationError("a group snapshot with no member disks is not replicable")
    if jobs < 1:
        raise ReplicationError(f"jobs must be >= 1, got {jobs}")
    Path(state_dir).mkdir(parents=True, exist_ok=True)
    for site in (src, dst):  # a site that cannot work fails here, before any copy starts
        engine_conf(site, state_dir)
        for m in members:
            try:
                site.pool(m.pool)
            except SiteConfigError as exc:
                raise ReplicationError(str(exc)) from None
    results = [MemberResult(m.image, m.snap, m.base, m.disk) for m in members]
    t0, w0 = time.monotonic(), time.time()
    # The group is verified only if every member is: once one fails, the
    # others stop (each resumes from its progress record next time).
    # Behind a hung DR OSD each member's engine fails only after several
    # of its requests time out one after the other; run member after
    # member, a group of 8 disks took 181 s to fail in the lab.
    stop = _GroupStop()
    argv = serve_argv(src, dst, members[0].pool, verify_full=verify_full,
                      rate_mbps=rate_mbps, state_dir=state_dir, epoch=epoch)
    stall_s = None if verify_full else \
        stall_bound_s(max(src.op_timeout_s, dst.op_timeout_s), rate_mbps)
    todo = list(enumerate(zip(members, results, strict=True)))
    todo.reverse()
    lock = threading.Lock()

    def worker() -> None:
        sess: _Session | None = None
        try:
            while True:
                with lock:
                    if not todo:
                        return
                    n, (m, r) = todo.pop()
                if stop.is_set():
                    r.state, r.error = "failed", f"not copied: {stop.why}"
                    if on_event:
                        on_event("member.failed", r.as_dict())
                    continue
                try:
                    if sess is None or not sess.alive():
                        if sess is not None:
                            sess.close()
                        sess = _Session(argv)
                    sess.copy(src, dst, m, r, f"m{n}", on_event, timeout_s, stop, stall_s)
                except Exception as exc:  # noqa: BLE001  recorded per member (invariant 7)
                    r.state, r.error = "failed", f"{type(exc).__name__}: {exc}"
                if r.state == "failed":
                    stop.set(f"{r.image} failed first ({r.error})")
        finally:
            if sess is not None:
                sess.close()

    with ThreadPoolExecutor(max_workers=min(jobs, len(members))) as ex:
        for f in [ex.submit(worker) for _ in range(min(jobs, len(members)))]:
            f.result()
    out = GroupReplication(
        state="verified" if all(r.state == "verified" for r in results) else "failed",
        members=results, started_at=w0, finished_at=time.time(),
        bytes_shipped=sum(r.bytes_shipped for r in results), seconds=time.monotonic() - t0)
    if on_event:
        on_event(f"group.{out.state}", out.as_dict())
    return out


def list_snaps(site: CephSite, image: str, pool: str = "rbd") -> list[str]:
    """Snapshot names of the image in creation order ([] if the image is absent)."""
    with CephConnection(site) as ceph:
        try:
            return [s.name for s in ceph.snapshots(pool, image)]
        except CephNotFound as exc:
            if exc.op == "open pool":  # a missing pool is the site's fault, not "no image"
                raise
            return []


def newest_common_snapshot(a: CephSite, b: CephSite, image: str,
                           prefix: str = "cp.", pool: str = "rbd") -> str | None:
    """The newest snapshot (in `a`'s order) present under the same name at both sites."""
    at_b = set(list_snaps(b, image, pool))
    common = [s for s in list_snaps(a, image, pool) if s in at_b and s.startswith(prefix)]
    return common[-1] if common else None
