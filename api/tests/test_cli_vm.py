"""`cutpoint vm list` / `cutpoint vm show` against a real API served over
HTTP, on inventories applied as agents report them; and a VM's identity:
a uid reported by another host moves the row (and its group membership),
two hosts both running it is a conflict that leaves it where it is."""

from __future__ import annotations

import json
from typing import Any

from cutpoint.api.models import (
    GroupSnapshot,
    Host,
    MemberSnapshot,
    Site,
    SnapState,
    Vm,
    utcnow,
)
from cutpoint.api.services import inventory as inv
from cutpoint.api.services import vm_definitions
from liveapi import cli, serve  # api/tests/liveapi.py
from sqlalchemy import select

UUID = "6f1b2c7e-0d3a-4c1b-9a8e-2b7c9d0e1f23"


def _vm(name: str, uid: str | None, state: str = "running",
        driver: str = "libvirt") -> dict[str, Any]:
    return {"name": name, "uid": uid, "driver": driver, "state": state, "stale": False,
            "disks": [{"id": f"{name}/vda", "node": "vda", "backend": "rbd", "pool": "rbd",
                       "image": f"{name}-disk0", "size": 8 << 30},
                      {"id": f"{name}/vdb", "node": "vdb", "backend": "rbd", "pool": "rbd",
                       "image": f"{name}-disk1"}]}


def _setup(sf: Any) -> dict[str, int]:
    with sf() as s:
        p, d = Site(name="primary"), Site(name="dr")
        s.add_all([p, d])
        s.flush()
        hosts = {"h1": Host(name="h1", site_id=p.id, address="10.0.0.1"),
                 "h2": Host(name="h2", site_id=p.id, address="10.0.0.2"),
                 "d1": Host(name="d1", site_id=d.id, address="10.0.1.1")}
        s.add_all(hosts.values())
        s.flush()
        inv.apply(s, hosts["h1"], {"vms": [_vm("db", UUID), _vm("web", None, driver="qmp")],
                                   "stale": False})
        inv.apply(s, hosts["h2"], {"vms": [_vm("web", "web-id-2", driver="qmp")]})
        inv.apply(s, hosts["d1"], {"vms": [_vm("standby", None, "shutoff")]})
        return {k: h.id for k, h in hosts.items()}


def _commit_snapshot(sf: Any, group_id: int, vm_name: str, host: str) -> str:
    with sf() as s:
        vm = s.scalar(select(Vm).join(Host).where(Vm.name == vm_name, Host.name == host))
        now = utcnow()
        gs = GroupSnapshot(group_id=group_id, txn="t-last", state=SnapState.committed,
                           cut_at=now, finished_at=now, consistency="crash")
        s.add(gs)
        s.flush()
        for d in vm.disks:
            s.add(MemberSnapshot(group_snapshot_id=gs.id, disk_id=d.id, host=host, vm=vm.name,
                                 disk=d.key, name="cp.app.t-last", state="present"))
        s.commit()
        return gs.txn


def _json(*args: str) -> Any:
    rc, out = cli(*args)
    assert rc == 0, out
    return json.loads(out)


def test_vm_list_and_show(api: Any, settings: Any, session_factory: Any,
                          tokens_by_role: dict[str, str]) -> None:
    _setup(session_factory)
    g = api.post("/v1/groups", json={"name": "app"}).json()
    assert api.post("/v1/groups/app/members", json={"vm": "db"}).status_code == 201
    txn = _commit_snapshot(session_factory, g["id"], "db", "h1")
    xml = f"<domain type='qemu'><name>db</name><uuid>{UUID}</uuid></domain>"
    with session_factory() as s:  # as the watch stores a vm.definition reply
        vm_definitions.store(s, s.scalar(select(Vm).where(Vm.name == "db")),
                             {"format": "libvirt-domain-xml", "definition": xml})
        s.commit()
    with serve(settings, session_factory) as url:
        o = ["--url", url, "--token", tokens_by_role["viewer"]]
        vms = _json("vm", "list", "--json", *o)
        assert [(v["site"], v["host"], v["name"]) for v in vms] == [
            ("dr", "d1", "standby"), ("primary", "h1", "db"), ("primary", "h1", "web"),
            ("primary", "h2", "web")]
        db = vms[1]
        assert db["uid"] == UUID and db["identity"] == "libvirt-uuid"
        assert db["state"] == "running" and db["present"] and not db["stale"]
        assert db["groups"] == ["app"]
        assert db["last_snapshot"]["txn"] == txn and db["last_snapshot"]["group"] == "app"
        assert [(d["node"], d["pool"], d["image"], d["size_bytes"], d["group"])
                for d in db["disks"]] == [("vda", "rbd", "db-disk0", 8 << 30, "app"),
                                          ("vdb", "rbd", "db-disk1", None, "app")]
        assert vms[2]["identity"] == "host-name" and vms[2]["uid"] is None
        assert vms[3]["identity"] == "configured-id" and vms[3]["uid"] == "web-id-2"
        assert vms[0]["groups"] == [] and vms[0]["last_snapshot"] is None
        assert [v["name"] for v in _json("vm", "list", "--site", "dr", "--json", *o)] == \
            ["standby"]
        assert [v["name"] for v in _json("vm", "list", "--host", "h2", "--json", *o)] == ["web"]
        shown = _json("vm", "show", "db", "--json", *o)
        assert shown["id"] == db["id"] and shown["host"] == "h1"
        assert [(d["version"], d["format"], d["size_bytes"]) for d in shown["definitions"]] \
            == [(1, "libvirt-domain-xml", len(xml))]
        assert _json("vm", "show", UUID, "--json", *o)["id"] == db["id"]  # by uid
        rc, out = cli("vm", "show", "web", *o)
        assert rc == 1 and "2 VMs are named 'web'" in out and "--host" in out, out
        assert _json("vm", "show", "web", "--host", "h2", "--json", *o)["uid"] == "web-id-2"
        rc, out = cli("vm", "show", "nope", *o)
        assert rc == 1 and "no VM named 'nope'" in out, out
        rc, out = cli("vm", "show", "db", *o)
        assert rc == 0 and "libvirt-uuid" in out and "db-disk0" in out and "8.0 GiB" in out
        assert "definition: v1 libvirt-domain-xml" in out, out
        assert txn in out, out
        rc, out = cli("vm", "list", *o)
        assert rc == 0 and "standby" in out, out


def test_vm_moves_host_by_uid(api: Any, settings: Any, session_factory: Any,
                              tokens_by_role: dict[str, str]) -> None:
    hosts = _setup(session_factory)
    assert api.post("/v1/groups", json={"name": "app"}).status_code == 201
    assert api.post("/v1/groups/app/members", json={"vm": "db"}).status_code == 201
    before = api.get("/v1/vms", params={"uid": UUID}).json()["items"][0]
    with session_factory() as s:
        h1, h2 = s.get(Host, hosts["h1"]), s.get(Host, hosts["h2"])
        # both hosts run it (a live migration midway): it stays on h1
        c = inv.apply(s, h2, {"vms": [_vm("web", "web-id-2", driver="qmp"), _vm("db", UUID)]})
        assert c["conflicts"] == 1 and c["moved"] == 0
        assert api.get(f"/v1/vms/{before['id']}").json()["host"] == "h1"
        # h1 lets go (undefined there), h2 runs it: the same row, on h2
        inv.apply(s, h1, {"vms": [_vm("web", None, driver="qmp")]})
        assert api.get(f"/v1/vms/{before['id']}").json()["present"] is False
        c = inv.apply(s, h2, {"vms": [_vm("web", "web-id-2", driver="qmp"), _vm("db", UUID)]})
        assert c["moved"] == 1 and c["conflicts"] == 0
        # h1 reports again without it: the moved row is not h1's to mark gone
        inv.apply(s, h1, {"vms": [_vm("web", None, driver="qmp")]})
    after = api.get(f"/v1/vms/{before['id']}").json()
    assert after["host"] == "h2" and after["present"] and after["uid"] == UUID
    assert after["groups"] == ["app"] and [d["id"] for d in after["disks"]] == \
        [d["id"] for d in before["disks"]]
    (member,) = api.get("/v1/groups/app").json()["members"]
    assert member["vm"] == "db" and member["host"] == "h2"
    with serve(settings, session_factory) as url:
        o = ["--url", url, "--token", tokens_by_role["viewer"]]
        assert _json("vm", "show", "db", "--json", *o)["host"] == "h2"
        assert [v["host"] for v in _json("vm", "list", "--all", "--json", *o)
                if v["name"] == "db"] == ["h2"]
