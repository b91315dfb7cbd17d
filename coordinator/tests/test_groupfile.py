"""The group file: loading, its errors, and writing it for a lab."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from cutpoint.coordinator import GroupFileError, load_group_file
from cutpoint.coordinator.spec import GroupSpec, SpecError
from cutpoint.lab.groupfile import write_group_file

STATUS: dict[str, Any] = {
    "state_dir": "/x/lab",
    "hosts": [{"name": "primary-h1", "site": "primary", "netns": "primary-h1",
               "address": "10.77.1.1"},
              {"name": "primary-h2", "site": "primary", "netns": "primary-h2",
               "address": "10.77.1.2"}],
    "vms": [{"name": f"primary-h{h}-vm1", "host": f"primary-h{h}", "site": "primary",
             "disks": [{"node": f"disk{i}", "backend": "rbd", "pool": "rbd",
                        "image": f"primary-h{h}-vm1-disk{i}"} for i in range(3)]}
            for h in (1, 2)],
}


def certs(tmp: Path) -> Path:
    d = tmp / "certs"
    d.mkdir()
    for f in ("ca.pem", "coordinator.pem", "coordinator.key"):
        (d / f).write_text("x")
    return d


def test_write_then_load_round_trip(tmp_path: Path) -> None:
    spec = write_group_file(STATUS, tmp_path / "g.yaml", group="web",
                            certs_dir=certs(tmp_path), lease_ms=1500, budget_ms=800)
    loaded = load_group_file(tmp_path / "g.yaml")
    assert loaded == spec
    assert [a.address for a in loaded.agents] == ["10.77.1.1", "10.77.1.2"]
    assert loaded.agents[0].vms[0].disk_ids() == [
        "primary-h1-vm1/disk0", "primary-h1-vm1/disk1", "primary-h1-vm1/disk2"]
    assert loaded.lease_ms == 1500 and loaded.effective_prepare_timeout_ms == 750
    assert loaded.snapshot_name("T1") == "cp.web.T1"


def test_relative_cert_paths_are_relative_to_the_file(tmp_path: Path) -> None:
    certs(tmp_path)
    (tmp_path / "g.yaml").write_text(
        "group: g\ntls: {ca: certs/ca.pem, cert: certs/coordinator.pem, "
        "key: certs/coordinator.key}\n"
        "agents:\n- {address: 10.0.0.1, vms: [{name: v, disks: [disk0]}]}\n")
    spec = load_group_file(tmp_path / "g.yaml")
    assert spec.tls is not None and spec.tls.ca == str(tmp_path / "certs" / "ca.pem")
    assert spec.agents[0].port == 7443 and spec.agents[0].name == "10.0.0.1"


@pytest.mark.parametrize(("text", "needle"), [
    ("group: g\nagents: []\n", "agents: expected a non-empty list"),
    ("group: g\nlease_ms: 0\nagents:\n- {address: a, vms: [{name: v, disks: [d]}]}\n",
     "lease_ms"),
    ("group: 'bad name'\nagents:\n- {address: a, vms: [{name: v, disks: [d]}]}\n", "name"),
    ("group: g\nagents:\n- {address: a, vms: [{name: v, disks: []}]}\n",
     "needs at least one disk"),
    (("group: g\nagents:\n- {address: a, vms: [{name: v, disks: [d]}]}\n"
     "- {address: b, vms: [{name: v, disks: [d]}]}\n"), "listed twice"),
    (("group: g\nlease_ms: 100\nprepare_timeout_ms: 100\n"
     "agents:\n- {address: a, vms: [{name: v, disks: [d]}]}\n"), "below lease_ms"),
    ("group: g\nbogus: 1\nagents:\n- {address: a, vms: [{name: v, disks: [d]}]}\n",
     "unknown key(s) bogus"),
    ("group: g\nagents:\n- {address: a, vms: [{name: v, disks: [d]}]}\n",
     "tls: ca, cert and key are required"),
    ("group: [\n", "not valid YAML"),
    ("group: g\nagents:\n- {address: a, cert_sha256: 'ab:cd', vms: [{name: v, disks: [d]}]}\n",
     "agents[0].cert_sha256: not a SHA-256 fingerprint"),
])
def test_bad_group_files_name_the_field(tmp_path: Path, text: str, needle: str) -> None:
    p = tmp_path / "g.yaml"
    p.write_text(text)
    with pytest.raises(GroupFileError) as ei:
        load_group_file(p)
    assert needle in str(ei.value) and str(p) in str(ei.value)


def test_missing_file_and_cert(tmp_path: Path) -> None:
    with pytest.raises(GroupFileError, match="cannot read"):
        load_group_file(tmp_path / "nope.yaml")
    (tmp_path / "g.yaml").write_text(
        "group: g\ntls: {ca: /nonexistent/ca.pem, cert: c, key: k}\n"
        "agents:\n- {address: a, vms: [{name: v, disks: [d]}]}\n")
    with pytest.raises(GroupFileError, match="tls.ca: /nonexistent/ca.pem does not exist"):
        load_group_file(tmp_path / "g.yaml")


def test_lab_vm_filter_and_unknown_vm(tmp_path: Path) -> None:
    spec = write_group_file(STATUS, tmp_path / "g.yaml", certs_dir=certs(tmp_path),
                            vms=["primary-h2-vm1"])
    assert [v.name for _, v in spec.vms()] == ["primary-h2-vm1"]
    with pytest.raises(GroupFileError, match="no such VM"):
        write_group_file(STATUS, tmp_path / "h.yaml", vms=["nope"])


def test_spec_round_trips_through_dict() -> None:
    pin = "AB:" * 31 + "CD"
    spec = GroupSpec.from_dict({"group": "g", "agents": [
        {"name": "h", "address": "a", "cert_sha256": pin,
         "vms": [{"name": "v", "disks": ["d0"]}]}]})
    assert spec.agents[0].cert_sha256 == "ab" * 31 + "cd"
    assert GroupSpec.from_dict(spec.to_dict()) == spec
    with pytest.raises(SpecError):
        GroupSpec.from_dict({"group": "g", "agents": [{"address": "a", "port": 0,
                                                       "vms": [{"name": "v", "disks": ["d"]}]}]})
