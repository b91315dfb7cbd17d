"""Unit tests of `cutpoint-lab bench scale` (no lab): the VM plan over the
hosts, the guest-less QEMU command line, and the table and goal check
built from a recorded document."""

from __future__ import annotations

from cutpoint.bench import scale as sb

STATUS = {
    "state_dir": "/var/lib/cutpoint/lab",
    "hosts": [{"name": f"primary-h{i}", "site": "primary", "address": f"10.77.1.{i}"}
              for i in range(1, 5)] + [{"name": "dr-h1", "site": "dr", "address": "10.77.2.1"}],
    "sites": {"primary": {"pool": "rbd", "ceph_conf": "/c/primary.conf", "client_id": "admin"}},
}


def test_plan_spreads_the_vms_round_robin_over_the_primary_hosts() -> None:
    vms = sb.plan(STATUS, sb.ScaleConfig(vms=[10, 25], disks=3, hosts=4))
    assert len(vms) == 25
    per_host = {h: sum(v["host"] == h for v in vms) for h in {v["host"] for v in vms}}
    assert per_host == {"primary-h1": 7, "primary-h2": 6, "primary-h3": 6, "primary-h4": 6}
    assert all(len(v["disks"]) == 3 for v in vms)
    assert len({d["image"] for v in vms for d in v["disks"]}) == 75
    assert vms[4]["name"] == "scale-primary-h1-vm2"


def test_qemu_has_no_machine_and_one_rbd_node_per_disk() -> None:
    vm = sb.plan(STATUS, sb.ScaleConfig(vms=[1], disks=2))[0]
    argv = sb.qemu_argv(vm, STATUS["sites"]["primary"])
    assert argv[argv.index("-machine") + 1] == "none"
    nodes = [argv[i + 1] for i, a in enumerate(argv) if a == "-blockdev"]
    assert [n.split(",")[1] for n in nodes] == ["node-name=disk0", "node-name=disk1"]
    assert all("driver=rbd" in n and "pool=rbd" in n for n in nodes)
    assert "-device" not in argv


def _row(vms: int, p99: float) -> dict[str, object]:
    s = {"p50": 1.0, "p99": p99}
    return {"vms": vms, "disks": 3 * vms, "hosts": 4, "committed": 10, "aborted": 0,
            **{k: s for k in ("pause_ms", "snapshot_ms", "overhead_ms", "total_ms",
                              "stop_ms", "barrier_ms", "cont_ms")}}


def test_table_states_the_goal_and_the_spread() -> None:
    doc = {"rows": [_row(10, 2.0), _row(100, 3.0)], "cpus": 2, "loadavg_1m": [1.0, 2.0],
           "qemu_rss_mib": 100.0, "agent_rtt_ms": {"p50": 0.2, "p99": 1.0},
           "goal": {"overhead_p99_max_ms": 2.4}, "overhead_p99_spread": 0.5}
    text = sb.scale_table(doc)
    assert "| 100 | 300 | 4 |" in text and "stop / barrier / cont" in text
    assert all(line.count("|") == 10 for line in text.splitlines()[:4])
    assert "2 x p50 + 2 ms = 2.40 ms" in text and "spread 50%" in text


def test_agent_settings_go_into_their_config_and_the_table() -> None:
    assert sb.agent_extra(sb.ScaleConfig()) == ""
    cfg = sb.ScaleConfig(pause_path="redirect", redirect_inline_max=0)
    assert sb.agent_extra(cfg) == "\n[agent]\npause_path = redirect\nredirect_inline_max = 0\n"
    row = {**_row(50, 2.0), "paths": {"redirect": 30, "in_pause": 20}}
    doc = {"rows": [row], "cpus": 2, "loadavg_1m": [1.0, 2.0], "qemu_rss_mib": 100.0,
           "agent_rtt_ms": {"p50": 0.2, "p99": 1.0}, "goal": {"overhead_p99_max_ms": 2.4},
           "overhead_p99_spread": 0.5,
           "config": {"pause_path": "redirect", "redirect_inline_max": 0}}
    text = sb.scale_table(doc)
    assert "pause_path redirect, redirect_inline_max 0" in text
    assert "50 VMs: in_pause 20, redirect 30" in text
