"""Bad input is rejected with one clear line and a non-zero exit, before
the lab lock is taken or anything is touched; plus unit tests of the lab's
pure parts (module order, QEMU argv, console parsing, lock)."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cutpoint.lab import config as C
from cutpoint.lab import image, vms
from cutpoint.lab.errors import LabBusy, LabError
from cutpoint.lab.lock import HELD_ENV, lab_lock

CLI = [str(Path(sys.executable).parent / "cutpoint-lab")]


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    e = dict(os.environ, **(env or {}))
    e.pop(HELD_ENV, None)
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=60,
                          env=e, check=False)


@pytest.mark.parametrize(("args", "env", "needle"), [
    (["--backend", "nfs"], {}, "unknown --backend 'nfs': choose one of rbd, qcow2"),
    (["--hosts", "0"], {}, "--hosts must be between 1 and 9, got 0"),
    (["--kernel", "/nonexistent/vmlinuz-9"], {}, "kernel not found: /nonexistent/vmlinuz-9"),
    ([], {"CUTPOINT_LAB_BOOT_DIR": "/nonexistent-boot"},
     "no kernel found: /nonexistent-boot/vmlinuz-* is absent"),
    (["--osd", "filestore"], {}, "unknown --osd 'filestore'"),
    (["--workload-args", "a b"], {}, "bad --workload-args 'a b': comma-separated"),
    (["--workload", "nosuch"], {}, "unknown --workload 'nosuch': choose one of none, labcheck"),
])
def test_lab_up_rejects_bad_input(args: list[str], env: dict[str, str], needle: str,
                                  tmp_path: Path) -> None:
    r = cli("up", "--state-dir", str(tmp_path), *args, env=env)
    assert r.returncode != 0
    err = r.stderr.strip().splitlines()
    assert len(err) == 1, r.stderr
    assert needle in err[0], err
    assert err[0].startswith("cutpoint-lab: error: ")
    assert not (tmp_path / "status.json").exists()


def test_cutpoint_lab_has_the_test_beds_commands() -> None:
    r = cli("--help")
    assert r.returncode == 0, r.stderr
    for cmd in ("up", "status", "down", "group-file", "build-image", "bench", "check", "demo",
                "dr-walkthrough"):
        assert f" {cmd} " in r.stdout, (cmd, r.stdout)
    r = cli("bench", "--help")
    for cmd in ("replication", "pause", "snapsize", "overhead", "quiesce", "control-plane",
                "agent", "scale"):
        assert f" {cmd} " in r.stdout, (cmd, r.stdout)
    r = cli("check", "--help")
    for cmd in ("writer", "kvstore", "sharedlog"):
        assert f" {cmd} " in r.stdout, (cmd, r.stdout)


def test_lab_status_without_lab_is_a_clear_error(tmp_path: Path) -> None:
    r = cli("status", "--state-dir", str(tmp_path))
    assert r.returncode != 0
    assert "no lab is up" in r.stderr and "status.json" in r.stderr


def test_lock_busy_is_reported(tmp_path: Path) -> None:
    path = str(tmp_path / "lock")
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(fd, b"pid 1 (test)\n")
    env_before = os.environ.pop(HELD_ENV, None)
    try:
        with pytest.raises(LabBusy, match="lab busy: .* held by pid 1 \\(test\\)"), \
                lab_lock(wait=False, path=path):
            pass
    finally:
        os.close(fd)
        if env_before is not None:
            os.environ[HELD_ENV] = env_before
    with lab_lock(wait=False, path=path):
        assert os.environ[HELD_ENV] == "1"


def test_modules_resolve_dependencies_first() -> None:
    kernel = C.newest_kernel()
    if kernel is None:
        pytest.skip("no /boot/vmlinuz-*")
    order = [n for n, _ in image.resolve_modules(["virtio_blk", "virtio_net"],
                                                 image.kernel_version(kernel))]
    for before, after in [("virtio_ring", "virtio"), ("virtio", "virtio_blk"),
                          ("failover", "net_failover"), ("net_failover", "virtio_net")]:
        if before in order and after in order:
            assert order.index(before) < order.index(after), order
    assert "virtio_blk" in order and "virtio_net" in order


def test_qemu_argv_names_disk_nodes_and_passes_guest_contract() -> None:
    cfg = C.LabConfig(hosts=1, vms_per_host=1, disks=2, workload="writer",
                      workload_args="a,b", state_dir="/tmp/x", driver="qemu")
    sites = {"primary": {"pool": "rbd", "ceph_conf": "/c/ceph.conf", "client_id": "admin"}}
    [vm] = vms.plan(cfg, sites, Path("/tmp/x"))
    argv = vms.qemu_argv(vm, {"kernel": "/k", "initrd": "/i"}, "tcg", ["10.77.101.1"],
                         sites, 128, "a,b")
    text = " ".join(argv)
    assert "driver=rbd,node-name=disk0,pool=rbd,image=primary-h1-vm1-disk0" in text
    assert "node-name=disk1" in text and "conf=/c/ceph.conf,user=admin" in text
    append = argv[argv.index("-append") + 1].split()
    for want in ("cp.workload=writer", "cp.vm=1", "cp.name=primary-h1-vm1",
                 "cp.ip=10.77.101.1/16", "cp.peers=10.77.101.1", "cp.args=a,b"):
        assert want in append


def test_libvirt_domain_xml_is_the_lab_guest_and_signable_for_dr() -> None:
    """The libvirt lab's domain: RBD disks as client.cutpoint behind the
    site's secret, the guest's kernel command line, a bridge on br0, the
    console logged to its file; and a definition vmdef_rewrite takes for DR
    (it would refuse a file console or an ethernet interface)."""
    import xml.etree.ElementTree as ET

    from cutpoint.api.config import DefinitionTarget
    from cutpoint.api.services.vmdef_policy import site_policy
    from cutpoint.api.services.vmdef_rewrite import (
        DrTarget,
        RewriteError,
        rbd_images,
        rewrite,
    )
    from cutpoint.lab import domains

    cfg = C.LabConfig(hosts=1, vms_per_host=1, disks=2, workload="writer",
                      state_dir="/tmp/x", driver="libvirt")
    lv = {"hosts": {"primary-h1": {"dir": "/tmp/x/libvirt/primary-h1", "netns": "primary-h1",
                                   "site": "primary", "uri": "qemu:///system?socket=/s"}}}
    sites = {"primary": {"pool": "rbd", "ceph_conf": "/c/ceph.conf", "client_id": "admin",
                         "mon_addrs": ["v2:10.77.0.2:3300", "v1:10.77.0.2:6789"]}}
    [vm] = vms.plan(cfg, sites, Path("/tmp/x"), lv)
    assert vm["driver"] == "libvirt" and "qmp" not in vm
    assert vm["pidfile"] == "/tmp/x/libvirt/primary-h1/run/qemu/primary-h1-vm1.pid"
    assert [d["node"] for d in vm["disks"]] == ["vda", "vdb"]
    secret = {"uuid": "5d0c3e6a-8f4b-4c21-9a7e-2b1f0e9d8c71", "user": "cutpoint"}
    xml = domains.domain_xml(vm, {"kernel": "/k", "initrd": "/i"}, "tcg",
                             vms.kernel_cmdline(vm, ["10.77.101.1"], ""), sites["primary"],
                             secret, "/tmp/x/libvirt/ceph-client.conf", 160)
    root = ET.fromstring(xml)
    assert root.get("type") == "qemu" and root.findtext("name") == "primary-h1-vm1"
    assert "cp.workload=writer" in (root.findtext("os/cmdline") or "").split()
    assert rbd_images(xml) == ["rbd/primary-h1-vm1-disk0", "rbd/primary-h1-vm1-disk1"]
    for disk in root.findall("devices/disk"):
        assert disk.find("auth").get("username") == "cutpoint"
        assert disk.find("auth/secret").get("uuid") == secret["uuid"]
        assert disk.find("source/host").attrib == {"name": "10.77.0.2", "port": "6789"}
        assert disk.find("source/config").get("file") == "/tmp/x/libvirt/ceph-client.conf"
    assert root.find("devices/interface/source").get("bridge") == "br0"
    assert root.find("devices/serial/log").get("file") == vm["console"]
    files = domains.dr_files(Path("/tmp/x"), {"kernel": "/b/k", "initrd": "/b/i"})
    assert files == {"boot_paths": ["/b"], "console_dir": "/tmp/x/libvirt/dr-console",
                     "ceph_conf": "/tmp/x/libvirt/ceph-client.conf"}
    dr = DrTarget(pool="rbd", mon_hosts=(("10.77.0.3", 6790),), auth_user="cutpoint",
                  secret_uuid=secret["uuid"], networks={"br0": "br0"},
                  policy=site_policy(DefinitionTarget(
                      host="dr-h1", auth_user="cutpoint", secret_uuid=secret["uuid"],
                      mon_hosts=["10.77.0.3:6790"], **files)))
    out = rewrite(xml.replace("/k<", "/b/k<").replace("/i<", "/b/i<"), dr)
    assert rbd_images(out) == rbd_images(xml)
    assert ET.fromstring(out).find("devices/serial/log").get("file") == \
        "/tmp/x/libvirt/dr-console/primary-h1-vm1.serial0.log"
    # a kernel outside the DR site's boot_paths is not signed
    with pytest.raises(RewriteError, match="<kernel> names host path '/k'"):
        rewrite(xml, dr)
    # the shape matters: raw QEMU's file console would not be signed
    with pytest.raises(RewriteError, match="reaches a host file"):
        rewrite(xml.replace("<serial type='pty'>", "<serial type='file'>"), dr)


def test_libvirt_mode_refuses_qcow2() -> None:
    cfg = C.LabConfig(backend="qcow2", driver="libvirt", state_dir="/tmp/x")
    with pytest.raises(LabError, match="--driver libvirt runs RBD disks only"):
        cfg.validate()


def test_console_lines_parse(tmp_path: Path) -> None:
    con = tmp_path / "console.log"
    con.write_text("noise\nCP-LABCHECK ping name=v from=1 to=2 tries=1 result=ok\r\n"
                   "CP-LABCHECK done name=v\n")
    recs = vms.console_lines({"console": str(con)})
    assert recs == [{"kind": "ping", "name": "v", "from": "1", "to": "2", "tries": "1",
                     "result": "ok"}, {"kind": "done", "name": "v"}]


def test_image_recipe_hash_covers_its_inputs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kernel = C.newest_kernel()
    if kernel is None:
        pytest.skip("no /boot/vmlinuz-*")
    wl = tmp_path / "wl" / "demo"
    wl.mkdir(parents=True)
    monkeypatch.setenv("CUTPOINT_WORKLOADS_DIR", str(tmp_path / "wl"))
    base = image.recipe(kernel)
    assert image.recipe(kernel)["hash"] == base["hash"]
    assert base["workloads"] == []
    binary = wl / "cp-demo"
    binary.write_bytes(b"\x7fELF one")
    binary.chmod(0o755)
    one = image.recipe(kernel)
    assert [w["name"] for w in one["workloads"]] == ["cp-demo"]
    assert one["hash"] != base["hash"]
    binary.write_bytes(b"\x7fELF two")
    assert image.recipe(kernel)["hash"] not in (base["hash"], one["hash"])
