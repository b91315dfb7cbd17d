"""The site check's snapshot_latency step on replies recorded from the lab's
real Ceph (test_site_lab.py with CUTPOINT_RECORD=1; site_check_replay.py):
the same calls in the same order, the timings as Ceph took them, and what
the check says the in_pause path would pause at that site."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from cutpoint.coordinator.dr.site import CephSite
from cutpoint.coordinator.dr.site_check import (
    IN_PAUSE_OVERHEAD_MS,
    LATENCY_SAMPLES,
    check_site,
    percentile,
)
from site_check_replay import Replay

DATA = Path(__file__).parent / "data"
# Never connected: every call is replayed.
SITE = CephSite("dr", pools={"rbd": "rbd"}, mon_host=("v2:127.0.0.1:1",))
RECORDINGS = ["site_check_tuned.json", "site_check_paxos500.json"]


def calls(name: str) -> list[dict[str, Any]]:
    return list(json.loads((DATA / name).read_text())["calls"])


def timed(cs: list[dict[str, Any]]) -> list[float]:
    """The recorded times of the latency step's snapshots."""
    return [c["ms"] for c in cs if c["call"] == "create_snapshot"
            and c["args"][2].startswith("cutpoint-check-lat")]


@pytest.mark.parametrize("recording", RECORDINGS)
def test_the_latency_is_what_ceph_took(recording: str) -> None:
    cs = calls(recording)
    rp = Replay(SITE, cs)
    r = check_site(SITE, replication_target=True, ceph=rp, clock=rp.clock)  # type: ignore[arg-type]
    assert r.ok, r.as_dict()
    assert rp.calls == [], "the check made fewer calls than were recorded"
    (lat,) = r.as_dict()["snapshot_latency"]
    want = timed(cs)
    assert len(want) == LATENCY_SAMPLES
    assert lat["samples_ms"] == pytest.approx(want, abs=0.06)
    assert lat["p50_ms"] == pytest.approx(sorted(want)[LATENCY_SAMPLES // 2], abs=0.06)
    assert lat["p99_ms"] == pytest.approx(max(want), abs=0.06)
    assert lat["in_pause_pause_p99_ms"] == pytest.approx(max(want) + IN_PAUSE_OVERHEAD_MS[1],
                                                         abs=0.2)
    step = next(s for s in r.steps if s.name == "snapshot_latency")
    assert step.status == "pass" and "the in_pause path would pause each VM" in step.detail
    print(step.detail)


def test_the_estimate_follows_the_site() -> None:
    """Recorded at the tuned mon and at +500 ms of propose interval: the
    second site's in_pause pause is the longer, by about the added time."""
    lo, hi = (timed(calls(n)) for n in RECORDINGS)
    assert percentile(hi, 50) - percentile(lo, 50) > 250


def test_a_failed_sample_removes_the_ones_made() -> None:
    """Derived from the tuned recording: the third timed snapshot fails
    (the recorded error of a stopped OSD's class, EIO here); the two made
    are removed, then the scratch snapshot and image, and the check fails
    at snapshot_latency and skips write and diff."""
    cs = calls("site_check_tuned.json")
    lat = [i for i, c in enumerate(cs) if c["call"] == "create_snapshot"
           and c["args"][2].startswith("cutpoint-check-lat")]
    head = cs[:lat[2]]
    fail = copy.deepcopy(cs[lat[2]])
    del fail["ret"]
    fail["error"] = {"class": "CephError", "op": "create snapshot",
                     "obj": f"rbd/{fail['args'][1]}@{fail['args'][2]}", "errno": 5,
                     "site": "dr", "detail": ""}
    removes = [c for c in cs if c["call"] == "remove_snapshot"]
    tail = [removes[0], removes[1], removes[-1]] + [c for c in cs if c["call"] in
                                                  ("remove_image", "close")]
    rp = Replay(SITE, head + [fail] + tail)
    r = check_site(SITE, replication_target=True, ceph=rp, clock=rp.clock)  # type: ignore[arg-type]
    assert rp.calls == []
    assert not r.ok and r.failed is not None and r.failed.name == "snapshot_latency"
    st = {s.name: s.status for s in r.steps}
    assert (st["write"], st["diff"], st["remove_snapshot"], st["remove_image"]) == \
        ("skip", "skip", "pass", "pass")
    assert r.as_dict()["snapshot_latency"] == []
