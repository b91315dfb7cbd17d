"""Monitoring that matches the code: `promtool check metrics` on the API's
/metrics (with data in every family), `promtool test rules` on the shipped
alert rules, and every metric the dashboard and the rules name exists in
what the API and the worker export."""

from __future__ import annotations

import datetime as dt
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from cutpoint.api.models import (
    Group,
    GroupSnapshot,
    Host,
    Job,
    JobState,
    Policy,
    RpoMiss,
    Site,
    SnapState,
    utcnow,
)
from test_metrics_dr import seed_dr

MON = Path(__file__).resolve().parents[1] / "monitoring"
WORKER_METRICS = {"cutpoint_task_runs_total", "cutpoint_task_seconds_bucket",
                  "cutpoint_task_seconds_sum", "cutpoint_task_seconds_count"}
pytestmark = pytest.mark.skipif(shutil.which("promtool") is None,
                                reason="promtool missing: run make setup")


def _seed(session_factory: Any) -> None:
    now = utcnow()
    with session_factory() as s:
        g = Group(name="m")
        g.policy = Policy(rpo_seconds=30)
        s.add(g)
        s.flush()
        s.add(GroupSnapshot(group_id=g.id, txn="m0", state=SnapState.committed,
                            max_pause_ms=12.0, cut_at=now - dt.timedelta(seconds=40)))
        s.add(RpoMiss(group_id=g.id, reason="scheduler_late", rpo_seconds=30))
        s.add(Job(id="00000000-0000-4000-8000-00000000000a", kind="replicate",
                  state=JobState.failed, error_code="copy_failed", group_id=g.id))
        site = Site(name="s")
        s.add(site)
        s.flush()
        s.add(Host(name="h", site_id=site.id, address="10.0.0.1", reachable=True))
        s.commit()
    seed_dr(session_factory)  # the DR, drill and job families


def test_api_metrics_pass_promtool(api: Any, session_factory: Any) -> None:
    _seed(session_factory)
    text = api.client.get("/metrics").text
    r = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True,
                       text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stdout + r.stderr


def test_alert_rules_pass_their_tests() -> None:
    r = subprocess.run(["promtool", "test", "rules", "alerts.test.yml"], cwd=MON,
                       capture_output=True, text=True, timeout=120, check=False)
    print(r.stdout)
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr


def _names(expr: str) -> set[str]:
    return set(re.findall(r"\bcutpoint_[a-z_]+\b", expr))


def test_dashboard_and_rules_query_exported_metrics(api: Any, session_factory: Any) -> None:
    _seed(session_factory)
    exported = set(WORKER_METRICS)
    for ln in api.client.get("/metrics").text.splitlines():
        if ln.startswith("# TYPE cutpoint_"):  # every family, with or without samples
            _, _, name, kind = ln.split()
            exported |= {name, name + "_total"} if kind == "counter" else \
                {name, name + "_bucket", name + "_sum", name + "_count"}
    dash = json.loads((MON / "dashboard.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    rules = (MON / "alerts.yml").read_text()
    exprs += re.findall(r"expr: (.+)", rules)
    assert len(dash["panels"]) >= 6 and dash["uid"] == "cutpoint-overview"
    missing = {n for e in exprs for n in _names(e)} - exported
    assert not missing, f"queried but never exported: {sorted(missing)}"
