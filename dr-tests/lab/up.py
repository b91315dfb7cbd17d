"""`cutpoint-lab up`: network, two Ceph sites, tiny image, guests.

Phases (status.json `phase` after each):

    clean previous lab -> network (cpbr0, host netns) -> ceph primary || ceph dr
    || image (+ accel probe) [|| libvirtd per host] -> disks [-> libvirt secrets]
    -> guests started -> guests booted ("up")

With `driver = libvirt` (domains.py) every host runs a libvirtd of its own,
the sites' cephx keys become libvirt secrets, and the guests are libvirt
domains; status `libvirt` records the daemons, the secrets and the
definition-signing key.

The Ceph sites and the image build run in parallel threads; each phase
logs its elapsed time.  The caller holds the lab lock (lock.lab_lock).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from cutpoint.lab import ceph, domains, down, image, net, probe, vms
from cutpoint.lab import config as C
from cutpoint.lab.errors import LabError
from cutpoint.lab.status import write_status


def up(cfg: C.LabConfig, log: Any = print, wait_boot: bool = True) -> dict[str, Any]:
    """Bring the lab up.  On failure, stop what was started (processes,
    namespaces, links) but keep the files, logs included, then re-raise."""
    cfg.validate()
    try:
        return _up(cfg, log, wait_boot)
    except BaseException as exc:
        log(f"lab up failed: {exc}")
        log(f"stopping what was started; logs stay in {cfg.state_dir} until `cutpoint-lab down`")
        try:
            down.down(cfg.state_dir, log=log, keep_files=True)
        except Exception as exc2:  # noqa: BLE001 - the first error is the one to report
            log(f"cleanup after the failure also failed: {exc2}")
        raise


def _up(cfg: C.LabConfig, log: Any, wait_boot: bool) -> dict[str, Any]:
    t0 = time.monotonic()

    def say(msg: str) -> None:
        log(f"[{time.monotonic() - t0:6.1f}s] {msg}")

    prev = down.has_previous(cfg.state_dir)
    if prev:
        say(f"a previous lab was found ({', '.join(prev[:6])}{' ...' if len(prev) > 6 else ''}); "
            "cleaning it up first")
        down.down(cfg.state_dir, log=lambda m: say(m))
    state = Path(cfg.state_dir)
    state.mkdir(parents=True, exist_ok=True)
    for j in down.clear_journals(state):
        say(f"removed {j} (a new lab has no paused VM)")
    mark = str(state)
    status: dict[str, Any] = {
        "state_dir": str(state), "phase": "network", "accel": None, "bridge": C.BRIDGE,
        "subnet": f"10.77.0.0/{C.PREFIX}", "config": cfg.as_dict(), "sites": {}, "hosts": [],
        "vms": [], "image": {}, "started_at": time.time(), "driver": cfg.driver,
    }
    write_status(status)
    net.setup_bridge()
    for name, site, idx in C.host_names(cfg):
        status["hosts"].append({"name": name, "site": site, "netns": name,
                                "address": net.setup_host(name, site, idx),
                                "veth": C.veth_name(site, idx)})
    say(f"network: bridge {C.BRIDGE}, hosts {', '.join(h['name'] for h in status['hosts'])}")
    status["phase"] = "ceph"
    write_status(status)

    assert cfg.kernel is not None
    kernel: str = cfg.kernel

    def img() -> tuple[dict[str, Any], dict[str, Any]]:
        i = image.build(kernel, log=say)
        if i.get("cached"):
            say(f"image: tiny {i['hash']} (cached)")
        a = probe.choose_accel(kernel, i, cfg.accel, log=say)
        return i, a

    with ThreadPoolExecutor(max_workers=4) as ex:
        futs = {site: ex.submit(ceph.up, state, site, cfg.osd, cfg.paxos, mark, say)
                for site in C.SITES}
        fimg = ex.submit(img)
        flv = ex.submit(domains.start_hosts, status, mark, say) \
            if cfg.driver == "libvirt" else None
        errors = []
        if flv is not None:
            try:
                status["libvirt"] = flv.result()
            except Exception as exc:  # noqa: BLE001
                errors.append(f"libvirt: {exc}")
        for site, f in futs.items():
            try:
                status["sites"][site] = f.result()
            except Exception as exc:  # noqa: BLE001 - reported below with the site
                errors.append(f"ceph {site}: {exc}")
        try:
            status["image"], accel = fimg.result()
        except Exception as exc:  # noqa: BLE001
            errors.append(f"image: {exc}")
    if errors:
        write_status(status)
        raise LabError("; ".join(errors))
    for site_status in status["sites"].values():
        site_status["qemu_conf"] = ceph.write_qemu_conf(site_status, cfg.qemu_op_timeout_s)
    status["accel"] = accel["accel"]
    status["accel_why"] = accel["why"]
    status["phase"] = "disks"
    write_status(status)

    if cfg.driver == "libvirt":
        domains.define_secrets(status)
        domains.signing_key(status)
        write_status(status)
        secrets = ", ".join(f"{k} {v['uuid']}" for k, v in status["libvirt"]["secrets"].items())
        say(f"libvirt: cephx secrets of client.{domains.ROLE}: {secrets}")
    status["vms"] = vms.plan(cfg, status["sites"], state, status.get("libvirt"))
    vms.create_disks(status["vms"], status["sites"])
    if status["vms"]:
        say(f"disks: {sum(len(v['disks']) for v in status['vms'])} x {cfg.disk_size_mb} MiB "
            f"({cfg.backend})")
    status["phase"] = "vms"
    write_status(status)
    try:
        vms.start(status["vms"], status["image"], status["accel"], status["sites"], cfg, mark,
                  status)
    finally:
        write_status(status)
    say(f"guests: {len(status['vms'])} started under {status['accel']}"
        + (" as libvirt domains" if cfg.driver == "libvirt" else ""))
    if wait_boot:
        # TCG guests share the machine's cores: allow more time for more guests.
        vms.wait_ready(status["vms"], timeout=max(180.0, 45.0 * len(status["vms"])), log=say)
    status["phase"] = "up"
    status["up_seconds"] = round(time.monotonic() - t0, 1)
    write_status(status)
    say(f"lab up in {status['up_seconds']}s")
    return status
