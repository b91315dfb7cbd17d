"""Standby guests of the lab's DR host: the copies of the primary VMs that failover boots.

The DR host's agent (`cutpoint.lab.agents`) gets one `[vm NAME]` section per
primary VM with RBD disks: the same VM name, its disks = the same-named DR
images (replication keeps the names), and

    start = <python> -m cutpoint.lab.standby start <spec.json>

so that failover boots them through the agent's `vm.start`
(docs/agent-protocol.md 4.9).  The spec is written before the agent starts
(`write_specs`), under `<lab state>/standby/<vm>/`: QEMU settings (kernel,
initrd, accel, memory, the VM's index, address and MAC, which the fenced
primary no longer uses), the tap `sb<index>` on the DR host's bridge, and
the console, QMP socket and pid file paths the coordinator reads.

`python -m cutpoint.lab.standby start SPEC` runs in the DR host's network
namespace (where the agent runs): it removes a previous run's console,
socket and pid file, creates the tap, and runs QEMU with the lab's argv
(`cutpoint.lab.vms.qemu_argv`, `-daemonize`), exiting 0 once QEMU has
daemonized, 1 with the reason otherwise.

The guest workload is part of the spec (`none` unless the caller sets it
with `set_workload` before `vm.start`): the guest's kernel command line
says what it runs after boot.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from cutpoint.lab import config as C
from cutpoint.lab.errors import LabError

DEFAULT_MEMORY_MB = 160


def standby_dir(status: dict[str, Any]) -> Path:
    return Path(status["state_dir"]) / "standby"


def dr_host(status: dict[str, Any]) -> dict[str, Any] | None:
    """The DR host that holds the standbys (the first one: VM names stay unique)."""
    return next((h for h in status.get("hosts", []) if h["site"] == "dr"), None)


def spec_path(status: dict[str, Any], vm: str, site: str = "dr") -> Path:
    if site == "dr":
        return standby_dir(status) / vm / "spec.json"
    v = next((x for x in status.get("vms", []) if x["name"] == vm), None)
    if v is None:
        raise LabError(f"no VM {vm} in the lab")
    return Path(v["dir"]) / "spec.json"


def plan(status: dict[str, Any]) -> list[dict[str, Any]]:
    """One spec per primary VM whose disks are all RBD (qcow2 disks are not replicated)."""
    host = dr_host(status)
    dr = status.get("sites", {}).get("dr")
    if host is None or dr is None:
        return []
    prim = sorted((v for v in status.get("vms", []) if v.get("site") == "primary"),
                  key=lambda v: v["index"])
    prim = [v for v in prim if v["disks"] and all(d["backend"] == "rbd" for d in v["disks"])]
    memory = int(status.get("config", {}).get("memory_mb") or DEFAULT_MEMORY_MB)
    out = []
    for v in prim:
        d = standby_dir(status) / v["name"]
        out.append({
            "name": v["name"], "index": v["index"], "address": C.vm_addr(v["index"]),
            "mac": C.vm_mac(v["index"]), "tap": f"sb{v['index']}", "netns": host["netns"],
            "host": host["name"], "dir": str(d), "qmp": str(d / "qmp.sock"),
            "console": str(d / "console.log"), "pidfile": str(d / "qemu.pid"),
            "workload": "none", "workload_args": "",
            "disks": [{"node": x["node"], "backend": "rbd", "pool": dr.get("pool", "rbd"),
                       "image": x["image"], "site": "dr"} for x in v["disks"]],
            "peers": [C.vm_addr(p["index"]) for p in prim],
            "image": {"kernel": status["image"]["kernel"], "initrd": status["image"]["initrd"]},
            "accel": status.get("accel", "tcg"), "memory_mb": memory,
            "site": {k: dr[k] for k in ("ceph_conf", "client_id", "keyring", "pool")
                     if k in dr},
        })
    return out


def primary_plan(status: dict[str, Any], host: str) -> list[dict[str, Any]]:
    """The same specs for the primary VMs of `host` (their own disks, tap and
    paths), for a lab whose primary agents can start their VMs again with
    `vm.start`: a failback boots the primary's VMs through its agents."""
    prim_all = sorted((v for v in status.get("vms", []) if v.get("site") == "primary"),
                      key=lambda v: v["index"])
    memory = int(status.get("config", {}).get("memory_mb") or DEFAULT_MEMORY_MB)
    site = status["sites"]["primary"]
    out = []
    for v in prim_all:
        if v["host"] != host or not v["disks"] or \
                not all(d["backend"] == "rbd" for d in v["disks"]):
            continue
        out.append({
            "name": v["name"], "index": v["index"], "address": v["address"],
            "mac": v["mac"], "tap": v["tap"], "netns": v["host"], "host": v["host"],
            "dir": v["dir"], "qmp": v["qmp"], "console": v["console"],
            "pidfile": v["pidfile"], "workload": v.get("workload", "none"),
            "workload_args": status.get("config", {}).get("workload_args", "") or "",
            "disks": [{"node": x["node"], "backend": "rbd", "pool": x["pool"],
                       "image": x["image"], "site": "primary"} for x in v["disks"]],
            "peers": [p["address"] for p in prim_all],
            "image": {"kernel": status["image"]["kernel"], "initrd": status["image"]["initrd"]},
            "accel": status.get("accel", "tcg"), "memory_mb": memory,
            "site": {k: site[k] for k in ("ceph_conf", "client_id", "keyring", "pool",
                                           "qemu_conf") if k in site},
        })
    return out


def write_primary_specs(status: dict[str, Any], host: str) -> list[dict[str, Any]]:
    """Write each primary VM's spec.json (in its own directory); returns them."""
    return _write(primary_plan(status, host))


def write_specs(status: dict[str, Any]) -> list[dict[str, Any]]:
    """Write every standby's spec.json; returns the specs (with `spec` = the file)."""
    return _write(plan(status))


def _write(specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for s in specs:
        p = Path(s["dir"]) / "spec.json"
        p.parent.mkdir(parents=True, exist_ok=True)
        s["spec"] = str(p)
        tmp = p.with_suffix(".tmp")
        tmp.write_text(json.dumps(s, indent=1))
        os.replace(tmp, p)
    return specs


def start_command(spec_file: str | os.PathLike[str]) -> str:
    """The agent's `start =` value: absolute interpreter, no blanks in any word."""
    argv = [sys.executable, "-m", "cutpoint.lab.standby", "start", str(spec_file)]
    if any(not w or " " in w or "\t" in w for w in argv):
        raise LabError(f"standby start command words must not contain blanks: {argv}")
    return " ".join(argv)


def load(status: dict[str, Any], vm: str, site: str = "dr") -> dict[str, Any]:
    """The spec of `vm`'s standby at DR, or (site "primary") of the primary VM."""
    p = spec_path(status, vm, site)
    try:
        return dict(json.loads(p.read_text()))
    except OSError as exc:
        raise LabError(f"no standby spec for {vm} at {p} (agents started without it?)") \
            from exc


def set_workload(status: dict[str, Any], vm: str, workload: str, args: str = "",
                 site: str = "dr") -> None:
    """What the standby runs after its next boot (the guest kernel command line)."""
    spec = load(status, vm, site)
    if spec.get("workload") == workload and spec.get("workload_args", "") == args:
        return
    spec["workload"], spec["workload_args"] = workload, args
    p = spec_path(status, vm, site)
    tmp = p.with_suffix(".tmp")
    tmp.write_text(json.dumps(spec, indent=1))
    os.replace(tmp, p)


def start(spec_file: str) -> None:
    """Launch the standby QEMU (run in the DR host namespace, by the agent)."""
    from cutpoint.lab import net
    from cutpoint.lab.vms import qemu_argv

    spec = json.loads(Path(spec_file).read_text())
    for f in (spec["console"], spec["qmp"], spec["pidfile"]):
        Path(f).unlink(missing_ok=True)
    # A tap left by an earlier boot of this standby (a killed QEMU) is reused.
    r = subprocess.run(["ip", "-n", spec["netns"], "link", "show", spec["tap"]],
                       capture_output=True, check=False)
    if r.returncode != 0:
        net.add_tap(spec["netns"], spec["tap"])
    sites = {d["site"]: spec["site"] for d in spec["disks"]}
    argv = qemu_argv(spec, spec["image"], spec["accel"], spec["peers"], sites,
                     int(spec["memory_mb"]), spec.get("workload_args", ""))
    Path(spec["dir"], "qemu.argv").write_text("\0".join(argv))
    cp = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    if cp.returncode != 0:
        raise LabError(f"{spec['name']}: QEMU did not start (exit {cp.returncode}): "
                       f"{(cp.stderr or cp.stdout).strip()[-600:]}")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] != "start":
        print("usage: python -m cutpoint.lab.standby start SPEC.json", file=sys.stderr)
        return 2
    try:
        start(args[1])
    except (LabError, OSError, KeyError, ValueError, subprocess.SubprocessError) as exc:
        print(f"cutpoint.lab.standby: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
