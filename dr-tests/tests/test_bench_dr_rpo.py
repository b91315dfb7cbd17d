"""Unit tests of the DR RPO benchmark's arithmetic (no lab): the per-interval
peaks (the histogram's definition), percentiles, and the table's verdict."""

from __future__ import annotations

import datetime as dt

from cutpoint.bench import dr_rpo as b

T0 = dt.datetime(2026, 11, 27, 16, 0, tzinfo=dt.UTC)


def at(s: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=s)


def test_peaks_are_reach_minus_newest_earlier_cut() -> None:
    # cut every 10 s, reached 3 s later; the third reached late (lag 12 s)
    pts = [(at(0), at(3)), (at(10), at(13)), (at(20), at(32)), (at(30), at(33))]
    assert b.peaks(pts) == [13.0, 22.0, 13.0]


def test_peaks_use_the_newest_cut_when_order_differs() -> None:
    # the snapshot cut at 10 is reached after the one cut at 20: the
    # interval that ends then had already the cut at 20
    pts = [(at(0), at(2)), (at(10), at(30)), (at(20), at(25))]
    assert b.peaks(pts) == [25.0, 10.0]


def test_pct_and_stats() -> None:
    xs = [float(x) for x in range(1, 101)]
    assert b.pct(xs, 50) == 51.0 and b.pct(xs, 99) == 99.0 and b.pct([], 50) is None
    st = b.stats([1.0, 3.0])
    assert st["n"] == 2 and st["max"] == 3.0 and st["mean"] == 2.0
    assert b.stats([])["p99"] is None


def _doc(p99: float) -> dict:
    st = {"n": 3, "p50": 12.0, "p99": p99, "max": p99, "mean": 12.0}
    phases = {k: st for k in ("capture_s", "commit_s", "queued_s", "job_to_copy_s", "copy_s",
                              "to_verified_s", "lag_s")}
    return {"config": {"rpo_s": 10, "minutes": 10.0, "sample_s": 1.0},
            "lab": {"vms": 10, "hosts": 2}, "dr_rpo_samples_s": st,
            "primary_rpo_samples_s": st, "dr_peaks_s": st, "primary_peaks_s": st,
            "phases_s": phases, "member_sync_s": st, "snapshots_committed": 60,
            "snapshots_not_committed": 0, "dr_points": 58, "dr_points_incremental": 58,
            "replicate_jobs_failed": 0, "bytes_changed_per_point": st}


def test_table_verdict() -> None:
    assert "p99 <= 15 s (per-interval peaks): met (14.00 s)" in b.table(_doc(14.0))
    assert "NOT met (16.50 s)" in b.table(_doc(16.5))


def test_config_refuses_bad_input() -> None:
    import pytest

    with pytest.raises(b.DrRpoError, match="minutes"):
        b.DrRpoConfig(minutes=0).validate()
    with pytest.raises(b.DrRpoError, match="rpo"):
        b.DrRpoConfig(rpo_s=0).validate()


def test_a_point_dr_retention_removed_still_counts_as_reached() -> None:
    from types import SimpleNamespace as NS

    t = dt.datetime(2026, 11, 28, 1, 0, tzinfo=dt.UTC)
    later = t + dt.timedelta(seconds=2)
    kept = NS(dr_verified_at=t)
    assert b._reached_dr(kept, []) == t
    gone = NS(dr_verified_at=None)
    members = [NS(attempt=1, state="failed", finished_at=t),
               NS(attempt=2, state="dr_deleted", finished_at=t),
               NS(attempt=2, state="dr_deleted", finished_at=later)]
    assert b._reached_dr(gone, members) == later
    # never verified: a member of the last attempt failed, or none copied
    assert b._reached_dr(gone, members[:1]) is None
    assert b._reached_dr(gone, []) is None
    members[2].state = "copying"
    assert b._reached_dr(gone, members) is None
