from __future__ import annotations

import datetime as dt

from cutpoint.api.schemas.common import Public


class DiskPublic(Public):
    id: int
    vm_id: int
    vm: str
    host: str
    node: str
    key: str
    backend: str
    pool: str | None
    image: str | None
    file: str | None
    present: bool
    group: str | None = None


class VmPublic(Public):
    id: int
    name: str
    host: str
    driver: str
    state: str
    present: bool
    synced_at: dt.datetime
    disks: list[DiskPublic]
