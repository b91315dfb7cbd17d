"""/v1/webhooks: subscriptions by admins only, validated (URL scheme, known
events, an absolute secret path); the secret is never accepted or shown;
`emit` records one delivery per subscription that wants the event, and
none for the others."""

from __future__ import annotations

import datetime as dt
from typing import Any

from cutpoint.api.models import (
    Group,
    GroupSnapshot,
    Policy,
    RpoMiss,
    SnapState,
    WebhookDelivery,
    utcnow,
)
from cutpoint.api.services import rpo, webhooks
from sqlalchemy import select


def test_subscriptions_validation_and_roles(api: Any) -> None:
    ok = {"name": "ops", "url": "https://hooks.example/cp", "events": ["drill.finished"],
          "secret_file": "/etc/cutpoint/hook.secret"}
    assert api.as_("operator").post("/v1/webhooks", json=ok).status_code == 403
    for bad, code in (({"url": "ftp://x/"}, 422), ({"url": "file:///etc/passwd"}, 422),
                      ({"events": []}, 422), ({"events": ["rpo.nope"]}, 400),
                      ({"secret_file": "relative/path"}, 422), ({"secret": "s3cr3t"}, 422)):
        r = api.post("/v1/webhooks", json={**ok, **bad})
        assert r.status_code == code, (bad, r.text)
    r = api.post("/v1/webhooks", json=ok)
    assert r.status_code == 201, r.text
    assert r.json()["events"] == ["drill.finished"] and "secret" not in r.json().get("url", "")
    assert api.post("/v1/webhooks", json=ok).status_code == 409
    assert api.as_("viewer").get("/v1/webhooks").json()["items"][0]["name"] == "ops"
    assert "rpo.breached" in api.as_("viewer").get("/v1/webhooks/events").json()
    assert api.as_("viewer").get("/v1/webhooks/ops/deliveries").json()["items"] == []
    assert api.get("/v1/webhooks/nope/deliveries").status_code == 404
    assert api.as_("operator").delete("/v1/webhooks/ops").status_code == 403
    assert api.delete("/v1/webhooks/ops").status_code == 204
    assert api.get("/v1/webhooks").json()["items"] == []


def test_emit_records_one_delivery_per_interested_subscription(api: Any,
                                                               session_factory: Any) -> None:
    for name, events in (("a", ["drill.finished"]), ("b", ["drill.finished", "rpo.breached"]),
                         ("c", ["rpo.breached"])):
        assert api.post("/v1/webhooks", json={
            "name": name, "url": "http://127.0.0.1:9/x", "events": events,
            "secret_file": "/nonexistent"}).status_code == 201
    with session_factory() as s:
        assert webhooks.emit(s, "drill.finished", {"job": "j1", "verdict": "passed"}) == 2
        s.commit()
        rows = list(s.scalars(select(WebhookDelivery)))
    assert len(rows) == 2 and {r.payload["verdict"] for r in rows} == {"passed"}
    assert all(r.state == "pending" and r.attempts == 0 for r in rows)
    assert webhooks.for_job("replicate", "succeeded") is None
    assert webhooks.for_job("replicate", "failed") == "replication.failed"
    assert webhooks.for_job("drill", "succeeded") == "drill.finished"


def test_the_first_recovery_point_after_a_miss_is_rpo_recovered(api: Any,
                                                                 session_factory: Any) -> None:
    assert api.post("/v1/webhooks", json={
        "name": "r", "url": "http://127.0.0.1:9/x", "events": ["rpo.recovered"],
        "secret_file": "/nonexistent"}).status_code == 201
    now = utcnow()
    with session_factory() as s:
        g = Group(name="rec")
        g.policy = Policy(rpo_seconds=30)
        s.add(g)
        s.flush()

        def point(txn: str, ago_s: float) -> GroupSnapshot:
            snap = GroupSnapshot(group_id=g.id, txn=txn, state=SnapState.committed,
                                 cut_at=now - dt.timedelta(seconds=ago_s))
            s.add(snap)
            s.flush()
            return snap

        point("p1", 120)
        assert rpo.note_recovery(s, g, point("p2", 90)) is False  # no miss in between
        s.add(RpoMiss(group_id=g.id, at=now - dt.timedelta(seconds=50),
                      reason="scheduler_late", rpo_seconds=30))
        s.flush()
        assert rpo.note_recovery(s, g, point("p3", 10)) is True   # the miss, then a point
        assert rpo.note_recovery(s, g, point("p4", 5)) is False   # already recovered
        s.commit()
        rows = list(s.scalars(select(WebhookDelivery)))
    assert [r.payload["recovery_point"] for r in rows] == ["p3"], [r.payload for r in rows]
    assert rows[0].event == "rpo.recovered" and rows[0].payload["group"] == "rec"


def test_cert_expiring_once_per_subscription_and_certificate(api: Any,
                                                             session_factory: Any) -> None:
    from cutpoint.api.models import Host, Site

    for name, events in (("certs", ["cert.expiring"]), ("other", ["drill.finished"])):
        assert api.post("/v1/webhooks", json={
            "name": name, "url": "https://hooks.example/cp", "events": events,
            "secret_file": "/etc/cutpoint/hook.secret"}).status_code == 201
    now = utcnow()
    with session_factory() as s:
        site = Site(name="ce")
        s.add(site)
        s.flush()
        s.add_all([Host(name="soon", site_id=site.id, address="10.0.0.7",
                        cert_not_after=now + dt.timedelta(days=5)),
                   Host(name="later", site_id=site.id, address="10.0.0.8",
                        cert_not_after=now + dt.timedelta(days=30))])
        s.commit()
        assert webhooks.cert_expiring(s, now) == 1
        s.commit()
        assert webhooks.cert_expiring(s, now + dt.timedelta(hours=1)) == 0  # told already
        rows = list(s.scalars(select(WebhookDelivery).where(
            WebhookDelivery.event == "cert.expiring")))
        assert [(r.payload["host"], r.payload["days_left"]) for r in rows] == [("soon", 5.0)]
        # a renewed certificate that expires soon again is a new event
        h = s.scalar(select(Host).where(Host.name == "soon"))
        assert h is not None
        h.cert_not_after = now + dt.timedelta(days=6)
        s.commit()
        assert webhooks.cert_expiring(s, now) == 1
        # and "later" once it is within the window
        assert webhooks.cert_expiring(s, now + dt.timedelta(days=20)) == 1
