from __future__ import annotations

from cutpoint.api.models import ApiToken, Role, utcnow
from cutpoint.api.security import hash_token, new_token
from cutpoint.api.services.common import add_unique, get_or_404
from sqlalchemy import select
from sqlalchemy.orm import Session


def create(session: Session, name: str, role: Role, secret: str) -> tuple[ApiToken, str]:
    """Returns the row and the token itself, which is shown once and never stored."""
    token = new_token()
    row = ApiToken(name=name, role=role, token_hash=hash_token(token, secret), prefix=token[:8])
    return add_unique(session, row, "token", name), token


def lookup(session: Session, token: str, secret: str) -> ApiToken | None:
    row = session.scalar(select(ApiToken).where(ApiToken.token_hash == hash_token(token, secret)))
    if row is None or row.revoked_at is not None:
        return None
    return row


def revoke(session: Session, token_id: int) -> ApiToken:
    row = get_or_404(session, ApiToken, token_id, "token")
    if row.revoked_at is None:
        row.revoked_at = utcnow()
        session.commit()
    return row
