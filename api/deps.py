"""FastAPI dependencies, as Annotated aliases for route signatures."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Annotated

from cutpoint.api.config import Settings
from cutpoint.api.errors import Forbidden, Unauthorized
from cutpoint.api.models import ApiToken, Role, utcnow
from cutpoint.api.security import role_allows
from cutpoint.api.services import audit, tokens
from fastapi import Depends, Header, Path, Query, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session


def get_settings_dep(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


SettingsDep = Annotated[Settings, Depends(get_settings_dep)]


def get_session(request: Request) -> Iterator[Session]:
    # Reads use read transactions: on SQLite they do not queue behind writers.
    factory = (request.app.state.read_session_factory
               if request.method in ("GET", "HEAD") else request.app.state.session_factory)
    session: Session = factory()
    if request.method not in ("GET", "HEAD"):
        audit.attach(session, request)  # no change without its audit row
    try:
        yield session
    finally:
        # Anything a service did not commit is dropped here, never saved.
        session.rollback()
        session.close()


# scope="function": the session closes when the route returns, before the
# response is sent, so no transaction (on SQLite: no write lock) outlives the
# route while the audit middleware writes its row.
SessionDep = Annotated[Session, Depends(get_session, scope="function")]

_bearer = HTTPBearer(auto_error=False, description="An API token from `cutpoint token create`")


def current_token(request: Request, session: SessionDep, settings: SettingsDep,
                  cred: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]) \
        -> ApiToken:
    if cred is None or cred.scheme.lower() != "bearer" or not cred.credentials:
        raise Unauthorized("a bearer token is required", code="token_missing")
    row = tokens.lookup(session, cred.credentials, settings.token_secret.get_secret_value())
    if row is None:
        raise Unauthorized("the token is unknown or revoked", code="token_invalid")
    request.state.actor = row.name
    request.state.role = row.role.value
    now = utcnow()
    # Throttled so that reads do not turn into a write per request.
    if row.last_used_at is None or (now - row.last_used_at).total_seconds() > 60:
        row.last_used_at = now
        try:
            with audit.unaudited(session):
                session.commit()
        except OperationalError:
            # Best effort: inside a read transaction on SQLite the upgrade to
            # a write can lose to a concurrent writer; the next call retries.
            session.rollback()
    return row


CurrentToken = Annotated[ApiToken, Depends(current_token)]


def require(role: Role) -> Callable[[ApiToken], ApiToken]:
    def _check(token: CurrentToken) -> ApiToken:
        if not role_allows(token.role, role):
            raise Forbidden(f"role {token.role.value} may not do this; {role.value} needed",
                            code="role_insufficient", extra={"required_role": role.value})
        return token
    # Read by roles_in_openapi: the OpenAPI document names each operation's role.
    _check.required_role = role  # type: ignore[attr-defined]
    return _check


Viewer = Annotated[ApiToken, Depends(require(Role.viewer))]
Operator = Annotated[ApiToken, Depends(require(Role.operator))]
Admin = Annotated[ApiToken, Depends(require(Role.admin))]

IfMatch = Annotated[str | None, Header(alias="If-Match", max_length=200)]
Limit = Annotated[int, Query(ge=1, le=500, description="Page size")]
Cursor = Annotated[str | None, Query(max_length=20, pattern=r"^[0-9]*$",
                                     description="next_cursor of the previous page")]
# Ids are 32-bit positive in every database we support; larger numbers are a
# 422, not an overflow deep in the driver.
IdPath = Annotated[int, Path(ge=1, le=2**31 - 1)]
