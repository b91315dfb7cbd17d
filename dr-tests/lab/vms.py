"""The lab's guests: one per (host, index), run inside the host netns.

Raw-QEMU mode (`--driver qemu`, this file):

Each guest gets `-blockdev` nodes named disk0, disk1, ... (the node the
virtio-blk device is attached to, so QMP snapshot commands can say
`device: diskN`), a QMP socket, a serial console log, and a tap on its
host's bridge.  QEMU daemonizes after its init is done, so a started guest
is a running process with a pid file.

libvirt mode (`--driver libvirt`): the same guest (kernel command line,
MAC, address, tap name, console file) as a libvirt domain of the host's
libvirtd (domains.py); status entries carry `driver`, `uri`, libvirt's
pid file and the domain's log instead of `qmp`.  `status.vm_pid` gives
either's QEMU pid.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from cutpoint.lab import config as C
from cutpoint.lab import domains, net
from cutpoint.lab.ceph import rbd_cmd
from cutpoint.lab.errors import LabError
from cutpoint.lab.proc import kill_pids, pid_alive, read_pidfile, run

READY = "cp-init: ready"


def plan(cfg: C.LabConfig, sites: dict[str, Any], state: Path,
         libvirt: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The VM entries of the status (VMs live on primary hosts); `libvirt`:
    the status's libvirt hosts (libvirt mode)."""
    vms = []
    g = 0
    for hname, site, _hidx in C.host_names(cfg):
        if site != "primary":
            continue
        for i in range(1, cfg.vms_per_host + 1):
            g += 1
            name = f"{hname}-vm{i}"
            d = state / "vms" / name
            disks = []
            for k in range(cfg.disks):
                disk: dict[str, Any] = {"node": f"disk{k}", "device": f"/dev/vd{chr(ord('a') + k)}",
                                        "backend": cfg.backend, "size_mb": cfg.disk_size_mb}
                if cfg.backend == "rbd":
                    disk.update(pool=sites[site]["pool"], image=f"{name}-disk{k}", site=site)
                else:
                    disk["file"] = str(d / f"disk{k}.qcow2")
                disks.append(disk)
            vms.append({
                "name": name, "host": hname, "site": site, "index": g, "host_index": i,
                "address": C.vm_addr(g), "mac": C.vm_mac(g), "tap": f"tap{i}",
                "qmp": str(d / "qmp.sock"), "console": str(d / "console.log"),
                "pidfile": str(d / "qemu.pid"), "pid": 0, "backend": cfg.backend,
                "workload": cfg.workload, "disks": disks, "dir": str(d), "driver": "qemu",
            })
            if cfg.driver == "libvirt":
                assert libvirt is not None
                domains.plan_vm(vms[-1], libvirt)
    return vms


def create_disks(vms: list[dict[str, Any]], sites: dict[str, Any]) -> None:
    jobs = []
    for vm in vms:
        Path(vm["dir"]).mkdir(parents=True, exist_ok=True)
        for disk in vm["disks"]:
            if disk["backend"] == "rbd":
                jobs.append(rbd_cmd(sites[disk["site"]], "create", "--size", f"{disk['size_mb']}M",
                                    f"{disk['pool']}/{disk['image']}"))
            else:
                jobs.append(["qemu-img", "create", "-q", "-f", "qcow2", disk["file"],
                             f"{disk['size_mb']}M"])
    with ThreadPoolExecutor(max_workers=4) as ex:
        list(ex.map(run, jobs))


def kernel_cmdline(vm: dict[str, Any], peers: list[str], workload_args: str) -> str:
    """The tiny image's init reads its role from here (both drivers)."""
    cmdline = ["console=ttyS0", "quiet", "panic=-1", f"cp.workload={vm['workload']}",
               f"cp.vm={vm['index']}", f"cp.name={vm['name']}",
               f"cp.ip={vm['address']}/{C.PREFIX}", f"cp.peers={','.join(peers)}",
               f"cp.ndisks={len(vm['disks'])}"]
    if workload_args:
        cmdline.append(f"cp.args={workload_args}")
    return " ".join(cmdline)


def qemu_argv(vm: dict[str, Any], image: dict[str, Any], accel: str, peers: list[str],
              sites: dict[str, Any], memory_mb: int, workload_args: str) -> list[str]:
    argv = ["qemu-system-x86_64", "-name", f"guest={vm['name']},process=cplab-{vm['name']}",
            "-nodefaults", "-no-user-config", "-machine", f"pc,accel={accel}",
            "-cpu", "kvm64" if accel == "kvm" else "qemu64",
            "-smp", "1", "-m", str(memory_mb), "-display", "none", "-no-reboot",
            "-kernel", image["kernel"], "-initrd", image["initrd"],
            "-append", kernel_cmdline(vm, peers, workload_args),
            "-chardev", f"file,id=console,path={vm['console']}", "-serial", "chardev:console",
            "-qmp", f"unix:{vm['qmp']},server=on,wait=off",
            "-netdev", f"tap,id=net0,ifname={vm['tap']},script=no,downscript=no",
            "-device", f"virtio-net-pci,netdev=net0,mac={vm['mac']},addr=0x3",
            "-pidfile", vm["pidfile"], "-daemonize"]
    for k, disk in enumerate(vm["disks"]):
        if disk["backend"] == "rbd":
            s = sites[disk["site"]]
            bd = (f"driver=rbd,node-name={disk['node']},pool={disk['pool']},image={disk['image']},"
                  f"conf={s.get('qemu_conf') or s['ceph_conf']},user={s['client_id']}")
        else:
            bd = (f"driver=qcow2,node-name={disk['node']},file.driver=file,"
                  f"file.filename={disk['file']},file.node-name={disk['node']}-file")
        argv += ["-blockdev", bd, "-device",
                 f"virtio-blk-pci,drive={disk['node']},id=vd{k},addr={hex(4 + k)}"]
    return argv


def start(vms: list[dict[str, Any]], image: dict[str, Any], accel: str,
          sites: dict[str, Any], cfg: C.LabConfig, mark: str,
          status: dict[str, Any] | None = None) -> None:
    peers = [vm["address"] for vm in vms]
    if cfg.driver == "libvirt":
        assert status is not None
        lv = status["libvirt"]
        conf = domains.client_conf(Path(status["state_dir"]), cfg.qemu_op_timeout_s)
        xmls = {vm["name"]: domains.domain_xml(
            vm, image, accel, kernel_cmdline(vm, peers, cfg.workload_args),
            sites[vm["site"]], lv["secrets"][vm["site"]], conf, cfg.memory_mb) for vm in vms}
        domains.start(vms, status, xmls)
        return

    def one(vm: dict[str, Any]) -> None:
        net.add_tap(vm["host"], vm["tap"])
        for f in (vm["console"], vm["qmp"], vm["pidfile"]):
            Path(f).unlink(missing_ok=True)
        argv = qemu_argv(vm, image, accel, peers, sites, cfg.memory_mb, cfg.workload_args)
        Path(vm["dir"], "qemu.argv").write_text("\0".join(argv))
        run(["ip", "netns", "exec", vm["host"], *argv], mark=mark, timeout=60)
        vm["pid"] = read_pidfile(Path(vm["pidfile"]))
        if not pid_alive(vm["pid"]):
            raise LabError(f"{vm['name']}: QEMU exited right after start (see {vm['console']})")

    with ThreadPoolExecutor(max_workers=4) as ex:
        list(ex.map(one, vms))


def _tail(path: str, lines: int = 3) -> str:
    try:
        text = Path(path).read_text(errors="replace").strip()
    except OSError:
        return "unreadable"
    return " | ".join(text.splitlines()[-lines:]) if text else "empty"


def wait_ready(vms: list[dict[str, Any]], timeout: float = 180, log: Any = print) -> None:
    """Wait until every guest's init printed its ready line."""
    t0 = time.monotonic()
    pending = {vm["name"]: vm for vm in vms}
    while pending:
        for name, vm in list(pending.items()):
            try:
                text = Path(vm["console"]).read_text(errors="replace")
            except OSError:
                text = ""
            if READY in text:
                del pending[name]
                log(f"{name}: booted ({time.monotonic() - t0:.1f}s)")
            elif not pid_alive(vm["pid"]):
                raise LabError(f"{name}: QEMU died during boot; console {vm['console']}: "
                               + " | ".join(text.strip().splitlines()[-3:]))
        if pending and time.monotonic() - t0 > timeout:
            raise LabError(f"guests not booted after {timeout:.0f}s: " + "; ".join(
                f"{n} (console: {_tail(v['console'])})" for n, v in sorted(pending.items())))
        if pending:
            time.sleep(0.2)


def stop_all(state: Path, vms: list[dict[str, Any]]) -> list[str]:
    pids = {}
    for vm in vms:
        pids[read_pidfile(Path(vm.get("pidfile", ""))) if vm.get("pidfile") else 0] = vm["name"]
        pids[vm.get("pid", 0)] = vm["name"]
    vmdir = state / "vms"
    if vmdir.is_dir():
        for pf in vmdir.glob("*/qemu.pid"):
            pids[read_pidfile(pf)] = pf.parent.name
    live = [p for p in pids if p and pid_alive(p)]
    kill_pids(live)
    return [f"qemu {pids[p]} (pid {p})" for p in live]


def console_lines(vm: dict[str, Any], prefix: str = "CP-LABCHECK ") -> list[dict[str, str]]:
    """Parse `PREFIX kind key=value ...` lines of a guest console."""
    out = []
    try:
        text = Path(vm["console"]).read_text(errors="replace")
    except OSError:
        return out
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith(prefix):
            continue
        parts = line[len(prefix):].split()
        if not parts:
            continue
        rec = {"kind": parts[0]}
        for p in parts[1:]:
            k, _, v = p.partition("=")
            rec[k] = v
        out.append(rec)
    return out


