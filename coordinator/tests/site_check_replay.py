"""Record the Ceph calls of a site check against a real cluster, and replay
them without one (libvirt's qemumonitorjsontest style: the replies were
captured from the lab's real Ceph, not written by hand).

    rec = Recorder(CephConnection(site))      # a lab test records ...
    check_site(site, ceph=rec)
    rec.save(path)                            # ... coordinator/tests/data/*.json
    rp = Replay.load(path)                    # a py-unit test replays
    check_site(site, ceph=rp, clock=rp.clock)

Each record is one call: its name, its arguments (bytes as their length),
the time it took, and its return value or its typed error.  The replay
checks that the check makes the same calls in the same order, and its clock
advances by each recorded call's time, so the timings come out as measured.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

from cutpoint.coordinator.dr import ceph_errors as CE
from cutpoint.coordinator.dr.site import CephConnection, Extent, SnapInfo

CALLS = ("connect", "close", "list_images", "create_image", "create_snapshot",
         "remove_snapshot", "write", "diff", "remove_image")


# The scratch image's name is random per check: compared without it.
_SCRATCH = re.compile(r"cutpoint-check-[0-9a-f]{10}")


def _arg(a: Any) -> Any:
    return {"bytes": len(a)} if isinstance(a, bytes) else a


def _same(recorded: list[Any], called: list[Any]) -> bool:
    def norm(x: Any) -> Any:
        return _SCRATCH.sub("cutpoint-check-*", x) if isinstance(x, str) else x
    return [norm(x) for x in recorded] == [norm(_arg(x)) for x in called]


def _ret(v: Any) -> Any:
    if isinstance(v, SnapInfo):
        return {"SnapInfo": [v.id, v.name, v.size]}
    if isinstance(v, list) and v and isinstance(v[0], Extent):
        return {"Extents": [[e.offset, e.length, e.exists] for e in v]}
    return v


def _unret(v: Any) -> Any:
    if isinstance(v, dict) and "SnapInfo" in v:
        return SnapInfo(*v["SnapInfo"])
    if isinstance(v, dict) and "Extents" in v:
        return [Extent(*e) for e in v["Extents"]]
    return v


class Recorder:
    """A CephConnection that records every call the site check makes."""

    def __init__(self, conn: CephConnection) -> None:
        self.conn = conn
        self.site = conn.site
        self.records: list[dict[str, Any]] = []

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self.conn, name)
        if name not in CALLS:
            return fn

        def call(*args: Any, **kw: Any) -> Any:
            rec: dict[str, Any] = {"call": name, "args": [_arg(a) for a in args]}
            t0 = time.monotonic()
            try:
                v = fn(*args, **kw)
            except CE.CephError as exc:
                rec.update(ms=(time.monotonic() - t0) * 1000,
                           error={"class": type(exc).__name__, "op": exc.op,
                                  "obj": exc.obj, "errno": exc.errno, "site": exc.site,
                                  "detail": exc.detail})
                self.records.append(rec)
                raise
            rec.update(ms=(time.monotonic() - t0) * 1000, ret=_ret(v))
            self.records.append(rec)
            return v
        return call

    def save(self, path: Path, about: str) -> None:
        path.write_text(json.dumps({"about": about, "calls": self.records}, indent=1) + "\n")


class Replay:
    """Plays recorded calls back in order, with a clock that follows them."""

    def __init__(self, site: Any, calls: list[dict[str, Any]]) -> None:
        self.site = site
        self.calls = list(calls)
        self.now = 1000.0

    @classmethod
    def load(cls, site: Any, path: Path) -> Replay:
        return cls(site, json.loads(path.read_text())["calls"])

    def clock(self) -> float:
        return self.now

    def __getattr__(self, name: str) -> Any:
        if name not in CALLS:
            raise AttributeError(name)

        def call(*args: Any, **kw: Any) -> Any:
            assert self.calls, f"the check made a call the recording lacks: {name}{args}"
            rec = self.calls.pop(0)
            assert rec["call"] == name, f"recorded {rec['call']}, the check called {name}"
            assert _same(rec["args"], list(args)), (name, rec["args"], args)
            self.now += rec["ms"] / 1000
            if "error" in rec:
                e = rec["error"]
                raise getattr(CE, e["class"])(e["op"], e["obj"], e["errno"], site=e["site"],
                                              detail=e["detail"])
            return _unret(rec.get("ret"))
        return call
