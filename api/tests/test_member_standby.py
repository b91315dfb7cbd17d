"""Adding a VM to a group when a DR host's agent lists the same VM name as
a standby (the VMs failover boots there through `vm.start`)."""

from __future__ import annotations

from typing import Any

import pytest
from cutpoint.api.errors import ApiError
from cutpoint.api.models import Host, Site
from cutpoint.api.schemas.groups import GroupCreate, MemberAdd
from cutpoint.api.schemas.policy import PolicyUpdate
from cutpoint.api.services import groups
from cutpoint.api.services import inventory as inv
from sqlalchemy.orm import Session, sessionmaker


def _dr_standby(s: Session) -> None:
    site = Site(name="dr")
    s.add(site)
    s.flush()
    host = Host(name="dr-h1", site_id=site.id, address="10.77.2.1")
    s.add(host)
    s.flush()
    inv.apply(s, host, {"vms": [
        {"name": "primary-h1-vm1", "driver": "qmp", "state": "shutoff",
         "disks": [{"id": "primary-h1-vm1/disk0", "node": "disk0", "backend": "rbd",
                    "pool": "rbd", "image": "primary-h1-vm1-disk0"}]}]})


def test_the_member_is_the_copy_outside_the_dr_site(session_factory: sessionmaker[Session],
                                                    inventory: dict[str, Any]) -> None:
    with session_factory() as s:
        _dr_standby(s)
        g = groups.create(s, GroupCreate(
            name="protected", policy=PolicyUpdate(replication_target="dr")))  # type: ignore[call-arg]
        m = groups.add_member(s, g, MemberAdd(vm="primary-h1-vm1"))
        assert m.vm is not None and m.vm.host.name == "primary-h1"
        # Without a DR target nothing tells the two apart: the caller names the host.
        plain = groups.create(s, GroupCreate(name="plain"))
        with pytest.raises(ApiError) as ei:
            groups.add_member(s, plain, MemberAdd(vm="primary-h1-vm1"))
        assert ei.value.code == "vm_ambiguous"
        m2 = groups.add_member(s, plain, MemberAdd(vm="primary-h1-vm1", host="dr-h1"))
        assert m2.vm is not None and m2.vm.host.name == "dr-h1"
