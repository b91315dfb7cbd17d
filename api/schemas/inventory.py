from __future__ import annotations

import datetime as dt

from cutpoint.api.schemas.common import Public
from pydantic import Field


class DiskPublic(Public):
    id: int
    vm_id: int
    vm: str
    host: str
    node: str = Field(description="The agent's disk name: a libvirt disk's target device (vda).")
    key: str
    backend: str
    pool: str | None
    image: str | None
    file: str | None
    size_bytes: int | None = Field(
        default=None, description="As the agent saw the image when it opened it; null: not "
        "known (an image not open yet, a qcow2 file).")
    present: bool
    group: str | None = None


class LastSnapshot(Public):
    """The newest committed group snapshot with a member of this VM."""

    id: int
    txn: str
    group: str
    cut_at: dt.datetime | None
    finished_at: dt.datetime | None
    consistency: str | None
    dr_verified_at: dt.datetime | None


class VmPublic(Public):
    id: int
    name: str
    uid: str | None = Field(
        default=None, description="The VM's identity across hosts: a libvirt domain's UUID, "
        "or a raw-QEMU VM's configured id; null: the agent gives none (host + name only).")
    identity: str = Field(description="What `uid` is: `libvirt-uuid`, `configured-id`, or "
                          "`host-name` when there is no uid.")
    host: str
    site: str
    driver: str
    state: str
    present: bool = Field(description="The host's agent lists the VM now.")
    stale: bool = Field(
        default=False, description="The agent's hypervisor connection is down: `state` is "
        "the last one seen.")
    synced_at: dt.datetime
    groups: list[str] = Field(default_factory=list,
                              description="The groups its disks are in (a VM member: one).")
    last_snapshot: LastSnapshot | None = None
    disks: list[DiskPublic]
