"""The non-default lab: qcow2 disks, bluestore OSDs, Ceph's default Paxos.

One guest with two qcow2 disks runs `labcheck`; the host reads each
pattern back from the qcow2 file (qemu-img with shared locking, since the
guest still has it open), and asks each cluster which object store its OSD
runs and which Paxos interval its mon uses.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from cutpoint.lab.ceph import ceph_cmd
from cutpoint.lab.labcheck import PATTERN_BYTES, expected_pattern, wait_done


def qcow2_read(path: str, n: int, tmp: Path) -> bytes:
    raw = tmp / (Path(path).stem + ".raw")
    subprocess.run(["qemu-img", "convert", "-U", "-f", "qcow2", "-O", "raw", path, str(raw)],
                   check=True, capture_output=True, timeout=120)
    with open(raw, "rb") as f:
        return f.read(n)


@pytest.mark.lab
@pytest.mark.lab_config(hosts=1, vms_per_host=1, disks=2, backend="qcow2", osd="bluestore",
                        paxos="default", workload="labcheck", fresh=True,
                        driver="qemu")  # qcow2 disks: raw QEMU only
def test_lab_qcow2_bluestore_default_paxos(lab: dict[str, Any], tmp_path: Path) -> None:
    [vm] = lab["vms"]
    assert [d["backend"] for d in vm["disks"]] == ["qcow2", "qcow2"]
    assert all("file" in d and "image" not in d for d in vm["disks"])
    lines = wait_done(lab)[vm["name"]]
    disks = [r for r in lines if r["kind"] == "disk"]
    assert [r["result"] for r in disks] == ["ok", "ok"], lines
    for k, d in enumerate(vm["disks"]):
        assert qcow2_read(d["file"], PATTERN_BYTES, tmp_path) == expected_pattern(vm["name"], k)

    for site in ("primary", "dr"):
        sdir = Path(lab["sites"][site]["data_dir"])
        meta = subprocess.run(ceph_cmd(sdir, "osd", "metadata", "0", "-f", "json"),
                              capture_output=True, text=True, check=True, timeout=60).stdout
        assert json.loads(meta)["osd_objectstore"] == "bluestore"
        # The block file is sparse: 10 GiB apparent, a little actually used.
        block = sdir / "osd" / "osd.0.block"
        st = block.stat()
        assert st.st_size == 10 << 30 and st.st_blocks * 512 < 1 << 30
        pi = subprocess.run(ceph_cmd(sdir, "config", "show", "mon.a", "paxos_propose_interval"),
                            capture_output=True, text=True, check=True, timeout=60).stdout
        assert float(pi) == 1.0, pi
        assert "paxos_propose_interval" not in lab["sites"][site]["mon_settings"]
