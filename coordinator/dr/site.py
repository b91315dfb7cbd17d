"""Ceph access of the control plane: one site description, one connection.

    site = CephSite("dr", pools={"rbd": "rbd"}, ceph_conf="/etc/ceph/dr.conf",
                    client_id="cutpoint", keyring="/etc/ceph/dr.client.cutpoint.keyring")
    with CephConnection(site) as ceph:
        ceph.create_snapshot("rbd", "vm1-disk0", "cp.web.0001")
        [s.name for s in ceph.snapshots("rbd", "vm1-disk0")]    # creation order

Everything the control plane asks a Ceph cluster goes through here, over
librados/librbd (Debian's python3-rados and python3-rbd), never through
the `rbd` CLI and its stderr.

Deadlines.  librados waits for a mon or OSD forever by default.  The
connection sets `client_mount_timeout` (connect), `rados_mon_op_timeout`
and `rados_osd_op_timeout` (every request), so librados itself fails a
request that gets no answer with ETIMEDOUT (`CephTimeout`).  One binding
call may still make many requests one after another, and librbd may wait
on things no timeout covers (a lock owner, a notify), so every call also
runs on a thread of its own and the caller waits at most `2 x timeout + 5
s` for it (`bulk_timeout_s` for the calls whose work grows with the image:
rollback, image removal, diff).  A call that overruns that is abandoned:
the caller gets `CephTimeout` and the connection refuses further calls,
because its handle may be stuck inside librados; open a new one.

Pools.  Callers name the logical pool (what the rest of cutpoint calls
it); `CephSite.pools` maps it to the pool at this site.

Secrets.  The site holds the keyring's path only.  librados reads the key;
nothing here reads, stores or logs it.

Errors are the typed `ceph_errors` classes, with the operation, the object
and the errno.  The site check for registration is `site_check.check_site`.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass, field
from typing import Any, Self, TypeVar

from cutpoint.coordinator.dr.ceph_errors import (
    CephError,
    CephNotFound,
    CephTimeout,
    CephUnreachable,
    from_binding,
)

log = logging.getLogger("cutpoint.ceph")
T = TypeVar("T")
MiB = 1 << 20


class SiteConfigError(ValueError):
    """A site description that cannot work (no mon, no pool, a bad id)."""


@dataclass(frozen=True)
class CephSite:
    """Where a site's Ceph cluster is and how the control plane logs in.

    `ceph_conf` (a ceph.conf path) or `mon_host` (mon addresses such as
    "v2:10.0.0.1:3300"), or both: `mon_host` then overrides the file's.
    `client_id` is the cephx id without "client.".  `keyring` is a path, or
    None for Ceph's default search (ceph.conf's `keyring`,
    /etc/ceph/$cluster.$name.keyring).  `pools`: logical pool -> pool here.
    Timeouts are whole seconds (librados takes seconds)."""

    name: str
    pools: Mapping[str, str]
    ceph_conf: str | None = None
    mon_host: tuple[str, ...] = ()
    client_id: str = "cutpoint"
    keyring: str | None = None
    connect_timeout_s: int = 10
    op_timeout_s: int = 30
    bulk_timeout_s: int = 900
    extra: Mapping[str, str] = field(default_factory=dict)  # more librados settings

    def __post_init__(self) -> None:
        if not self.name:
            raise SiteConfigError("a Ceph site needs a name")
        if not self.ceph_conf and not self.mon_host:
            raise SiteConfigError(f"site {self.name}: give a ceph.conf path or mon addresses")
        if isinstance(self.mon_host, str):
            raise SiteConfigError(f"site {self.name}: mon_host is a list of addresses")
        cid = self.client_id
        if not cid or cid.startswith("client.") or any(c.isspace() for c in cid):
            raise SiteConfigError(f"site {self.name}: bad cephx client id {cid!r} "
                                  "(the id without 'client.', e.g. 'cutpoint')")
        if not self.pools or not all(k and v for k, v in self.pools.items()):
            raise SiteConfigError(f"site {self.name}: the pool map is empty or has an "
                                  f"empty name: {dict(self.pools)}")
        for t in ("connect_timeout_s", "op_timeout_s", "bulk_timeout_s"):
            v = getattr(self, t)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise SiteConfigError(f"site {self.name}: {t} must be a whole number of "
                                      f"seconds >= 1, not {v!r}")
        for k in self.extra:
            if "key" in k.replace("keyring", ""):
                raise SiteConfigError(f"site {self.name}: a key is given by keyring path, "
                                      f"not as setting {k!r}")

    @classmethod
    def from_mapping(cls, name: str, d: Mapping[str, Any]) -> CephSite:
        """From a dict such as {ceph_conf, keyring, client_id, pool} (one pool,
        mapped to itself) or {..., pools: {logical: pool}}."""
        pools = d.get("pools") or ({d["pool"]: d["pool"]} if d.get("pool") else {})
        known = {"ceph_conf", "mon_host", "client_id", "keyring", "connect_timeout_s",
                 "op_timeout_s", "bulk_timeout_s"}
        kw = {k: d[k] for k in known if d.get(k) is not None}
        if "mon_host" in kw:
            kw["mon_host"] = tuple(kw["mon_host"])
        return cls(name=name, pools=dict(pools), **kw)

    def pool(self, logical: str) -> str:
        try:
            return self.pools[logical]
        except KeyError:
            raise SiteConfigError(f"site {self.name} maps no pool {logical!r} "
                                  f"(its pools: {sorted(self.pools)})") from None

    def call_bound_s(self) -> float:
        """How long a caller waits for one binding call before abandoning it."""
        return 2 * self.op_timeout_s + 5

    def librados_conf(self) -> dict[str, str]:
        conf = {**self.extra,
                "client_mount_timeout": str(self.connect_timeout_s),
                "rados_mon_op_timeout": str(self.op_timeout_s),
                "rados_osd_op_timeout": str(self.op_timeout_s)}
        if self.mon_host:
            conf["mon_host"] = ",".join(self.mon_host)
        if self.keyring:
            conf["keyring"] = self.keyring
        return conf


@dataclass(frozen=True)
class ImageInfo:
    pool: str  # logical
    name: str
    id: str
    size: int
    object_size: int
    features: int
    parent: str | None  # "pool/image@snap" of a clone's parent (pool as named at the site)


@dataclass(frozen=True)
class SnapInfo:
    id: int
    name: str
    size: int


@dataclass(frozen=True)
class Extent:
    offset: int
    length: int
    exists: bool  # False: discarded since the base (reads as zeroes)


@dataclass(frozen=True)
class Locker:
    client: str  # e.g. "client.4123"
    cookie: str  # "auto <id>": the exclusive lock of an open image
    address: str
    exclusive: bool


@dataclass(frozen=True)
class ImageRef:
    """An image (or its snapshot) at a site, its pool by logical name."""

    pool: str
    image: str
    snap: str | None = None

    def __str__(self) -> str:
        return _spec(self.pool, self.image, self.snap)


class _StopDiff(Exception):
    """Raised from a diff callback to end the iteration at the first extent."""


def _bindings() -> tuple[Any, Any]:
    """The rados and rbd modules (Debian's python3-rados/-rbd; setup links them
    into .venv).  Imported on first use, so that a site description can be
    built and validated where the bindings are absent."""
    import rados  # type: ignore[import-not-found]
    import rbd  # type: ignore[import-not-found]

    return rados, rbd


def _spec(pool: str, image: str, snap: str | None = None) -> str:
    return f"{pool}/{image}" + (f"@{snap}" if snap else "")


class CephConnection:
    """One librados session to a site; a context manager.  Thread-safe."""

    def __init__(self, site: CephSite) -> None:
        self.site = site
        self._cluster: Any = None
        self._ioctx: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._abandoned: str | None = None

    # -- session --------------------------------------------------------------
    def __enter__(self) -> Self:
        self.connect()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def connect(self) -> None:
        """Connect within client_mount_timeout (waited for at most 2 x
        connect_timeout_s + 5 s); a second call on a live session does nothing."""
        if self._cluster is not None:
            return
        rados, _ = _bindings()

        s = self.site
        who = f"client.{s.client_id} at " + (",".join(s.mon_host) or str(s.ceph_conf))
        if s.keyring:  # a missing keyring is ENOENT at connect: name the file
            who += f" (keyring {s.keyring})"
        try:
            cluster = rados.Rados(rados_id=s.client_id, conffile=s.ceph_conf or None,
                                  conf=s.librados_conf())
        except rados.Error as exc:
            raise from_binding(exc, "read configuration", str(s.ceph_conf or s.mon_host),
                               site=s.name, connecting=True) from None
        t0 = time.monotonic()
        try:
            self._bounded("connect", who, lambda: cluster.connect(timeout=s.connect_timeout_s),
                          s.connect_timeout_s * 2 + 5, connecting=True)
        except CephError:
            if not self._abandoned:
                cluster.shutdown()
            raise
        self._cluster = cluster
        log.debug("ceph connect site=%s %s ms=%.1f", s.name, who,
                  (time.monotonic() - t0) * 1000)

    def close(self) -> None:
        """Release the session; never waits on a handle whose call was abandoned."""
        cluster, self._cluster = self._cluster, None
        ioctxs, self._ioctx = list(self._ioctx.values()), {}
        if cluster is None:
            return
        if self._abandoned:
            # A call still runs inside librados: shutting down under it could
            # block or crash.  The handle is left to the process's exit.
            log.warning("ceph site=%s: session left open, a call was abandoned (%s)",
                        self.site.name, self._abandoned)
            return

        def shut() -> None:
            for io in ioctxs:
                io.close()
            cluster.shutdown()

        try:
            self._bounded("shutdown", self.site.name, shut, self.site.call_bound_s())
        except CephError as exc:
            log.warning("ceph site=%s: %s", self.site.name, exc)

    # -- the one runner ---------------------------------------------------------
    def _bounded(self, op: str, obj: str, fn: Callable[[], T], bound_s: float, *,
                 connecting: bool = False) -> T:
        """Run one binding call on its own thread; wait at most `bound_s`."""
        rados, rbd = _bindings()

        if self._abandoned:
            raise CephTimeout(op, obj, None, site=self.site.name,
                              detail=f"session unusable: an earlier call was abandoned "
                                     f"({self._abandoned})")
        box: dict[str, Any] = {}

        def run() -> None:
            try:
                box["value"] = fn()
            except BaseException as exc:  # noqa: BLE001  handed to the caller's thread
                box["error"] = exc

        t0 = time.monotonic()
        th = threading.Thread(target=run, name=f"ceph {op}", daemon=True)
        th.start()
        th.join(bound_s)
        ms = (time.monotonic() - t0) * 1000
        if th.is_alive():
            self._abandoned = f"{op} {obj} still running after {bound_s:.0f} s"
            log.warning("ceph site=%s op=%r obj=%s abandoned after %.0f ms", self.site.name,
                        op, obj, ms)
            cls = CephUnreachable if connecting else CephTimeout
            raise cls(op, obj, None, site=self.site.name,
                      detail=f"no answer within {bound_s:.0f} s; call abandoned")
        exc = box.get("error")
        if exc is None:
            log.debug("ceph site=%s op=%r obj=%s ms=%.1f", self.site.name, op, obj, ms)
            return box["value"]  # type: ignore[no-any-return]
        if isinstance(exc, (rados.Error, rbd.Error)):
            err = from_binding(exc, op, obj, site=self.site.name, connecting=connecting)
            log.debug("ceph site=%s op=%r obj=%s ms=%.1f error=%s", self.site.name, op, obj,
                      ms, err.code)
            raise err from None
        raise exc

    def _call(self, op: str, obj: str, fn: Callable[[], T], *, bulk: bool = False) -> T:
        if self._cluster is None:
            raise CephError(op, obj, None, site=self.site.name, detail="not connected")
        return self._bounded(op, obj, fn,
                             self.site.bulk_timeout_s if bulk else self.site.call_bound_s())

    def _io(self, pool: str) -> Any:
        """The I/O context of logical `pool` (opened once per session)."""
        real = self.site.pool(pool)
        with self._lock:
            io = self._ioctx.get(real)
        if io is None:
            cluster = self._cluster
            if cluster is None:
                raise CephError("open pool", real, None, site=self.site.name,
                                detail="not connected")
            io = self._call("open pool", real, lambda: cluster.open_ioctx(real))
            with self._lock:
                io = self._ioctx.setdefault(real, io)
        return io

    def _image(self, op: str, pool: str, image: str, fn: Callable[[Any], T], *,
               snap: str | None = None, read_only: bool = False, bulk: bool = False,
               obj: str | None = None) -> T:
        """Open pool/image (at `snap`), apply fn, close: one bounded call."""
        _, rbd = _bindings()
        io = self._io(pool)

        def run() -> T:
            with rbd.Image(io, image, snapshot=snap, read_only=read_only) as img:
                return fn(img)

        return self._call(op, obj or _spec(pool, image, snap), run, bulk=bulk)

    # -- images -----------------------------------------------------------------
    def list_images(self, pool: str) -> list[str]:
        _, rbd = _bindings()
        io = self._io(pool)
        return sorted(self._call("list images", self.site.pool(pool),
                                 lambda: rbd.RBD().list(io)))

    def image_info(self, pool: str, image: str) -> ImageInfo:
        _, rbd = _bindings()
        def info(img: Any) -> ImageInfo:
            st = img.stat()
            try:
                p = img.get_parent_image_spec()
                parent = f"{p['pool_name']}/{p['image_name']}@{p['snap_name']}"
            except rbd.ImageNotFound:
                parent = None
            return ImageInfo(pool, image, img.id(), int(st["size"]), int(st["obj_size"]),
                             int(img.features()), parent)

        return self._image("image info", pool, image, info, read_only=True)

    def image_exists(self, pool: str, image: str) -> bool:
        try:
            self.image_info(pool, image)
        except CephNotFound as exc:
            if exc.op == "open pool":
                raise
            return False
        return True

    def create_image(self, pool: str, image: str, size: int, *,
                     features: int | None = None) -> None:
        _, rbd = _bindings()
        io = self._io(pool)
        self._call("create image", _spec(pool, image),
                   lambda: rbd.RBD().create(io, image, size, features=features))

    def remove_image(self, pool: str, image: str) -> None:
        """Remove an image without snapshots (EBUSY while a client has it open)."""
        _, rbd = _bindings()
        io = self._io(pool)
        self._call("remove image", _spec(pool, image), lambda: rbd.RBD().remove(io, image),
                   bulk=True)

    def clone(self, pool: str, image: str, snap: str, clone_image: str, *,
              clone_pool: str | None = None) -> None:
        """A copy-on-write child of image@snap (protect the snapshot first)."""
        _, rbd = _bindings()
        io, cio = self._io(pool), self._io(clone_pool or pool)
        self._call("clone", f"{_spec(pool, image, snap)} -> "
                   f"{_spec(clone_pool or pool, clone_image)}",
                   lambda: rbd.RBD().clone(io, image, snap, cio, clone_image))

    def write(self, pool: str, image: str, offset: int, data: bytes) -> None:
        def w(img: Any) -> None:
            n = img.write(data, offset)
            if n != len(data):
                raise OSError(f"short write: {n} of {len(data)} bytes")

        self._image("write", pool, image, w)

    def read(self, pool: str, image: str, offset: int, length: int, *,
             snap: str | None = None) -> bytes:
        return self._image("read", pool, image, lambda img: bytes(img.read(offset, length)),
                           snap=snap, read_only=True)

    # -- snapshots --------------------------------------------------------------
    def snapshots(self, pool: str, image: str) -> list[SnapInfo]:
        """The image's user snapshots in creation order (snapshot ids only grow)."""
        def ls(img: Any) -> list[SnapInfo]:
            return [SnapInfo(int(s["id"]), s["name"], int(s["size"]))
                    for s in img.list_snaps() if s.get("namespace", 0) == 0]

        return sorted(self._image("list snapshots", pool, image, ls, read_only=True),
                      key=lambda s: s.id)

    def create_snapshot(self, pool: str, image: str, snap: str) -> SnapInfo:
        def mk(img: Any) -> SnapInfo:
            img.create_snap(snap)
            return SnapInfo(int(img.snap_get_id(snap)), snap, int(img.size()))

        return self._image("create snapshot", pool, image, mk, obj=_spec(pool, image, snap))

    def remove_snapshot(self, pool: str, image: str, snap: str) -> None:
        self._image("remove snapshot", pool, image, lambda img: img.remove_snap(snap),
                    obj=_spec(pool, image, snap))

    def remove_snapshot_by_id(self, pool: str, image: str, snap_id: int) -> None:
        self._image("remove snapshot", pool, image,
                    lambda img: img.remove_snap_by_id(snap_id),
                    obj=f"{_spec(pool, image)} snapshot id {snap_id}")

    def rollback(self, pool: str, image: str, snap: str) -> None:
        """Rewrite the image's head to `snap` (every object: O(image size))."""
        self._image("rollback", pool, image, lambda img: img.rollback_to_snap(snap),
                    obj=_spec(pool, image, snap), bulk=True)

    def protect(self, pool: str, image: str, snap: str) -> None:
        self._image("protect snapshot", pool, image, lambda img: img.protect_snap(snap),
                    obj=_spec(pool, image, snap))

    def unprotect(self, pool: str, image: str, snap: str) -> None:
        self._image("unprotect snapshot", pool, image, lambda img: img.unprotect_snap(snap),
                    obj=_spec(pool, image, snap))

    def is_protected(self, pool: str, image: str, snap: str) -> bool:
        return bool(self._image("snapshot info", pool, image,
                                lambda img: img.is_protected_snap(snap), read_only=True,
                                obj=_spec(pool, image, snap)))

    # -- diffs ------------------------------------------------------------------
    def diff(self, pool: str, image: str, from_snap: str | None, *,
             snap: str | None = None, whole_object: bool = False) -> list[Extent]:
        """Extents of `snap` (or the head) that differ from `from_snap` (None: all data)."""
        def it(img: Any) -> list[Extent]:
            out: list[Extent] = []
            img.diff_iterate(0, img.size(), from_snap,
                             lambda off, n, exists: out.append(Extent(off, n, exists)),
                             whole_object=whole_object)
            return out

        return self._image("diff", pool, image, it, snap=snap, read_only=True, bulk=True,
                           obj=f"{_spec(pool, image, snap)} since {from_snap or 'creation'}")

    def changed_since(self, pool: str, image: str, snap: str) -> bool:
        """Whether the head was written (or discarded) since `snap`; stops at the first extent."""
        def it(img: Any) -> bool:
            def found(off: int, n: int, exists: bool) -> None:
                raise _StopDiff

            try:
                # whole_object: with fast-diff the object map answers, no
                # object is read; for a yes/no answer the extents are moot.
                img.diff_iterate(0, img.size(), snap, found, whole_object=True)
            except _StopDiff:
                return True
            return False

        return self._image("diff", pool, image, it, read_only=True, bulk=True,
                           obj=f"{_spec(pool, image)} since {snap}")

    # -- locks and metadata -------------------------------------------------------
    def lockers(self, pool: str, image: str) -> list[Locker]:
        """Who holds the image locked; an open writer holds its exclusive lock ("auto" cookie)."""
        def ls(img: Any) -> list[Locker]:
            got = img.list_lockers()
            if not got:
                return []
            return [Locker(str(c), str(k), str(a), bool(got.get("exclusive")))
                    for c, k, a in got.get("lockers", [])]

        return self._image("list lockers", pool, image, ls, read_only=True)

    def metadata_get(self, pool: str, image: str, key: str) -> str | None:
        """The image's metadata value for `key`, None when the key is not set."""
        _, rbd = _bindings()
        def get(img: Any) -> str | None:
            try:
                return str(img.metadata_get(key))
            except (KeyError, rbd.ImageNotFound):  # the image is open: the key is absent
                return None

        return self._image("get metadata", pool, image, get, read_only=True,
                           obj=f"{_spec(pool, image)} key {key}")

    def metadata_set(self, pool: str, image: str, key: str, value: str) -> None:
        self._image("set metadata", pool, image, lambda img: img.metadata_set(key, value),
                    obj=f"{_spec(pool, image)} key {key}")

    def metadata_list(self, pool: str, image: str, prefix: str = "") -> dict[str, str]:
        """The image's metadata whose keys start with `prefix`."""
        def ls(img: Any) -> dict[str, str]:
            return {str(k): str(v) for k, v in img.metadata_list() if str(k).startswith(prefix)}

        return self._image("list metadata", pool, image, ls, read_only=True)

    def metadata_remove(self, pool: str, image: str, key: str) -> None:
        """Removes `key` from the image's metadata (absent: nothing to do)."""
        def rm(img: Any) -> None:
            try:
                img.metadata_remove(key)
            except KeyError:
                pass

        self._image("remove metadata", pool, image, rm, obj=f"{_spec(pool, image)} key {key}")

    # -- reading and verification ---------------------------------------------------
    def iter_read(self, pool: str, image: str, snap: str | None = None, *,
                  chunk: int = 4 * MiB) -> Generator[bytes, None, None]:
        """The whole image (at `snap`) front to back, `chunk` bytes at a time,
        holes as zeroes: the bytes of `rbd export pool/image@snap -`.  The image
        stays open while the caller iterates; each read is one bounded call."""
        _, rbd = _bindings()
        io = self._io(pool)
        obj = _spec(pool, image, snap)
        img = self._call("open image", obj,
                         lambda: rbd.Image(io, image, snapshot=snap, read_only=True))
        try:
            size = int(self._call("image size", obj, img.size))
            for off in range(0, size, chunk):
                n = min(chunk, size - off)

                def rd(o: int = off, k: int = n) -> bytes:
                    return bytes(img.read(o, k))

                yield self._call("read", f"{obj} at {off}", rd)
        finally:
            if not self._abandoned:
                self._call("close image", obj, img.close)

    def sha256(self, pool: str, image: str, snap: str | None = None, *,
               chunk: int = 4 * MiB) -> str:
        """SHA-256 of the whole image (at `snap`), holes read as zeroes: the same
        digest as `rbd export pool/image@snap - | sha256sum`."""
        h = hashlib.sha256()
        for data in self.iter_read(pool, image, snap, chunk=chunk):
            h.update(data)
        return h.hexdigest()
