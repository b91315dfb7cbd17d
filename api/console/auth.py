"""The console's session: the operator's API token in a cookie, checked on
every request exactly as the REST API checks a bearer token.

- The session cookie holds the token itself, HttpOnly (no script reads it),
  SameSite=Strict (no other site's page sends it) and Path=/console; Secure
  when the console is reached over HTTPS.  Nothing is kept server-side, so
  revoking the token (`cutpoint token revoke`) ends every console session of
  it at the next request.
- Each request hands the cookie to `deps.current_token` as the bearer
  credentials and each action to `deps.require(role)`: one lookup, one role
  rule, the same `last_used_at` and the same audit actor as the REST API.
- State-changing forms carry a CSRF token bound to the session: an HMAC of
  the session's token under the API's `token_secret`, so it needs no store
  and changes with the token.  The login form, which has no session yet,
  uses a random value that is both in a short-lived cookie and in the form.

The token is never written to a log, a URL or a page.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from typing import Annotated

from cutpoint.api.deps import SessionDep, SettingsDep, current_token, require
from cutpoint.api.errors import ApiError, Forbidden
from cutpoint.api.models import ApiToken, Role
from cutpoint.api.security import role_allows
from fastapi import Depends, Request, Response
from fastapi.security import HTTPAuthorizationCredentials

COOKIE = "cp_console"
LOGIN_COOKIE = "cp_console_login"
PATH = "/console"


class LoginRequired(Exception):
    """No session, or its token is unknown or revoked (the reason is shown)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass
class ConsoleUser:
    """The console's user: the token's row plus what the pages need."""

    token: ApiToken
    csrf: str

    @property
    def name(self) -> str:
        return self.token.name

    @property
    def role(self) -> str:
        return self.token.role.value

    def may(self, role: str) -> bool:
        return role_allows(self.token.role, Role(role))

    def need(self, role: Role) -> None:
        """Forbidden (403) unless the token's role allows `role`: the REST rule."""
        require(role)(self.token)


def csrf_for(token: str, secret: str) -> str:
    return hmac.new(secret.encode(), b"console-csrf\0" + token.encode(),
                    hashlib.sha256).hexdigest()


def check_token(request: Request, session: SessionDep, settings: SettingsDep,
                token: str) -> ApiToken:
    """The REST API's own check of `token` (deps.current_token)."""
    cred = HTTPAuthorizationCredentials(scheme="Bearer", credentials=token)
    return current_token(request, session, settings, cred)


def current(request: Request, session: SessionDep, settings: SettingsDep) -> ConsoleUser:
    tok = request.cookies.get(COOKIE)
    if not tok:
        raise LoginRequired("")
    try:
        row = check_token(request, session, settings, tok)
    except ApiError as exc:
        raise LoginRequired("your session's token is unknown or revoked; "
                            "sign in again") from exc
    user = ConsoleUser(row, csrf_for(tok, settings.token_secret.get_secret_value()))
    request.state.console_user = user  # the pages' header, error pages included
    return user


User = Annotated[ConsoleUser, Depends(current)]


def check_csrf(user: ConsoleUser, sent: str) -> None:
    if not sent or not hmac.compare_digest(sent, user.csrf):
        raise Forbidden("the form's CSRF token does not match this session; reload the page",
                        code="csrf_mismatch")


def _secure(request: Request) -> bool:
    return request.url.scheme == "https"


def start(request: Request, response: Response, token: str) -> None:
    response.set_cookie(COOKIE, token, path=PATH, httponly=True, samesite="strict",
                        secure=_secure(request))
    response.delete_cookie(LOGIN_COOKIE, path=PATH, httponly=True, samesite="strict",
                           secure=_secure(request))


def end(request: Request, response: Response) -> None:
    response.delete_cookie(COOKIE, path=PATH, httponly=True, samesite="strict",
                           secure=_secure(request))


def new_login_nonce() -> str:
    """The sign-in form's CSRF value (set_login_nonce puts it in a cookie too)."""
    return secrets.token_urlsafe(24)


def set_login_nonce(request: Request, response: Response, nonce: str) -> None:
    """The cookie half of the sign-in form's CSRF value, for ten minutes."""
    response.set_cookie(LOGIN_COOKIE, nonce, path=PATH, max_age=600, httponly=True,
                        samesite="strict", secure=_secure(request))


def check_login_nonce(request: Request, sent: str) -> None:
    have = request.cookies.get(LOGIN_COOKIE, "")
    if not have or not sent or not hmac.compare_digest(have, sent):
        raise Forbidden("the sign-in form expired or came from elsewhere; reload it",
                        code="csrf_mismatch")
