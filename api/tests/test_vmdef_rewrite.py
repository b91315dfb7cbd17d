"""vmdef_rewrite on a domain XML recorded from libvirt (data/domains/
lab-rbd.xml, `virsh dumpxml --inactive` of the lab's domain shape, see
data/domains/record.py): each rewrite lands where libvirt reads it, the
rest of the definition is left as it was, and what cannot run at DR (a
file disk, an unmapped network) is refused."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from cutpoint.api.services.vmdef_rewrite import (
    DrTarget,
    RewriteError,
    rbd_images,
    rewrite,
)

XML = (Path(__file__).parent / "data" / "domains" / "lab-rbd.xml").read_text()
DR_SECRET = "0b7e3c1a-2f45-4e8a-9d61-3c2a5e7f9b10"
TARGET = DrTarget(pool="dr", mon_hosts=(("10.78.0.11", 6789), ("10.78.0.12", 6789)),
                  auth_user="cutpoint-dr", secret_uuid=DR_SECRET,
                  networks={"br-prod": "br-dr", "prod-backend": "dr-backend"})


def test_recorded_xml_is_the_primary_site() -> None:
    assert rbd_images(XML) == ["rbd/prod-db1-disk0", "rbd/prod-db1-disk1"]
    root = ET.fromstring(XML)
    assert root.find("seclabel") is not None
    assert root.findtext("uuid")


def test_failover_rewrite() -> None:
    out = rewrite(XML, TARGET)
    root = ET.fromstring(out)
    assert rbd_images(out) == ["dr/prod-db1-disk0", "dr/prod-db1-disk1"]
    for disk in root.findall("devices/disk"):
        assert [(h.get("name"), h.get("port")) for h in disk.findall("source/host")] == \
            [("10.78.0.11", "6789"), ("10.78.0.12", "6789")]
        auth = disk.find("auth")
        assert auth is not None and auth.get("username") == "cutpoint-dr"
        assert [(s.get("type"), s.get("uuid")) for s in auth] == [("ceph", DR_SECRET)]
        # libvirt's order: auth before source
        tags = [c.tag for c in disk]
        assert tags.index("auth") < tags.index("source")
    assert [s.get("bridge") for s in root.findall("devices/interface[@type='bridge']/source")] \
        == ["br-dr"]
    assert [s.get("network") for s in root.findall(
        "devices/interface[@type='network']/source")] == ["dr-backend"]
    assert root.find("seclabel") is None
    # a failover keeps the VM's identity: name, UUID, MAC addresses
    orig = ET.fromstring(XML)
    assert root.findtext("name") == "prod-db1"
    assert root.findtext("uuid") == orig.findtext("uuid")
    assert [m.get("address") for m in root.iter("mac")] == \
        [m.get("address") for m in orig.iter("mac")]
    # nothing else moved: the same elements outside disks and interfaces
    assert [e.tag for e in root.find("devices")] == [e.tag for e in orig.find("devices")]
    assert root.find("os/type").get("machine") == "pc-i440fx-7.2"
    assert "10.77.0.11" not in out and "5a1e1a9f" not in out and "br-prod" not in out


def test_drill_rewrite_with_clones_new_name_and_uuid() -> None:
    new_uuid = "7d3f0c2e-8b1a-4c5d-9e6f-0a1b2c3d4e5f"
    t = DrTarget(**{**TARGET.__dict__, "name": "prod-db1-drill-7", "uuid": new_uuid,
                    "images": {"rbd/prod-db1-disk0": "dr/drill-7-prod-db1-disk0",
                               "rbd/prod-db1-disk1": "dr/drill-7-prod-db1-disk1"}})
    out = rewrite(XML, t)
    root = ET.fromstring(out)
    assert root.findtext("name") == "prod-db1-drill-7"
    assert root.findtext("uuid") == new_uuid
    assert rbd_images(out) == ["dr/drill-7-prod-db1-disk0", "dr/drill-7-prod-db1-disk1"]
    assert list(root.iter("mac")) == []  # libvirt makes new ones: no clash with production


def test_images_by_target_dev() -> None:
    t = DrTarget(**{**TARGET.__dict__, "by_target": {"vdb": "dr-ssd/db1-b"},
                    "images": {"rbd/prod-db1-disk1": "dr/never"}})
    assert rbd_images(rewrite(XML, t)) == ["dr/prod-db1-disk0", "dr-ssd/db1-b"]


def test_uuid_dropped_when_asked() -> None:
    out = rewrite(XML, DrTarget(**{**TARGET.__dict__, "uuid": ""}))
    assert ET.fromstring(out).find("uuid") is None


def test_unmapped_network_is_refused() -> None:
    with pytest.raises(RewriteError, match="bridge 'br-prod'"):
        rewrite(XML, DrTarget(**{**TARGET.__dict__, "networks": {"prod-backend": "x"}}))


def test_file_disk_is_refused() -> None:
    xml = XML.replace("</devices>", "<disk type='file' device='disk'><driver name='qemu' "
                      "type='qcow2'/><source file='/var/lib/x.qcow2'/>"
                      "<target dev='vdc' bus='virtio'/></disk></devices>")
    with pytest.raises(RewriteError, match="disk vdc is not an RBD image"):
        rewrite(xml, TARGET)
    # a CD-ROM is no data of the VM's: left as it is
    cd = XML.replace("</devices>", "<disk type='file' device='cdrom'>"
                     "<target dev='hdc' bus='ide'/><readonly/></disk></devices>")
    assert "hdc" in rewrite(cd, TARGET)


def test_not_a_domain() -> None:
    with pytest.raises(RewriteError):
        rewrite("<network><name>x</name></network>", TARGET)
    with pytest.raises(RewriteError, match="not XML"):
        rewrite("<domain>", TARGET)


@pytest.mark.parametrize(("extra", "why"), [
    (("<hostdev mode='subsystem' type='pci'><source><address domain='0' bus='0' slot='3' "
      "function='0'/></source></hostdev>"), "<hostdev>"),
    ("<filesystem type='mount'><source dir='/'/><target dir='root'/></filesystem>",
     "<filesystem>"),
    (("<disk type='file' device='cdrom'><source file='/etc/shadow'/>"
      "<target dev='hdc' bus='ide'/></disk>"), "cdrom hdc has a source"),
    ("<serial type='file'><source path='/etc/cron.d/x'/></serial>", "type='file'"),
    ("<interface type='ethernet'><script path='/tmp/x.sh'/></interface>",
     "only bridge and network"),
    ("<interface type='bridge'><source bridge='br-prod'/><script path='/tmp/x'/></interface>",
     "host script"),
])
def test_host_access_is_not_signed(extra: str, why: str) -> None:
    with pytest.raises(RewriteError, match=why.replace("(", r"\(")):
        rewrite(XML.replace("</devices>", extra + "</devices>"), TARGET)


def test_qemu_passthrough_and_emulator_are_not_signed() -> None:
    qemu = XML.replace("<domain type='qemu'>", "<domain type='qemu' xmlns:qemu="
                       "'http://libvirt.org/schemas/domain/qemu/1.0'>").replace(
        "</domain>", "<qemu:commandline><qemu:arg value='-x'/></qemu:commandline></domain>")
    with pytest.raises(RewriteError, match="qemu: namespace"):
        rewrite(qemu, TARGET)
    with pytest.raises(RewriteError, match="not a QEMU"):
        rewrite(XML.replace("/usr/bin/qemu-system-x86_64", "/bin/sh"), TARGET)


def test_the_guest_agent_channel_stays_without_a_host_path() -> None:
    live = XML.replace("<target type='virtio' name='org.qemu.guest_agent.0'/>",
                       "<source mode='bind' path='/var/lib/libvirt/qemu/channel/x'/>"
                       "<target type='virtio' name='org.qemu.guest_agent.0'/>")
    out = ET.fromstring(rewrite(live, TARGET))
    ch = out.find("devices/channel")
    assert ch is not None and ch.find("source") is None
    assert ch.find("target").get("name") == "org.qemu.guest_agent.0"


def test_drill_isolates_every_interface_on_the_drill_bridge() -> None:
    """A drill's copy: both interfaces (a bridge and a libvirt network) end
    up on the one drill bridge, with no MAC, whatever `networks` maps; the
    production names are gone from the output."""
    t = DrTarget(**{**TARGET.__dict__, "networks": {}, "name": "drill-1-prod-db1",
                    "uuid": "7d3f0c2e-8b1a-4c5d-9e6f-0a1b2c3d4e5f", "isolate": "cpdrill0",
                    "taps": "d0000000100"})
    out = rewrite(XML, t)
    root = ET.fromstring(out)
    itfs = root.findall("devices/interface")
    assert [(i.get("type"), i.find("source").attrib) for i in itfs] == \
        [("bridge", {"bridge": "cpdrill0"}), ("bridge", {"bridge": "cpdrill0"})]
    assert all(i.find("model").get("type") == "virtio" for i in itfs)
    assert [i.find("target").get("dev") for i in itfs] == ["d00000001000", "d00000001001"]
    assert list(root.iter("mac")) == []
    assert "br-prod" not in out and "prod-backend" not in out and "br-dr" not in out
