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
    member_request,
    replicate_group,
    serve_argv,
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


def test_a_serve_session_gets_the_sites_and_each_member_its_mapped_pools(
        tmp_path: Path) -> None:
    """The group's copies go through `cutpoint-sync --serve`: the session has
    both sites' access and what every copy shares; each request names its
    member and its pool as each site maps it."""
    src = CephSite("primary", pools={"vms": "vms", "db": "db-p"},
                   ceph_conf="/etc/ceph/p.conf", op_timeout_s=5)
    dst = CephSite("dr", pools={"vms": "dr-vms", "db": "db-dr"},
                   ceph_conf="/etc/ceph/d.conf", op_timeout_s=9)
    argv = serve_argv(src, dst, "vms", rate_mbps=12.5, epoch=4, state_dir=str(tmp_path),
                      verify_full=True)
    assert "--serve" in argv and "--image" not in argv and "--snap" not in argv
    assert (opt(argv, "--src-conf"), opt(argv, "--dst-conf"), opt(argv, "--dst-pool")) == \
        ("/etc/ceph/p.conf", "/etc/ceph/d.conf", "dr-vms")
    assert (opt(argv, "--epoch"), opt(argv, "--rate-mbps"), opt(argv, "--op-timeout"),
            opt(argv, "--state-dir")) == ("4", "12.5", "9", str(tmp_path))
    assert "--verify-full" in argv
    req = member_request(src, dst, MemberCopy("pg-data", "cp.g.3", "cp.g.2", pool="db"), "m1")
    assert req == {"id": "m1", "image": "pg-data", "snap": "cp.g.3", "base": "cp.g.2",
                   "src_pool": "db-p", "dst_pool": "db-dr"}


def test_a_session_that_cannot_connect_fails_the_group_with_why(tmp_path: Path) -> None:
    """The real engine, no cluster: its session reports that a site could not
    be connected; the first member fails with that message, and the group
    stops (the others are not copied or fail the same way)."""
    missing = str(tmp_path / "nowhere.conf")
    src = CephSite("primary", pools={"rbd": "rbd"}, ceph_conf=missing)
    dst = CephSite("dr", pools={"rbd": "rbd"}, ceph_conf=missing)
    members = [MemberCopy(f"img{i}", "cp.g.2", "cp.g.1") for i in range(4)]
    events: list[str] = []
    rep = replicate_group(src, dst, members, jobs=2, state_dir=str(tmp_path / "state"),
                          on_event=lambda kind, _doc: events.append(kind))
    assert rep.state == "failed" and not rep.recovery_point
    assert all(m.state == "failed" for m in rep.members)
    errors = [m.error or "" for m in rep.members]
    first = [m for m in rep.members if (m.error or "").startswith("cutpoint-sync rc=1: ")]
    assert first and all("nowhere.conf: No such file" in (m.error or "") for m in first), errors
    assert all(m.returncode == 1 for m in first)
    # the rest: never started, or stopped (killed) once the first had failed
    assert all(e.startswith(("cutpoint-sync rc=1: ", "not copied: ")) or ": stopped: " in e
               for e in errors), errors
    assert events[-1] == "group.failed"
