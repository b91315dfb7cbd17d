"""Unit tests of the group snapshot benchmark helpers (no lab): statistics,
VM spreading over hosts, and the tables built from recorded documents."""

from __future__ import annotations

import pytest
from cutpoint.bench import groupsnap as gs


def test_percentile_nearest_rank() -> None:
    xs = [float(x) for x in range(1, 101)]
    assert gs.percentile(xs, 50) == 50.0
    assert gs.percentile(xs, 99) == 99.0
    assert gs.percentile(xs, 100) == 100.0
    assert gs.percentile([7.0], 99) == 7.0
    assert gs.percentile([], 50) is None
    s = gs.summary([3.0, 1.0, 2.0])
    assert (s["n"], s["p50"], s["max"], s["mean"]) == (3, 2.0, 3.0, 2.0)


def status_with(hosts: int, per_host: int) -> dict[str, object]:
    vms = [{"name": f"primary-h{h}-vm{i}", "host": f"primary-h{h}", "site": "primary"}
           for h in range(1, hosts + 1) for i in range(1, per_host + 1)]
    return {"vms": vms}


def test_spread_vms_round_robin_over_hosts() -> None:
    st = status_with(3, 4)
    assert gs.spread_vms(st, 2) == ["primary-h1-vm1", "primary-h2-vm1"]
    four = gs.spread_vms(st, 4)
    assert four[3] == "primary-h1-vm2"
    assert len({n.split("-vm")[0] for n in gs.spread_vms(st, 3)}) == 3
    with pytest.raises(gs.BenchError, match="12 primary VMs, 13 wanted"):
        gs.spread_vms(st, 13)


def test_pause_config_lab_params() -> None:
    cfg = gs.PauseConfig(vms=[2, 4, 10], hosts=3)
    assert cfg.lab_params()["vms_per_host"] == 4


def test_tables() -> None:
    row = {"vms": 2, "disks": 6, "hosts": 2, "committed": 20, "aborted": 0,
           "pause_path": "redirect", "paths": {"redirect": 38, "in_pause": 2}}
    for k in ("pause_ms", "snapshot_ms", "overhead_ms", "total_ms"):
        row[k] = gs.summary([10.0, 20.0])
    t = gs.pause_table({"rows": [row]})
    assert "| redirect (in_pause 2, redirect 38) | 2 | 6 | 2 | 10.0 / 20.0 / 20.0 |" in t
    # the pause's parts, "-" where a run did not record them (older JSON)
    assert "| +0 ms | redirect | " + " | ".join(["- / -"] * 9) + " |" in t
    row.update({k: gs.summary([1.0, 3.0]) for k in (
        "stop_ms", "switch_ms", "barrier_ms", "cont_ms", "prestop_ms", "journal_ms",
        "prepare_ms", "agent_skew_ms", "log_commit_ms")})
    t = gs.pause_table({"rows": [row]})
    assert "| +0 ms | redirect | " + " | ".join(["1.0 / 3.0"] * 9) + " |" in t
    assert gs._per_agent({"prepared_ms:h1": 3.0, "prepared_ms:h2": 5.0, "total_ms": 9.0}) == \
        {"prepared_ms": {"h1": 3.0, "h2": 5.0}}
    doc = {"config": {"interval_s": 10.0}, "ratio": 0.7, "cycle_ratios": [0.7],
           "phases": [
               {"phase": "baseline-1", "seconds": 60, "records": 600, "records_per_s": 10.0,
                "snapshots": 0, "pause_ms": gs.summary([]), "loadavg_1m": 1.5},
               {"phase": "snapshots-1", "seconds": 60, "records": 420, "records_per_s": 7.0,
                "snapshots": 6, "pause_ms": gs.summary([50.0]), "loadavg_1m": 2.0,
                "paths": {"redirect": 12}}]}
    t = gs.overhead_table(doc)
    assert "| snapshots-1 | 60 | 420 | 7.0 | 6 | 50.0 / 50.0 | redirect 12 | 2.00 |" in t
    assert "| baseline-1 | 60 | 600 | 10.0 | 0 | - / - | - | 1.50 |" in t
    assert "70.0% of the baseline" in t and "per cycle: 70%" in t


def test_overhead_judges_each_snapshot_phase_against_the_baselines_around_it() -> None:
    # A machine slowing down by 10 records/s per phase, snapshots costing
    # nothing: each cycle's own pair says 90% and 87.5%, the bracketed
    # ratios say 100%.
    base, snap = [100.0, 80.0, 60.0], [90.0, 70.0]
    r = gs.overhead_ratios(base, snap)
    assert r["ratio"] == 1.0
    assert r["cycle_ratios"] == [0.9, 0.875]
    assert r["bracketed_ratios"] == [1.0, 1.0]
    assert r["bracketed_median"] == 1.0
    # Snapshots that cost 10%: the bracketed median shows it, and the
    # table says the goal is not met.
    r = gs.overhead_ratios(base, [81.0, 63.0])
    assert [round(x, 3) for x in r["bracketed_ratios"]] == [0.9, 0.9]
    doc = {"config": {"interval_s": 10.0}, "phases": [], **r}
    t = gs.overhead_table(doc)
    assert "median 90.0%" in t and "goal >= 97%: NOT met" in t
    doc = {"config": {"interval_s": 10.0}, "phases": [], **gs.overhead_ratios(base, snap)}
    assert "goal >= 97%: met" in gs.overhead_table(doc)


def test_a_bench_of_the_redirect_path_runs_qemu_vms() -> None:
    # Only the qmp driver redirects: on the lab's default (libvirt) every
    # member would take the cut in the pause, and the row would say redirect.
    assert gs.OverheadConfig(pause_path="redirect").lab_params()["driver"] == "qemu"
    assert "driver" not in gs.OverheadConfig(pause_path="in_pause").lab_params()
    assert "driver" not in gs.OverheadConfig().lab_params()
    assert gs.PauseConfig(vms=[2], pause_paths=["redirect", "in_pause"]) \
        .lab_params()["driver"] == "qemu"
    assert "driver" not in gs.PauseConfig(vms=[2], pause_paths=["in_pause"]).lab_params()
