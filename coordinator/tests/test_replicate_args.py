"""What cutpoint-sync is given for a site: the CephSite's ceph.conf (or a
generated one for mon addresses), cephx id, keyring path and the member's
pool as that site maps it; a site that cannot work stops the group before
any copy starts.  No cluster needed."""

from __future__ import annotations

from pathlib import Path

import pytest
from cutpoint.coordinator.dr.replicate import (
    MemberCopy,
    ReplicationError,
    replicate_group,
    stall_bound_s,
    sync_argv,
)
from cutpoint.coordinator.dr.site import CephSite


def opt(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_the_engine_gets_each_sites_access_and_mapped_pool(tmp_path: Path) -> None:
    src = CephSite("primary", pools={"vms": "vms"}, ceph_conf="/etc/ceph/p.conf",
                   keyring="/etc/ceph/p.client.cutpoint.keyring")
    dst = CephSite("dr", pools={"vms": "dr-vms"}, mon_host=("v2:10.0.0.9:3300", "10.0.0.10"),
                   client_id="cp-dr")
    argv = sync_argv(src, dst, MemberCopy("img", "cp.g.2", "cp.g.1", pool="vms"),
                     state_dir=str(tmp_path))
    assert (opt(argv, "--src-conf"), opt(argv, "--src-id"), opt(argv, "--src-keyring"),
            opt(argv, "--src-pool")) == ("/etc/ceph/p.conf", "cutpoint",
                                         "/etc/ceph/p.client.cutpoint.keyring", "vms")
    conf = Path(opt(argv, "--dst-conf"))
    assert conf.parent == tmp_path and "[global]\nmon_host = v2:10.0.0.9:3300,10.0.0.10\n" \
        in conf.read_text()
    assert (opt(argv, "--dst-id"), opt(argv, "--dst-pool")) == ("cp-dr", "dr-vms")
    assert "--dst-keyring" not in argv  # Ceph's default search
    assert (opt(argv, "--image"), opt(argv, "--snap"), opt(argv, "--base")) == \
        ("img", "cp.g.2", "cp.g.1")


def test_the_engine_gets_the_sites_op_timeout() -> None:
    """A hung OSD fails a copy within the sites' own op timeout (the larger
    of the two: one bound covers both connections)."""
    src = CephSite("primary", pools={"rbd": "rbd"}, ceph_conf="/etc/ceph/p.conf",
                   op_timeout_s=5)
    dst = CephSite("dr", pools={"rbd": "rbd"}, ceph_conf="/etc/ceph/d.conf", op_timeout_s=7)
    argv = sync_argv(src, dst, MemberCopy("img", "cp.g.2", None, pool="rbd"))
    assert opt(argv, "--op-timeout") == "7"


def test_a_site_that_cannot_work_stops_the_group_before_any_copy(tmp_path: Path) -> None:
    ok = CephSite("primary", pools={"rbd": "rbd"}, ceph_conf="/etc/ceph/p.conf")
    both = CephSite("dr", pools={"rbd": "rbd"}, ceph_conf="/etc/ceph/d.conf",
                    mon_host=("10.0.0.9",))
    unmapped = CephSite("dr", pools={"other": "other"}, ceph_conf="/etc/ceph/d.conf")
    m = [MemberCopy("img", "cp.g.1")]
    with pytest.raises(ReplicationError, match="not both"):
        replicate_group(ok, both, m, state_dir=str(tmp_path))
    with pytest.raises(ReplicationError, match="maps no pool 'rbd'"):
        replicate_group(ok, unmapped, m, state_dir=str(tmp_path))


def test_a_copy_is_stopped_after_two_op_timeouts_without_progress() -> None:
    """Two of the op timeouts the engine runs with, 60 s at least, plus
    16 MiB's time under a rate limit."""
    assert stall_bound_s(30) == 60
    assert stall_bound_s(5) == 60
    assert stall_bound_s(100) == 200
    assert stall_bound_s(30, 8) == pytest.approx(60 + (16 << 20) / 8e6)
