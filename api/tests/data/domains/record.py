"""Records the domain XML that test_vmdef_rewrite.py rewrites, from a real
libvirtd: `sudo .venv/bin/python api/tests/data/domains/record.py`.

A libvirtd of its own (dr-tests/lab/libvirt.py: a private mount
namespace, so no other libvirtd is touched) defines the lab's libvirt
domain shape -- agent/tests/libvirt_agent.py `domain_xml`, with the RBD
disk of test_agent_libvirt_rbd_lab.py (cephx secret, monitor host), a
second RBD disk, a bridge and a libvirt-network interface, a guest agent
channel and a dynamic seclabel -- then writes `virsh dumpxml --inactive`
(what the agent's vm.definition returns: VIR_DOMAIN_XML_INACTIVE) to
lab-rbd.xml.  Defining needs neither Ceph nor the bridge: libvirt checks
them at start.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[3] / "agent" / "tests"))

from cutpoint.lab.libvirt import LibvirtHost
from libvirt_agent import GUEST_AGENT, domain_xml

NAME = "prod-db1"
SECRET = "5a1e1a9f-4a55-4d8c-9c6e-1f7c8b6e2a01"


def rbd_disk(image: str, dev: str) -> str:
    return (f"<disk type='network' device='disk'><driver name='qemu' type='raw'/>"
            f"<auth username='cutpoint'><secret type='ceph' uuid='{SECRET}'/></auth>"
            f"<source protocol='rbd' name='rbd/{image}'>"
            f"<host name='10.77.0.11' port='6789'/></source>"
            f"<target dev='{dev}' bus='virtio'/></disk>")


def main() -> None:
    devices = (rbd_disk(f"{NAME}-disk0", "vda") + rbd_disk(f"{NAME}-disk1", "vdb")
               + "<interface type='bridge'><source bridge='br-prod'/>"
                 "<mac address='52:54:00:12:34:56'/><model type='virtio'/></interface>"
               + "<interface type='network'><source network='prod-backend'/>"
                 "<model type='virtio'/></interface>"
               + GUEST_AGENT)
    xml = domain_xml(NAME, devices).replace(
        "</devices>", "</devices>\n  <seclabel type='dynamic' model='dac' relabel='yes'/>")
    host = LibvirtHost(Path(tempfile.mkdtemp(prefix="cp-record-domxml-")))
    host.start()
    try:
        src = host.dir / "in.xml"
        src.write_text(xml)
        host.virsh("define", str(src))
        out = host.virsh("dumpxml", "--inactive", NAME)
        assert out
        (HERE / "lab-rbd.xml").write_text(out)
        ver = host.virsh("version")
        print(ver)
    finally:
        host.stop()


if __name__ == "__main__":
    main()
