"""The audit log: every mutating API call, durable (DESIGN.md "Auth").

A change and its audit row are written in one transaction: the session of a
mutating request (`attach`) inserts the call's row at its first commit, so
if the row cannot be written the commit fails and the change is not made
(503 `audit_unavailable`).  After the response the middleware sets the row's
final status (`finish`); a call that committed nothing (refused: 401, 403,
404, 409...) gets its row then (`record`), and a successful call that could
not be recorded at all is answered 503 instead of its success.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from cutpoint.api.errors import Unavailable
from cutpoint.api.models import AuditEntry
from sqlalchemy import event, insert, update
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, SessionTransaction

log = logging.getLogger("cutpoint.audit")

REQUEST = "cutpoint_audit_request"   # session.info: the request being audited
PENDING = "cutpoint_audit_pending"   # session.info: its row, inserted, not committed


class AuditUnavailable(Unavailable):
    code = "audit_unavailable"

    def __init__(self, cause: BaseException) -> None:
        first = str(cause).strip().splitlines()[0] if str(cause).strip() else ""
        super().__init__("the call was not carried out: its audit record could not be "
                         f"written ({type(cause).__name__}: {first[:300]})")


def record(session: Session, *, actor: str | None, role: str | None, method: str, path: str,
           status: int, request_id: str, remote: str | None,
           detail: dict[str, Any] | None = None) -> None:
    session.add(AuditEntry(actor=actor, role=role, method=method, path=path[:512],
                           status=status, request_id=request_id, remote=remote, detail=detail))
    session.commit()


def finish(session: Session, entry_id: int, status: int) -> None:
    session.execute(update(AuditEntry).where(AuditEntry.id == entry_id).values(status=status))
    session.commit()


def attach(session: Session, request: Any) -> None:
    """Write `request`'s audit row with the first commit of `session`."""
    session.info[REQUEST] = request


@contextmanager
def unaudited(session: Session) -> Iterator[None]:
    """Commits inside are bookkeeping of the request itself (the token's
    last use), not the call's change: they carry no audit row."""
    request = session.info.pop(REQUEST, None)
    try:
        yield
    finally:
        if request is not None:
            session.info[REQUEST] = request


def _fields(request: Any) -> dict[str, Any]:
    route = request.scope.get("route")
    return {"actor": request.state.actor, "role": request.state.role,
            "method": request.method, "path": request.url.path[:512],
            # Provisional: the route's success status; `finish` sets the real one.
            "status": getattr(route, "status_code", None) or 200,
            "request_id": request.state.request_id,
            "remote": request.client.host if request.client else None,
            "detail": {"query": str(request.url.query)[:500]} if request.url.query else None}


@event.listens_for(Session, "before_commit")
def _with_the_change(session: Session) -> None:
    request = session.info.get(REQUEST)
    if request is None or PENDING in session.info \
            or getattr(request.state, "audit_id", None) is not None:
        return
    # The change first: its own errors (a taken name...) stay its own.
    session.flush()
    try:
        res = session.execute(insert(AuditEntry).values(**_fields(request)))
    except SQLAlchemyError as exc:
        log.error("event=audit_unavailable method=%s path=%s error=%s", request.method,
                  request.url.path, exc)
        raise AuditUnavailable(exc) from exc
    session.info[PENDING] = res.inserted_primary_key[0]


@event.listens_for(Session, "after_commit")
def _committed(session: Session) -> None:
    entry_id = session.info.pop(PENDING, None)
    if entry_id is not None:
        session.info[REQUEST].state.audit_id = entry_id


@event.listens_for(Session, "after_soft_rollback")
def _rolled_back(session: Session, previous: SessionTransaction) -> None:
    session.info.pop(PENDING, None)  # the row went with the change
