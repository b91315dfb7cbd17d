"""rbd-mirror in snapshot mode as a baseline of the replication benchmark.

On the lab's two clusters: pool mirroring in `image` mode at both sites,
peers bootstrapped by the bench (`rbd mirror pool peer bootstrap create` at
the primary, `... import --direction rx-only` at DR), one `rbd-mirror`
daemon at DR (Debian package `rbd-mirror`), and each benchmarked image
enabled for mirroring in snapshot mode.  A round is one mirror snapshot
(`rbd mirror image snapshot`, here through librbd's
`mirror_image_create_snapshot` on a connection the bench keeps open, so that
no process start sits inside the timing): the time from its creation to the
DR image's non-primary mirror snapshot of it marked complete, polled every
few ms on a connection kept open too.  rbd-mirror checks no hash of what it
copied; the bench does, once per image size (`dr_sha256`), outside the
timing.  Everything is undone by `stop()`: mirroring disabled, the DR
images removed by the daemon, the peer and the bootstrap user removed.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from cutpoint.bench.replication import MiB, ReplicationError, pool_of, rbd, spec
from cutpoint.bench.replication_cluster import ceph

PEER_USER = "client.rbd-mirror-peer"


def mirror_binary() -> str:
    found = shutil.which("rbd-mirror")
    if not found:
        raise ReplicationError(["rbd-mirror"], -1, "", "rbd-mirror not installed (Debian "
                               "package rbd-mirror, in scripts/debian-packages.txt)")
    return found


def _connect(site: dict[str, Any]) -> Any:
    import rados

    c = rados.Rados(conffile=site["ceph_conf"], rados_id=site.get("client_id", "admin"),
                    conf={"keyring": site["keyring"]})
    c.connect(timeout=30)
    return c


class Mirror:
    """The rbd-mirror setup of one benchmark run (primary -> DR, rx-only)."""

    def __init__(self, status: dict[str, Any], log: Any = print, poll_s: float = 0.005):
        self.status, self.log, self.poll_s = status, log, poll_s
        self.p, self.d = status["sites"]["primary"], status["sites"]["dr"]
        self.pool = pool_of(self.p)
        self.proc: subprocess.Popen[bytes] | None = None
        self.enabled: list[str] = []
        self.tmp = Path(tempfile.mkdtemp(prefix="cutpoint-rbd-mirror-"))
        self.pc = self.dc = self.pio = self.dio = None

    # ---- setup and teardown ------------------------------------------------

    def start(self) -> None:
        exe = mirror_binary()
        for site, name in ((self.p, "primary"), (self.d, "dr")):
            rbd(site, "mirror", "pool", "enable", "--site-name", name, self.pool, "image")
        token = self.tmp / "token"
        token.write_text(rbd(self.p, "mirror", "pool", "peer", "bootstrap", "create",
                             "--site-name", "primary", self.pool).strip())
        rbd(self.d, "mirror", "pool", "peer", "bootstrap", "import", "--site-name", "dr",
            "--direction", "rx-only", self.pool, str(token))
        run = Path(self.d["ceph_conf"]).parent
        argv = [exe, "-f", "-c", self.d["ceph_conf"], "--id", self.d.get("client_id", "admin"),
                "--keyring", self.d["keyring"],
                "--log-file", str(self.tmp / "rbd-mirror.log"),
                "--admin-socket", str(self.tmp / "rbd-mirror.asok")]
        self.log(f"starting rbd-mirror at DR: {' '.join(argv)} (conf dir {run})")
        with open(self.tmp / "rbd-mirror.out", "ab") as out:
            # rbd-mirror opens its local cluster in a CephContext of its own
            # that reads the config through the default search path, not -c:
            # without CEPH_CONF it logs "can't open ceph.conf" and never
            # replays (checked on 16.2.15).
            env = dict(os.environ, CEPH_CONF=self.d["ceph_conf"])
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True, env=env)
        self.pc, self.dc = _connect(self.p), _connect(self.d)
        self.pio = self.pc.open_ioctx(self.pool)
        self.dio = self.dc.open_ioctx(pool_of(self.d))
        self._wait_daemon()

    def _wait_daemon(self, timeout: float = 60) -> None:
        """Until the DR pool's mirroring status names a running daemon."""
        t0 = time.monotonic()
        while True:
            if self.proc is not None and self.proc.poll() is not None:
                raise ReplicationError(["rbd-mirror"], self.proc.returncode or -1, "",
                                       f"rbd-mirror exited; see {self.tmp}/rbd-mirror.log")
            doc = json.loads(rbd(self.d, "mirror", "pool", "status", "--verbose", "--format",
                                 "json", self.pool))
            # A daemon is listed as soon as it registers with the mgr, also
            # one that cannot reach its own cluster: wait for its health.
            if any(d.get("health") == "OK" for d in doc.get("daemons", [])):
                self.log(f"rbd-mirror up after {time.monotonic() - t0:.1f} s")
                return
            if time.monotonic() - t0 > timeout:
                raise ReplicationError(["rbd", "mirror", "pool", "status"], 0, json.dumps(doc),
                                       f"no rbd-mirror daemon reported within {timeout:.0f} s")
            time.sleep(0.5)

    def stop(self) -> None:
        """Disable what start() and enable() set up; best effort, logged."""
        for image in list(self.enabled):
            try:
                self.disable(image)
            except ReplicationError as exc:
                self.log(f"rbd-mirror cleanup: {exc}")
        for io in (self.pio, self.dio):
            if io is not None:
                io.close()
        for c in (self.pc, self.dc):
            if c is not None:
                c.shutdown()
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        for site in (self.d, self.p):
            try:
                info = json.loads(rbd(site, "mirror", "pool", "info", "--format", "json",
                                      self.pool))
                for peer in info.get("peers", []):
                    rbd(site, "mirror", "pool", "peer", "remove", self.pool, peer["uuid"])
                rbd(site, "mirror", "pool", "disable", self.pool)
            except ReplicationError as exc:
                self.log(f"rbd-mirror cleanup: {exc}")
        try:
            ceph(self.p, "auth", "rm", PEER_USER)
        except ReplicationError as exc:
            self.log(f"rbd-mirror cleanup: {exc}")

    # ---- images ------------------------------------------------------------

    def enable(self, image: str, timeout: float = 900) -> float:
        """Enable snapshot mirroring of a primary image; returns the seconds
        from the command to its first mirror snapshot complete at DR (the
        full copy, with the DR image's creation)."""
        t0 = time.monotonic()
        rbd(self.p, "mirror", "image", "enable", spec(self.p, image), "snapshot")
        self.enabled.append(image)
        sid = self._newest_primary_mirror_snap(image)
        self._wait_arrival(image, sid, t0 + timeout)
        return time.monotonic() - t0

    def disable(self, image: str, timeout: float = 120) -> None:
        """Stop mirroring an image; waits for the daemon to remove its DR copy."""
        rbd(self.p, "mirror", "image", "disable", "--force", spec(self.p, image))
        if image in self.enabled:
            self.enabled.remove(image)
        t0 = time.monotonic()
        while image in json.loads(rbd(self.d, "ls", "--format", "json", pool_of(self.d))):
            if time.monotonic() - t0 > timeout:
                raise ReplicationError(["rbd-mirror"], 0, "", f"DR copy of {image} not removed "
                                       f"within {timeout:.0f} s of disabling mirroring")
            time.sleep(0.2)

    def snapshot(self, image: str, timeout: float = 600) -> tuple[float, float]:
        """One mirror snapshot of the primary image; returns (ms to create it,
        seconds from its creation to its arrival, complete, at DR)."""
        import rbd as librbd

        with librbd.Image(self.pio, image) as img:
            t0 = time.monotonic()
            sid = img.mirror_image_create_snapshot()
            t1 = time.monotonic()
        self._wait_arrival(image, sid, t1 + timeout)
        return (t1 - t0) * 1000, time.monotonic() - t1

    def _newest_primary_mirror_snap(self, image: str) -> int:
        import rbd as librbd

        with librbd.Image(self.pio, image, read_only=True) as img:
            ids = [s["id"] for s in img.list_snaps()
                   if s.get("namespace") == librbd.RBD_SNAP_NAMESPACE_TYPE_MIRROR]
        if not ids:
            raise ReplicationError(["rbd-mirror"], 0, "", f"{image}: no mirror snapshot at the "
                                   "primary after enabling mirroring")
        return max(ids)

    def _dr_snap(self, image: str, primary_snap_id: int) -> dict[str, Any] | None:
        """The DR image's mirror snapshot of `primary_snap_id`, if any."""
        import rbd as librbd

        try:
            with librbd.Image(self.dio, image, read_only=True) as img:
                for s in img.list_snaps():
                    m = s.get("mirror")
                    if m and int(m.get("primary_snap_id", -1)) == primary_snap_id:
                        return dict(s)
        except librbd.ImageNotFound:
            return None
        return None

    def _wait_arrival(self, image: str, primary_snap_id: int, deadline: float) -> None:
        while True:
            s = self._dr_snap(image, primary_snap_id)
            if s is not None and s["mirror"].get("complete"):
                return
            if self.proc is not None and self.proc.poll() is not None:
                raise ReplicationError(["rbd-mirror"], self.proc.returncode or -1, "",
                                       f"rbd-mirror exited; see {self.tmp}/rbd-mirror.log")
            if time.monotonic() > deadline:
                raise ReplicationError(["rbd-mirror"], 0, "", f"{image}: mirror snapshot "
                                       f"{primary_snap_id} not complete at DR in time")
            time.sleep(self.poll_s)

    def dr_sha256(self, image: str) -> str:
        """SHA-256 of the DR image at its newest complete mirror snapshot (read
        through librbd: `rbd export` takes no snapshot of the mirror namespace)."""
        import rbd as librbd

        with librbd.Image(self.dio, image, read_only=True) as img:
            done = [s for s in img.list_snaps() if s.get("mirror")
                    and s["mirror"].get("complete")]
            if not done:
                raise ReplicationError(["rbd-mirror"], 0, "", f"{image}: no complete mirror "
                                       "snapshot at DR")
            snap = max(done, key=lambda s: s["id"])
            img.set_snap_by_id(snap["id"])
            h, size, off = hashlib.sha256(), img.size(), 0
            while off < size:
                n = min(4 * MiB, size - off)
                h.update(img.read(off, n))
                off += n
        return h.hexdigest()

