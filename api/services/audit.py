from __future__ import annotations

from typing import Any

from cutpoint.api.models import AuditEntry
from sqlalchemy.orm import Session


def record(session: Session, *, actor: str | None, role: str | None, method: str, path: str,
           status: int, request_id: str, remote: str | None,
           detail: dict[str, Any] | None = None) -> None:
    session.add(AuditEntry(actor=actor, role=role, method=method, path=path[:512],
                           status=status, request_id=request_id, remote=remote, detail=detail))
    session.commit()
