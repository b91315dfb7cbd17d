"""A captured libvirt domain XML, rewritten for the DR site.

The control plane stores each protected VM's persistent definition as its
agent gives it (`vm.definition`, agent-protocol 4.11: libvirt's inactive
XML).  That XML names the primary site: its RBD images and monitors, the
cephx user and the libvirt secret that holds its key, the host's bridges
and libvirt networks, the domain's name and UUID, a security label of the
host.  Failover and drills start the VM at DR from a copy rewritten here
(pure: XML in, XML out, no I/O):

    <disk type='network'><source protocol='rbd' name='POOL/IMAGE'>
        name        -> the DR image (`by_target`: the disk's target dev to
                       the DR "pool/image", as failover knows its members;
                       `images`: primary "pool/image" to the DR one -- a
                       drill's clone names; neither: the same image name
                       in `pool`)
        <host/>     -> the DR site's monitors (`mon_hosts`)
        <auth username=..><secret type='ceph' uuid=..>
                    -> the DR cephx user and libvirt secret UUID
    <interface type='bridge'><source bridge=..>
    <interface type='network'><source network=..>
                    -> `networks` (a name missing from the map is an
                       error: a VM is never attached to a guessed network);
                       a drill's copy (`isolate`): every one becomes
                       <interface type='bridge'><source bridge=ISOLATE>,
                       the DR hosts' drill bridge, with no route to
                       production
    <name>, <uuid>  -> `name` / `uuid` when given (a drill runs beside
                       production: a name and UUID of its own, and no MAC
                       addresses, which libvirt then generates); `uuid=""`
                       drops <uuid> (libvirt makes one)
    <seclabel>      -> removed (the DR host labels it by its own policy)

A disk that is not RBD (a file, a block device) cannot exist at DR:
RewriteError names it, as it does an unmapped network.  The output is
what the DR agent is sent, signed (vmdef_sign.py).

The signature makes the DR agent define whatever the XML says, as root,
and the XML came from the primary host's agent.  So what would reach into
the DR host beyond the VM's own disks and networks is refused rather
than signed (a primary host that lies does not get the DR hosts with
it): QEMU command-line passthrough (the qemu: namespace), host devices,
host directories, shared memory, USB redirection, smartcards; a CD-ROM
or floppy with a source; character devices on host files, pipes or
devices; interfaces other than bridge and network, or with scripts; an
emulator that is not a QEMU.  A unix channel's host path is dropped
(libvirt makes its own).
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass, field

CUTPOINT_NS = "https://cutpoint.dev/xmlns/agent/1"
ET.register_namespace("cutpoint", CUTPOINT_NS)


class RewriteError(ValueError):
    """The definition cannot be started at DR as asked (a message saying why)."""


@dataclass(frozen=True)
class DrTarget:
    """Where and how the VM runs at DR."""
    pool: str                                    # DR pool of images not in `images`
    mon_hosts: tuple[tuple[str, int], ...]       # DR monitors (address, port)
    auth_user: str                               # DR cephx user (without "client.")
    secret_uuid: str                             # DR libvirt secret of that user's key
    networks: dict[str, str] = field(default_factory=dict)  # bridge/network -> DR's
    images: dict[str, str] = field(default_factory=dict)    # "pool/img" -> DR "pool/img"
    by_target: dict[str, str] = field(default_factory=dict)  # target dev -> DR "pool/img"
    name: str | None = None                      # a new domain name (drills)
    uuid: str | None = None                      # a new UUID; "" drops <uuid>
    new_macs: bool = False                       # drop <mac> (drills; implied by name)
    # a drill: every bridge or network interface on this one bridge instead
    # (the isolated drill network; `networks` is then not used)
    isolate: str | None = None
    # a drill: its interfaces' tap devices are named <taps><n> (n: the
    # interface's index), not left to libvirt's vnetN: a drill's taps are
    # then its own by name, and two libvirtds of one network namespace
    # never pick the same vnetN at once
    taps: str | None = None


def _one(parent: ET.Element, tag: str) -> ET.Element:
    el = parent.find(tag)
    if el is None:
        el = ET.SubElement(parent, tag)
    return el


def _rbd_disk(disk: ET.Element, t: DrTarget) -> None:
    src = disk.find("source")
    assert src is not None
    old = src.get("name", "")
    if "/" not in old:
        raise RewriteError(f"disk {_target(disk)}: rbd source {old!r} names no pool")
    src.set("name", t.by_target.get(_target(disk)) or t.images.get(old)
            or f"{t.pool}/{old.split('/', 1)[1]}")
    for h in src.findall("host"):
        src.remove(h)
    for addr, port in t.mon_hosts:
        ET.SubElement(src, "host", {"name": addr, "port": str(port)})
    for sl in src.findall("seclabel"):
        src.remove(sl)
    auth = disk.find("auth")
    if auth is None:
        # libvirt reads <auth> before <source>; keep that order
        auth = ET.Element("auth")
        disk.insert(list(disk).index(src), auth)
    auth.attrib.clear()
    auth.set("username", t.auth_user)
    for s in list(auth):
        auth.remove(s)
    ET.SubElement(auth, "secret", {"type": "ceph", "uuid": t.secret_uuid})


def _target(disk: ET.Element) -> str:
    tgt = disk.find("target")
    return tgt.get("dev", "?") if tgt is not None else "?"


def _disks(devices: ET.Element, t: DrTarget) -> None:
    for disk in devices.findall("disk"):
        if disk.get("device", "disk") != "disk":
            continue  # a CD-ROM or floppy: no data of the VM's
        src = disk.find("source")
        if disk.get("type") == "network" and src is not None and \
                src.get("protocol") == "rbd":
            _rbd_disk(disk, t)
        else:
            raise RewriteError(f"disk {_target(disk)} is not an RBD image "
                               f"(type {disk.get('type')!r}): it has no copy at DR")


def _interfaces(devices: ET.Element, t: DrTarget, new_macs: bool) -> None:
    for n, itf in enumerate(devices.findall("interface")):
        kind = itf.get("type")
        src = itf.find("source")
        if kind in ("bridge", "network") and t.isolate is not None:
            itf.set("type", "bridge")
            if src is None:
                src = ET.SubElement(itf, "source")
            src.attrib.clear()
            src.set("bridge", t.isolate)
            for tgt in itf.findall("target"):
                itf.remove(tgt)
            if t.taps is not None:
                ET.SubElement(itf, "target", {"dev": f"{t.taps}{n}"})
        elif kind in ("bridge", "network") and src is not None:
            old = src.get(kind, "")
            if old not in t.networks:
                raise RewriteError(f"interface on {kind} {old!r}: no DR {kind} mapped "
                                   f"(networks)")
            src.set(kind, t.networks[old])
        if new_macs:
            for mac in itf.findall("mac"):
                itf.remove(mac)


QEMU_NS = "{http://libvirt.org/schemas/domain/qemu/1.0}"
HOST_DEVICES = ("hostdev", "filesystem", "shmem", "redirdev", "smartcard")
CHARDEVS = ("serial", "console", "parallel", "channel")
EMULATORS = ("qemu-system-", "qemu-kvm", "kvm")


def _refuse_host_access(root: ET.Element) -> None:
    for el in root.iter():
        if isinstance(el.tag, str) and el.tag.startswith(QEMU_NS):
            raise RewriteError("the definition passes QEMU arguments through (qemu: "
                               "namespace): not signed")
    devices = root.find("devices")
    if devices is None:
        return
    for dev in devices:
        if dev.tag in HOST_DEVICES:
            raise RewriteError(f"the definition has a <{dev.tag}> (host access): not signed")
        if dev.tag == "disk" and dev.get("device", "disk") != "disk" and \
                dev.find("source") is not None:
            raise RewriteError(f"{dev.get('device')} {_target(dev)} has a source on the host: "
                               "not signed")
        if dev.tag in CHARDEVS:
            if dev.get("type", "pty") not in ("pty", "unix", "spicevmc", "null", "vc"):
                raise RewriteError(f"<{dev.tag} type={dev.get('type')!r}> reaches a host "
                                   "file or device: not signed")
            for src in dev.findall("source"):
                dev.remove(src)  # unix: libvirt makes the socket's path itself
        if dev.tag == "interface":
            if dev.get("type") not in ("bridge", "network"):
                raise RewriteError(f"<interface type={dev.get('type')!r}>: only bridge and "
                                   "network interfaces are signed")
            if dev.find("script") is not None or dev.find("downscript") is not None:
                raise RewriteError("an interface runs a host script: not signed")
        if dev.tag == "emulator":
            name = (dev.text or "").strip().rsplit("/", 1)[-1]
            if not name.startswith(EMULATORS):
                raise RewriteError(f"emulator {dev.text!r} is not a QEMU: not signed")


def rewrite(xml: str, t: DrTarget) -> str:
    """`xml` (a libvirt domain XML) rewritten for the DR site `t`."""
    try:
        root = ET.fromstring(xml)
    except ET.ParseError as exc:
        raise RewriteError(f"not XML: {exc}") from None
    if root.tag != "domain" or root.find("name") is None:
        raise RewriteError("not a libvirt domain XML (<domain> with <name>)")
    if not t.mon_hosts:
        raise RewriteError("no DR monitor hosts")
    _refuse_host_access(root)
    if t.name is not None:
        _one(root, "name").text = t.name
    if t.uuid == "":
        for u in root.findall("uuid"):
            root.remove(u)
    elif t.uuid is not None:
        _one(root, "uuid").text = t.uuid
    for sl in root.findall("seclabel"):
        root.remove(sl)
    devices = root.find("devices")
    if devices is not None:
        _disks(devices, t)
        _interfaces(devices, t, t.new_macs or t.name is not None)
    return ET.tostring(root, encoding="unicode") + "\n"


def rbd_images(xml: str) -> list[str]:
    """The "pool/image" of each RBD disk of `xml`, in order."""
    root = ET.fromstring(xml)
    return [src.get("name", "") for src in root.findall("devices/disk/source")
            if src.get("protocol") == "rbd"]
