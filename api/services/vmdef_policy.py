"""The shape a captured definition must have to be signed for DR.

A definition comes from the primary host's agent, and the DR agent defines
what the control plane signs, as root (vmdef_sign.py).  A primary host that
lies (a compromised hypervisor reports the definition) must not get the DR
hosts with it: the signature proves who signed, not that the XML is safe.
So a definition is signed only in this allow-list shape, and the DR agent
checks the same shape again before it defines it (agent/defpolicy.c).

Allowed, element by element (anything else is refused, named):

    <domain>    name uuid genid title description metadata memory ...
                (ROOT); <seclabel> and <resource> are dropped (the DR
                host labels and places the VM by its own policy)
    <os>        type boot bootmenu smbios bios firmware cmdline, and the
                host files kernel initrd dtb loader, and nvram's template,
                only under the DR site's `boot_paths`; <nvram>'s own file
                is dropped (libvirt makes the VM's own)
    <devices>   disk: RBD network disks only (a CD-ROM or floppy without a
                  source); its <config file=> becomes the DR site's
                  `ceph_conf` (or is dropped)
                interface: bridge or network, mapped by the network map,
                  no script, no host backend, no <target> (libvirt names
                  the tap; `managed='no'` would hand over a host device)
                serial console parallel channel: pty unix null vc
                  spicevmc spiceport qemu-vdagent, with no host source (a
                  unix channel's socket path is libvirt's); a <log file=>
                  becomes a file of the VM in the DR site's `console_dir`
                  (or is dropped)
                controller input graphics video sound audio memballoon
                  watchdog panic iommu vsock hub memory emulator (a QEMU
                  binary of a system directory); rng with a random
                  backend on /dev/urandom, /dev/random or /dev/hwrng;
                  tpm with the emulator backend
    refused     hostdev filesystem shmem redirdev smartcard lease crypto
                pstore, a disk of a host file or block device, a LUN,
                the qemu: namespace (command-line passthrough), any other
                namespace outside <metadata>, <bootloader>, and any
                absolute path the rules above do not allow (`blkiotune`
                device paths, a `<rom file=>`, an fw_cfg file, a
                `<graphics socket=>` ...)

`refusals(xml, policy)` lists every refusal (the capture's status:
vm_definitions.py); the rewrite (vmdef_rewrite.py) stops at the first and
checks its own output once more with `check_paths`.
"""

from __future__ import annotations

import posixpath
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any


class RewriteError(ValueError):
    """The definition cannot be started at DR as asked (a message saying why)."""


@dataclass(frozen=True)
class SitePolicy:
    """What a DR site allows of a definition's host files."""
    # absolute directories (or files) on the DR hosts that <kernel>,
    # <initrd>, <dtb>, <loader> and <nvram template=> may name
    boot_paths: tuple[str, ...] = ()
    # the DR hosts' directory of console logs: a VM's <log file=> becomes
    # <console_dir>/<domain name>.<device><n>.log; None drops the logs
    console_dir: str | None = None
    # the Ceph client conf of the DR hosts' QEMUs; None drops <config>
    ceph_conf: str | None = None


def site_policy(conf: Any) -> SitePolicy:
    """The policy of a site's `definition_targets` entry (config.DefinitionTarget)."""
    return SitePolicy(boot_paths=tuple(getattr(conf, "boot_paths", None) or ()),
                      console_dir=getattr(conf, "console_dir", None),
                      ceph_conf=getattr(conf, "ceph_conf", None))


QEMU_NS = "{http://libvirt.org/schemas/domain/qemu/1.0}"
ROOT = frozenset({
    "name", "uuid", "genid", "title", "description", "metadata", "maxMemory", "memory",
    "currentMemory", "blkiotune", "memtune", "memoryBacking", "vcpu", "vcpus", "iothreads",
    "iothreadids", "cputune", "numatune", "resource", "sysinfo", "os", "features", "cpu",
    "clock", "on_poweroff", "on_reboot", "on_crash", "on_lockfailure", "pm", "perf",
    "devices", "seclabel"})
OS = frozenset({"type", "kernel", "initrd", "dtb", "cmdline", "loader", "nvram", "boot",
                "bootmenu", "smbios", "bios", "firmware"})
BOOT_FILES = ("kernel", "initrd", "dtb", "loader")
DEVICES = frozenset({
    "emulator", "disk", "controller", "interface", "serial", "console", "parallel",
    "channel", "input", "graphics", "video", "sound", "audio", "memballoon", "rng",
    "watchdog", "panic", "iommu", "vsock", "hub", "memory", "tpm"})
DISK = frozenset({"driver", "auth", "source", "target", "address", "boot", "readonly",
                  "shareable", "serial", "wwn", "vendor", "product", "iotune", "blockio",
                  "geometry", "alias", "transient", "backingStore"})
RBD_SOURCE = frozenset({"host", "config", "auth", "snapshot", "seclabel"})
INTERFACE = frozenset({"mac", "source", "model", "address", "driver", "mtu", "bandwidth",
                       "link", "boot", "rom", "alias", "coalesce", "tune", "filterref",
                       "virtualport", "vlan", "acpi", "target"})
CHARDEVS = frozenset({"serial", "console", "parallel", "channel"})
CHAR_TYPES = frozenset({"pty", "unix", "null", "vc", "spicevmc", "spiceport",
                        "qemu-vdagent"})
CHAR = frozenset({"source", "target", "address", "log", "alias"})
RNG_FILES = frozenset({"/dev/urandom", "/dev/random", "/dev/hwrng"})
EMULATOR_DIRS = frozenset({"/usr/bin", "/usr/libexec", "/usr/local/bin", "/usr/sbin"})
EMULATORS = re.compile(r"^(qemu-system-[A-Za-z0-9_]+|qemu-kvm|kvm)$")
# Attributes and element texts that libvirt reads as host paths: each must
# be one the site allows (an attribute named so, anywhere; an element text
# starting with "/" is checked the same way, wherever it is).
PATH_ATTRS = frozenset({"file", "path", "dir", "socket", "template", "evdev", "tap",
                        "vhost", "rendernode"})
FREE_TEXT = frozenset({"cmdline", "title", "description"})


def normal_abs(path: str) -> bool:
    """An absolute path with no "..", ".", empty or trailing component."""
    return path.startswith("/") and not path.startswith("//") and \
        posixpath.normpath(path) == path and "\0" not in path


def under(path: str, prefixes: tuple[str, ...] | list[str]) -> bool:
    """Whether `path` (absolute, normal) is one of `prefixes` or below one."""
    if not normal_abs(path):
        return False
    return any(path == p.rstrip("/") or path.startswith(p.rstrip("/") + "/")
               for p in prefixes if normal_abs(p.rstrip("/") or "/"))


def _name(el: ET.Element) -> str:
    return el.tag if isinstance(el.tag, str) else "?"


def _where(dev: ET.Element) -> str:
    tgt = dev.find("target")
    what = (tgt.get("dev") or tgt.get("name") or tgt.get("port")) if tgt is not None else None
    return f"<{_name(dev)}>" + (f" {what}" if what else "")


def _tgt(d: ET.Element) -> str:
    tgt = d.find("target")
    return (tgt.get("dev") or "?") if tgt is not None else "?"


def _disk(d: ET.Element) -> Iterator[str]:
    device = d.get("device", "disk")
    if device in ("cdrom", "floppy"):
        if d.find("source") is not None:
            yield f"{device} {_tgt(d)} has a source on the host"
        return
    if device != "disk":
        yield f"<disk device={device!r}> {_tgt(d)}: a host device passed through"
        return
    src = d.find("source")
    if d.get("type") != "network" or src is None or src.get("protocol") != "rbd":
        yield (f"disk {_tgt(d)} is not an RBD image (type {d.get('type')!r}): it has no "
               "copy at DR")
        return
    for c in d:
        if c.tag not in DISK:
            yield f"disk {_tgt(d)}: <{_name(c)}> is not allowed"
        elif c.tag == "backingStore" and len(c):
            yield f"disk {_tgt(d)}: a <backingStore> with content"
    for c in src:
        if c.tag not in RBD_SOURCE:
            yield f"disk {_tgt(d)}: <source><{_name(c)}> is not allowed"


def _interface(i: ET.Element) -> Iterator[str]:
    if i.get("type") not in ("bridge", "network"):
        yield f"<interface type={i.get('type')!r}>: only bridge and network interfaces are signed"
        return
    for c in i:
        if c.tag in ("script", "downscript"):
            yield f"an interface runs a host script (<{c.tag}>)"
        elif c.tag not in INTERFACE:
            yield f"interface: <{_name(c)}> is not allowed"


def _chardev(c: ET.Element) -> Iterator[str]:
    if c.get("type", "pty") not in CHAR_TYPES:
        yield f"<{c.tag} type={c.get('type')!r}> reaches a host file or device"
    for x in c:
        if x.tag not in CHAR:
            yield f"{_where(c)}: <{_name(x)}> is not allowed"


def _device(dev: ET.Element) -> Iterator[str]:
    tag = dev.tag
    if tag not in DEVICES:
        yield f"<{_name(dev)}> is not allowed (host access or not in the allow-list)"
    elif tag == "disk":
        yield from _disk(dev)
    elif tag == "interface":
        yield from _interface(dev)
    elif tag in CHARDEVS:
        yield from _chardev(dev)
    elif tag == "emulator":
        path = (dev.text or "").strip()
        if not normal_abs(path) or posixpath.dirname(path) not in EMULATOR_DIRS or \
                not EMULATORS.match(posixpath.basename(path)):
            yield f"emulator {path!r} is not a QEMU of a system directory"
    elif tag == "rng":
        for b in dev.findall("backend"):
            if b.get("model") == "random" and (b.text or "/dev/urandom").strip() in RNG_FILES:
                continue
            if b.get("model") == "builtin":
                continue
            yield f"<rng> backend {b.get('model')!r} {(b.text or '').strip()!r} is not allowed"
    elif tag == "tpm":
        for b in dev.findall("backend"):
            if b.get("type") != "emulator":
                yield f"<tpm> backend {b.get('type')!r}: only the emulator is allowed"
    elif tag == "input" and dev.get("type") not in ("mouse", "keyboard", "tablet"):
        yield f"<input type={dev.get('type')!r}>: a host input device"


# Where the rewrite replaces or drops what the primary wrote: these paths
# are not judged as given (the rewrite's output is: check_paths).
def _rewritten(path: tuple[str, ...], attr: str | None) -> bool:
    if len(path) >= 2 and path[1] in ("seclabel", "resource"):
        return True
    if len(path) >= 3 and path[-1] == "log" and path[-2] in CHARDEVS and attr == "file":
        return True
    if len(path) >= 3 and path[-1] == "source" and path[-2] in CHARDEVS:
        return True
    if path[-2:] == ("source", "config") and attr == "file":
        return True
    return path[-2:] == ("os", "nvram") and attr is None or \
        (len(path) >= 2 and path[-2] == "nvram")


def _paths(el: ET.Element, path: tuple[str, ...], policy: SitePolicy | None,
           final: bool) -> Iterator[str]:
    """Every host path under `el` the site does not allow (policy None: the
    boot files are not judged; final: nothing is exempted as rewritten)."""
    tag = _name(el)
    if tag == "metadata":
        return  # opaque to libvirt: it acts on nothing in it
    allowed = _allowed(policy)
    boot = tag in BOOT_FILES or (tag == "nvram")
    if tag == "emulator" or tag == "backend" and path[-2:-1] == ("rng",):
        pass  # judged by _device
    elif tag not in FREE_TEXT and (el.text or "").strip().startswith("/") and \
            (final or not _rewritten(path, None)):
        value = (el.text or "").strip()
        if boot and policy is None:
            pass
        elif not under(value, allowed):
            yield f"<{tag}> names host path {value!r}, which the DR site does not allow"
    elif tag in BOOT_FILES and (el.text or "").strip() and policy is not None:
        yield f"<{tag}> {(el.text or '').strip()!r} is not an absolute host path"
    for k, v in el.attrib.items():
        if k in PATH_ATTRS or v.startswith("/"):
            if not final and _rewritten(path, k):
                continue
            if boot and policy is None:
                continue
            if not under(v, allowed):
                yield f"<{tag} {k}={v!r}>: a host path the DR site does not allow"
    for c in el:
        yield from _paths(c, path + (_name(c),), policy, final)


def _allowed(policy: SitePolicy | None) -> tuple[str, ...]:
    if policy is None:
        return ()
    extra = [p for p in (policy.console_dir, policy.ceph_conf) if p]
    return tuple(policy.boot_paths) + tuple(extra)


def _mixed(el: ET.Element) -> Iterator[str]:
    """libvirt reads an element's text with XPath string(), which joins
    every descendant's: text beside child elements (an ET tail) would be
    read with them, so it is refused rather than judged in pieces."""
    if el.tag == "metadata":
        return
    if len(el) and ((el.text or "").strip() or any((c.tail or "").strip() for c in el)):
        yield f"<{_name(el)}> with text beside its child elements"
    if len(el) and el.tag in BOOT_FILES:
        yield f"<{_name(el)}> with child elements"
    for c in el:
        yield from _mixed(c)


def _shape(root: ET.Element) -> Iterator[str]:
    yield from _mixed(root)
    for el in root.iter():
        if isinstance(el.tag, str) and el.tag.startswith(QEMU_NS):
            yield f"<qemu:{el.tag[len(QEMU_NS):]}>: QEMU arguments passed through (qemu: namespace)"
            return
    for el in root:
        if el.tag not in ROOT:
            yield f"<domain> child <{_name(el)}> is not allowed"
        elif el.tag == "metadata":
            continue
        for x in el.iter():
            if isinstance(x.tag, str) and x.tag.startswith("{") and el.tag != "metadata":
                yield f"<{x.tag}>: an element of another namespace"
    os_ = root.find("os")
    for el in (os_ if os_ is not None else []):
        if el.tag not in OS:
            yield f"<os> child <{_name(el)}> is not allowed"
    devices = root.find("devices")
    for dev in (devices if devices is not None else []):
        yield from _device(dev)


def refusals(root: ET.Element, policy: SitePolicy | None = None) -> list[str]:
    """Why `root` (a domain) cannot be signed: every reason, none when it
    can.  `policy` None judges what does not depend on the DR site."""
    out = list(_shape(root))
    if policy is not None and root.find("os/cmdline") is not None and \
            root.find("os/kernel") is None:
        out.append("<cmdline> without <kernel>")
    out += _paths(root, ("domain",), policy, final=False)
    return list(dict.fromkeys(out))


def check_paths(root: ET.Element, policy: SitePolicy) -> None:
    """The rewrite's output once more: every host path is one the site allows."""
    for why in _paths(root, ("domain",), policy, final=True):
        raise RewriteError(why)


def refusals_of(xml: str, policy: SitePolicy | None = None) -> list[str]:
    """`refusals` of a domain XML's text (not XML: that reason)."""
    if "<!DOCTYPE" in xml or "<!ENTITY" in xml:
        return ["a DOCTYPE in a domain XML"]
    try:
        root = ET.fromstring(xml)
    except ET.ParseError as exc:
        return [f"not XML: {exc}"]
    if root.tag != "domain":
        return ["not a libvirt domain XML"]
    return refusals(root, policy)
