"""API tokens: `cp_<id>_<secret>`, stored as HMAC-SHA256(token_secret, token)."""

from __future__ import annotations

import hashlib
import hmac
import secrets

from cutpoint.api.models import Role

TOKEN_PREFIX = "cp_"
ROLE_RANK = {Role.viewer: 0, Role.operator: 1, Role.admin: 2}


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def hash_token(token: str, secret: str) -> str:
    return hmac.new(secret.encode(), token.encode(), hashlib.sha256).hexdigest()


def role_allows(have: Role, need: Role) -> bool:
    return ROLE_RANK[have] >= ROLE_RANK[need]
