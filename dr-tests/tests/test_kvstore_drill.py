"""Recovery drill of cp-kvstore on the lab (issue 7, item 4).

Four tiny guests on two primary hosts run the store and its clients. Each
guest is a ZHT node: server, secondary of its predecessor's partitions,
and a client. Their disks are RBD images on the primary Ceph cluster.
Every snapshot the drill checks is first replicated to the DR Ceph
cluster with the project's group replication (`coordinator.dr.replicate`,
one `cutpoint-sync` per disk: the first copy full, later ones
incremental), and everything after that reads the DR copies. The drill
does five things:

1. Negative control, uncoordinated: every disk is snapshotted one after
   another with `rbd snap create` and no pause, replicated, and the DR
   copies are checked. The checker must fail.
2. Group snapshots under load, through the real agents and coordinator
   (`cutpoint snapshot --group-file`), on the live cut (agents'
   `pause_path = live`: no guest stopped, its sent packets held until
   COMMIT; the shared log's drill takes the default redirect cut). The newest one is replicated with
   full verification; every member must be verified at DR (invariant 5).
   Its DR copies are exported and checked offline: every invariant holds.
3. Restore: clones of the DR member snapshots, made on the DR cluster,
   boot on the DR host (new addresses, so the copies run isolated next to
   the running primaries). The store cold-restarts (load, replay,
   reconcile, serve; the membership epoch goes up), and
   `cutpoint-lab check kvstore --live` finds the digests the offline check
   predicted.
4. Negative control, fsync off: DR clones boot again, as
   `--no-fsync --simulate-power-loss` with clients. Every guest is
   paused, the disks are read, and only "acknowledged survives" fails.
5. Cleanup of the clones, the drill guests and the DR replicas.

`Drill` is shared with test_sharedlog_drill.py.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from cutpoint.checkers import kvstore as kv
from cutpoint.lab.errors import LabError

pytestmark = pytest.mark.lab

CLI = [str(Path(sys.executable).parent / "cutpoint")]
LAB_CLI = [str(Path(sys.executable).parent / "cutpoint-lab")]
DISK_MB = 32
PARTS = 8
# Raw QEMU: this drill proves the live cut on the guest stores, the shared
# log's the redirect cut (issue 19, goal 1); a libvirt domain takes them
# only through tainting raw QMP, so there it falls back to in_pause.
LAB = {"hosts": 2, "vms_per_host": 2, "disks": 1, "workload": "kvstore",
       "disk_size_mb": DISK_MB, "driver": "qemu"}


def cutpoint(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """`cutpoint ARGS`; the test bed's own commands (`check ...`) are `cutpoint-lab`'s."""
    cli = LAB_CLI if args and args[0] == "check" else CLI
    return subprocess.run([*cli, *args], capture_output=True, text=True,
                          timeout=timeout, check=False,
                          env=dict(os.environ, COLUMNS="250"))


class Drill:
    """One store on the lab: snapshots, exports, restored copies."""

    def __init__(self, status: dict[str, Any], tmp: Path, group: str,
                 pause_path: str = "redirect") -> None:
        from cutpoint.lab.agents import start_agents
        from cutpoint.lab.groupfile import write_group_file
        self.status = status
        self.tmp = tmp
        self.group = group
        self.site = status["sites"]["primary"]
        self.certs = Path(status["state_dir"]) / "certs"
        # The cut the agents take (agent-protocol §5.1): the shared log's
        # drill proves the default redirect cut, this store's the live cut.
        self.pause_path = pause_path
        self.agents = start_agents(status, self.certs,
                                   extra=f"\n[agent]\npause_path = {pause_path}\n")
        self.file = tmp / "group.yaml"
        write_group_file(status, self.file, certs_dir=self.certs, group=group)
        self.db = f"sqlite:///{tmp / 'coordinator.db'}"
        self.vms = sorted(status["vms"], key=lambda v: v["index"])
        self.restored: list[dict[str, Any]] = []
        self.clones: list[tuple[str, str]] = []    # (site, pool/image)
        self.dr = status["sites"]["dr"]
        self.sync_dir = tmp / "sync"              # cutpoint-sync progress records
        self.replicated: list[str] = []          # snapshots at DR, oldest first
        self.left_at_dr: list[str] = []          # DR images after close()

    # -- load --
    def consoles(self, vms: list[dict[str, Any]] | None = None) -> list[str]:
        return [Path(v["console"]).read_text(errors="replace")
                for v in (vms or self.vms)]

    def wait_console(self, pattern: str, count: int = 1,
                     vms: list[dict[str, Any]] | None = None,
                     timeout: float = 300, any_vm: bool = False) -> None:
        """Until every guest's console (or, with any_vm, one of them)
        matched pattern count times."""
        rx = re.compile(pattern)
        end = time.monotonic() + timeout
        done = any if any_vm else all
        while True:
            texts = self.consoles(vms)
            if done(len(rx.findall(t)) >= count for t in texts):
                return
            for t in texts:
                assert "FATAL" not in t, t[-1500:]
            if time.monotonic() > end:
                pytest.fail(f"no {count}x '{pattern}' after {timeout}s: "
                            + " | ".join(t[-400:] for t in texts))
            time.sleep(1)

    # -- snapshots --
    def rbd(self, *args: str, timeout: float = 120, site: str = "primary") -> str:
        from cutpoint.lab.ceph import run_rbd
        res = run_rbd(self.status["sites"][site], *args, timeout=timeout)
        # the head of stderr names a crash (signal, thread); the tail the error
        assert res.returncode == 0, (f"rbd {' '.join(args)}: rc={res.returncode}: "
                                     f"{res.stderr[:1000]} ... {res.stderr[-1000:]}")
        return res.stdout

    def image(self, vm: dict[str, Any]) -> str:
        d = vm["disks"][0]
        return f"{d['pool']}/{d['image']}"

    def group_snapshot(self) -> str:
        """A coordinated group snapshot; returns the member snapshot name."""
        res = cutpoint("snapshot", "--group-file", str(self.file), "--db",
                       self.db, "--json")
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
        doc, _ = json.JSONDecoder().raw_decode(res.stdout, res.stdout.index("{"))
        assert doc["state"] == "committed", doc
        # qmp VMs on RBD take the cut the agents are set to
        assert {v.get("pause_path") for v in doc["vms"]} == {self.pause_path}, doc["vms"]
        txn = doc["txn"]
        snaps = json.loads(self.rbd("snap", "ls", "--format", "json",
                                    self.image(self.vms[0])))
        names = [s["name"] for s in snaps if txn in s["name"]]
        assert len(names) == 1, (txn, snaps)
        return names[0]

    def uncoordinated(self, name: str, gap_s: float) -> str:
        """Every disk snapshotted one after another, no pause."""
        for vm in self.vms:
            self.rbd("snap", "create", f"{self.image(vm)}@{name}")
            time.sleep(gap_s)
        return name

    def replicate(self, snap: str, verify_full: bool = False) -> Any:
        """Every member disk's snap to the DR cluster with the project's
        group replication (coordinator.dr.replicate: one cutpoint-sync per
        disk), incrementally from the previous replicated snapshot.
        Asserts invariant 5: each member verified at DR, hence a recovery
        point, and the DR snapshot (the engine's completion marker) is
        there."""
        from cutpoint.coordinator.dr.replicate import (
            MemberCopy,
            list_snaps,
            replicate_group,
        )
        base = self.replicated[-1] if self.replicated else None
        members = [MemberCopy(vm["disks"][0]["image"], snap, base,
                              disk=f"{vm['name']}/{vm['disks'][0]['node']}")
                   for vm in self.vms]
        from cutpoint.lab.sites import ceph_site

        rep = replicate_group(ceph_site(self.status, "primary"), ceph_site(self.status, "dr"),
                              members, jobs=2,
                              verify_full=verify_full, state_dir=str(self.sync_dir))
        print(f"replicated {snap} (base {base}): {rep.state}, "
              f"{rep.bytes_shipped} B shipped in {rep.seconds:.1f} s, "
              + ", ".join(f"{m.disk} {'full' if m.full else 'incr'} "
                          f"{m.bytes_shipped} B {m.seconds:.1f} s" for m in rep.members))
        assert len(rep.members) == len(self.vms), rep.as_dict()
        for m in rep.members:
            assert m.state == "verified" and m.error is None, m.as_dict()
            assert m.verified_full or not verify_full, m.as_dict()
            assert snap in list_snaps(ceph_site(self.status, "dr"), m.image), (m.image, snap)
        assert rep.state == "verified" and rep.recovery_point, rep.as_dict()
        self.replicated.append(snap)
        return rep

    def export(self, snap: str, tag: str, site: str = "dr") -> list[Path]:
        """Raw images of every member's snap, read from `site`."""
        if site == "dr":
            assert snap in self.replicated, f"{snap} was not replicated to DR"
        out = []
        for vm in self.vms:
            p = self.tmp / f"{tag}-{vm['name']}.img"
            p.unlink(missing_ok=True)
            out.append(p)

        def one(args: tuple[dict[str, Any], Path]) -> None:
            vm, p = args
            self.rbd("export", "--no-progress", f"{self.image(vm)}@{snap}", str(p),
                     site=site)
        with ThreadPoolExecutor(max_workers=4) as ex:
            list(ex.map(one, zip(self.vms, out, strict=True)))
        return out

    # -- restored copies on the DR host --
    def boot_restored(self, snap: str, args: str, tag: str) -> list[str]:
        """Clones of the replicated snap, made on the DR cluster, booted on
        the DR host with new addresses; returns the new peer addresses in
        ring order.  Nothing of the primary cluster is used."""
        from cutpoint.lab import config as C
        from cutpoint.lab import net, vms
        from cutpoint.lab.proc import read_pidfile
        assert snap in self.replicated, f"{snap} was not replicated to DR"
        self.stop_restored()
        dr_host = next(h["name"] for h in self.status["hosts"] if h["site"] == "dr")
        state = Path(self.status["state_dir"])
        for vm in self.vms:
            try:
                self.rbd("snap", "protect", f"{self.image(vm)}@{snap}", site="dr")
            except AssertionError:
                pass              # already protected
        new = []
        for k, vm in enumerate(self.vms):
            g = vm["index"] + 40
            clone = f"{vm['disks'][0]['image']}-{tag}"
            self.rbd("clone", f"{self.image(vm)}@{snap}",
                     f"{vm['disks'][0]['pool']}/{clone}", site="dr")
            self.clones.append(("dr", f"{vm['disks'][0]['pool']}/{clone}"))
            d = state / "vms" / f"drill-{tag}-{vm['name']}"
            d.mkdir(parents=True, exist_ok=True)
            disk = dict(vm["disks"][0], image=clone, site="dr")
            nv = dict(vm, name=f"drill-{tag}-{vm['name']}", host=dr_host,
                      index=g, address=C.vm_addr(g), mac=C.vm_mac(g),
                      tap=f"tap{k + 1}", qmp=str(d / "qmp.sock"),
                      console=str(d / "console.log"),
                      pidfile=str(d / "qemu.pid"), dir=str(d), disks=[disk])
            new.append(nv)
        peers = [v["address"] for v in new]

        def launch(nv: dict[str, Any]) -> None:
            net.add_tap(dr_host, nv["tap"])
            for f in (nv["console"], nv["qmp"], nv["pidfile"]):
                Path(f).unlink(missing_ok=True)
            argv = vms.qemu_argv(nv, self.status["image"], self.status["accel"],
                                 peers, self.status["sites"], 160, args)
            env = dict(os.environ, CUTPOINT_LAB_MARK=str(state))
            res = subprocess.run(["ip", "netns", "exec", dr_host, *argv],
                                 capture_output=True, text=True, timeout=60,
                                 env=env, check=False)
            assert res.returncode == 0, res.stderr
            nv["pid"] = read_pidfile(Path(nv["pidfile"]))

        for nv in new:
            launch(nv)
            self.restored.append(nv)
        try:
            vms.wait_ready(new, timeout=120, log=lambda m: None)
        except LabError as exc:
            # Seen once in a fresh-clone `make test`: 3 of 4 restored guests
            # up in ~20 s, the 4th without its init's ready line after 180 s
            # (its console was lost with the lab, so the cause is unknown).
            # Such a guest is started once more, visibly, with its console
            # tail printed; a second stall fails the test.
            stuck = [nv for nv in new if vms.READY not in self._console(nv)]
            print(f"boot retry ({len(stuck)} guest(s)): {exc}")
            for nv in stuck:
                self._stop_one(nv)
                launch(nv)
            vms.wait_ready(stuck, timeout=180, log=lambda m: None)
        for nv in new:            # each guest's disk is open on the DR cluster
            disk = nv["disks"][0]
            st = json.loads(self.rbd("status", "--format", "json",
                                     f"{disk['pool']}/{disk['image']}", site="dr"))
            assert st.get("watchers"), (nv["name"], st)
        return peers

    @staticmethod
    def _qmp(nv: dict[str, Any], cmd: str) -> None:
        """One QMP command on a restored guest; asserts it returned."""
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(10)
            s.connect(nv["qmp"])
            f = s.makefile("rw")
            f.readline()
            for c in ("qmp_capabilities", cmd):
                f.write(json.dumps({"execute": c}) + "\n")
                f.flush()
                while True:
                    reply = json.loads(f.readline())
                    if "return" in reply or "error" in reply:
                        break
                assert "return" in reply, (nv["name"], c, reply)

    def pause_restored(self) -> None:
        """QMP stop on every restored guest: drained and flushed, a cut."""
        for nv in self.restored:
            self._qmp(nv, "stop")

    def export_restored(self, tag: str) -> list[Path]:
        out = []
        for nv in self.restored:
            p = self.tmp / f"{tag}-{nv['name']}.img"
            p.unlink(missing_ok=True)
            disk = nv["disks"][0]
            self.rbd("export", "--no-progress", f"{disk['pool']}/{disk['image']}",
                     str(p), site=disk["site"])
            out.append(p)
        return out

    @staticmethod
    def _console(nv: dict[str, Any]) -> str:
        try:
            return Path(nv["console"]).read_text(errors="replace")
        except OSError:
            return ""

    def _stop_one(self, nv: dict[str, Any]) -> None:
        """Stop one restored guest and remove its tap."""
        from cutpoint.lab.proc import pid_alive
        # QMP quit first: QEMU closes its RBD image, so the watch and
        # the exclusive lock go at once. After SIGKILL the watch lingers
        # ~30 s at the OSD and `rbd rm` of the clone is refused.
        if nv.get("pid") and pid_alive(nv["pid"]):
            try:
                self._qmp(nv, "quit")
            except (OSError, ValueError, AssertionError):
                pass          # gone already, or hung: SIGKILL below
            for _ in range(200):
                if not pid_alive(nv["pid"]):
                    break
                time.sleep(0.05)
        if nv.get("pid") and pid_alive(nv["pid"]):
            os.kill(nv["pid"], signal.SIGKILL)
            for _ in range(100):
                if not pid_alive(nv["pid"]):
                    break
                time.sleep(0.05)
        subprocess.run(["ip", "netns", "exec", nv["host"], "ip", "link",
                        "del", nv["tap"]], capture_output=True, check=False)

    def stop_restored(self) -> None:
        for nv in self.restored:
            self._stop_one(nv)
        self.restored = []
        for site, c in self.clones:
            end = time.monotonic() + 45   # a killed guest's watch expires in ~30 s
            while True:
                r = subprocess.run(self._rbd_argv(site, "rm", "--no-progress", c),
                                   capture_output=True, text=True, check=False,
                                   timeout=120)
                if r.returncode == 0 or "No such file" in r.stderr:
                    break
                if time.monotonic() > end:
                    print(f"clone {site}:{c} not removed: {r.stderr.strip()[-300:]}")
                    break
                time.sleep(2)
        self.clones = []

    def _rbd_argv(self, site: str, *args: str) -> list[str]:
        from cutpoint.lab.ceph import rbd_cmd
        return rbd_cmd(self.status["sites"][site], *args)

    def remove_replicas(self) -> None:
        """The replicated images at DR, with their snapshots (best effort:
        the clones are gone first, so the snapshots can be unprotected)."""
        if not self.replicated:
            return
        t0 = time.monotonic()

        def one(vm: dict[str, Any]) -> None:
            img = self.image(vm)
            for snap in self.replicated:
                subprocess.run(self._rbd_argv("dr", "snap", "unprotect", f"{img}@{snap}"),
                               capture_output=True, check=False, timeout=120)
            for args in (("snap", "purge", "--no-progress", img),
                         ("rm", "--no-progress", img)):
                subprocess.run(self._rbd_argv("dr", *args), capture_output=True,
                               check=False, timeout=120)
        with ThreadPoolExecutor(max_workers=4) as ex:
            list(ex.map(one, self.vms))
        self.replicated = []
        left = subprocess.run(self._rbd_argv("dr", "ls", self.dr.get("pool", "rbd")),
                              capture_output=True, text=True, check=False, timeout=120)
        self.left_at_dr = left.stdout.split() if left.returncode == 0 else [left.stderr]
        print(f"DR replicas removed in {time.monotonic() - t0:.1f} s; "
              f"left at DR: {self.left_at_dr or 'nothing'}")

    def close(self) -> None:
        from cutpoint.lab.agents import stop_agents
        try:
            self.stop_restored()
            self.remove_replicas()
        finally:
            stop_agents(self.status)


@pytest.mark.lab_config(**LAB)
def test_kvstore_drill(lab: dict[str, Any], tmp_path: Path) -> None:
    d = Drill(lab, tmp_path, "kvstore", pause_path="live")
    try:
        d.wait_console(r"serving on", 1)
        d.wait_console(r"client \d+: op \d+", 1)

        # 1. uncoordinated snapshots, one after another, replicated: must fail
        unc = d.uncoordinated(f"unc.{int(time.time())}", 2.0)
        d.replicate(unc)                  # the first, full copy to DR
        bad = kv.check_disks(d.export(unc, "unc"))      # read at DR
        print(f"\nuncoordinated: failed {bad.failed()} {bad.stats}")
        assert not bad.ok, bad.as_dict()
        assert "acked_survives" in bad.failed() or "dependent_order" in bad.failed()

        # 2. group snapshots under load; the newest is replicated and its
        #    DR copies are checked offline
        d.group_snapshot()
        d.wait_console(r"client \d+: op \d+", 2)
        snap = d.group_snapshot()
        d.replicate(snap, verify_full=True)   # incremental; invariant 5 asserted
        disks = d.export(snap, "gs")          # the DR copies
        v = kv.check_disks(disks)
        print(f"group snapshot {snap}: {v.failed() or 'ok'} {v.stats}")
        assert v.ok, v.as_dict()
        assert v.stats["acked_mutations"] > 20, v.stats
        res = cutpoint("check", "kvstore", *map(str, disks), "--json")
        assert res.returncode == 0 and json.loads(res.stdout)["ok"], res.stdout

        # 3. restore DR-cluster clones on the DR host, cold restart, live digests
        peers = d.boot_restored(snap, "--role=server", "live")
        d.wait_console(r"serving on", 1, vms=d.restored)
        addrs = ",".join(f"{p}:7700" for p in peers)
        res = cutpoint("check", "kvstore", *map(str, disks), "--live", addrs, "--json")
        doc = json.loads(res.stdout)
        print(f"live at DR: ok={doc['ok']} failed={doc['failed']}")
        assert res.returncode == 0 and doc["ok"], doc
        assert any("membership changed" in t for t in d.consoles(d.restored))

        # 4. fsync off (servers), clients on: only acked_survives fails
        d.boot_restored(snap, "--no-fsync,--simulate-power-loss", "nofsync")
        d.wait_console(r"client \d+: op \d+", 1, vms=d.restored)
        d.pause_restored()
        nv = kv.check_disks(d.export_restored("nofsync"))
        print(f"no-fsync: failed {nv.failed()} {nv.stats}")
        assert nv.failed() == ["acked_survives"], nv.as_dict()
    finally:
        d.close()
    assert d.left_at_dr == [], f"scratch left on the DR cluster: {d.left_at_dr}"
