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
