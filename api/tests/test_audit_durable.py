"""Audit is durable: a mutating call is carried out only with its audit
record, written in the same transaction as the change.

The fault: the database refuses inserts into audit_log (a trigger that
raises, on SQLite and PostgreSQL), while every other table still works.
"""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import Connection, text

BREAK = {
    "sqlite": [("CREATE TRIGGER audit_broken BEFORE INSERT ON audit_log "
               "BEGIN SELECT RAISE(ABORT, 'audit log unavailable'); END")],
    "postgresql": [
        ("CREATE FUNCTION audit_broken() RETURNS trigger LANGUAGE plpgsql AS "
        "$$ BEGIN RAISE EXCEPTION 'audit log unavailable'; END $$"),
        ("CREATE TRIGGER audit_broken BEFORE INSERT ON audit_log "
        "FOR EACH ROW EXECUTE FUNCTION audit_broken()")],
}


@pytest.fixture
def broken_audit(connection: Connection) -> None:
    for stmt in BREAK[connection.dialect.name]:
        connection.execute(text(stmt))


def test_a_change_whose_audit_record_cannot_be_written_is_not_made(
        api: Any, connection: Connection, broken_audit: None) -> None:
    r = api.post("/v1/sites", json={"name": "unaudited"})
    print(f"\nPOST /v1/sites with audit_log refusing inserts -> {r.status_code} {r.text}")
    assert r.status_code == 503, r.text
    assert r.json()["code"] == "audit_unavailable", r.text
    names = [s["name"] for s in api.get("/v1/sites").json()["items"]]
    assert "unaudited" not in names
    # A refused call stays refused (nothing was changed to audit).
    assert api.as_("viewer").post("/v1/sites", json={"name": "v"}).status_code == 403


def test_the_audit_record_commits_with_the_change(api: Any) -> None:
    r = api.post("/v1/sites", json={"name": "audited"})
    assert r.status_code == 201, r.text
    rid = r.headers["X-Request-Id"]
    rows = [x for x in api.get("/v1/audit").json()["items"] if x["request_id"] == rid]
    assert [(x["method"], x["path"], x["status"], x["actor"]) for x in rows] == \
        [("POST", "/v1/sites", 201, "test-admin")], rows
