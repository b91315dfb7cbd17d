"""A failover's preconditions that need no lab: the DR site's Ceph access
(absent, and a mon address that answers nothing: real librados, bounded by
the connect timeout) and the fencing epoch (which the database supplies).
The agents' check runs against a real agent in test_agent_booter.py; all
four through the API in api/tests/test_failover_api.py and, with real
agents and QEMU, api/tests/test_failover_lab.py."""

from __future__ import annotations

import time

import pytest
from cutpoint.coordinator.dr import preconditions as pre
from cutpoint.coordinator.dr.site import CephConnection, CephSite


def test_no_ceph_access_configured() -> None:
    c = pre.dr_site_reachable(None, "dr", ["rbd"], "site 'dr' has no Ceph access: set it "
                              "with PATCH /v1/sites/2 (site_has_no_ceph)")
    assert (c.name, c.status, c.code, c.unavailable) == ("dr_site_reachable", "fail",
                                                         "no_ceph_site", False)
    assert c.message == "site 'dr' has no Ceph access: set it with PATCH /v1/sites/2 " \
        "(site_has_no_ceph)"
    c = pre.dr_site_reachable(None, "dr", ["rbd"])
    assert c.message == "site 'dr' has no Ceph access configured"


def test_a_dr_site_that_answers_nothing_fails_within_its_connect_timeout() -> None:
    site = CephSite("dr", pools={"rbd": "rbd"}, mon_host=("v2:127.0.0.1:9",),
                    connect_timeout_s=2)
    ceph = CephConnection(site)
    t0 = time.monotonic()
    try:
        c = pre.dr_site_reachable(ceph, "dr", ["rbd"])
    finally:
        ceph.close()
    took = time.monotonic() - t0
    assert (c.status, c.code, c.unavailable) == ("fail", "ceph_unreachable", True), c
    assert 1.5 < took < 2 * 2 + 5 + 1, took  # librados's timeout, within site.py's bound
    assert c.ms == pytest.approx(took * 1000, rel=0.2)
    assert c.detail["error"]["errno"] == 110


def _reserve_ok(n: int) -> None:
    assert n >= 1


@pytest.mark.parametrize(("state", "want"), [
    (pre.FencingState(0, None), ("pass", None, {"epoch": 1, "reuse": False})),
    (pre.FencingState(2, "primary", "succeeded"), ("pass", None, {"epoch": 3, "reuse": False})),
    (pre.FencingState(1, "dr", "succeeded"), ("fail", "already_failed_over", {"epoch": 1})),
    (pre.FencingState(1, "dr", None), ("fail", "already_failed_over", {"epoch": 1})),
    (pre.FencingState(1, "dr", "running"), ("fail", "failover_in_progress", {"epoch": 1})),
    (pre.FencingState(1, "dr", "failed"), ("pass", None, {"epoch": 1, "reuse": True})),
    # Another job's epoch, still running: refused; this job's own (its
    # worker died after taking it, the job is run again): reused.
    (pre.FencingState(1, "dr", "running", "other-job"),
     ("fail", "failover_in_progress", {"epoch": 1})),
    (pre.FencingState(1, "dr", "running", "this-job"), ("pass", None, {"epoch": 1, "reuse": True})),
])
def test_the_fencing_epoch(state: pre.FencingState, want: tuple[str, str | None,
                                                                 dict[str, object]]) -> None:
    c = pre.fencing_epoch_available(state, "dr", _reserve_ok, "this-job")
    assert (c.status, c.code, c.detail) == want, c


def test_an_epoch_the_database_refuses() -> None:
    def refuse(n: int) -> None:
        raise RuntimeError(f"UNIQUE constraint failed: fencing_epochs epoch {n}")

    c = pre.fencing_epoch_available(pre.FencingState(4, "primary"), "dr", refuse)
    assert (c.status, c.code) == ("fail", "epoch_unavailable")
    assert "fencing epoch 5 cannot be recorded" in c.message and "UNIQUE" in c.message


def test_first_failure_and_skips() -> None:
    checks = [pre.Check("a", pre.PASS), pre.skipped("b", "needs a"),
              pre.Check("c", pre.FAIL, "x"), pre.Check("d", pre.FAIL, "y")]
    first = pre.first_failure(checks)
    assert first is not None and first.name == "c"
    assert pre.first_failure(checks[:2]) is None
