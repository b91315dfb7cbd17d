"""Sending webhook deliveries: signed, retried with backoff, recorded.

Each pending delivery whose time has come is POSTed as JSON with:

    X-Cutpoint-Event: <event>
    X-Cutpoint-Delivery: <delivery id>
    X-Cutpoint-Timestamp: <unix seconds>
    X-Cutpoint-Signature: sha256=<hex HMAC-SHA256(secret, timestamp + "." + body)>

The receiver recomputes the HMAC over the timestamp and the raw body with
the shared secret, compares in constant time, and rejects old timestamps
(replays).  A 2xx answer delivers it; anything else (an error status, no
answer within 10 s, a refused connection, an unreadable secret file) is an
attempt that failed: the next one comes after 2^attempts seconds (at most
5 minutes), and after MAX_ATTEMPTS the delivery is `failed`.  The secret
is read from the subscription's file at each send and never logged.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from cutpoint.api.models import Webhook, WebhookDelivery, utcnow
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

MAX_ATTEMPTS = 8
TIMEOUT_S = 10.0
BATCH = 50
log = logging.getLogger("cutpoint.webhooks")


def signature(secret: bytes, timestamp: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret, timestamp.encode() + b"." + body,
                                hashlib.sha256).hexdigest()


def backoff_s(attempts: int) -> float:
    return float(min(2 ** attempts, 300))


@dataclass
class Sent:
    delivered: list[int] = field(default_factory=list)
    retrying: list[int] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)


def _send(w: Webhook, d: WebhookDelivery) -> tuple[int | None, str | None]:
    """One attempt: (HTTP status or None, error or None)."""
    try:
        secret = Path(w.secret_file).read_bytes().strip()
    except OSError as exc:
        return None, f"secret file {w.secret_file}: {exc.strerror or exc}"
    if not secret:
        return None, f"secret file {w.secret_file} is empty"
    body = json.dumps(d.payload, sort_keys=True, default=str).encode()
    ts = str(int(time.time()))
    headers = {"Content-Type": "application/json", "User-Agent": "cutpoint-webhook",
               "X-Cutpoint-Event": d.event, "X-Cutpoint-Delivery": str(d.id),
               "X-Cutpoint-Timestamp": ts, "X-Cutpoint-Signature": signature(secret, ts, body)}
    try:
        r = httpx.post(w.url, content=body, headers=headers, timeout=TIMEOUT_S,
                       follow_redirects=False)
    except httpx.HTTPError as exc:
        return None, f"{type(exc).__name__}: {exc}"[:500]
    if 200 <= r.status_code < 300:
        return r.status_code, None
    return r.status_code, f"HTTP {r.status_code}: {r.text[:200]}"


def deliver_due(sf: sessionmaker[Session], now: dt.datetime | None = None) -> Sent:
    """Send every delivery that is due (one attempt each)."""
    out = Sent()
    with sf() as s:
        due = list(s.scalars(select(WebhookDelivery)
                             .where(WebhookDelivery.state == "pending",
                                    WebhookDelivery.next_attempt_at <= (now or utcnow()))
                             .order_by(WebhookDelivery.id).limit(BATCH)))
        hooks = {w.id: w for w in s.scalars(select(Webhook).where(
            Webhook.id.in_({d.webhook_id for d in due})))}
        s.commit()  # no transaction held across the HTTP calls
        for d in due:
            status, error = _send(hooks[d.webhook_id], d)
            d.attempts += 1
            d.last_status, d.last_error = status, error
            if error is None:
                d.state, d.delivered_at = "delivered", utcnow()
                out.delivered.append(d.id)
            elif d.attempts >= MAX_ATTEMPTS:
                d.state = "failed"
                out.failed.append(d.id)
            else:
                d.next_attempt_at = utcnow() + dt.timedelta(seconds=backoff_s(d.attempts))
                out.retrying.append(d.id)
            log.info("event=webhook_attempt delivery=%s webhook=%s kind=%s attempt=%s "
                     "status=%s result=%s", d.id, d.webhook_id, d.event, d.attempts, status,
                     d.state if d.state != "pending" else "retry")
            s.commit()
    return out
