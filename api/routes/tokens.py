from __future__ import annotations

from cutpoint.api.deps import Admin, Cursor, IdPath, Limit, SessionDep, SettingsDep
from cutpoint.api.models import ApiToken, Role
from cutpoint.api.schemas.common import Page
from cutpoint.api.schemas.tokens import TokenCreate, TokenCreated, TokenPublic
from cutpoint.api.services import tokens
from cutpoint.api.services.common import paginate
from fastapi import APIRouter
from sqlalchemy import select

router = APIRouter(prefix="/tokens", tags=["tokens"])


@router.get("", response_model=Page[TokenPublic])
def list_tokens(session: SessionDep, _: Admin, limit: Limit = 50, cursor: Cursor = None) \
        -> Page[TokenPublic]:
    """Every API token's name, role and dates; never the token."""
    rows, nxt = paginate(session, select(ApiToken), ApiToken.id, limit, cursor)
    return Page(items=[TokenPublic.model_validate(r) for r in rows], next_cursor=nxt)


@router.post("", status_code=201, response_model=TokenCreated)
def create_token(data: TokenCreate, session: SessionDep, settings: SettingsDep, _: Admin) \
        -> TokenCreated:
    """The token is in this reply only; the server keeps its hash."""
    row, token = tokens.create(session, data.name, Role(data.role),
                               settings.token_secret.get_secret_value())
    return TokenCreated.model_validate({**TokenPublic.model_validate(row).model_dump(),
                                        "token": token})


@router.delete("/{token_id}", response_model=TokenPublic)
def revoke_token(token_id: IdPath, session: SessionDep, _: Admin) -> TokenPublic:
    """Revoke a token; it is refused from the next call on."""
    return TokenPublic.model_validate(tokens.revoke(session, token_id))
