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


def health(status: dict[str, Any]) -> dict[str, Any]:
    """Which recorded processes are alive now."""
    out: dict[str, Any] = {"vms": {}, "ceph": {}}
    for vm in status.get("vms", []):
        out["vms"][vm["name"]] = pid_alive(vm.get("pid", 0))
    for site, s in status.get("sites", {}).items():
        for daemon, pid in s.get("pids", {}).items():
            out["ceph"][f"{site} {daemon}"] = pid_alive(pid)
    out["ok"] = all(out["vms"].values()) and all(out["ceph"].values())
    return out
