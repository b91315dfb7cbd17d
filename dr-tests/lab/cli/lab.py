"""`cutpoint-lab up | status | down | group-file | build-image`: the lab
itself (see docs/lab.md).  `register(app)` adds them to the top level of
`cutpoint-lab`."""

from __future__ import annotations

import json
import sys
from typing import Any

import typer
from cutpoint.lab import config as C
from cutpoint.lab.errors import LabError


def register(app: typer.Typer) -> None:
    app.command()(up)
    app.command()(status)
    app.command()(down)
    app.command("group-file")(group_file)
    app.command("build-image")(build_image)


def _fail(msg: str) -> None:
    typer.echo(f"cutpoint-lab: error: {msg}", err=True)
    raise typer.Exit(2)


def _log(msg: str) -> None:
    typer.echo(msg)
    sys.stdout.flush()


def _log_err(msg: str) -> None:
    typer.echo(msg, err=True)


def up(
    hosts: int = typer.Option(2, "--hosts", help="primary-site hosts (network namespaces)"),
    vms_per_host: int = typer.Option(1, "--vms-per-host", help="QEMU guests per primary host"),
    disks: int = typer.Option(1, "--disks", help="virtio disks per guest"),
    backend: str = typer.Option("rbd", "--backend", help="disk backend: rbd or qcow2"),
    driver: str = typer.Option(C.default_driver(), "--driver",
                               help="how guests run: libvirt (a libvirtd per host, domains "
                                    "with RBD disks and a cephx secret) or qemu (raw QEMU "
                                    "with QMP)"),
    workload: str = typer.Option("none", "--workload", help="workload every guest starts"),
    workload_args: str = typer.Option("", "--workload-args", help="comma-separated workload args"),
    disk_size_mb: int = typer.Option(64, "--disk-size-mb", help="size of each disk in MiB"),
    osd: str = typer.Option("memstore", "--osd", help="OSD object store: memstore or bluestore"),
    paxos: str = typer.Option("tuned", "--paxos",
                              help="mon paxos: tuned (propose interval 0.01 s) or default"),
    dr_hosts: int = typer.Option(1, "--dr-hosts", help="DR-site hosts"),
    memory_mb: int = typer.Option(160, "--memory-mb", help="guest memory in MiB"),
    qemu_op_timeout: int = typer.Option(
        30, "--qemu-op-timeout",
        help="rados op timeouts (s) of QEMU's Ceph client; 0 none"),
    kernel: str = typer.Option(None, "--kernel", help="guest kernel (default: newest /boot/vmlinuz-*)"),
    accel: str = typer.Option(None, "--accel", help="force tcg or kvm (default: boot probe)"),
    state_dir: str = typer.Option(None, "--state-dir", help=f"default {C.DEFAULT_STATE_DIR}"),
    wait: bool = typer.Option(False, "--wait", help="wait for the lab lock instead of failing"),
    json_out: bool = typer.Option(False, "--json", help="print the status JSON when up"),
) -> None:
    """Bring the lab up (cleaning up any previous lab first)."""
    from cutpoint.lab import lock
    from cutpoint.lab import up as lab_up

    cfg = C.LabConfig(hosts=hosts, vms_per_host=vms_per_host, disks=disks, backend=backend,
                      driver=driver, workload=workload, workload_args=workload_args, disk_size_mb=disk_size_mb,
                      osd=osd, paxos=paxos, dr_hosts=dr_hosts, memory_mb=memory_mb,
                      qemu_op_timeout_s=qemu_op_timeout, kernel=kernel, accel=accel, state_dir=str(C.state_dir(state_dir)))
    try:
        cfg.validate()
        # With --json, stdout carries only the JSON; progress goes to stderr.
        log = _log_err if json_out else _log
        with lock.lab_lock(wait=wait, log=log):
            status = lab_up.up(cfg, log=log)
    except LabError as exc:
        _fail(str(exc))
    if json_out:
        typer.echo(json.dumps(status, indent=2))
    else:
        _summary(status)


def _summary(s: dict[str, Any]) -> None:
    typer.echo(f"state dir {s['state_dir']}, accelerator {s.get('accel')} "
               f"({s.get('accel_why', '?')}), phase {s.get('phase')}")
    img = s.get("image") or {}
    if img:
        typer.echo(f"  image tiny {img.get('hash')} in {img.get('dir')} "
                   f"(workloads: {', '.join(img.get('workloads') or []) or 'none'})")
    for site, v in s.get("sites", {}).items():
        typer.echo(f"  site {site:8} mon {v['mon_addr']:18} pool {v['pool']}  conf {v['ceph_conf']}")
    lv = (s.get("libvirt") or {}).get("hosts", {})
    for h in s.get("hosts", []):
        uri = f"  libvirt {lv[h['name']]['uri']}" if h["name"] in lv else ""
        typer.echo(f"  host {h['name']:12} netns {h['netns']:12} {h['address']}{uri}")
    for site, sec in ((s.get("libvirt") or {}).get("secrets") or {}).items():
        typer.echo(f"  libvirt secret of site {site}: {sec['uuid']} (client.{sec['user']})")
    for vm in s.get("vms", []):
        disks = ", ".join(d.get("image") or d.get("file", "?") for d in vm["disks"])
        typer.echo(f"  vm   {vm['name']:16} on {vm['host']:11} {vm['address']:13} "
                   f"{vm.get('driver', 'qemu'):7} pid {vm['pid']:<7} "
                   f"disks {disks}")


def status(
    json_out: bool = typer.Option(False, "--json", help="print the status as JSON"),
    state_dir: str = typer.Option(None, "--state-dir", help=f"default {C.DEFAULT_STATE_DIR}"),
) -> None:
    """Show the lab (sites, hosts, VMs, image) and whether its processes live."""
    from cutpoint.lab.status import health, load_status

    try:
        s = load_status(state_dir)
    except LabError as exc:
        _fail(str(exc))
    if json_out:
        typer.echo(json.dumps(s, indent=2))
        return
    _summary(s)
    h = health(s)
    dead = [k for k, v in {**h["vms"], **h["ceph"], **h["libvirt"]}.items() if not v]
    typer.echo(f"  health: {'all processes running' if not dead else 'DEAD: ' + ', '.join(dead)}")


def down(
    state_dir: str = typer.Option(None, "--state-dir", help=f"default {C.DEFAULT_STATE_DIR}"),
    wait: bool = typer.Option(False, "--wait", help="wait for the lab lock instead of failing"),
) -> None:
    """Tear the lab down: no process, namespace, link or mount is left."""
    from cutpoint.lab import down as lab_down
    from cutpoint.lab import lock

    try:
        with lock.lab_lock(wait=wait, log=_log):
            removed = lab_down.down(str(C.state_dir(state_dir)), log=_log)
    except LabError as exc:
        _fail(str(exc))
    typer.echo(f"lab down: {len(removed)} item(s) removed; nothing left" if removed
               else "lab down: nothing to remove; nothing left")


def group_file(
    output: str = typer.Option(None, "--output", "-o", help="default <state dir>/group.yaml"),
    group: str = typer.Option("lab", "--group", help="group name (snapshots cp.<group>.<txn>)"),
    vms: str = typer.Option(None, "--vms", help="comma-separated VM names (default: all primary VMs)"),
    certs_dir: str = typer.Option(None, "--certs-dir", help="ca.pem + coordinator.pem/.key; default <state dir>/certs"),
    lease_ms: int = typer.Option(2000, "--lease-ms"),
    budget_ms: int = typer.Option(1000, "--budget-ms"),
    state_dir: str = typer.Option(None, "--state-dir", help=f"default {C.DEFAULT_STATE_DIR}"),
) -> None:
    """Write the group file G of the running lab (for `cutpoint snapshot --group-file G`)."""
    from cutpoint.coordinator.groupfile import GroupFileError
    from cutpoint.lab.groupfile import write_group_file
    from cutpoint.lab.status import load_status

    try:
        s = load_status(state_dir)
        path = output or str(C.state_dir(state_dir) / "group.yaml")
        spec = write_group_file(s, path, group=group, certs_dir=certs_dir, lease_ms=lease_ms,
                                budget_ms=budget_ms, vms=vms.split(",") if vms else None)
    except (LabError, GroupFileError) as exc:
        _fail(str(exc))
    typer.echo(f"wrote {path}: group {spec.name}, {len(spec.vms())} VM(s) on {len(spec.agents)} agent(s)")


def build_image(
    name: str = typer.Argument(..., help="image recipe: debian-pg"),
    fmt: str = typer.Option("raw", "--format", help="raw or qcow2"),
    force: bool = typer.Option(False, "--force", help="rebuild even if cached"),
) -> None:
    """Build (or reuse from the cache) a Debian guest image (dr-tests/images/debian)."""
    from cutpoint.lab import debian_image

    argv = ["build", name, "--format", fmt] + (["--force"] if force else [])
    raise typer.Exit(debian_image.main(argv))
