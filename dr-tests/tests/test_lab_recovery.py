"""Failure test: `kill -9` of every QEMU and Ceph process of a running lab.

Then `cutpoint-lab up` must say it found a previous lab, clean it up and
come up healthy; after a second kill -9, `cutpoint-lab down` must remove
everything (run twice: idempotent).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from cutpoint.lab import net
from cutpoint.lab.proc import lab_processes, pid_alive
from cutpoint.lab.status import health, load_status

CLI = [str(Path(sys.executable).parent / "cutpoint-lab")]


def kill9_all(status: dict[str, Any]) -> list[int]:
    pids = [vm["pid"] for vm in status["vms"]]
    pids += [p for s in status["sites"].values() for p in s["pids"].values()]
    assert pids and all(pid_alive(p) for p in pids)
    for p in pids:
        os.kill(p, signal.SIGKILL)
    for p in pids:
        for _ in range(100):
            if not pid_alive(p):
                break

            time.sleep(0.05)
        assert not pid_alive(p)
    return pids


@pytest.mark.lab
@pytest.mark.lab_config(hosts=1, vms_per_host=1, disks=1, fresh=True)
def test_lab_up_after_kill9_cleans_and_recovers(lab: dict[str, Any], lab_session: Any) -> None:
    kill9_all(lab)
    assert not health(load_status())["ok"]

    # The fixture holds the lab lock and exported CUTPOINT_LAB_LOCK_HELD=1.
    up = subprocess.run([*CLI, "up", "--hosts", "1", "--vms-per-host", "1"],
                        capture_output=True, text=True, timeout=600, check=False)
    assert up.returncode == 0, up.stdout + up.stderr
    assert "a previous lab was found" in up.stdout and "cleaning it up first" in up.stdout, up.stdout
    new = load_status()
    assert new["phase"] == "up"
    assert health(new)["ok"], health(new)
    assert {vm["pid"] for vm in new["vms"]}.isdisjoint(vm["pid"] for vm in lab["vms"])

    kill9_all(new)
    for _ in range(2):
        down = subprocess.run([*CLI, "down"], capture_output=True, text=True, timeout=300,
                              check=False)
        assert down.returncode == 0, down.stdout + down.stderr
        assert "nothing left" in down.stdout
    assert lab_processes() == []
    left = net.leftovers()
    assert left == {"netns": [], "links": [], "mounts": []}, left
    lab_session.status = None


@pytest.mark.lab
@pytest.mark.lab_config(hosts=1, vms_per_host=1, disks=1, fresh=True)
def test_lab_down_stops_agents_whose_starter_died(lab: dict[str, Any], lab_session: Any,
                                                  tmp_path: Path) -> None:
    """Agents outlive a test or worker killed before it could stop them;
    `lab down` must still find them (by the lab mark) and stop them."""
    from cutpoint.lab import agents

    started = agents.start_agents(lab, tmp_path / "certs")
    pids = [a["pid"] for a in started]
    assert pids and all(pid_alive(p) for p in pids)
    # No stop_agents(): the starter is gone as far as the lab knows.
    down = subprocess.run([*CLI, "down"], capture_output=True, text=True, timeout=300,
                          check=False)
    assert down.returncode == 0, down.stdout + down.stderr
    assert not [p for p in pids if pid_alive(p)], down.stdout
    assert lab_processes() == []
    lab_session.status = None
