"""The group definition file (YAML, or JSON which is YAML too).

    group: web                  # group name; snapshots are cp.<group>.<txn>
    lease_ms: 2000              # longest pause while agents wait for COMMIT
    budget_ms: 1000             # snapshot budget of COMMIT
    prepare_timeout_ms: 1000    # optional; default lease_ms / 2
    quiesce: fs-freeze          # optional; crash (default) or fs-freeze: guest
                                # fs freeze through the QEMU guest agent, with a
                                # per-VM fallback to crash (agent-protocol §4.3)
    freeze_timeout_ms: 5000     # optional; freeze deadline sent in PREPARE (each
                                # agent uses min(it, its [agent] freeze_timeout_ms))
                                # and sizes the wait for PREPARED; default 5000
    tls:                        # coordinator's client cert + the agents' CA
      ca: certs/ca.pem          # relative paths are relative to this file
      cert: certs/coordinator.pem
      key: certs/coordinator.key
    agents:
      - name: primary-h1
        address: 10.77.1.1
        port: 7443
        vms:
          - name: primary-h1-vm1
            disks: [disk0, disk1, disk2]   # QEMU node names

The loader only turns the file into a `GroupSpec`; everything after that is
shared with groups stored by the control plane.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from cutpoint.coordinator.spec import GroupSpec, SpecError


class GroupFileError(ValueError):
    """The group file cannot be used; the message names the file and field."""


def load_group_file(path: str | Path) -> GroupSpec:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise GroupFileError(f"{p}: cannot read group file: {exc.strerror}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise GroupFileError(f"{p}: not valid YAML: {exc}") from exc
    try:
        spec = GroupSpec.from_dict(data, base=p.resolve().parent)
    except SpecError as exc:
        raise GroupFileError(f"{p}: {exc}") from exc
    if spec.tls is None:
        raise GroupFileError(f"{p}: tls: ca, cert and key are required to reach agents")
    for label, f in spec.tls.to_dict().items():
        if not Path(f).is_file():
            raise GroupFileError(f"{p}: tls.{label}: {f} does not exist")
    return spec


def dump_group_spec(spec: GroupSpec) -> str:
    d: dict[str, Any] = {
        "group": spec.name, "lease_ms": spec.lease_ms, "budget_ms": spec.budget_ms,
        "prepare_timeout_ms": spec.effective_prepare_timeout_ms,
    }
    if spec.quiesce != "crash":
        d["quiesce"] = spec.quiesce
        d["freeze_timeout_ms"] = spec.freeze_timeout_ms
    if spec.tls is not None:
        d["tls"] = spec.tls.to_dict()
    d["agents"] = [{"name": a.name, "address": a.address, "port": a.port,
                    "vms": [{"name": v.name, "disks": list(v.disks)} for v in a.vms]}
                   for a in spec.agents]
    return "# cutpoint group file\n" + yaml.safe_dump(d, sort_keys=False)


def spec_from_lab(status: dict[str, Any], *, group: str = "lab",
                  certs_dir: str | Path | None = None, site: str = "primary",
                  vms: list[str] | None = None, port: int = 7443,
                  lease_ms: int = 2000, budget_ms: int = 1000,
                  prepare_timeout_ms: int | None = None, quiesce: str = "crash",
                  freeze_timeout_ms: int | None = None) -> GroupSpec:
    """A GroupSpec for the VMs of a running lab (`cutpoint lab status --json`).

    certs_dir holds ca.pem, coordinator.pem and coordinator.key (the layout of
    cutpoint.lab.agents); default `<state_dir>/certs`.
    """
    certs = Path(certs_dir) if certs_dir else Path(status["state_dir"]) / "certs"
    hosts = {h["name"]: h for h in status.get("hosts", [])}
    chosen = [v for v in status.get("vms", [])
              if v.get("site", site) == site and (vms is None or v["name"] in vms)]
    if vms is not None:
        missing = sorted(set(vms) - {v["name"] for v in chosen})
        if missing:
            raise GroupFileError(f"no such VM(s) in the lab at site {site}: "
                                 f"{', '.join(missing)}")
    if not chosen:
        raise GroupFileError(f"the lab has no VM at site {site}")
    by_host: dict[str, list[dict[str, Any]]] = {}
    for v in chosen:
        by_host.setdefault(v["host"], []).append(v)
    agents = []
    for host, hvms in by_host.items():
        if host not in hosts:
            raise GroupFileError(f"VM {hvms[0]['name']} is on unknown host {host}")
        agents.append({
            "name": host, "address": hosts[host]["address"], "port": port,
            "vms": [{"name": v["name"], "disks": [d["node"] for d in v["disks"]]}
                    for v in hvms]})
    d: dict[str, Any] = {
        "group": group, "lease_ms": lease_ms, "budget_ms": budget_ms,
        "prepare_timeout_ms": prepare_timeout_ms,
        "quiesce": quiesce, "freeze_timeout_ms": freeze_timeout_ms,
        "tls": {"ca": str(certs / "ca.pem"), "cert": str(certs / "coordinator.pem"),
                "key": str(certs / "coordinator.key")},
        "agents": agents,
    }
    try:
        return GroupSpec.from_dict(d)
    except SpecError as exc:
        raise GroupFileError(f"lab group: {exc}") from exc


def write_group_file(status: dict[str, Any], path: str | Path, **kwargs: Any) -> GroupSpec:
    """Write the group file G for the running lab (`cutpoint lab group-file`).

    kwargs are those of `spec_from_lab`.  The file is written atomically.
    """
    spec = spec_from_lab(status, **kwargs)
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(dump_group_spec(spec), encoding="utf-8")
    os.replace(tmp, p)
    return spec
