"""A signed definition is no way into the DR host (vmdef_policy.py).

Each case is one element a primary host that lies could put in the domain
XML it reports, on the recorded lab domain (data/domains/lab-rbd.xml): the
rewrite either refuses it, naming the element, or rewrites it onto a path
the DR site owns; and no host path of the primary's reaches the output.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from cutpoint.api.services.vmdef_policy import SitePolicy, refusals_of, under
from cutpoint.api.services.vmdef_rewrite import DrTarget, RewriteError, rewrite

XML = (Path(__file__).parent / "data" / "domains" / "lab-rbd.xml").read_text()
POLICY = SitePolicy(boot_paths=("/var/lib/cutpoint/boot",),
                    console_dir="/var/log/cutpoint/console",
                    ceph_conf="/etc/ceph/cutpoint-dr.conf")
TARGET = DrTarget(pool="dr", mon_hosts=(("10.78.0.11", 6789),), auth_user="cutpoint-dr",
                  secret_uuid="0b7e3c1a-2f45-4e8a-9d61-3c2a5e7f9b10",
                  networks={"br-prod": "br-dr", "prod-backend": "dr-backend"},
                  policy=POLICY)
BAD = "/etc/shadow"


def dev(extra: str) -> str:
    return XML.replace("</devices>", extra + "</devices>")


def os_(extra: str) -> str:
    return XML.replace("<boot dev='hd'/>", extra + "<boot dev='hd'/>")


RBD = ("<disk type='network' device='disk'><source protocol='rbd' name='rbd/x'>{}</source>"
       "{}<target dev='vdz' bus='virtio'/></disk>")

REFUSED = [
    ("kernel", os_(f"<kernel>{BAD}</kernel>"), "<kernel> names host path '/etc/shadow'"),
    ("initrd", os_(f"<kernel>/var/lib/cutpoint/boot/vmlinuz</kernel><initrd>{BAD}</initrd>"),
     "<initrd> names host path"),
    ("dtb", os_(f"<dtb>{BAD}</dtb>"), "<dtb> names host path"),
    ("loader", os_(f"<loader readonly='yes' type='pflash'>{BAD}</loader>"),
     "<loader> names host path"),
    ("kernel-dotdot", os_("<kernel>/var/lib/cutpoint/boot/../../../etc/shadow</kernel>"),
     "<kernel> names host path"),
    ("kernel-relative", os_("<kernel>etc/shadow</kernel>"), "not an absolute host path"),
    ("nvram-template", os_(f"<nvram template='{BAD}'/>"), "<nvram template='/etc/shadow'>"),
    ("acpi-table", os_(f"<acpi><table type='slic'>{BAD}</table></acpi>"), "<os> child <acpi>"),
    ("bootloader", XML.replace("<os>", "<bootloader>/usr/bin/pygrub</bootloader><os>"),
     "<domain> child <bootloader>"),
    ("fwcfg", XML.replace("<os>", f"<sysinfo type='fwcfg'><entry name='opt/x' file='{BAD}'/>"
                          "</sysinfo><os>"), "<entry file='/etc/shadow'>"),
    ("blkiotune", XML.replace("<os>", "<blkiotune><device><path>/dev/sda</path>"
                              "<weight>100</weight></device></blkiotune><os>"),
     "<path> names host path '/dev/sda'"),
    ("rom", dev(f"<interface type='bridge'><source bridge='br-prod'/><rom file='{BAD}'/>"
                "</interface>"), "<rom file='/etc/shadow'>"),
    ("tap-backend", dev("<interface type='bridge'><source bridge='br-prod'/>"
                        "<backend tap='/dev/net/tun'/></interface>"), "interface: <backend>"),
    ("vnc-socket", dev(f"<graphics type='vnc' socket='{BAD}'/>"),
     "<graphics socket='/etc/shadow'>"),
    ("audio-file", dev(f"<audio id='2' type='file' path='{BAD}'/>"), "<audio path="),
    ("rng-file", dev(f"<rng model='virtio'><backend model='random'>{BAD}</backend></rng>"),
     "<rng> backend 'random' '/etc/shadow'"),
    ("rng-egd", dev("<rng model='virtio'><backend model='egd' type='unix'><source mode='connect'"
                    f" path='{BAD}'/></backend></rng>"), "<rng> backend 'egd'"),
    ("tpm-passthrough", dev("<tpm model='tpm-tis'><backend type='passthrough'>"
                            "<device path='/dev/tpm0'/></backend></tpm>"),
     "<tpm> backend 'passthrough'"),
    ("nvdimm", dev(f"<memory model='nvdimm'><source><path>{BAD}</path></source><target><size "
                   "unit='KiB'>1024</size></target></memory>"), "<path> names host path"),
    ("backing-file", dev(RBD.format("", f"<backingStore type='file'><source file='{BAD}'/>"
                                    "</backingStore>")), "a <backingStore> with content"),
    ("rbd-host-socket", dev(RBD.format(f"<host transport='unix' socket='{BAD}'/>", "")),
     "<host socket='/etc/shadow'>"),
    ("lun", dev("<disk type='block' device='lun'><source dev='/dev/sda'/>"
                "<target dev='sda' bus='scsi'/></disk>"), "<disk device='lun'> sda"),
    ("block-disk", dev("<disk type='block' device='disk'><source dev='/dev/sda'/>"
                       "<target dev='vdz' bus='virtio'/></disk>"), "disk vdz is not an RBD"),
    ("evdev", dev("<input type='evdev'><source dev='/dev/input/event0'/></input>"),
     "<input type='evdev'>"),
    ("hostdev", dev("<hostdev mode='subsystem' type='pci'/>"), "<hostdev> is not allowed"),
    ("shmem", dev("<shmem name='x'/>"), "<shmem> is not allowed"),
    ("lease", dev(f"<lease><lockspace>x</lockspace><key>y</key><target path='{BAD}'/></lease>"),
     "<lease> is not allowed"),
    ("unknown-device", dev("<pstore backend='acpi-erst'><path>/tmp/x</path></pstore>"),
     "<pstore> is not allowed"),
    ("emulator-tmp", XML.replace("/usr/bin/qemu-system-x86_64", "/tmp/qemu-system-x86_64"),
     "is not a QEMU of a system directory"),
    ("other-namespace", XML.replace("<domain type='qemu'>", "<domain type='qemu' xmlns:x='urn:x'>")
     .replace("</devices>", "<x:thing/></devices>"), "another namespace"),
    ("kernel-split", os_("<kernel><x/>/etc/shadow</kernel>"), "<kernel> with text beside"),
    ("kernel-child", os_("<kernel><x>etc/shadow</x></kernel>"), "<kernel> with child elements"),
    ("doctype", "<!DOCTYPE domain [<!ENTITY k '/etc/shadow'>]>" + os_("<kernel>&k;</kernel>"),
     "a DOCTYPE"),
    ("pipe-serial", dev(f"<serial type='pipe'><source path='{BAD}'/></serial>"),
     "<serial type='pipe'>"),
]


@pytest.mark.parametrize(("xml", "why"), [(x, w) for _, x, w in REFUSED],
                         ids=[n for n, _, _ in REFUSED])
def test_host_access_is_refused_naming_the_element(xml: str, why: str) -> None:
    with pytest.raises(RewriteError) as e:
        rewrite(xml, TARGET)
    assert why in str(e.value), str(e.value)
    # the same reason at capture time (the definition's status)
    assert any(why in r for r in refusals_of(xml, POLICY)), refusals_of(xml, POLICY)


def _paths(out: str) -> list[str]:
    root = ET.fromstring(out)
    got = []
    for el in root.iter():
        got += [v for v in el.attrib.values() if v.startswith("/")]
        if (el.text or "").strip().startswith("/"):
            got.append((el.text or "").strip())
    return got


def test_console_log_goes_to_the_dr_console_dir() -> None:
    xml = XML.replace("<channel type='unix'>",
                      f"<serial type='pty'><source path='/dev/pts/9'/><log file='{BAD}' "
                      "append='on'/><target port='0'/></serial>"
                      f"<console type='pty'><log file='{BAD}'/><target type='serial'/></console>"
                      "<channel type='unix'>")
    out = rewrite(xml, TARGET)
    root = ET.fromstring(out)
    assert [lg.attrib for lg in root.iter("log")] == [
        {"file": "/var/log/cutpoint/console/prod-db1.serial0.log", "append": "off"},
        {"file": "/var/log/cutpoint/console/prod-db1.console0.log", "append": "off"}]
    assert root.find("devices/serial/source") is None
    assert BAD not in out
    # no console_dir at the site: the log is dropped, the pty stays
    bare = DrTarget(**{**TARGET.__dict__, "policy": SitePolicy()})
    root = ET.fromstring(rewrite(xml, bare))
    assert list(root.iter("log")) == [] and root.find("devices/serial").get("type") == "pty"


def test_ceph_conf_nvram_target_dev_and_seclabel_are_the_dr_sites() -> None:
    xml = XML.replace("<host name='10.77.0.11' port='6789'/>",
                      f"<host name='10.77.0.11' port='6789'/><config file='{BAD}'/>"
                      "<seclabel model='dac' relabel='no'/>") \
        .replace("<source bridge='br-prod'/>",
                 "<source bridge='br-prod'/><target dev='eth0' managed='no'/>") \
        .replace("<boot dev='hd'/>", "<loader readonly='yes' type='pflash'>"
                 "/var/lib/cutpoint/boot/OVMF_CODE.fd</loader><nvram template="
                 f"'/var/lib/cutpoint/boot/OVMF_VARS.fd'>{BAD}</nvram><boot dev='hd'/>") \
        .replace("<seclabel type='dynamic' model='dac' relabel='yes'/>",
                 "<seclabel type='static' model='dac' relabel='yes'><label>+0:+0</label>"
                 "</seclabel><resource><partition>/machine</partition></resource>")
    out = rewrite(xml, TARGET)
    root = ET.fromstring(out)
    assert [c.get("file") for c in root.iter("config")] == ["/etc/ceph/cutpoint-dr.conf"] * 2
    assert root.find("devices/interface/target") is None
    assert root.find("seclabel") is None and "+0:+0" not in out
    assert root.find("resource") is None
    nv = root.find("os/nvram")
    assert nv is not None and not (nv.text or "").strip()
    assert BAD not in out
    for p in _paths(out):
        assert under(p, ("/var/lib/cutpoint/boot", "/var/log/cutpoint/console",
                         "/etc/ceph/cutpoint-dr.conf", "/usr/bin/qemu-system-x86_64")), p
    # no ceph_conf at the site: <config> dropped (the host's default conf)
    bare = DrTarget(**{**TARGET.__dict__, "policy": SitePolicy(boot_paths=POLICY.boot_paths)})
    assert list(ET.fromstring(rewrite(xml, bare)).iter("config")) == []


def test_direct_kernel_boot_only_from_the_sites_boot_paths() -> None:
    xml = os_("<kernel>/var/lib/cutpoint/boot/vmlinuz</kernel>"
              "<initrd>/var/lib/cutpoint/boot/initrd.img</initrd>"
              "<cmdline>console=ttyS0 root=/dev/vda</cmdline>")
    root = ET.fromstring(rewrite(xml, TARGET))
    assert root.findtext("os/kernel") == "/var/lib/cutpoint/boot/vmlinuz"
    assert root.findtext("os/cmdline") == "console=ttyS0 root=/dev/vda"
    # a site that allows no boot files refuses the same definition
    with pytest.raises(RewriteError, match="<kernel> names host path"):
        rewrite(xml, DrTarget(**{**TARGET.__dict__, "policy": SitePolicy()}))
    # a prefix is a directory, not a string prefix
    with pytest.raises(RewriteError, match="<kernel> names host path"):
        rewrite(xml.replace("/var/lib/cutpoint/boot/vmlinuz", "/var/lib/cutpoint/boot-x"),
                TARGET)


def test_capture_status_without_a_site() -> None:
    """Capture judges what does not depend on the DR site (the boot files
    are judged per site), and lists every reason."""
    assert refusals_of(XML) == []
    kern = os_("<kernel>/srv/boot/vmlinuz</kernel>")
    assert refusals_of(kern) == []
    assert refusals_of(kern, POLICY) == [
        "<kernel> names host path '/srv/boot/vmlinuz', which the DR site does not allow"]
    two = dev("<hostdev mode='subsystem' type='pci'/><filesystem type='mount'/>")
    assert [r.split(" ")[0] for r in refusals_of(two)] == ["<hostdev>", "<filesystem>"]
    assert refusals_of("<domain") == ["not XML: unclosed token: line 1, column 0"]


def test_a_domain_name_cannot_leave_the_console_dir() -> None:
    with pytest.raises(RewriteError, match="domain name"):
        rewrite(XML, DrTarget(**{**TARGET.__dict__, "name": "../../etc/cron.d/x"}))


def test_recorded_lab_shape_passes() -> None:
    """The lab's own domain (direct kernel boot, console log, ceph conf) is
    signed for a site that allows its files."""
    lab = (os_("<kernel>/var/lib/cutpoint/boot/vmlinuz</kernel>"
               "<initrd>/var/lib/cutpoint/boot/initrd.img</initrd><cmdline>quiet</cmdline>")
           .replace("<host name='10.77.0.11' port='6789'/>",
                    "<host name='10.77.0.11' port='6789'/><config file='/srv/lab/ceph.conf'/>")
           .replace("<channel type='unix'>", "<serial type='pty'><log file='/srv/lab/vm1/"
                    "console.log' append='off'/><target port='0'/></serial><channel type='unix'>"))
    out = rewrite(lab, TARGET)
    assert "/srv/lab" not in out


# The rewritten shapes the DR agent's own policy is tested on (agent/tests/
# test_defpolicy.c reads them): the recorded domain, and the lab's direct
# kernel boot shape, as this rewrite signs them.  CUTPOINT_REWRITE_SHAPES=1
# writes them again.
LAB_BOOT = (os_("<kernel>/var/lib/cutpoint/boot/vmlinuz</kernel>"
                "<initrd>/var/lib/cutpoint/boot/initrd.img</initrd>"
                "<cmdline>console=ttyS0 quiet cp.workload=writer</cmdline>")
            .replace("<boot dev='hd'/>", "")
            .replace("<host name='10.77.0.11' port='6789'/>",
                     "<host name='10.77.0.11' port='6789'/><config file='/srv/lab/ceph.conf'/>")
            .replace("<channel type='unix'>", "<serial type='pty'><log file='/srv/lab/vm1/"
                     "console.log' append='off'/><target port='0'/></serial><channel type='unix'>"))
SHAPES = {"lab-rbd-dr.xml": XML, "lab-boot-dr.xml": LAB_BOOT}


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_rewritten_shapes_for_the_agent_tests_are_current(name: str) -> None:
    import os

    path = Path(__file__).parent / "data" / "domains" / name
    out = rewrite(SHAPES[name], TARGET)
    if os.environ.get("CUTPOINT_REWRITE_SHAPES"):
        path.write_text(out)
    assert path.read_text() == out, f"{path}: run with CUTPOINT_REWRITE_SHAPES=1"
