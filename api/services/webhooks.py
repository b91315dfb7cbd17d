"""Webhook subscriptions, and the one call that records an event for them.

`emit(session, event, payload)` adds one pending delivery per subscription
that wants `event`, in the caller's transaction: the event is recorded if
and only if what it reports is.  The worker sends them
(`services/webhook_delivery.py`).  Events:

- `rpo.breached`: a group missed its RPO (with the reason);
- `rpo.recovered`: the first recovery point after a miss;
- `replication.failed`: a replicate job failed;
- `drill.finished`: a drill job ended (its verdict);
- `failover.finished`, `failback.finished`: the job ended (its state, RTO);
- `cert.expiring`: an agent's certificate, as it presented it at the last
  inventory pull, expires within CERT_WARN_DAYS (`cert_expiring`, sent by
  the webhook tick once per subscription and certificate).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from cutpoint.api.errors import ApiError
from cutpoint.api.models import Host, Webhook, WebhookDelivery, as_utc, utcnow
from cutpoint.api.services.common import add_unique, get_or_404
from sqlalchemy import select
from sqlalchemy.orm import Session

EVENTS = ("rpo.breached", "rpo.recovered", "replication.failed", "drill.finished", "failover.finished",
          "failback.finished", "cert.expiring")
# As the CutpointAgentCertExpiring alert (api/monitoring/alerts.yml).
CERT_WARN_DAYS = 14
# The job kinds whose end is an event, and when: (event, on failure only).
JOB_EVENTS = {"replicate": ("replication.failed", True), "drill": ("drill.finished", False),
              "failover": ("failover.finished", False),
              "failback": ("failback.finished", False)}


def create(session: Session, name: str, url: str, events: list[str],
           secret_file: str) -> Webhook:
    unknown = sorted(set(events) - set(EVENTS))
    if unknown:
        raise ApiError(f"unknown event(s) {', '.join(unknown)}; known: {', '.join(EVENTS)}",
                       code="unknown_event")
    return add_unique(session, Webhook(name=name, url=url, events=sorted(set(events)),
                                       secret_file=secret_file), "webhook", name)


def resolve(session: Session, ref: str) -> Webhook:
    if ref.isdigit():
        return get_or_404(session, Webhook, int(ref), "webhook")
    w = session.scalar(select(Webhook).where(Webhook.name == ref))
    if w is None:
        return get_or_404(session, Webhook, -1, "webhook")  # the usual 404
    return w


def delete(session: Session, w: Webhook) -> None:
    session.delete(w)
    session.commit()


def emit(session: Session, event: str, payload: dict[str, Any]) -> int:
    """Record `event` for every subscription that wants it (no commit:
    it goes with the caller's).  Returns how many deliveries it added."""
    assert event in EVENTS, event
    n = 0
    body = {"event": event, "at": utcnow().isoformat(), **payload}
    for w in session.scalars(select(Webhook)):
        if event in (w.events or []):
            session.add(WebhookDelivery(webhook_id=w.id, event=event, payload=body))
            n += 1
    return n


def cert_expiring(session: Session, now: dt.datetime | None = None) -> int:
    """`cert.expiring` for every host whose agent certificate expires within
    CERT_WARN_DAYS, to each subscription that wants it and was not yet told
    of that certificate (host and expiry); no commit.  Returns how many
    deliveries it added."""
    now = now or utcnow()
    horizon = now + dt.timedelta(days=CERT_WARN_DAYS)
    hosts = [h for h in session.scalars(select(Host).where(Host.cert_not_after.is_not(None)))
             if h.cert_not_after is not None and as_utc(h.cert_not_after) <= horizon]
    wanting = [w for w in session.scalars(select(Webhook)) if "cert.expiring" in (w.events or [])]
    if not hosts or not wanting:
        return 0
    told = {(d.webhook_id, d.payload.get("host"), d.payload.get("not_after"))
            for d in session.scalars(select(WebhookDelivery).where(
                WebhookDelivery.event == "cert.expiring"))}
    n = 0
    for h in hosts:
        assert h.cert_not_after is not None
        expiry = as_utc(h.cert_not_after)
        not_after = expiry.isoformat()
        body = {"event": "cert.expiring", "at": now.isoformat(), "host": h.name,
                "site": h.site.name, "not_after": not_after,
                "days_left": round((expiry - now).total_seconds() / 86400, 1)}
        for w in wanting:
            if (w.id, h.name, not_after) not in told:
                session.add(WebhookDelivery(webhook_id=w.id, event="cert.expiring", payload=body))
                n += 1
    return n



def for_job(kind: str, state: str) -> str | None:
    """The event a job of `kind` that ended in `state` emits, if any."""
    ev = JOB_EVENTS.get(kind)
    if ev is None or (ev[1] and state != "failed"):
        return None
    return ev[0]


def job_payload(job: Any, group: str | None) -> dict[str, Any]:
    """What a job's event says: the job, its group and outcome, and the
    result's headline figures (a drill's verdict, a failover's RTO)."""
    r = job.result or {}
    headline = {k: r[k] for k in ("verdict", "rto_s", "recovery_point", "drill_id")
                if k in r}
    return {"job": job.id, "kind": job.kind, "state": job.state.value, "group": group,
            "error_code": job.error_code, "error": (job.error or "")[:500] or None,
            "result": headline}
