"""Webhooks end to end, with a real worker and beat on real Redis and a real
HTTP receiver: a replication that fails (the group has no DR target) is
delivered as `replication.failed`, signed with HMAC-SHA256 by the secret in
the subscription's file; the receiver refuses the first two attempts with
500, so the delivery is retried with backoff and recorded (3 attempts,
delivered).  The receiver checks the signature as a real one would, and a
tampered body does not verify (the negative control)."""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import json
import secrets
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from cutpoint.api import services_local
from cutpoint.api.models import Group, GroupSnapshot, Policy, SnapState, utcnow
from plane import Plane, admin_client, wait_for  # api/tests/plane.py
from test_worker import make_certs


class Receiver:
    """Answers 500 to the first `fail_first` POSTs, then 200; keeps them all."""

    def __init__(self, fail_first: int) -> None:
        self.fail_first = fail_first
        self.got: list[tuple[int, dict[str, str], bytes]] = []
        self.at: list[float] = []
        rcv = self

        class H(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                status = 500 if len(rcv.got) < rcv.fail_first else 200
                rcv.got.append((status, dict(self.headers), body))
                rcv.at.append(time.monotonic())
                self.send_response(status)
                self.end_headers()
                self.wfile.write(b"ok" if status == 200 else b"try later")

            def log_message(self, *_: Any) -> None:
                pass

        self.srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.srv.server_address[1]}/hook"
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()


def verify(secret: bytes, headers: dict[str, str], body: bytes) -> bool:
    """What a receiver does: HMAC over timestamp + "." + raw body, constant time."""
    want = "sha256=" + hmac.new(secret, headers["X-Cutpoint-Timestamp"].encode() + b"." + body,
                                hashlib.sha256).hexdigest()
    return hmac.compare_digest(want, headers["X-Cutpoint-Signature"])


@pytest.fixture
def plane(tmp_path: Path, local_services: services_local.Endpoints) -> Iterator[Plane]:
    with Plane(tmp_path, int(local_services.redis_port or 0), make_certs(tmp_path / "certs"),
               CUTPOINT_WEBHOOK_TICK_S="1", CUTPOINT_RETENTION_INTERVAL_S="3600",
               CUTPOINT_INVENTORY_INTERVAL_S="3600") as p:
        yield p


def test_a_failed_replication_is_delivered_signed_after_retries(plane: Plane,
                                                                tmp_path: Path) -> None:
    secret = secrets.token_hex(32).encode()
    sfile = tmp_path / "hook.secret"
    sfile.write_bytes(secret + b"\n")
    rcv = Receiver(fail_first=2)
    with plane.sf() as s:
        g = Group(name="hooked")
        g.policy = Policy(keep_last=5)
        s.add(g)
        s.flush()
        snap = GroupSnapshot(group_id=g.id, txn="t1", state=SnapState.committed,
                             cut_at=utcnow() - dt.timedelta(seconds=5))
        s.add(snap)
        s.commit()
        sid = snap.id
    plane.start("worker")
    plane.start("beat")
    with admin_client(plane) as c:
        r = c.post("/v1/webhooks", json={"name": "ops", "url": rcv.url,
                                         "events": ["replication.failed", "drill.finished"],
                                         "secret_file": str(sfile)})
        assert r.status_code == 201, r.text
        assert secret.decode() not in r.text
        job = c.post(f"/v1/snapshots/{sid}/replicate", json={}).json()
        wait_for(lambda: c.get(f"/v1/jobs/{job['id']}").json()["state"] == "failed", 60,
                 "the replication to fail", plane)
        wait_for(lambda: c.get("/v1/webhooks/ops/deliveries").json()["items"][0]["state"]
                 == "delivered", 60, "the delivery", plane)
        d = c.get("/v1/webhooks/ops/deliveries").json()["items"]
    print(f"\ndelivery: {json.dumps(d[0], default=str)[:600]}")
    assert len(d) == 1 and d[0]["event"] == "replication.failed", d
    assert d[0]["attempts"] == 3 and d[0]["last_status"] == 200, d
    assert [st for st, _, _ in rcv.got] == [500, 500, 200]
    for _, headers, body in rcv.got:
        assert headers["X-Cutpoint-Event"] == "replication.failed"
        assert verify(secret, headers, body), headers
        assert not verify(secret, headers, body.replace(b"failed", b"passed"))
        assert not verify(b"another secret", headers, body)
    doc = json.loads(rcv.got[-1][2])
    assert doc["event"] == "replication.failed" and doc["job"] == job["id"], doc
    assert doc["group"] == "hooked" and doc["error_code"] == "no_target", doc
    # Backoff: the second attempt comes 2 s after the first at the earliest,
    # the third 4 s after the second.
    gaps = [b - a for a, b in zip(rcv.at, rcv.at[1:], strict=False)]
    print(f"gaps between attempts: {', '.join(f'{x:.1f} s' for x in gaps)}")
    assert gaps[0] >= 1.9 and gaps[1] >= 3.9, gaps
    assert secret.decode() not in plane.tail(1_000_000)
