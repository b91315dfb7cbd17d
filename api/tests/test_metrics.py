"""/metrics: the domain metrics come from the database."""

from __future__ import annotations

import datetime as dt
from typing import Any

from cutpoint.api.models import (
    Group,
    GroupSnapshot,
    Host,
    Policy,
    RpoMiss,
    Site,
    SnapState,
    utcnow,
)


def test_metrics_from_database(api: Any, session_factory: Any) -> None:
    now = utcnow()
    with session_factory() as s:
        g = Group(name="m")
        g.policy = Policy(rpo_seconds=30)
        s.add(g)
        s.flush()
        for i, (pause, state) in enumerate([(3.0, SnapState.committed),
                                            (40.0, SnapState.committed),
                                            (None, SnapState.aborted)]):
            s.add(GroupSnapshot(group_id=g.id, txn=f"m{i}", state=state, max_pause_ms=pause,
                                cut_at=now - dt.timedelta(seconds=10 - i)))
        s.add(RpoMiss(group_id=g.id, reason="snapshot_aborted:connect", rpo_seconds=30))
        site = Site(name="s")
        s.add(site)
        s.flush()
        s.add(Host(name="h", site_id=site.id, address="10.0.0.1", reachable=False))
        s.commit()
    text = api.client.get("/metrics").text
    assert 'cutpoint_pause_seconds_bucket{group="m",le="0.005"} 1.0' in text
    assert 'cutpoint_pause_seconds_bucket{group="m",le="0.05"} 2.0' in text
    assert 'cutpoint_pause_seconds_count{group="m"} 2.0' in text
    assert 'cutpoint_pause_seconds_sum{group="m"} 0.043' in text
    assert 'cutpoint_group_snapshots{group="m",state="committed"} 2.0' in text
    assert 'cutpoint_group_snapshots{group="m",state="aborted"} 1.0' in text
    assert 'cutpoint_rpo_misses_total{group="m",reason="snapshot_aborted:connect"} 1.0' in text
    assert 'cutpoint_agent_reachable{host="h",site="s"} 0.0' in text
    assert 'cutpoint_rpo_target_seconds{group="m"} 30.0' in text
    line = next(ln for ln in text.splitlines()
                if ln.startswith('cutpoint_achieved_rpo_seconds{group="m"}'))
    assert 8.0 <= float(line.split()[-1]) < 60.0
