"""VM definitions captured for DR (services/vm_definitions.py, GET
/v1/vms/{id}/definitions), on a real database: a vm.definition reply (the
domain XML recorded from libvirt, data/domains/lab-rbd.xml) is stored as
version 1, the same definition again stores nothing, a changed one is
version 2; a reply whose sha256 is not its text's is refused; the watch's
selection is the VMs a group protects; the routes show the versions to a
viewer and the text of one.  (That an agent answers vm.definition is
agent/tests/test_defsig.c and the agent-lab test.)"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
from cutpoint.api.models import Host, Vm
from cutpoint.api.services import vm_definitions
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

XML = (Path(__file__).parent / "data" / "domains" / "lab-rbd.xml").read_text()


def _reply(text: str) -> dict[str, Any]:
    return {"vm": "x", "driver": "libvirt", "format": "libvirt-domain-xml",
            "definition": text, "sha256": hashlib.sha256(text.encode()).hexdigest()}


def _vm(s: Session, name: str) -> Vm:
    return s.scalars(select(Vm).where(Vm.name == name)).one()


def test_versions_only_on_change(api: Any, inventory: dict[str, Any],
                                 session_factory: sessionmaker[Session]) -> None:
    with session_factory() as s:
        vm = _vm(s, "primary-h1-vm1")
        row, new = vm_definitions.store(s, vm, _reply(XML))
        assert (row.version, new) == (1, True)
        row, new = vm_definitions.store(s, vm, _reply(XML))
        assert (row.version, new) == (1, False)
        changed = XML.replace("<memory unit='KiB'>65536</memory>",
                              "<memory unit='KiB'>131072</memory>")
        row, new = vm_definitions.store(s, vm, _reply(changed))
        assert (row.version, new) == (2, True)
        bad = _reply(XML) | {"sha256": "0" * 64}
        with pytest.raises(vm_definitions.DefinitionError, match="sha256"):
            vm_definitions.store(s, vm, bad)
        with pytest.raises(vm_definitions.DefinitionError, match="known format"):
            vm_definitions.store(s, vm, _reply(XML) | {"format": "other"})
        s.commit()
        vm_id = vm.id
    viewer = api.as_("viewer")
    r = viewer.get(f"/v1/vms/{vm_id}/definitions")
    assert r.status_code == 200, r.text
    got = r.json()
    assert [(d["version"], d["format"], d["host"]) for d in got] == \
        [(1, "libvirt-domain-xml", "primary-h1"), (2, "libvirt-domain-xml", "primary-h1")]
    assert got[0]["sha256"] == hashlib.sha256(XML.encode()).hexdigest()
    assert got[0]["size_bytes"] == len(XML.encode())
    assert "definition" not in got[0]
    r = viewer.get(f"/v1/vms/{vm_id}/definitions/1")
    assert r.status_code == 200 and r.json()["definition"] == XML
    assert viewer.get(f"/v1/vms/{vm_id}/definitions/3").json()["code"] == "definition_not_found"
    assert api.as_(None).get(f"/v1/vms/{vm_id}/definitions").status_code == 401


def test_dr_status_names_what_the_rewrite_refuses(api: Any, inventory: dict[str, Any],
                                                 session_factory: sessionmaker[Session]) -> None:
    """A captured version that the DR rewrite would refuse says so when it
    is read (vmdef_policy), before any failover needs it."""
    hostile = XML.replace("</devices>", "<hostdev mode='subsystem' type='pci'/></devices>") \
        .replace("<boot dev='hd'/>", "<kernel>/srv/k/vmlinuz</kernel><boot dev='hd'/>")
    with session_factory() as s:
        vm = _vm(s, "primary-h1-vm1")
        vm_definitions.store(s, vm, _reply(XML))
        vm_definitions.store(s, vm, _reply(hostile))
        s.commit()
        vm_id = vm.id
    got = api.as_("viewer").get(f"/v1/vms/{vm_id}/definitions").json()
    assert [(d["version"], d["dr_status"]) for d in got] == [(1, "signable"), (2, "refused")]
    assert got[0]["dr_refusals"] == []
    assert got[1]["dr_refusals"][0].startswith("<hostdev> is not allowed"), got[1]
    one = api.as_("viewer").get(f"/v1/vms/{vm_id}/definitions/2").json()
    assert one["dr_status"] == "refused" and one["dr_refusals"] == got[1]["dr_refusals"]


def test_protected_vms_are_group_members(api: Any, inventory: dict[str, Any], settings: Any,
                                         session_factory: sessionmaker[Session]) -> None:
    host = inventory["hosts"][0]
    with session_factory() as s:
        assert vm_definitions.protected(s, host) == []
    assert api.post("/v1/groups", json={"name": "app"}).status_code == 201
    assert api.post("/v1/groups/app/members", json={"vm": "primary-h1-vm1"}).status_code == 201
    assert api.post("/v1/groups/app/members",
                    json={"disk": "primary-h1-vm2/disk1"}).status_code == 201
    with session_factory() as s:
        assert [v.name for v in vm_definitions.protected(s, host)] == \
            ["primary-h1-vm1", "primary-h1-vm2"]
        # the host has no pin: its agent is not called, nothing stored
        out = vm_definitions.refresh_host(s, settings, s.get(Host, host), changed=True)
        assert out == {"new": 0, "same": 0, "failed": 2}

