"""The lab status: `<state dir>/status.json`, written as the lab comes up.

Other code reads it through `load_status()`; `cutpoint-lab status --json`
prints the same dict.  It is rewritten after each bring-up phase (field
`phase`), so teardown after a failed or killed `lab up` knows what exists.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from cutpoint.lab import config as C
from cutpoint.lab.errors import LabNotUp
from cutpoint.lab.proc import pid_alive

FILE = "status.json"


def load_status(state_dir: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    d = C.state_dir(state_dir)
    try:
        return json.loads((d / FILE).read_text())
    except FileNotFoundError:
        raise LabNotUp(f"no lab is up: {d / FILE} does not exist (run `cutpoint-lab up`)") from None
    except ValueError as exc:
        raise LabNotUp(f"lab status {d / FILE} is unreadable: {exc}") from None


def write_status(status: dict[str, Any]) -> None:
    d = Path(status["state_dir"])
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / (FILE + ".tmp")
    with open(tmp, "w") as f:
        json.dump(status, f, indent=2)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, d / FILE)


def vm_pid(vm: dict[str, Any]) -> int:
    """The pid of a lab VM's QEMU now, whichever the driver; 0 when it does
    not run.  A libvirt domain: libvirt's pid file (a domain started again
    through libvirt has a new pid).  Raw QEMU: the pid recorded at start
    (the process the lab started; a test that starts it again records the
    new one)."""
    pid = int(vm.get("pid") or 0)
    if vm.get("driver") == "libvirt":
        try:
            pid = int(Path(vm["pidfile"]).read_text().strip())
        except (OSError, ValueError, KeyError):
            pid = 0
    return pid if pid_alive(pid) else 0


def vm_running(vm: dict[str, Any]) -> bool:
    return vm_pid(vm) > 0


def health(status: dict[str, Any]) -> dict[str, Any]:
    """Which recorded processes are alive now."""
    out: dict[str, Any] = {"vms": {}, "ceph": {}, "libvirt": {}}
    for vm in status.get("vms", []):
        # the process the lab started: one started again is not the lab's
        out["vms"][vm["name"]] = pid_alive(int(vm.get("pid") or 0))
    for host, h in (status.get("libvirt") or {}).get("hosts", {}).items():
        try:
            pid = int((Path(h["dir"]) / "libvirtd.pid").read_text().strip())
        except (OSError, ValueError):
            pid = 0
        out["libvirt"][host] = pid_alive(pid)
    for site, s in status.get("sites", {}).items():
        for daemon, pid in s.get("pids", {}).items():
            out["ceph"][f"{site} {daemon}"] = pid_alive(pid)
    out["ok"] = all(out["vms"].values()) and all(out["ceph"].values()) \
        and all(out["libvirt"].values())
    return out
