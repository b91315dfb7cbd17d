from __future__ import annotations

from typing import Any, TypeVar

from cutpoint.api.errors import ApiError, Conflict, NotFound, PreconditionFailed
from sqlalchemy import Select, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

M = TypeVar("M")


def get_or_404(session: Session, model: type[M], ident: Any, what: str) -> M:
    obj = session.get(model, ident)
    if obj is None:
        raise NotFound(f"{what} {ident} does not exist", code=f"{what}_not_found")
    return obj


def get_by_name_or_404(session: Session, model: type[M], name: str, what: str) -> M:
    """The row of `model` whose unique `name` column is `name`; 404 `<what>_not_found`."""
    obj = session.scalar(select(model).where(model.name == name))  # type: ignore[attr-defined]
    if obj is None:
        raise NotFound(f"{what} {name!r} does not exist", code=f"{what}_not_found")
    return obj


def add_unique(session: Session, obj: M, what: str, name: str) -> M:
    """Add and commit a new row; a unique-constraint clash (the name is taken,
    possibly by a concurrent request) is rolled back and becomes 409
    `<what>_exists`."""
    session.add(obj)
    try:
        session.commit()
    except IntegrityError:
        session.rollback()
        raise Conflict(f"{what} {name!r} already exists", code=f"{what}_exists") from None
    return obj


def parse_cursor(cursor: str | None) -> int | None:
    if cursor is None or cursor == "":
        return None
    if not cursor.isdigit() or len(cursor) > 18:
        raise ApiError(f"cursor {cursor!r} is not one this API handed out", code="bad_cursor")
    return int(cursor)


def paginate(session: Session, stmt: Select[Any], id_col: Any, limit: int,
             cursor: str | None, *, newest_first: bool = False) -> tuple[list[Any], str | None]:
    """Keyset pagination on an integer id; returns (rows, next_cursor)."""
    after = parse_cursor(cursor)
    if after is not None:
        stmt = stmt.where(id_col < after if newest_first else id_col > after)
    stmt = stmt.order_by(id_col.desc() if newest_first else id_col.asc()).limit(limit + 1)
    rows = list(session.scalars(stmt).unique().all())
    nxt = None
    if len(rows) > limit:
        rows = rows[:limit]
        nxt = str(rows[-1].id)
    return rows, nxt


def etag(kind: str, ident: Any, version: int) -> str:
    return f'"{kind}-{ident}-v{version}"'


def check_if_match(if_match: str | None, current: str) -> None:
    """RFC 9110 §13.1.1: If-Match with no matching entity tag → 412."""
    if if_match is None:
        return
    tags = [t.strip() for t in if_match.split(",")]
    if "*" in tags or current in tags or f"W/{current}" in tags:
        return
    raise PreconditionFailed(f"If-Match {if_match} does not match the current ETag {current}",
                             code="etag_mismatch", extra={"etag": current})
