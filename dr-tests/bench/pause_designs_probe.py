"""Time the in-pause part of four ways to cut one QEMU VM's RBD disks.

Run with the system Python, which has Debian's python3-rbd bindings:

    /usr/bin/python3 pause_designs_probe.py < PLAN.json

PLAN: {"qmp": socket, "conf": ceph.conf, "client_id", "keyring", "pool",
"qemu_conf": the conf= QEMU opens RBD with, "disks": [{"node", "image",
"size_mb"}], "rounds": N, "designs": ["today", "redirect", "live", "fleecing"],
"tag": str}.  Prints one JSON object: per design the samples of each
phase in ms.  Kept free of project imports (like rbd_snaptime.py).

- today: `stop`, rbd_snap_create of every disk (one thread each, images
  opened in advance, as the agent's `rbd` method), `cont`.
- redirect: before the pause, one qcow2 overlay per disk on a new RBD
  image (blockdev-add, blockdev-create, blockdev-add with backing null).
  In the pause: a QMP `transaction` of `blockdev-snapshot` onto them.
  After `cont`: rbd_snap_create of the now-frozen bases, then an active
  `block-commit` of each overlay back (ready, complete), blockdev-del,
  and the overlay image removed.
- live: as redirect, without `stop` and `cont`: the `transaction` alone
  is the VM's cut (QMP documents a `transaction` as atomic; this probe
  times it and does not check the cut's consistency), and
  its time is what the guest's block I/O waits on; the vCPUs never stop.
  A group cut this way needs something else to keep a VM's post-cut
  writes from reaching another VM before that one is cut: with PLAN's
  "hold" ({"netdev", "netns", "address", "hold_ms", "queue": rx, "control":
  false}), the guest's
  outbound packets are held by a QEMU `filter-buffer` on its netdev from
  before the transaction until hold_ms after it (the stand-in for the
  wait for COMMIT), and icmp_pinger.py pings the guest from its host
  namespace the whole run: replies to echoes sent in a hold must arrive
  after its release, none lost.
- fleecing: before the pause, one qcow2 target per disk on a new RBD image
  with the disk as its backing.  In the pause: a `transaction` of
  `block-dirty-bitmap-add` and `blockdev-backup sync=none` (QEMU's
  copy-before-write).  After `cont`: rbd_snap_create of the disks (they
  hold writes made after the cut: the blocks the bitmap marks would still
  have to be copied from the target into a clone of that snapshot, which
  this probe does not do), then the job cancelled and the nodes removed.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

HOLD_ID = "cutpoint-hold"


class QmpError(Exception):
    pass


class Qmp:
    """A blocking QMP client that keeps the events it reads on the way."""

    def __init__(self, path: str, timeout: float = 60.0) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(path)
        self.buf = b""
        self.events: list[dict[str, Any]] = []
        self._line()  # greeting
        self.cmd("qmp_capabilities")

    def _line(self) -> dict[str, Any]:
        while b"\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise QmpError("QMP socket closed")
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return json.loads(line)

    def cmd(self, execute: str, /, **args: Any) -> Any:
        msg: dict[str, Any] = {"execute": execute}
        if args:
            msg["arguments"] = args
        self.sock.sendall(json.dumps(msg).encode() + b"\n")
        while True:
            r = self._line()
            if "event" in r:
                self.events.append(r)
            elif "error" in r:
                raise QmpError(f"{execute} {json.dumps(args)}: {r['error'].get('desc')}")
            elif "return" in r:
                return r["return"]

    def wait_event(self, name: str, job: str, timeout: float = 120.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            for i, e in enumerate(self.events):
                if e["event"] == name and e.get("data", {}).get("device", e.get(
                        "data", {}).get("id")) == job:
                    return self.events.pop(i)
            if time.monotonic() > deadline:
                raise QmpError(f"no {name} for {job} within {timeout}s")
            r = self._line()
            if "event" in r:
                self.events.append(r)


def ms(t0: float, t1: float) -> float:
    return (t1 - t0) * 1000.0


def snap_all(images: list[Any], name: str) -> None:
    """rbd_snap_create on every image at once (librbd has no async create)."""
    errs: list[BaseException] = []

    def one(img: Any) -> None:
        try:
            img.create_snap(name)
        except BaseException as e:  # noqa: BLE001 - reported below
            errs.append(e)
    th = [threading.Thread(target=one, args=(img,)) for img in images]
    for t in th:
        t.start()
    for t in th:
        t.join()
    if errs:
        raise errs[0]


def paused(q: Qmp, action: Any) -> dict[str, float]:
    """stop, action(), cont: each one timed, and the whole pause."""
    t0 = time.perf_counter()
    q.cmd("stop")
    t1 = time.perf_counter()
    try:
        action()
    finally:
        t2 = time.perf_counter()
        q.cmd("cont")
        t3 = time.perf_counter()
    return {"stop_ms": ms(t0, t1), "cut_ms": ms(t1, t2), "cont_ms": ms(t2, t3),
            "pause_ms": ms(t0, t3)}


class Probe:
    def __init__(self, plan: dict[str, Any]) -> None:
        import rados
        import rbd
        self.rbd = rbd
        self.plan = plan
        self.cluster = rados.Rados(conffile=plan["conf"], rados_id=plan["client_id"],
                                   conf={"keyring": plan["keyring"]})
        self.cluster.connect(timeout=30)
        self.ioctx = self.cluster.open_ioctx(plan["pool"])
        self.disks = plan["disks"]
        self.images = [rbd.Image(self.ioctx, d["image"]) for d in self.disks]
        self.q = Qmp(plan["qmp"])
        # live: a QEMU filter-buffer on the guest's netdev, off between cuts
        # (queue rx: what the guest sends into the netdev).  Its interval,
        # a release timer on the guest's clock, is set to the largest
        # value: only `status off` releases.
        self.hold: dict[str, Any] = plan.get("hold") or {}
        self.windows: list[tuple[float, float]] = []
        if self.hold:
            self.q.cmd("object-add", **{"qom-type": "filter-buffer", "id": HOLD_ID,
                                         "netdev": self.hold["netdev"],
                                         "queue": self.hold.get("queue", "rx"),
                                         "interval": 0xFFFFFFFF, "status": "off"})

    def close(self) -> None:
        if self.hold:
            self.q.cmd("object-del", id=HOLD_ID)
        for img in self.images:
            img.close()
        self.ioctx.close()
        self.cluster.shutdown()

    def _rbd_node(self, node: str, image: str) -> None:
        self.q.cmd("blockdev-add", driver="rbd", **{"node-name": node},
                   pool=self.plan["pool"], image=image, conf=self.plan["qemu_conf"],
                   user=self.plan["client_id"])

    def _qcow2_on_rbd(self, k: int, kind: str, backing: str | None) -> str:
        """A fresh qcow2 node on a new RBD image; returns its node name."""
        d = self.disks[k]
        img = f"{d['image']}.{kind}"
        size = d["size_mb"] << 20
        self.rbd.RBD().create(self.ioctx, img, size)
        self._rbd_node(f"{kind}f{k}", img)
        job = f"mk{kind}{k}"
        self.q.cmd("blockdev-create", **{"job-id": job},
                   options={"driver": "qcow2", "file": f"{kind}f{k}", "size": size})
        self._job_concluded(job)
        self.q.cmd("blockdev-add", driver="qcow2", **{"node-name": f"{kind}{k}"},
                   file=f"{kind}f{k}", backing=backing)
        return f"{kind}{k}"

    def _job_concluded(self, job: str, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            jobs = {j["id"]: j for j in self.q.cmd("query-jobs")}
            j = jobs.get(job)
            if j and j["status"] == "concluded":
                if j.get("error"):
                    raise QmpError(f"job {job}: {j['error']}")
                self.q.cmd("job-dismiss", id=job)
                return
            if time.monotonic() > deadline:
                raise QmpError(f"job {job} not concluded within {timeout}s")
            time.sleep(0.01)

    def _drop(self, k: int, kind: str) -> None:
        self.q.cmd("blockdev-del", **{"node-name": f"{kind}{k}"})
        self.q.cmd("blockdev-del", **{"node-name": f"{kind}f{k}"})
        self.rbd.RBD().remove(self.ioctx, f"{self.disks[k]['image']}.{kind}")

    def _unsnap(self, name: str) -> None:
        for img in self.images:
            img.remove_snap(name)

    def today(self, snap: str) -> dict[str, float]:
        r = paused(self.q, lambda: snap_all(self.images, snap))
        r["backend_ms"] = r["cut_ms"]
        self._unsnap(snap)
        return r

    def redirect(self, snap: str) -> dict[str, float]:
        return self._switched(snap, stop=True)

    def live(self, snap: str) -> dict[str, float]:
        return self._switched(snap, stop=False)

    def _switched(self, snap: str, stop: bool) -> dict[str, float]:
        """redirect (stop=True) or live (stop=False): the same overlays and
        the same `transaction`; live leaves the vCPUs running, so what the
        guest waits on is the transaction alone (its block I/O drained and
        held while it runs)."""
        t0 = time.perf_counter()
        ovs = [self._qcow2_on_rbd(k, "ov", None) for k in range(len(self.disks))]
        t1 = time.perf_counter()
        acts = [{"type": "blockdev-snapshot",
                 "data": {"node": d["node"], "overlay": ov}}
                for d, ov in zip(self.disks, ovs)]
        if stop:
            r = paused(self.q, lambda: self.q.cmd("transaction", actions=acts))
        else:
            r = self._live_cut(acts)
        t2 = time.perf_counter()
        snap_all(self.images, snap)
        t3 = time.perf_counter()
        self.merge_back(ovs)
        t4 = time.perf_counter()
        for k in range(len(ovs)):
            self._drop(k, "ov")
        self._unsnap(snap)
        r.update(prepare_ms=ms(t0, t1), backend_ms=ms(t2, t3), commit_ms=ms(t3, t4))
        return r

    def merge_back(self, ovs: list[str]) -> None:
        """An active block-commit of each switched overlay back onto its
        base (ready, then completed); its nodes stay for _drop."""
        for k, ov in enumerate(ovs):
            self.q.cmd("block-commit", **{"job-id": f"commit{k}"}, device=ov)
        for k in range(len(ovs)):
            self.q.wait_event("BLOCK_JOB_READY", f"commit{k}")
            self.q.cmd("block-job-complete", device=f"commit{k}")
        for k in range(len(ovs)):
            e = self.q.wait_event("BLOCK_JOB_COMPLETED", f"commit{k}")
            if e["data"].get("error"):
                raise QmpError(f"commit{k}: {e['data']['error']}")

    def _hold(self, status: str) -> None:
        """The filter on or off; the negative control ("control": true)
        times the same windows with the filter left off, and must see
        replies come through them."""
        if not self.hold.get("control"):
            self.q.cmd("qom-set", path=f"/objects/{HOLD_ID}", property="status", value=status)

    def _live_cut(self, acts: list[dict[str, Any]]) -> dict[str, float]:
        """The transaction with the vCPUs running; with a hold, the guest's
        outbound packets held from before it until hold_ms after it (the
        stand-in for the wait for COMMIT)."""
        r: dict[str, float] = {"stop_ms": 0.0, "cont_ms": 0.0}
        if self.hold:
            t0 = time.perf_counter()
            self._hold("on")
            w0 = time.time()  # held for certain from here ...
            r["hold_on_ms"] = ms(t0, time.perf_counter())
        ta = time.perf_counter()
        self.q.cmd("transaction", actions=acts)
        tb = time.perf_counter()
        r.update(cut_ms=ms(ta, tb), pause_ms=ms(ta, tb))
        if self.hold:
            time.sleep(self.hold["hold_ms"] / 1000.0)
            self.windows.append((w0, time.time()))  # ... to here: a reply to an echo
            t1 = time.perf_counter()                 # sent in between comes after
            self._hold("off")
            t2 = time.perf_counter()
            r.update(release_ms=ms(t1, t2), held_ms=ms(t0, t2))
        return r

    def fleecing(self, snap: str) -> dict[str, float]:
        t0 = time.perf_counter()
        tgts = [self._qcow2_on_rbd(k, "fl", d["node"]) for k, d in enumerate(self.disks)]
        t1 = time.perf_counter()
        acts: list[dict[str, Any]] = []
        for k, (d, tgt) in enumerate(zip(self.disks, tgts)):
            acts.append({"type": "block-dirty-bitmap-add",
                         "data": {"node": d["node"], "name": "cut"}})
            acts.append({"type": "blockdev-backup",
                         "data": {"job-id": f"fleece{k}", "device": d["node"],
                                  "target": tgt, "sync": "none"}})
        r = paused(self.q, lambda: self.q.cmd("transaction", actions=acts))
        t2 = time.perf_counter()
        snap_all(self.images, snap)
        t3 = time.perf_counter()
        for k, d in enumerate(self.disks):
            self.q.cmd("block-job-cancel", device=f"fleece{k}")
            self.q.wait_event("BLOCK_JOB_CANCELLED", f"fleece{k}")
            self.q.cmd("block-dirty-bitmap-remove", node=d["node"], name="cut")
            self._drop(k, "fl")
        t4 = time.perf_counter()
        self._unsnap(snap)
        r.update(prepare_ms=ms(t0, t1), backend_ms=ms(t2, t3), cleanup_ms=ms(t3, t4))
        return r


class Pinger:
    """icmp_pinger.py in the guest's host namespace for the whole run: what
    the hold did to the guest's replies."""

    def __init__(self, hold: dict[str, Any]) -> None:
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", hold["netns"], sys.executable,
             str(Path(__file__).with_name("icmp_pinger.py")), hold["address"],
             str(hold.get("ping_interval_s", 0.005))],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def result(self, windows: list[tuple[float, float]]) -> dict[str, Any]:
        out, _ = self.proc.communicate(timeout=60)
        return classify(out, windows)


def classify(out: str, windows: list[tuple[float, float]]) -> dict[str, Any]:
    """icmp_pinger.py's output against the hold windows: replies to echoes
    sent inside a window (from `status on` returned to `status off` sent:
    the hold is on for certain) and outside one; a reply's arrival after
    its window's end, in ms (a negative one came through the hold)."""
    held: list[float] = []
    free: list[float] = []
    late: list[float] = []
    lost = -1
    for line in out.splitlines():
        if line.startswith("lost "):
            lost = int(line.split()[1])
            continue
        sent, rtt, got = (float(x) for x in line.split())
        w = next((w for w in windows if w[0] <= sent <= w[1]), None)
        if w is None:
            free.append(rtt)
        else:
            held.append(rtt)
            late.append((got - w[1]) * 1000.0)
    return {"replies_in_hold": len(held), "replies_outside": len(free), "lost": lost,
            "rtt_in_hold_ms": held, "rtt_outside_ms": free,
            "arrival_after_release_ms": late}


def main() -> int:
    plan = json.load(sys.stdin)
    p = Probe(plan)
    pinger = Pinger(plan["hold"]) if plan.get("hold") and "live" in plan["designs"] else None
    out: dict[str, Any] = {d: {} for d in plan["designs"]}
    try:
        time.sleep(0.2 if pinger else 0)  # the pinger's first echoes, outside any hold
        for i in range(plan["rounds"]):
            for design in plan["designs"]:
                r = getattr(p, design)(f"pd.{plan['tag']}.{design}.{i}")
                for key, val in r.items():
                    out[design].setdefault(key, []).append(val)
    finally:
        p.close()
        if pinger:
            out["ping"] = pinger.result(p.windows)
    json.dump(out, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
