"""The writer workload's checker as the test bed uses it (docs/writer.md).

The record format and the proof over a set of disks are the product's
(cutpoint.coordinator.dr.writer_records, also the built-in drill check
`writer`); they are re-exported here.  This module adds what needs the lab:
naming images by lab site (`primary:rbd/img@snap`), reading them with the
`rbd` CLI as the lab's own tools do (`RbdSpec`: an independent reader, not
the product's librbd path), and mapping a group snapshot's member disks to
the lab's images (`cutpoint-lab check writer`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cutpoint.coordinator.dr.writer_records import (
    MAGIC,
    RECORD_SIZE,
    Anomaly,
    CephImageSpec,
    CheckerError,
    FileSpec,
    Qcow2Spec,
    Record,
    Scan,
    Spec,
    Verdict,
    check_files,
    check_streams,
    classify,
    encode_record,
    iter_records,
    scan_process,
    scan_specs,
)

__all__ = ["MAGIC", "RECORD_SIZE", "Anomaly", "CephImageSpec", "CheckerError", "FileSpec",
           "Qcow2Spec", "RbdSpec", "Record", "Scan", "Spec", "Verdict", "check_files",
           "check_streams", "classify", "encode_record", "iter_records", "parse_image",
           "scan_specs", "specs_for_group_snapshot"]


@dataclass(frozen=True)
class RbdSpec:
    """An RBD image or snapshot read with `rbd export`, and how to reach its cluster."""

    pool: str
    image: str
    snap: str | None
    conf: str
    client_id: str = "admin"
    keyring: str | None = None

    @property
    def name(self) -> str:
        return f"{self.pool}/{self.image}" + (f"@{self.snap}" if self.snap else "")

    def export_argv(self) -> list[str]:
        argv = ["rbd", "-c", self.conf, "--id", self.client_id]
        if self.keyring:
            argv += ["--keyring", self.keyring]
        return [*argv, "export", "--no-progress", self.name, "-"]

    def scan_into(self, scan: Scan) -> None:
        scan_process(scan, self.name, self.export_argv())


def parse_image(text: str, *, conf: str | None = None, client_id: str = "admin",
                keyring: str | None = None,
                sites: dict[str, dict[str, Any]] | None = None) -> Spec:
    """Parse one --images value.

    Forms: ``qcow2:PATH[@SNAP]``, ``PATH.qcow2[@SNAP]``,
    ``SITE:POOL/IMAGE[@SNAP]`` (SITE a lab site: primary, dr),
    ``CONF:POOL/IMAGE[@SNAP]`` (CONF a ceph.conf path) and
    ``POOL/IMAGE[@SNAP]`` (with conf given, or the lab's primary site).
    """
    if not text:
        raise ValueError("empty image name")
    if text.startswith("qcow2:") or ".qcow2" in text:
        body = text.removeprefix("qcow2:")
        path, _, snap = body.partition("@") if "@" in body else (body, "", "")
        if not path:
            raise ValueError(f"{text!r}: no qcow2 path")
        return Qcow2Spec(path, snap or None)
    prefix, sep, rest = text.rpartition(":")
    if not sep:
        prefix, rest = "", text
    name, _, snap = rest.partition("@")
    pool, slash, image = name.partition("/")
    if not slash or not pool or not image or "/" in image:
        raise ValueError(f"{text!r}: expected [SITE:]POOL/IMAGE[@SNAP]")
    if "@" in rest and not snap:
        raise ValueError(f"{text!r}: empty snapshot name after '@'")
    if prefix and ("/" in prefix or prefix.endswith(".conf")):
        return RbdSpec(pool, image, snap or None, prefix, client_id, keyring)
    if not prefix and conf:
        return RbdSpec(pool, image, snap or None, conf, client_id, keyring)
    site_name = prefix or "primary"
    if sites is None:
        sites = _lab_sites()
    site = sites.get(site_name)
    if site is None:
        raise ValueError(f"{text!r}: unknown site {site_name!r} "
                         f"(known: {', '.join(sorted(sites)) or 'none'}); "
                         "give --conf or a CONF:POOL/IMAGE form")
    return RbdSpec(pool, image, snap or None, site["ceph_conf"],
                   site.get("client_id", "admin"), site.get("keyring"))


def _lab_sites() -> dict[str, dict[str, Any]]:
    try:
        from cutpoint.lab.status import load_status
    except ImportError as e:  # the lab package is optional for the checker
        raise ValueError(f"no --conf given and the lab is not available: {e}") from e
    try:
        status = load_status()
    except Exception as e:  # surfaced to the user as is
        raise ValueError(f"no --conf given and no lab status: {e}") from e
    return dict(status.get("sites", {}))


def specs_for_group_snapshot(txn: str, db_url: str,
                             status: dict[str, Any]) -> list[Spec]:
    """The member snapshots of committed group snapshot `txn`, found in the
    coordinator's transaction log, mapped to images through the lab status
    (disk id "<vm>/<node>" -> RBD image or qcow2 file)."""
    from cutpoint.coordinator import TxLog
    txlog = TxLog(db_url, create=False)
    try:
        rec = txlog.get(txn)
    finally:
        txlog.dispose()
    if rec is None:
        raise ValueError(f"no group snapshot {txn!r} in {db_url}")
    if rec.state != "committed":
        raise ValueError(f"group snapshot {txn!r} is {rec.state}, not committed: "
                         "it is not a recovery point")
    disks = {f"{vm['name']}/{d['node']}": (vm, d)
             for vm in status.get("vms", []) for d in vm.get("disks", [])}
    sites = status.get("sites", {})
    specs: list[Spec] = []
    for m in rec.snapshots:
        if m.get("state") != "created":
            raise ValueError(f"member {m.get('disk')} of {txn} is "
                             f"{m.get('state')}, not created")
        found = disks.get(m["disk"])
        if found is None:
            raise ValueError(f"member disk {m['disk']!r} of {txn} is not a disk "
                             "of the lab")
        vm, d = found
        if d.get("backend") == "qcow2":
            specs.append(Qcow2Spec(d["file"], m["name"]))
        else:
            site = sites[vm.get("site", "primary")]
            specs.append(RbdSpec(d["pool"], d["image"], m["name"],
                                 site["ceph_conf"], site.get("client_id", "admin"),
                                 site.get("keyring")))
    if not specs:
        raise ValueError(f"group snapshot {txn!r} has no member snapshots")
    return specs
