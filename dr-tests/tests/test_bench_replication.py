"""Unit tests of the replication benchmark's bookkeeping (no lab): the
per-round medians and spreads, the verdict taken from medians, the idle
check on recorded `ceph` replies, the rbd-mirror column, the write ceiling
fractions, the configuration checks, and the table."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from cutpoint.bench import replication_bench as rbench
from cutpoint.bench import replication_cluster as rc
from cutpoint.bench import replication_report as rb

MiB = rb.MiB
DATA = Path(__file__).parent / "data" / "ceph_replies"


def pair(sync_s: float, pipe_s: float, changed: int = 4 * MiB, shipped: int | None = None,
         first: str = "sync", busy: list[str] | None = None) -> rb.Pair:
    return rb.Pair(changed, changed if shipped is None else shipped, sync_s, pipe_s, first,
                   {"copy": sync_s * 500, "plan": 5.0}, busy=busy or [])


def test_round_reports_medians_and_spread() -> None:
    r = rb.Round(1024, "full", [pair(2.0, 7.0), pair(2.2, 2.1, first="pipeline"),
                                pair(9.0, 2.5)])
    row = r.row()
    assert (row["sync_s"], row["sync_min_s"], row["sync_max_s"]) == (2.2, 2.0, 9.0)
    assert (row["pipe_s"], row["pipe_min_s"], row["pipe_max_s"]) == (2.5, 2.1, 7.0)
    # one outlier each way does not decide: medians 2.2 vs 2.5
    assert row["speedup"] == pytest.approx(2.5 / 2.2, abs=1e-3)
    assert row["sync_wins"] == 1 and row["n"] == 3
    assert row["sync_phase_ms"] == {"copy": 1100.0, "plan": 5.0}
    assert [p["first"] for p in row["pairs"]] == ["sync", "pipeline", "sync"]
    assert row["sync_mbps"] == pytest.approx(4 / 2.2, abs=0.1)


def test_verdict_uses_medians_not_totals() -> None:
    # cutpoint-sync loses one full copy badly (a disturbed sample) but its
    # median is faster: the old sum-of-samples verdict would say not met.
    full = rb.Round(1024, "full", [pair(7.0, 2.0, 1024 * MiB), pair(2.0, 2.4, 1024 * MiB),
                                   pair(1.9, 2.3, 1024 * MiB)], identical=True)
    inc = rb.Round(1024, "+4 MiB/64K", [pair(0.08, 0.09), pair(0.09, 0.08),
                                         pair(0.08, 0.10)], identical=True)
    s = rb.summarize([full, inc])
    assert sum(p.sync_s for p in full.pairs) > sum(p.pipe_s for p in full.pairs)
    assert s["throughput_ratio_sync_over_pipeline"] == pytest.approx((2.3 + 0.09) / 2.08, 1e-3)
    assert s["target_throughput_met"] is True
    assert (s["rounds_sync_not_slower"], s["rounds"]) == (2, 2)
    assert (s["pairs_sync_not_slower"], s["pairs"]) == (4, 6)
    assert s["full_ratio"] == pytest.approx(2.3 / 2.0, 1e-3)
    assert s["all_identical"] is True and s["target_ratio_met"] is True


def test_verdict_not_met_when_median_slower() -> None:
    full = rb.Round(256, "full", [pair(1.0, 0.6), pair(0.5, 0.6), pair(1.1, 0.55)],
                    identical=True)
    s = rb.summarize([full])
    assert s["target_throughput_met"] is False
    assert s["throughput_ratio_sync_over_pipeline"] == pytest.approx(0.6, 1e-3)
    # no incremental round: the shipped/changed target cannot be claimed
    assert s["target_ratio_met"] is False and s["shipped_over_changed"] is None


def test_shipped_ratio_is_checked_per_pair() -> None:
    ok = rb.Round(256, "+4 MiB/64K", [pair(0.1, 0.1), pair(0.1, 0.1)], identical=True)
    bad = rb.Round(256, "+16 MiB/1024K",
                   [pair(0.1, 0.1, 16 * MiB), pair(0.1, 0.1, 16 * MiB, shipped=18 * MiB)],
                   identical=False)
    s = rb.summarize([ok, bad])
    assert s["max_pair_ratio"] == pytest.approx(18 / 16, 1e-3)
    assert s["target_ratio_met"] is False
    assert s["all_identical"] is False


def test_median_refuses_nothing() -> None:
    with pytest.raises(ValueError):
        rb.median([])


def _reply(name: str) -> Any:
    return json.loads((DATA / name).read_text())


def test_busy_reasons_idle_cluster() -> None:
    # `ceph pg ls --format json` of a lab site (Pacific), idle
    assert rc.busy_reasons(_reply("pg_ls_idle.json")) == []


def test_busy_reasons_while_trimming() -> None:
    # the same, recorded while the OSD trimmed the bench's removed snapshots
    why = rc.busy_reasons(_reply("pg_ls_snaptrim.json"))
    assert why and any("snaptrim" in w for w in why), why


def test_busy_reasons_counts_queued_trims_of_clean_pgs() -> None:
    # A PG whose state still reads active+clean but has snapshots queued
    # (the state is reported a moment later) is busy.
    reply = _reply("pg_ls_idle.json")
    reply["pg_stats"][0]["snaptrimq_len"] = 3
    assert rc.busy_reasons(reply) == ["3 snapshots queued for trimming"]
    reply["pg_stats"][1]["state"] = "active+clean+snaptrim_wait"
    assert rc.busy_reasons(reply)[0] == "1 pg active+clean+snaptrim_wait"


def test_table_shows_median_and_spread() -> None:
    r = rb.Round(1024, "full", [pair(2.0, 7.0, 1024 * MiB), pair(2.2, 2.1, 1024 * MiB),
                                pair(9.0, 2.5, 1024 * MiB)], identical=True)
    doc = {"rounds": [r.row()], "summary": rb.summarize([r])}
    text = rb.table(doc)
    assert "| 1024 | full | 3 | 1024.0 | 1.000 | 2.20 (2.00–9.00) |" in text
    assert "2.50 (2.10–7.00)" in text and "1/3" in text
    # no incremental round: nothing to claim
    assert "targets judged on cutpoint-sync: incremental >= 1.5x export-diff: NOT met" in text
    assert "faster than rbd-mirror: not measured" in text


def test_rbd_mirror_column_and_verdicts() -> None:
    def mp(sync_s: float, pipe_s: float, mirror_s: float | None) -> rb.Pair:
        p = pair(sync_s, pipe_s)
        p.mirror_s, p.mirror_snap_ms = mirror_s, 12.0
        return p

    full = rb.Round(256, "full", [mp(1.0, 1.2, 2.0), mp(1.0, 1.1, None)], identical=True)
    inc = rb.Round(256, "+4 MiB/64K", [mp(0.10, 0.16, 0.08), mp(0.10, 0.15, 0.09),
                                        mp(0.11, 0.16, 0.07)], identical=True)
    row = inc.row()
    assert row["mirror_n"] == 3 and row["mirror_s"] == 0.08
    assert row["speedup_vs_mirror"] == pytest.approx(0.08 / 0.10, 1e-3)
    assert row["sync_wins_vs_mirror"] == 0 and row["io_kib"] == 64
    assert full.row()["mirror_n"] == 1 and full.row()["io_kib"] == 4096
    s = rb.summarize([full, inc])
    assert s["incremental_ratio"] == pytest.approx(1.6, 1e-3)
    assert s["target_incremental_1_5_met"] is True
    assert s["incremental_ratio_vs_mirror"] == pytest.approx(0.8, 1e-3)
    assert s["target_beats_mirror_met"] is False
    doc = {"rounds": [full.row(), inc.row()], "summary": s,
           "ceiling_mbps": {"64": 40.0, "4096": 200.0}}
    text = rb.table(doc)
    assert "rbd-mirror snapshot s median" in text
    assert "0.08 (0.07–0.09, n=3)" in text
    # 4 MiB in 0.10 s = 40 MiB/s: all of the 64 KiB ceiling
    assert "40.0 (100%)" in text
    assert "faster than rbd-mirror: NOT met" in text


def test_serve_column_decides_the_targets_when_measured() -> None:
    def sp(sync_s: float, pipe_s: float, serve_s: float, mirror_s: float) -> rb.Pair:
        p = pair(sync_s, pipe_s)
        p.serve_s, p.mirror_s = serve_s, mirror_s
        p.serve_phase_ms = {"connect": 2.0, "copy": serve_s * 500}
        return p

    # one-shot runs lose to both baselines, the serve session beats both
    inc = rb.Round(256, "+4 MiB/64K", [sp(0.12, 0.10, 0.05, 0.08), sp(0.13, 0.11, 0.06, 0.07),
                                        sp(0.12, 0.10, 0.05, 0.08)], identical=True)
    row = inc.row()
    assert row["serve_n"] == 3 and row["serve_s"] == 0.05
    assert row["speedup_serve"] == pytest.approx(0.10 / 0.05, 1e-3)
    assert row["speedup_serve_vs_mirror"] == pytest.approx(0.08 / 0.05, 1e-3)
    assert row["serve_phase_ms"] == {"connect": 2.0, "copy": 25.0}
    s = rb.summarize([inc])
    assert s["incremental_ratio"] < 1 and s["incremental_ratio_vs_mirror"] < 1
    assert s["incremental_ratio_serve"] == pytest.approx(2.0, 1e-3)
    assert s["target_method"] == "cutpoint-sync --serve"
    assert s["target_incremental_1_5_met"] is True and s["target_beats_mirror_met"] is True
    text = rb.table({"rounds": [row], "summary": s})
    assert "0.050 (0.050–0.060) | 80.0 | 2.00x" in text
    assert "targets judged on cutpoint-sync --serve" in text


def test_without_rbd_mirror_no_column_and_no_verdict() -> None:
    inc = rb.Round(256, "+4 MiB/64K", [pair(0.1, 0.1)], identical=True)
    s = rb.summarize([inc])
    assert s["incremental_ratio_vs_mirror"] is None and s["target_beats_mirror_met"] is None
    text = rb.table({"rounds": [inc.row()], "summary": s})
    assert "rbd-mirror snapshot s" not in text and "faster than rbd-mirror: not measured" in text


def test_config_checks_baselines_and_dr_budget() -> None:
    rbench.BenchConfig(baselines=["export-diff", "rbd-mirror"]).validate()  # 4 x 768 MiB
    with pytest.raises(ValueError, match="held 4 times at DR"):
        rbench.BenchConfig(sizes_mib=[256, 1024],
                           baselines=["export-diff", "rbd-mirror"]).validate()
    with pytest.raises(ValueError, match="held 3 times at DR"):
        rbench.BenchConfig(sizes_mib=[256, 1024]).validate()
    with pytest.raises(ValueError, match="--baseline"):
        rbench.BenchConfig(baselines=["export-diff", "zerto"]).validate()
    with pytest.raises(ValueError, match="repeats"):
        rbench.BenchConfig(repeats=0).validate()


def test_rbd_bench_rate_parsed() -> None:
    # the last line of Pacific's `rbd bench --io-type write`
    out = ("bench  type write io_size 65536 io_threads 16 bytes 268435456 pattern random\n"
           "  SEC       OPS   OPS/SEC   BYTES/SEC\n"
           "    1      2480   2489.02   156 MiB/s\n"
           "elapsed: 1   ops: 4096   ops/sec: 2522.9   bytes/sec: 165347696.64\n")
    assert rc.bench_rate(out) == pytest.approx(165347696.64)
    assert rc.bench_rate("elapsed: 2  ops: 64  ops/sec: 30.1  bytes/sec: 120 MiB/s\n") \
        == 120 * MiB
    assert rc.bench_rate("no summary") is None
