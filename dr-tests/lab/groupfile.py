"""The group file of the running lab (`cutpoint-lab group-file`).

    spec = spec_from_lab(load_status(), group="lab")
    write_group_file(status, "group.yaml", certs_dir=...)

A GroupSpec for (some of) the lab's VMs, one agent per lab host on its
address, with the coordinator certificate the lab's agents trust
(cutpoint.lab.agents); the file format is the product's
(cutpoint.coordinator.groupfile).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from cutpoint.coordinator.groupfile import GroupFileError, dump_group_spec
from cutpoint.coordinator.spec import GroupSpec, SpecError


def spec_from_lab(status: dict[str, Any], *, group: str = "lab",
                  certs_dir: str | Path | None = None, site: str = "primary",
                  vms: list[str] | None = None, port: int = 7443,
                  lease_ms: int = 2000, budget_ms: int = 1000,
                  prepare_timeout_ms: int | None = None, quiesce: str = "crash",
                  freeze_timeout_ms: int | None = None) -> GroupSpec:
    """A GroupSpec for the VMs of a running lab (`cutpoint-lab status --json`).

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
    """Write the group file G for the running lab (`cutpoint-lab group-file`).

    kwargs are those of `spec_from_lab`.  The file is written atomically.
    """
    spec = spec_from_lab(status, **kwargs)
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(dump_group_spec(spec), encoding="utf-8")
    os.replace(tmp, p)
    return spec
