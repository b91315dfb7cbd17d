from __future__ import annotations

from cutpoint.api.deps import Admin, Cursor, Limit, SessionDep
from cutpoint.api.models import AuditEntry
from cutpoint.api.schemas.audit import AuditPublic
from cutpoint.api.schemas.common import Page
from cutpoint.api.services.common import paginate
from fastapi import APIRouter
from sqlalchemy import select

router = APIRouter(prefix="/audit", tags=["audit"])


@router.get("", response_model=Page[AuditPublic])
def list_audit(session: SessionDep, _: Admin, limit: Limit = 50, cursor: Cursor = None) \
        -> Page[AuditPublic]:
    """Every mutating call, newest first (admin only)."""
    rows, nxt = paginate(session, select(AuditEntry), AuditEntry.id, limit, cursor,
                         newest_first=True)
    return Page(items=[AuditPublic.model_validate(r) for r in rows], next_cursor=nxt)
