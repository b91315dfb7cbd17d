"""Unit tests of `cutpoint-lab bench pause-designs`' network hold (no lab):
the ICMP echo the pinger sends, the classification of its replies against
the hold windows, and the table that says whether any came through."""

from __future__ import annotations

from typing import Any

from cutpoint.bench import icmp_pinger, pause_designs, pause_designs_probe

# Two hold windows (the hold on for certain from the first time to the
# second) and a pinger's output: echo sent at, rtt ms, reply received at.
WINDOWS = [(100.000, 100.012), (200.000, 200.012)]
LINES = [
    "99.990000 0.500 99.990500",     # outside any window
    "100.005000 7.800 100.012800",   # held: came 0.8 ms after the release
    "200.001000 11.700 200.012700",  # held: came 0.7 ms after
    "200.004000 1.000 200.005000",   # came through the hold
    "lost 0",
]
OUT = "\n".join(LINES)


def test_an_echo_sums_to_zero_with_its_checksum() -> None:
    packet = icmp_pinger.echo(0x1234, 7)
    assert packet[0] == 8 and packet[1] == 0  # echo request, code 0
    assert icmp_pinger.checksum(packet) == 0
    assert icmp_pinger.echo(0x1234, 8) != packet


def test_replies_are_classified_by_the_window_their_echo_was_sent_in() -> None:
    r = pause_designs_probe.classify(OUT, WINDOWS)
    assert (r["replies_in_hold"], r["replies_outside"], r["lost"]) == (3, 1, 0)
    late = [round(x, 1) for x in r["arrival_after_release_ms"]]
    assert late == [0.8, 0.7, -7.0]


def _live_row(ping: dict[str, Any]) -> dict[str, Any]:
    def s(v: float) -> dict[str, float]:
        return {"p50": v, "p99": v, "max": v, "n": 20}
    return {"backend_latency_ms": 0, "design": "live", "pause_ms": s(1.2), "cut_ms": s(1.2),
            "stop_ms": s(0.0), "cont_ms": s(0.0), "backend_ms": s(12.0), "prepare_ms": s(95.0),
            "commit_ms": s(5.5), "hold_on_ms": s(0.5), "release_ms": s(0.6), "held_ms": s(12.4),
            "ping": ping}


def test_the_hold_table_counts_the_replies_that_came_through(capsys: Any) -> None:
    ping = pause_designs._ping(pause_designs_probe.classify(OUT, WINDOWS), print)
    assert ping["arrived_before_release"] == 1
    assert "1 of them before its release" in capsys.readouterr().out
    table = pause_designs.designs_table({"rows": [_live_row(ping)]})
    line = next(x for x in table.splitlines() if x.startswith("| +0 ms | 0.5"))
    assert line.split(" | ")[3:6] == ["3", "1", "0.7 / 0.8"], line


def test_without_a_hold_there_is_no_hold_table() -> None:
    row = _live_row({})
    del row["ping"]
    assert "network hold" not in pause_designs.designs_table({"rows": [row]})
