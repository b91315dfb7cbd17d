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

    <serial|console|...><log file=..>
                    -> <console_dir>/<name>.<device><n>.log (the DR
                       site's `console_dir`; none: dropped)
    <disk><source><config file=..>
                    -> the DR site's `ceph_conf` (none: dropped)
    <os><nvram>     -> its file dropped (libvirt makes the VM's own)
    <interface><target>
                    -> dropped (libvirt names the tap), but for a drill's
                       `taps`

The output is what the DR agent is sent, signed (vmdef_sign.py).  The
signature makes the DR agent define whatever the XML says, as root, and
the XML came from the primary host's agent: so only a definition of the
allow-list shape of vmdef_policy.py is rewritten (a primary host that
lies does not get the DR hosts with it), anything else is refused with
RewriteError naming the element, and the output is checked once more:
every host path in it is one the DR site allows (`SitePolicy`: its
boot files, console directory and Ceph conf).
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field

from cutpoint.api.services.vmdef_policy import (
    CHARDEVS,
    RewriteError,
    SitePolicy,
    check_paths,
    refusals,
)

__all__ = ["DrTarget", "RewriteError", "SitePolicy", "rbd_images", "rewrite"]

CUTPOINT_NS = "https://cutpoint.dev/xmlns/agent/1"
ET.register_namespace("cutpoint", CUTPOINT_NS)


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
    # the DR site's host files a definition may name (vmdef_policy.py:
    # boot_paths, console_dir, ceph_conf; site_policy of its
    # definition_targets entry)
    policy: SitePolicy = field(default_factory=SitePolicy)


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
    for sl in src.findall("seclabel") + src.findall("auth"):
        src.remove(sl)
    for conf in src.findall("config"):
        src.remove(conf)
    if t.policy.ceph_conf:
        ET.SubElement(src, "config", {"file": t.policy.ceph_conf})
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
            for tgt in itf.findall("target"):
                itf.remove(tgt)  # libvirt names the tap (managed='no': a host's)
            old = src.get(kind, "")
            if old not in t.networks:
                raise RewriteError(f"interface on {kind} {old!r}: no DR {kind} mapped "
                                   f"(networks)")
            src.set(kind, t.networks[old])
        if new_macs:
            for mac in itf.findall("mac"):
                itf.remove(mac)


NAME = re.compile(r"^[^/\x00-\x1f]{1,200}$")


def _chardevs(root: ET.Element, devices: ET.Element, t: DrTarget) -> None:
    """Host sources dropped (a unix socket's path is libvirt's), console
    logs into the DR site's console directory, one file per device."""
    name = root.findtext("name") or ""
    count: dict[str, int] = {}
    for dev in devices:
        if dev.tag not in CHARDEVS:
            continue
        n = count.get(dev.tag, 0)
        count[dev.tag] = n + 1
        for src in dev.findall("source"):
            dev.remove(src)
        for log in dev.findall("log"):
            if t.policy.console_dir:
                log.attrib.clear()
                log.set("file", f"{t.policy.console_dir.rstrip('/')}/{name}.{dev.tag}{n}.log")
                log.set("append", "off")
            else:
                dev.remove(log)


def _os(root: ET.Element) -> None:
    os_ = root.find("os")
    if os_ is None:
        return
    for nv in os_.findall("nvram"):
        nv.text = None  # libvirt makes the VM's own nvram file
        for c in list(nv):
            nv.remove(c)


def rewrite(xml: str, t: DrTarget) -> str:
    """`xml` (a libvirt domain XML) rewritten for the DR site `t`."""
    if "<!DOCTYPE" in xml or "<!ENTITY" in xml:
        # entities would make libvirt read another document than this one
        raise RewriteError("a DOCTYPE in a domain XML: not signed")
    try:
        root = ET.fromstring(xml)
    except ET.ParseError as exc:
        raise RewriteError(f"not XML: {exc}") from None
    if root.tag != "domain" or root.find("name") is None:
        raise RewriteError("not a libvirt domain XML (<domain> with <name>)")
    if not t.mon_hosts:
        raise RewriteError("no DR monitor hosts")
    why = refusals(root, t.policy)
    if why:
        raise RewriteError(f"not signed: {why[0]}" +
                           (f" (and {len(why) - 1} more)" if len(why) > 1 else ""))
    if t.name is not None:
        _one(root, "name").text = t.name
    if t.uuid == "":
        for u in root.findall("uuid"):
            root.remove(u)
    elif t.uuid is not None:
        _one(root, "uuid").text = t.uuid
    if not NAME.match(root.findtext("name") or ""):
        raise RewriteError(f"domain name {root.findtext('name')!r}: empty, too long, or "
                           "with a '/' or a control character")
    for sl in root.findall("seclabel") + root.findall("resource"):
        root.remove(sl)
    _os(root)
    devices = root.find("devices")
    if devices is not None:
        _disks(devices, t)
        _interfaces(devices, t, t.new_macs or t.name is not None)
        _chardevs(root, devices, t)
    check_paths(root, t.policy)
    return ET.tostring(root, encoding="unicode") + "\n"


def rbd_images(xml: str) -> list[str]:
    """The "pool/image" of each RBD disk of `xml`, in order."""
    root = ET.fromstring(xml)
    return [src.get("name", "") for src in root.findall("devices/disk/source")
            if src.get("protocol") == "rbd"]
