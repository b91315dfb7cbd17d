"""`cutpoint-lab down`: remove every trace of a lab, idempotently.

Leftovers are found two ways, so that a crash (kill -9 of `lab up`, QEMU or
Ceph) or a deleted state dir still ends clean:
  1. from the state dir: status.json, QEMU, libvirtd and Ceph pid files
     (libvirt mode: each host's libvirtd destroys and undefines its
     domains and undefines its secrets before it is stopped);
  2. by pattern: processes marked CUTPOINT_LAB_MARK / booted with
     `cp.name=` / Ceph daemons with a cutpoint config path / libvirtd and
     virtlogd with the mark; whatever runs in a host namespace, namespaces
     `primary-hN`/`dr-hN`, links `cpbr0` and `cpv*`, /run/netns mounts.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from cutpoint.lab import ceph, domains, net, vms
from cutpoint.lab import config as C
from cutpoint.lab.errors import LabError
from cutpoint.lab.proc import kill_pids, lab_processes
from cutpoint.lab.status import FILE


def leftovers() -> dict[str, list[str]]:
    left = net.leftovers()
    left["processes"] = [f"{pid} {cmd[:100]}" for pid, cmd in lab_processes()]
    return left


def down(state_dir: str | None = None, log: Any = print, keep_files: bool = False) -> list[str]:
    """Tear the lab down; returns what was removed.  Raises if anything remains."""
    state = C.state_dir(state_dir)
    removed: list[str] = []
    vm_list: list[dict[str, Any]] = []
    status: dict[str, Any] | None = None
    try:
        import json
        status = json.loads((state / FILE).read_text())
        vm_list = status.get("vms", []) if status else []
    except (OSError, ValueError):
        pass
    removed += domains.down(state, status)
    removed += vms.stop_all(state, vm_list)
    for site in C.SITES:
        removed += ceph.down(state, site)
    stray = lab_processes()
    if stray:
        kill_pids([p for p, _ in stray])
        removed += [f"process {p} ({cmd.split()[0]})" for p, cmd in stray]
    removed += net.teardown()
    removed += clear_journals(state)
    if not keep_files:
        for sub in ("ceph", "vms", "libvirt", FILE):
            p = state / sub
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
                removed.append(f"files {p}")
            elif p.exists():
                p.unlink()
    for r in removed:
        log(f"down: removed {r}")
    left = leftovers()
    bad = {k: v for k, v in left.items() if v}
    if bad:
        raise LabError(f"lab down left things behind: {bad}")
    return removed


def clear_journals(state: Path) -> list[str]:
    """Remove the lab agents' journals; returns what went.

    They name VMs of a lab that is gone: an entry left by an agent that was
    killed mid-transaction (a recovery test) would otherwise be "recovered"
    against the next lab's VM of the same name, which then refused every
    prepare (seen: BUSY, the merge of a redirect cut it never had).  `up`
    calls it too, since the lab before may have been torn down by an older
    `down`.  The agents' logs stay."""
    out = []
    for j in sorted((state / "agents").glob("*/journal*")):
        j.unlink(missing_ok=True)
        out.append(f"agent journal {j}")
    return out


def has_previous(state_dir: str | None = None) -> list[str]:
    """What a previous lab left (state file, processes, namespaces, links)."""
    state = C.state_dir(state_dir)
    found = []
    if (state / FILE).exists():
        found.append(f"state {state / FILE}")
    if (state / "ceph").exists():
        found.append(f"data {state / 'ceph'}")
    if (state / "libvirt").exists():
        found.append(f"data {state / 'libvirt'}")
    singular = {"netns": "netns", "links": "link", "mounts": "mount", "processes": "process"}
    for k, v in leftovers().items():
        found += [f"{singular.get(k, k)} {x.split()[0]}" for x in v]
    return found


